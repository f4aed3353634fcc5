// A GPT-2-architecture transformer: pre-LayerNorm blocks, learned positional embeddings, one
// fused qkv projection, an MLP with GELU; every weight in x @ W orientation (Hugging Face's
// Conv1D layout). Where the weights come from is someone else's business: the built-in reference
// model draws them from a seed (reference_model.h), a Hugging Face GPT-2 checkpoint supplies them
// (hf_gpt2.h).
//
// Hooks take TransformerLens names (blocks.L.hook_resid_pre / hook_attn_out / hook_resid_mid /
// ln2.hook_normalized / mlp.hook_post / hook_mlp_out / hook_resid_post) and the forward pass
// stops after the deepest hooked block (TransformerLens' stop_at_layer).
#ifndef LATENTD_ENGINE_GPT2_MODEL_H_
#define LATENTD_ENGINE_GPT2_MODEL_H_

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/activation_model.h"
#include "engine/hook_name.h"
#include "engine/transformer_shape.h"

namespace latentd::engine {

enum class Gpt2Activation {
  kGeluTanh,  // GPT-2's "gelu_new" (also "gelu_pytorch_tanh", "gelu_fast")
  kGeluErf,   // "gelu"
  kRelu,      // "relu"
};

// The shape and the few numerical choices of a GPT-2 model.
struct Gpt2Config {
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;  // divides d_model
  int64_t d_mlp = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // positions the model has embeddings for
  double layer_norm_eps = 1e-5;
  Gpt2Activation activation = Gpt2Activation::kGeluTanh;
  bool scale_attn_weights = true;                // scores / sqrt(d_head)
  bool scale_attn_by_inverse_layer_idx = false;  // and / (layer + 1)
  std::string what = "the model";                // TransformerShape::what
};

// The shape of a model of `config`, for checks.
TransformerShape Gpt2Shape(const Gpt2Config& config);

struct Gpt2Block {
  at::Tensor ln1_w, ln1_b;  // [d]
  at::Tensor W_qkv, b_qkv;  // [d, 3d], [3d]: q | k | v, each head's d_head columns contiguous
  at::Tensor W_O, b_O;      // [d, d], [d]
  at::Tensor ln2_w, ln2_b;  // [d]
  at::Tensor W_in, b_in;    // [d, d_mlp], [d_mlp]
  at::Tensor W_out, b_out;  // [d_mlp, d], [d]
};

// Everything a Gpt2Model is made of, float32. The caller vouches for the shapes (the loaders
// check them against `config`).
struct Gpt2Weights {
  Gpt2Config config;
  at::Tensor W_E;    // [vocab_size, d]; also the unembedding (tied) unless W_U is set
  at::Tensor W_pos;  // [context_length, d]
  // After the last block, for the downstream loss only: the final LayerNorm (undefined when the
  // checkpoint has none) and the unembedding [vocab_size, d] when it is not W_E (W_E centered
  // by center_writing_weights still unembeds with the checkpoint's own).
  at::Tensor ln_f_w, ln_f_b, W_U;
  std::vector<Gpt2Block> blocks;
  std::string model_id;     // what the dataset records as its model
  std::string weight_hash;  // "fnv1a64:..." of what the weights were made from
};

class Gpt2Model : public ActivationModel {
 public:
  // The model reading `hooks` (at least one, each checked with CheckTransformerHook), its
  // weights moved to `device`.
  static absl::StatusOr<std::unique_ptr<Gpt2Model>> Create(Gpt2Weights weights,
                                                           const std::vector<HookName>& hooks,
                                                           const at::Device& device);

  at::Tensor Forward(const at::Tensor& tokens) override;
  std::vector<at::Tensor> ForwardHooks(const at::Tensor& tokens) override;
  int64_t hook_width() const override { return hook_widths_[0]; }
  std::vector<int64_t> hook_widths() const override { return hook_widths_; }
  int64_t vocab_size() const override { return config().vocab_size; }
  int64_t max_context() const override { return config().context_length; }
  int64_t parameter_bytes() const override { return Gpt2Shape(config()).parameter_bytes; }
  int64_t activation_bytes_per_token(int64_t seq_len) const override {
    return TransformerActivationBytesPerToken(Gpt2Shape(config()), seq_len);
  }
  int64_t num_blocks() const override { return w_.config.n_layers; }
  const std::string& model_id() const override { return w_.model_id; }
  const std::string& weight_hash() const override { return w_.weight_hash; }
  const Gpt2Config& config() const { return w_.config; }

  // Every weight by a TransformerLens-like name (embed.W_E, embed.W_pos, blocks.L.ln1.w,
  // blocks.L.attn.W_qkv, blocks.L.attn.W_O, blocks.L.mlp.W_in, ...), on the device: what
  // bench/extract_python_peer.py loads to run the same model in Python, and where the
  // unembedding (embed.W_E, tied) comes from.
  std::vector<std::pair<std::string, at::Tensor>> NamedWeights() const override;

  // The full residual stream after every block (for tests): element L is resid_post of block L.
  std::vector<at::Tensor> AllResidPost(const at::Tensor& tokens);

  std::string next_token_loss_unsupported() const override;
  NextTokenPredictions PredictNextTokens(const at::Tensor& tokens, const HookSplices& splices,
                                         bool losses, KeyValueCache* cache = nullptr) override;
  std::vector<at::Tensor> ForwardSpliced(const at::Tensor& tokens,
                                         const std::vector<HookName>& hooks,
                                         const HookSplices& splices,
                                         KeyValueCache* cache = nullptr) override;

 private:
  Gpt2Model() = default;
  // The activations of `hooks` (in that order) from one pass that stops once it has them all;
  // with `all`, every block runs and each one's resid_post is appended to it; with `last`, every
  // block runs and *last is the final residual stream. `splices` (may be null) replace their
  // hooks' activations on the way. `cache`: tokens continue its positions.
  std::vector<at::Tensor> Run(const at::Tensor& tokens, const std::vector<HookName>& hooks,
                              std::vector<at::Tensor>* all, const HookSplices* splices = nullptr,
                              at::Tensor* last = nullptr, KeyValueCache* cache = nullptr);

  Gpt2Weights w_;
  std::vector<HookName> hooks_;
  std::vector<int64_t> hook_widths_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_GPT2_MODEL_H_
