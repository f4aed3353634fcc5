// The built-in reference transformer (the X1 workload): GPT-2-style pre-LayerNorm, learned
// positional embeddings, tanh-GELU MLP, weights N(0, 0.02) drawn from the seed, attention and MLP
// output projections scaled by 1/sqrt(2 * n_layers), LayerNorm gains 1 and all biases 0.
// Forward stops after the hooked block (TransformerLens stop_at_layer); with several hooks, after
// the deepest.
#ifndef LATENTD_ENGINE_REFERENCE_MODEL_H_
#define LATENTD_ENGINE_REFERENCE_MODEL_H_

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/activation_model.h"
#include "engine/hook_name.h"
#include "proto/latentd/v1/extract.pb.h"

namespace latentd::engine {

// The spec with defaults filled in (d_model 256, 4 layers, 4 heads, d_mlp 4 * d_model,
// vocab 4096, context 128, seed 0); INVALID_ARGUMENT "extract.model.reference.<field>" when
// a value is out of range (d_model % n_heads != 0, ...).
absl::StatusOr<latentd::v1::ReferenceModelSpec> ResolveReferenceSpec(
    const latentd::v1::ReferenceModelSpec& spec);
// Checks that `hook` exists in the model (layer < n_layers; not hidden_states).
absl::Status CheckReferenceHook(const latentd::v1::ReferenceModelSpec& resolved,
                                const HookName& hook);
// Width of the hooked activation: d_mlp for mlp.hook_post, else d_model.
int64_t ReferenceHookWidth(const latentd::v1::ReferenceModelSpec& resolved, const HookName& hook);

class ReferenceModel : public ActivationModel {
 public:
  // Weights are drawn on the CPU (identical for a seed on every machine), then moved to `device`.
  static absl::StatusOr<std::unique_ptr<ReferenceModel>> Create(
      const latentd::v1::ReferenceModelSpec& spec, const HookName& hook, const at::Device& device);
  // Several hooks (at least one), read in one forward pass (ForwardHooks).
  static absl::StatusOr<std::unique_ptr<ReferenceModel>> Create(
      const latentd::v1::ReferenceModelSpec& spec, const std::vector<HookName>& hooks,
      const at::Device& device);

  at::Tensor Forward(const at::Tensor& tokens) override;
  std::vector<at::Tensor> ForwardHooks(const at::Tensor& tokens) override;
  int64_t hook_width() const override { return hook_width_; }
  std::vector<int64_t> hook_widths() const override;
  int64_t vocab_size() const override { return spec_.vocab_size(); }
  int64_t max_context() const override { return spec_.context_length(); }
  int64_t parameter_bytes() const override;
  int64_t activation_bytes_per_token(int64_t seq_len) const override;
  const std::string& model_id() const override { return model_id_; }
  const std::string& weight_hash() const override { return weight_hash_; }

  // Every weight by a GPT-2-like name (embed.W_E, embed.W_pos, blocks.L.ln1.w, blocks.L.attn.W_qkv
  // [d, 3d] (q | k | v, heads contiguous), blocks.L.attn.W_O, blocks.L.mlp.W_in, ...), on the
  // device: what bench/extract_python_peer.py loads to run the same model in Python.
  std::vector<std::pair<std::string, at::Tensor>> NamedWeights() const;

  // The full residual stream after every block (for tests): element L is resid_post of block L.
  std::vector<at::Tensor> AllResidPost(const at::Tensor& tokens);

 private:
  struct Block {
    at::Tensor ln1_w, ln1_b, W_qkv, b_qkv, W_O, b_O, ln2_w, ln2_b, W_in, b_in, W_out, b_out;
  };
  ReferenceModel() = default;
  // The activations of `hooks` (in that order) from one pass that stops once it has them all;
  // with `all`, every block runs and each one's resid_post is appended to it.
  std::vector<at::Tensor> Run(const at::Tensor& tokens, const std::vector<HookName>& hooks,
                              std::vector<at::Tensor>* all);

  latentd::v1::ReferenceModelSpec spec_;
  std::vector<HookName> hooks_;
  int64_t hook_width_ = 0;
  at::Tensor W_E_, W_pos_;
  std::vector<Block> blocks_;
  std::string model_id_, weight_hash_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_REFERENCE_MODEL_H_
