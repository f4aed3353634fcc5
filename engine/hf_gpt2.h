// Hugging Face GPT-2 checkpoints, run natively: a directory as `save_pretrained` writes it (or as
// the Hub serves it) with config.json and model.safetensors, or the shards that
// model.safetensors.index.json names. The weights fill a Gpt2Model (gpt2_model.h), so extraction
// needs no TorchScript export and hooks take TransformerLens names, as SAELens SAEs for GPT-2 do.
//
// What is read: config.json's model_type ("gpt2"), n_embd, n_layer, n_head, n_inner (null: 4 *
// n_embd), vocab_size, n_positions, layer_norm_epsilon, activation_function (gelu_new,
// gelu_pytorch_tanh, gelu_fast, gelu, relu), scale_attn_weights and
// scale_attn_by_inverse_layer_idx, with Hugging Face's defaults when absent; tensor names with or
// without the "transformer." prefix (GPT2Model or GPT2LMHeadModel); lm_head is GPT-2's tied
// embedding and the attention-mask buffers are not weights, so both are skipped; any other dtype
// than F32/F16/BF16/F64, a missing tensor, a shape other than config.json implies or a NaN/Inf
// weight is INVALID_ARGUMENT naming the file and the tensor.
//
// center_writing_weights is TransformerLens' processing of the same name (on by default in
// HookedTransformer.from_pretrained, off in from_pretrained_no_processing): every weight that
// writes into the residual stream loses its mean over d_model, so resid_pre/mid/post, attn_out
// and mlp_out are the Hugging Face values minus their per-token mean (LayerNorm makes everything
// downstream identical). An SAE trained on a processed model wants it.
#ifndef LATENTD_ENGINE_HF_GPT2_H_
#define LATENTD_ENGINE_HF_GPT2_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gpt2_model.h"
#include "engine/hf_checkpoint.h"
#include "engine/hook_name.h"

namespace latentd::engine {

// config.json's GPT-2 fields; INVALID_ARGUMENT "<dir>/config.json: <field> ..." for a value it
// cannot run.
absl::StatusOr<Gpt2Config> ReadHfGpt2Config(const HfConfig& config);

// config.json (NOT_FOUND without one), then the weight files' headers (cheap: no weight is read):
// every tensor present with the shape config.json implies and a float dtype. What submit checks.
absl::StatusOr<Gpt2Config> CheckHfGpt2(const std::string& dir);

// Every weight, float32 on the CPU. The hash (CRC32C) covers the stored bytes of every weight it
// reads, the configuration the forward pass uses and center_writing_weights; the model id is
// "huggingface:gpt2:<dir>".
absl::StatusOr<Gpt2Weights> LoadHfGpt2Weights(const HfModelOptions& options);

// LoadHfGpt2Weights into a model reading `hooks`, on `device`. The hooks are checked against
// config.json before any weight is read.
absl::StatusOr<std::unique_ptr<Gpt2Model>> LoadHfGpt2Model(const HfModelOptions& options,
                                                           const std::vector<HookName>& hooks,
                                                           const at::Device& device);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HF_GPT2_H_
