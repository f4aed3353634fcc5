// A Llama-architecture transformer (Llama 2/3, Mistral, Qwen2/3, Gemma 1/2/3 and the like): RMSNorm
// before attention and MLP, rotary position embeddings (Hugging Face's half-split layout,
// optionally Llama 3's frequency scaling), grouped-query attention, a gated MLP
// down(act(gate(x)) * up(x)); Gemma's variations are options (embedding scale, norms after
// attention and MLP too, attention-logit soft-capping, its own attention scale; Gemma 3's and
// Qwen3's norms of each query and key head, Gemma 3's sliding-window layers), and so are
// GPT-NeoX's (Pythia: LayerNorm, rotary on part of each head, an ungated MLP, attention and MLP
// in parallel), OLMo 2's (norms only after attention and MLP, a norm over all query and key
// heads) and Phi-3's (LongRoPE, rotary on part of each head). Weights are as
// Hugging Face's nn.Linear holds them: [out, in].
//
// Hooks take TransformerLens names with TransformerLens' meaning for this architecture:
// resid_pre / resid_mid / resid_post, attn_out (o_proj's output), ln2.hook_normalized (the MLP's
// normed input: post_attention_layernorm's output, Gemma 2's pre_feedforward_layernorm's),
// mlp.hook_post (act(gate) * up, d_mlp wide), mlp_out (down_proj's output). The forward stops
// after the deepest hooked block.
#ifndef LATENTD_ENGINE_LLAMA_MODEL_H_
#define LATENTD_ENGINE_LLAMA_MODEL_H_

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

enum class LlamaActivation { kSilu, kGeluTanh, kGeluErf };

struct LlamaConfig {
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;    // even
  int64_t d_mlp = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  double norm_eps = 1e-6;
  bool layer_norm = false;  // LayerNorm with biases instead of RMSNorm (GPT-NeoX)
  double rope_theta = 10000.0;
  int64_t rotary_dim = 0;  // the leading dims of each head that rotate; 0: all of them
  // Llama 3's rope_scaling ("rope_type": "llama3"); factor 0 means none.
  double rope_factor = 0, rope_low_freq_factor = 1, rope_high_freq_factor = 4;
  int64_t rope_original_context = 8192;
  LlamaActivation activation = LlamaActivation::kSilu;
  bool qkv_bias = false;  // q/k/v projections have biases (Qwen2, Llama's attention_bias)
  bool o_bias = false;    // o_proj has one (Llama's attention_bias)
  bool mlp_bias = false;  // gate/up/down have them (Llama's mlp_bias)
  bool tied_embeddings = false;
  bool gated_mlp = true;  // down(act(gate(x)) * up(x)); else down(act(up(x))) (GPT-NeoX)
  // x + attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX's use_parallel_residual): no resid_mid.
  bool parallel_residual = false;
  double embed_scale = 1;          // the embeddings are multiplied by it (Gemma: sqrt(d_model))
  bool post_norms = false;         // RMSNorm on attention's and the MLP's outputs too (Gemma 2)
  double attn_softcap = 0;         // scores -> cap * tanh(scores / cap) before the mask; 0: none
  double final_logit_softcap = 0;  // logits -> cap * tanh(logits / cap) (Gemma 2); 0: none
  double attn_scale = 0;           // scores' scale; 0: 1 / sqrt(head_dim)
  // The checkpoint stores each norm's gain as w with (1 + w) applied (Gemma); the loader adds 1.
  bool norm_gain_offset = false;
  bool qk_norm =
      false;  // RMSNorm over each query and key head before the rotation (Qwen3, Gemma 3)
  // RMSNorm over the whole query and key projections (all heads at once) before the rotation
  // (OLMo 2); q_norm and k_norm are then [heads * head_dim] and [kv_heads * head_dim].
  bool qk_norm_full = false;
  // RMSNorm before attention and before the MLP. OLMo 2 has none: its only norms are post_norms,
  // on what attention and the MLP add to the residual stream.
  bool pre_norms = true;
  // The checkpoint's norm gains multiply in float32 before the result returns to bfloat16
  // (OLMo 2); the loader makes them float32. Default: a bfloat16 gain multiplies after (Llama).
  bool norm_gain_float32 = false;
  // The checkpoint fuses q/k/v into one qkv_proj and gate/up into one gate_up_proj (Phi-3); the
  // loader splits them. Not a property of the forward pass.
  bool fused_projections = false;
  // LongRoPE (rope_scaling "longrope", Phi-3): each frequency divided by its factor, the short
  // ones for sequences of up to rope_original_context positions, the long ones beyond; cos and
  // sin multiplied by rope_attention_factor. One factor per rotated pair of dims (the
  // Hugging Face loader checks the counts). Empty: none.
  std::vector<double> rope_short_factors, rope_long_factors;
  double rope_attention_factor = 1;
  // Sliding-window attention on the layers `sliding_layers` marks (Gemma 3: five local layers to
  // one global): a position attends to itself and the sliding_window - 1 before it. Those layers
  // rotate with `rope_local_theta` (when > 0) and no rope scaling. 0: no window.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;  // n_layers entries when sliding_window > 0
  double rope_local_theta = 0;
  double rope_linear_factor = 0;  // rope_scaling "linear": frequencies divided by it; 0: none
  // Weights and activations in bfloat16, as Hugging Face runs a model loaded with
  // torch_dtype=bfloat16: norms and softmax computed in float32 (Gemma's 1 + w gains kept in
  // float32), everything else in bfloat16; hooks come out as float32. Default: all float32.
  bool bfloat16 = false;
  std::string what = "the model";  // TransformerShape::what
};

