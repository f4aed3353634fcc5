// TransformerLens hook names (blocks.{L}.hook_resid_pre, ...), the hidden_states.{N} names of
// TorchScript models and Hugging Face module paths (the names sparsify gives its SAEs), parsed
// without torch (submit-time validation uses this).
#ifndef LATENTD_ENGINE_HOOK_NAME_H_
#define LATENTD_ENGINE_HOOK_NAME_H_

#include <string>

#include "absl/status/statusor.h"

namespace latentd::engine {

enum class HookPoint {
  kResidPre,
  kResidMid,
  kResidPost,
  // The attention's per-head outputs before its output projection, heads side by side
  // ([.., n_heads * d_head], TransformerLens' attn.hook_z flattened as SAELens' hook_z SAEs
  // read it): attn_out = z W_O + b_O.
  kAttnZ,
  kAttnOut,
  // The MLP's input normalized, without the norm's gain and bias: TransformerLens'
  // ln2.hook_normalized (its RMSNorm hooks before the gain; its default fold_ln leaves a
  // LayerNorm none), what SAELens', lm-saes' and circuit-tracer's transcoders read.
  kMlpIn,
  // The MLP's input as the MLP gets it (the norm's output, gain and bias applied):
  // mlp.hook_in (circuit-tracer's name), what sparsify's transcoders read.
  kMlpInput,
  kMlpPost,
  // What the MLP module returns: mlp.hook_out (circuit-tracer's name, what its Llama and Qwen
  // transcoders predict). hook_mlp_out everywhere but in models with a norm after the MLP
  // (Gemma 2 and 3's post_feedforward_layernorm), where hook_mlp_out is after that norm.
  kMlpOutput,
  kMlpOut,
  kHiddenStates
};

struct HookName {
  HookPoint point = HookPoint::kResidPost;
  int layer = 0;  // block index; for kHiddenStates the index into the hidden-state list
};

// INVALID_ARGUMENT "extract.hook_name: ..." when the name is not one of:
//   blocks.{L}.hook_resid_pre | hook_resid_mid | hook_resid_post | attn.hook_z | hook_attn_out |
//   hook_mlp_out | mlp.hook_post | ln2.hook_normalized | mlp.hook_in | mlp.hook_out, or
//   hidden_states.{N}, or
//   a module path {P}.{L}[.mlp | .attn | .self_attn | .attention] with P one of h, layers,
//   transformer.h, model.layers, gpt_neox.layers: the output of block L (resid_post), of its
//   MLP (hook_mlp_out) or of its attention (hook_attn_out).
absl::StatusOr<HookName> ParseHookName(const std::string& name);

// The TransformerLens name of a hook ("blocks.3.hook_mlp_out", "hidden_states.4"): what
// ParseHookName reads back.
std::string HookNameString(const HookName& hook);

// The index into a Hugging Face hidden_states list that equals this hook: hidden_states[L] is the
// input of block L (resid_pre), hidden_states[L + 1] its output (resid_post). Other hook points
// are not in hidden_states: INVALID_ARGUMENT.
absl::StatusOr<int> HiddenStateIndex(const HookName& hook);

// Whether two hooks read the same activation: the same point of the same block, or the same
// residual-stream position under its other names (blocks.L.hook_resid_post is
// blocks.{L+1}.hook_resid_pre and hidden_states.{L+1}).
bool SameActivation(const HookName& a, const HookName& b);

// Whether a forward pass computes `a` before `b` (hidden_states.N is block N's input): a
// transcoder's output hook must come after its input hook, so that the forward has the input
// when it reaches the output and can put the transcoder's prediction there.
bool ComputedBefore(const HookName& a, const HookName& b);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HOOK_NAME_H_
