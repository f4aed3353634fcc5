// Where an SAE's latents land in the model and what each lands there: the hooks steering adds
// (z' - z) times the decoder at and attribution takes its gradients at.
//
//   an SAE:                        its own hook, W_dec's rows;
//   a transcoder:                  its output hook, W_dec's rows;
//   layer L of a cross-layer       the output hook of every layer m >= L of the release, the
//   transcoder (circuit-tracer):   rows of W_dec_L[:, m - L, :] (read from the release);
//   a crosscoder over hooks:       each of its sources, block s of W_dec's rows at source s;
//   a crosscoder over models,      its hook, block s of W_dec's rows.
//   run as source s's model:
//
// In the hook's units a latent's change dz adds dz * DecoderOutputScale(x) * row at each (the
// SAE's input normalization undone; its bias, a normalization's shift and a skip connection do
// not move with the latents).
#ifndef LATENTD_ENGINE_DECODER_WRITES_H_
#define LATENTD_ENGINE_DECODER_WRITES_H_

#include <ATen/ATen.h>

#include <vector>

#include "absl/status/statusor.h"
#include "engine/hook_name.h"
#include "engine/steering_model.h"

namespace latentd::engine {

// The hooks steering.sae's decoder writes, in the order a forward pass reaches them.
std::vector<HookName> WrittenHooks(const SteeringModel& steering);

// For a crosscoder, which of its sources (blocks) each hook of WrittenHooks is; empty for
// others.
std::vector<int64_t> WrittenBlocks(const SteeringModel& steering);

// For `latents` (int64 [n], each in [0, d_sae)): per hook of WrittenHooks, the rows they write
// there, [n, width of the hook] float32. INVALID_ARGUMENT (or DATA_LOSS) from a cross-layer
// release whose decoder files do not hold the latents.
absl::StatusOr<std::vector<at::Tensor>> WrittenRows(const SteeringModel& steering,
                                                    const at::Tensor& latents);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_DECODER_WRITES_H_
