// Hugging Face checkpoints run natively, whatever their architecture: config.json's model_type
// picks the reader (gpt2: hf_gpt2.h; llama, mistral, qwen2, gemma, gemma2: hf_llama.h;
// gpt_neox: hf_neox.h). Another model_type is INVALID_ARGUMENT pointing at the TorchScript route.
#ifndef LATENTD_ENGINE_HF_MODEL_H_
#define LATENTD_ENGINE_HF_MODEL_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/activation_model.h"
#include "engine/gpt2_model.h"
#include "engine/hf_checkpoint.h"
#include "engine/hook_name.h"
#include "engine/llama_model.h"
#include "engine/transformer_shape.h"

namespace latentd::engine {

// config.json and the weight files' headers, and the options against the architecture (no
// weight is read): what submit checks.
absl::StatusOr<TransformerShape> CheckHfModel(const HfModelOptions& options);

// The weights of one architecture, read once and shared by the replicas made from them.
struct HfModelWeights {
  std::optional<Gpt2Weights> gpt2;
  std::optional<LlamaWeights> llama;
};
// RESOURCE_EXHAUSTED with the numbers, before reading anything, when the float32 weights and
// the largest weight file (in memory while it is converted) exceed options.host_memory_limit_bytes.
absl::StatusOr<HfModelWeights> LoadHfModelWeights(const HfModelOptions& options);

// A model of `weights` reading `hooks`, on `device` (CPU replicas share the tensors).
absl::StatusOr<std::unique_ptr<ActivationModel>> CreateHfModel(const HfModelWeights& weights,
                                                               const std::vector<HookName>& hooks,
                                                               const at::Device& device);

// CheckHfModel's config reading and the hooks, then the weights, then the model.
absl::StatusOr<std::unique_ptr<ActivationModel>> LoadHfModel(const HfModelOptions& options,
                                                             const std::vector<HookName>& hooks,
                                                             const at::Device& device);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HF_MODEL_H_
