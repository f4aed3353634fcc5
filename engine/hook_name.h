// TransformerLens hook names (blocks.{L}.hook_resid_pre, ...) and the hidden_states.{N} names of
// TorchScript models, parsed without torch (submit-time validation uses this).
#ifndef LATENTD_ENGINE_HOOK_NAME_H_
#define LATENTD_ENGINE_HOOK_NAME_H_

#include <string>

#include "absl/status/statusor.h"

namespace latentd::engine {

enum class HookPoint {
  kResidPre,
  kResidMid,
  kResidPost,
  kAttnOut,
  kMlpOut,
  kMlpPost,
  kHiddenStates
};

struct HookName {
  HookPoint point = HookPoint::kResidPost;
  int layer = 0;  // block index; for kHiddenStates the index into the hidden-state list
};

// INVALID_ARGUMENT "extract.hook_name: ..." when the name is not one of:
//   blocks.{L}.hook_resid_pre | hook_resid_mid | hook_resid_post | hook_attn_out | hook_mlp_out |
//   mlp.hook_post, or hidden_states.{N}
absl::StatusOr<HookName> ParseHookName(const std::string& name);

// The index into a Hugging Face hidden_states list that equals this hook: hidden_states[L] is the
// input of block L (resid_pre), hidden_states[L + 1] its output (resid_post). Other hook points
// are not in hidden_states: INVALID_ARGUMENT.
absl::StatusOr<int> HiddenStateIndex(const HookName& hook);

// Whether two hooks read the same activation: the same point of the same block, or the same
// residual-stream position under its other names (blocks.L.hook_resid_post is
// blocks.{L+1}.hook_resid_pre and hidden_states.{L+1}).
bool SameActivation(const HookName& a, const HookName& b);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HOOK_NAME_H_
