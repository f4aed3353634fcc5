// Hugging Face Llama-architecture checkpoints run natively (llama_model.h): model_type llama
// (Llama 2, 3, 3.1/3.2 with rope_scaling "llama3"), mistral, qwen2, qwen3 (q_norm / k_norm on
// each head), gemma and gemma2 (Gemma Scope's models: embeddings times sqrt(d_model), RMSNorm
// gains stored as w and applied as 1 + w, hidden_activation, and for gemma2
// pre_feedforward/post_feedforward norms, attn_logit_softcapping and query_pre_attn_scalar),
// gemma3_text and gemma3 (Gemma Scope 2's models: Gemma 2's layout without the soft-capping, plus
// q_norm / k_norm, sliding-window local layers (layer_types or sliding_window_pattern) rotating
// with rope_local_base_freq, global ones with rope_theta and a "linear" rope_scaling; the
// multimodal gemma3's text_config and its language model's tensors, the vision tower ignored),
// in the same directory layout as GPT-2's (hf_checkpoint.h). Tensor names with or without the
// "model." prefix (LlamaForCausalLM or LlamaModel); lm_head.weight unless tie_word_embeddings.
//
// Read from config.json: hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, head_dim, intermediate_size, vocab_size, max_position_embeddings,
// rms_norm_eps, rope_theta, rope_scaling (null, "default", "linear" or "llama3"), hidden_act (silu,
// gelu_pytorch_tanh / gelu_new, gelu), attention_bias, mlp_bias, tie_word_embeddings;
// sliding_window (mistral, and qwen2 with use_sliding_window) caps the sequence length, since
// within the window full attention is what the model computes. Anything else it would need
// (other rope scalings, another model_type) is INVALID_ARGUMENT naming the field.
#ifndef LATENTD_ENGINE_HF_LLAMA_H_
#define LATENTD_ENGINE_HF_LLAMA_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/hf_checkpoint.h"
#include "engine/hook_name.h"
#include "engine/llama_model.h"

namespace latentd::engine {

// Whether `model_type` is one this reader takes.
bool IsHfLlamaType(const std::string& model_type);

absl::StatusOr<LlamaConfig> ReadHfLlamaConfig(const HfConfig& config);

// config.json, then the weight files' headers (no weight is read).
absl::StatusOr<LlamaConfig> CheckHfLlama(const std::string& dir);

// The options that do not apply to this architecture: center_writing_weights (RMSNorm is not
// invariant to the mean) is INVALID_ARGUMENT naming it.
absl::Status CheckHfLlamaOptions(const LlamaConfig& config, const HfModelOptions& options);

// CheckHfLlamaOptions, then every weight, float32 on the CPU; the hash (CRC32C) covers the
// stored bytes of every weight it reads and the configuration the forward pass uses; the model
// id is "huggingface:<model_type>:<dir>".
absl::StatusOr<LlamaWeights> LoadHfLlamaWeights(const HfModelOptions& options);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HF_LLAMA_H_
