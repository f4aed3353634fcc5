#include "engine/hook_name.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace latentd::engine {

absl::StatusOr<HookName> ParseHookName(const std::string& name) {
  auto bad = [&]() {
    return absl::InvalidArgumentError(absl::StrCat(
        "extract.hook_name: \"", name,
        "\" is not blocks.{L}.hook_resid_pre|hook_resid_mid|hook_resid_post|hook_attn_out|"
        "hook_mlp_out|mlp.hook_post or hidden_states.{N}"));
  };
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  HookName hook;
  if (parts.size() == 2 && parts[0] == "hidden_states") {
    if (!absl::SimpleAtoi(parts[1], &hook.layer) || hook.layer < 0) return bad();
    hook.point = HookPoint::kHiddenStates;
    return hook;
  }
  if (parts.size() < 3 || parts[0] != "blocks" || !absl::SimpleAtoi(parts[1], &hook.layer) ||
      hook.layer < 0 || parts[1].empty() || parts[1][0] == '+' || parts[1][0] == '-') {
    return bad();
  }
  const std::string rest = name.substr(parts[0].size() + parts[1].size() + 2);
  if (rest == "hook_resid_pre") {
    hook.point = HookPoint::kResidPre;
  } else if (rest == "hook_resid_mid") {
    hook.point = HookPoint::kResidMid;
  } else if (rest == "hook_resid_post") {
    hook.point = HookPoint::kResidPost;
  } else if (rest == "hook_attn_out") {
    hook.point = HookPoint::kAttnOut;
  } else if (rest == "hook_mlp_out") {
    hook.point = HookPoint::kMlpOut;
  } else if (rest == "mlp.hook_post") {
    hook.point = HookPoint::kMlpPost;
  } else {
    return bad();
  }
  return hook;
}

absl::StatusOr<int> HiddenStateIndex(const HookName& hook) {
  switch (hook.point) {
    case HookPoint::kHiddenStates:
      return hook.layer;
    case HookPoint::kResidPre:
      return hook.layer;
    case HookPoint::kResidPost:
      return hook.layer + 1;
    default:
      return absl::InvalidArgumentError(
          "extract.hook_name: a TorchScript model exposes hidden states only (hidden_states.N, "
          "blocks.L.hook_resid_pre, blocks.L.hook_resid_post)");
  }
}

bool SameActivation(const HookName& a, const HookName& b) {
  if (a.point == b.point && a.layer == b.layer) return true;
  const absl::StatusOr<int> x = HiddenStateIndex(a), y = HiddenStateIndex(b);
  return x.ok() && y.ok() && *x == *y;
}

}  // namespace latentd::engine
