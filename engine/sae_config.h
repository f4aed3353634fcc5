// The cfg.json + safetensors layout SAELens and sparsify ship SAEs in, read without torch so that
// submit-time validation stays cheap (it reads cfg.json and the safetensors header only).
//
// Accepted cfg.json fields: d_in, d_sae (sparsify: num_latents), architecture ("standard"/"relu",
// "topk", "jumprelu", "gated"; absent with a k means topk, as sparsify writes), k (or
// activation_fn_kwargs.k), apply_b_dec_to_input (default true), hook_name (older SAELens:
// hook_point; sparsify: none, the directory's name is the module, e.g. layers.6),
// model_from_pretrained_kwargs.center_writing_weights, model_name, dtype.
// Refused (INVALID_ARGUMENT naming the field), because they change what the encoder computes:
// SAELens' normalize_activations other than "none", rescale_acts_by_decoder_norm true.
// Weights: sae_weights.safetensors, else the only *.safetensors file in the directory, holding
// W_enc [d_in, d_sae] (or sparsify's encoder.weight [d_sae, d_in]), b_enc (encoder.bias) [d_sae],
// W_dec [d_sae, d_in], b_dec [d_in], threshold [d_sae] for JumpReLU, and for Gated (SAELens'
// GatedSAE, Rajamanoharan et al. 2024) b_gate (in place of b_enc), r_mag and b_mag [d_sae];
// F32, F16, BF16 or F64.
// Gemma Scope's release layout is read too: a directory with params.npz (W_enc, W_dec, b_enc,
// b_dec, threshold; float32) and no cfg.json is a JumpReLU SAE with apply_b_dec_to_input false,
// d_in and d_sae from W_enc, and its hook from the path (.../gemma-scope-2b-pt-res/layer_20/...:
// blocks.20.hook_resid_post; -mlp: hook_mlp_out).
#ifndef LATENTD_ENGINE_SAE_CONFIG_H_
#define LATENTD_ENGINE_SAE_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latentd::engine {

enum class SaeArchitecture { kRelu, kTopK, kJumpRelu, kGated };
const char* SaeArchitectureName(SaeArchitecture a);  // "relu", "topk", "jumprelu", "gated"

struct SaeConfig {
  int64_t d_in = 0;
  int64_t d_sae = 0;
  SaeArchitecture architecture = SaeArchitecture::kTopK;
  int32_t k = 0;                     // TopK only; 1 <= k <= d_sae
  bool apply_b_dec_to_input = true;  // pre = (x - b_dec) W_enc + b_enc when true
  std::string hook_name;             // informational
  std::string model_name;            // informational
  // SAELens' model_from_pretrained_kwargs.center_writing_weights: whether the model the SAE was
  // trained on had TransformerLens' centering (unset when cfg.json does not say).
  std::optional<bool> center_writing_weights;
};

absl::StatusOr<SaeConfig> ParseSaeConfigJson(const std::string& text);
std::string SaeConfigToJson(const SaeConfig& cfg);

inline constexpr char kGemmaScopeParams[] = "params.npz";

// Where the weights of the SAE in `dir` are (see above; params.npz when the directory has no
// safetensors file). NOT_FOUND when there are none.
absl::StatusOr<std::string> FindSaeWeightsFile(const std::string& dir);

// Reads dir/cfg.json and checks the safetensors header of the weights file against it: every
// tensor present with the shape the config implies. INVALID_ARGUMENT naming the mismatch.
absl::StatusOr<SaeConfig> ReadAndCheckSae(const std::string& dir);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_SAE_CONFIG_H_
