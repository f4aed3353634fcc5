// Hugging Face GPT-NeoX checkpoints (model_type gpt_neox: Pythia, the models of much
// interpretability work and of sparsify's and SAELens' Pythia SAEs), run natively as a
// llama_model.h with GPT-NeoX's options: LayerNorm with biases, rotary embeddings on the first
// rotary_pct of each head, an ungated MLP with biases, and (use_parallel_residual, the default)
// attention and MLP both reading the block's input, so the block has no hook_resid_mid.
//
// Read from config.json: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
// vocab_size, max_position_embeddings, layer_norm_eps, rotary_pct, rotary_emb_base (or
// rope_theta), hidden_act (gelu, gelu_new / gelu_fast / gelu_pytorch_tanh), use_parallel_residual,
// attention_bias, tie_word_embeddings; rope_scaling must be null. Tensors under "gpt_neox."
// (GPTNeoXForCausalLM) or without it (GPTNeoXModel), embed_out unless tied; the fused
// query_key_value weight (each head's q, k, v rows together) is split into q, k and v.
#ifndef LATENTD_ENGINE_HF_NEOX_H_
#define LATENTD_ENGINE_HF_NEOX_H_

#include <string>

#include "absl/status/statusor.h"
#include "engine/hf_checkpoint.h"
#include "engine/llama_model.h"

namespace latentd::engine {

absl::StatusOr<LlamaConfig> ReadHfNeoxConfig(const HfConfig& config);

// config.json, then the weight files' headers (no weight is read).
absl::StatusOr<LlamaConfig> CheckHfNeox(const std::string& dir);

// Every weight, float32 on the CPU, as LlamaWeights; hash and model id as hf_llama.h's.
// center_writing_weights applies as for GPT-2 (LayerNorm makes it invisible downstream): the
// embedding, attention's dense and the MLP's dense_4h_to_h outputs lose their mean over d_model,
// as TransformerLens' from_pretrained does to Pythia.
absl::StatusOr<LlamaWeights> LoadHfNeoxWeights(const HfModelOptions& options);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HF_NEOX_H_
