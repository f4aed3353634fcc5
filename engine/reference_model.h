// The built-in reference transformer (the X1 workload): a GPT-2-architecture model (gpt2_model.h)
// whose weights are drawn from a seed: N(0, 0.02), attention and MLP output projections scaled by
// 1/sqrt(2 * n_layers), LayerNorm gains 1 and all biases 0, tanh-GELU, LayerNorm eps 1e-5. The same
// seed gives the same weights (and weight hash) on every machine.
#ifndef LATENTD_ENGINE_REFERENCE_MODEL_H_
#define LATENTD_ENGINE_REFERENCE_MODEL_H_

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gpt2_model.h"
#include "engine/hook_name.h"
#include "proto/latentd/v1/extract.pb.h"

namespace latentd::engine {

// The spec with defaults filled in (d_model 256, 4 layers, 4 heads, d_mlp 4 * d_model,
// vocab 4096, context 128, seed 0); INVALID_ARGUMENT "extract.model.reference.<field>" when
// a value is out of range (d_model % n_heads != 0, ...).
absl::StatusOr<latentd::v1::ReferenceModelSpec> ResolveReferenceSpec(
    const latentd::v1::ReferenceModelSpec& spec);
// The architecture of a resolved spec.
Gpt2Config ReferenceGpt2Config(const latentd::v1::ReferenceModelSpec& resolved);
// The weights of a resolved spec, drawn on the CPU; the hash is FNV-1a over every weight's
// bytes in creation order.
Gpt2Weights DrawReferenceWeights(const latentd::v1::ReferenceModelSpec& resolved);

// The reference model for `spec` (resolved here) reading `hooks` (at least one), on `device`.
absl::StatusOr<std::unique_ptr<Gpt2Model>> CreateReferenceModel(
    const latentd::v1::ReferenceModelSpec& spec, const std::vector<HookName>& hooks,
    const at::Device& device);
absl::StatusOr<std::unique_ptr<Gpt2Model>> CreateReferenceModel(
    const latentd::v1::ReferenceModelSpec& spec, const HookName& hook, const at::Device& device);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_REFERENCE_MODEL_H_
