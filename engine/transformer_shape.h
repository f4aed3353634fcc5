// The shape of a natively run decoder-only transformer (GPT-2, Llama, ...): what submit-time
// checks need to know of it without loading it. Torch-free.
#ifndef LATENTD_ENGINE_TRANSFORMER_SHAPE_H_
#define LATENTD_ENGINE_TRANSFORMER_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/hook_name.h"

namespace latentd::engine {

struct TransformerShape {
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;  // query heads
  int64_t d_head = 0;   // a query head's width; 0: d_model / n_heads
  int64_t d_mlp = 0;    // the MLP's hidden width: mlp.hook_post
  int64_t vocab_size = 0;
  int64_t context_length = 0;   // the longest sequence the model takes
  int64_t parameter_bytes = 0;  // float32 bytes of every weight
  bool has_resid_mid = true;    // false where attention and MLP read the same input (GPT-NeoX)
  // Names the model in messages ("the reference model", "the GPT-2 model in /data/gpt2").
  std::string what = "the model";
};

// The fields an architecture's config (Gpt2Config, LlamaConfig) names alike; the caller adds
// parameter_bytes and what differs.
template <typename Config>
TransformerShape CommonShape(const Config& c) {
  TransformerShape s;
  s.d_model = c.d_model;
  s.n_layers = c.n_layers;
  s.n_heads = c.n_heads;
  s.d_mlp = c.d_mlp;
  s.vocab_size = c.vocab_size;
  s.context_length = c.context_length;
  s.what = c.what;
  return s;
}

// OK when `hook` exists in the model: a TransformerLens name (or module path) with layer <
// n_layers; INVALID_ARGUMENT "extract.hook_name: ..." otherwise.
absl::Status CheckTransformerHook(const TransformerShape& shape, const HookName& hook);
// Width of the hooked activation: d_mlp for mlp.hook_post, n_heads * d_head for attn.hook_z,
// else d_model.
int64_t TransformerHookWidth(const TransformerShape& shape, const HookName& hook);
// Every hook checked (at least one) and its width, in order.
absl::StatusOr<std::vector<int64_t>> TransformerHookWidths(const TransformerShape& shape,
                                                           const std::vector<HookName>& hooks);
// Activation bytes one token costs inside a forward pass (an upper bound for memory checks): a
// few residual-sized tensors, q/k/v, the attention row per head and the MLP's hidden layers.
int64_t TransformerActivationBytesPerToken(const TransformerShape& shape, int64_t seq_len);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TRANSFORMER_SHAPE_H_