TransformerShape LlamaShape(const LlamaConfig& config);
// Every field the forward pass depends on, as text (for weight hashes).
std::string LlamaConfigFingerprint(const LlamaConfig& config);

struct LlamaBlock {
  at::Tensor attn_norm;  // [d]; every norm's gain as multiplied in (Gemma's 1 + w added in)
  at::Tensor attn_norm_b, mlp_norm_b;        // [d], LayerNorm's biases (layer_norm only)
  at::Tensor W_q, b_q, W_k, b_k, W_v, b_v;   // [heads * head_dim, d]; biases may be undefined
  at::Tensor q_norm, k_norm;                 // [head_dim] with qk_norm, wider with qk_norm_full
  at::Tensor W_o, b_o;                       // [d, heads * head_dim]
  at::Tensor mlp_norm;                       // [d]
  at::Tensor post_attn_norm, post_mlp_norm;  // [d], with post_norms only
  at::Tensor W_gate, b_gate, W_up, b_up;     // [d_mlp, d]; no gate unless gated_mlp
  at::Tensor W_down, b_down;                 // [d, d_mlp]
};

struct LlamaWeights {
  LlamaConfig config;
  at::Tensor W_E;  // [vocab, d]
  at::Tensor W_U;  // [vocab, d]: lm_head, or W_E when tied
  // The norm after the last block (bias: LayerNorm models), for the downstream loss only;
  // undefined when the checkpoint has none.
  at::Tensor final_norm, final_norm_b;
  std::vector<LlamaBlock> blocks;
  std::string model_id, weight_hash;
};

class LlamaModel : public ActivationModel {
 public:
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(LlamaWeights weights,
                                                            const std::vector<HookName>& hooks,
                                                            const at::Device& device);

  at::Tensor Forward(const at::Tensor& tokens) override;
  std::vector<at::Tensor> ForwardHooks(const at::Tensor& tokens) override;
  int64_t hook_width() const override { return hook_widths_[0]; }
  std::vector<int64_t> hook_widths() const override { return hook_widths_; }
  int64_t vocab_size() const override { return w_.config.vocab_size; }
  int64_t max_context() const override { return w_.config.context_length; }
  int64_t parameter_bytes() const override { return LlamaShape(w_.config).parameter_bytes; }
  int64_t activation_bytes_per_token(int64_t seq_len) const override {
    return TransformerActivationBytesPerToken(LlamaShape(w_.config), seq_len);
  }
  int64_t num_blocks() const override { return w_.config.n_layers; }
  const std::string& model_id() const override { return w_.model_id; }
  const std::string& weight_hash() const override { return w_.weight_hash; }
  const LlamaConfig& config() const { return w_.config; }

  // "embed.W_E", "unembed.W_U" (lm_head, or W_E when tied), "blocks.L.attn.W_O" [heads *
  // head_dim, d] and "blocks.L.mlp.W_out" [d_mlp, d] (o_proj and down_proj transposed: what a
  // direction in attn.hook_z or mlp.hook_post writes to the residual stream).
  std::vector<std::pair<std::string, at::Tensor>> NamedWeights() const override;

  std::string next_token_loss_unsupported() const override;
  NextTokenPredictions PredictNextTokens(const at::Tensor& tokens, const HookSplices& splices,
                                         bool losses, KeyValueCache* cache = nullptr) override;
  std::vector<at::Tensor> ForwardSpliced(const at::Tensor& tokens,
                                         const std::vector<HookName>& hooks,
                                         const HookSplices& splices,
                                         KeyValueCache* cache = nullptr) override;

 private:
  LlamaModel() = default;
  // The activations of `hooks` from one pass that stops once it has them all; with
  // `predictions`, every block runs and *predictions is PredictNextTokens' (the losses when
  // `losses`). `splices` (may be null) replace their hooks' activations on the way. `cache`:
  // tokens continue its positions.
  std::vector<at::Tensor> Run(const at::Tensor& tokens, const std::vector<HookName>& hooks,
                              const HookSplices* splices = nullptr,
                              NextTokenPredictions* predictions = nullptr, bool losses = false,
                              KeyValueCache* cache = nullptr);

  LlamaWeights w_;
  std::vector<HookName> hooks_;
  std::vector<int64_t> hook_widths_;
  at::Tensor inv_freq_;        // [rotary dims / 2], on the device
  at::Tensor local_inv_freq_;  // the sliding-window layers' own, when they rotate differently
  at::Tensor long_inv_freq_;   // LongRoPE's for sequences longer than rope_original_context
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_LLAMA_MODEL_H_
