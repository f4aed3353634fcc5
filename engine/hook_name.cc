#include "engine/hook_name.h"

#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace latentd::engine {

namespace {

bool ParseLayer(absl::string_view text, int* layer) {
  return !text.empty() && text[0] >= '0' && text[0] <= '9' && absl::SimpleAtoi(text, layer) &&
         *layer >= 0;
}

// Each point within a block with its TransformerLens name (blocks.{L}.<name>): what
// ParseHookName reads and HookNameString writes.
constexpr std::pair<HookPoint, const char*> kBlockHookNames[] = {
    {HookPoint::kResidPre, "hook_resid_pre"},   {HookPoint::kResidMid, "hook_resid_mid"},
    {HookPoint::kResidPost, "hook_resid_post"}, {HookPoint::kAttnZ, "attn.hook_z"},
    {HookPoint::kAttnOut, "hook_attn_out"},     {HookPoint::kMlpOut, "hook_mlp_out"},
    {HookPoint::kMlpPost, "mlp.hook_post"},     {HookPoint::kMlpIn, "ln2.hook_normalized"},
    {HookPoint::kMlpInput, "mlp.hook_in"},      {HookPoint::kMlpOutput, "mlp.hook_out"},
};

// A Hugging Face module path whose output is the activation (what sparsify names its SAEs by).
bool ParseModulePath(absl::string_view name, HookName* hook) {
  for (absl::string_view prefix :
       {"h.", "layers.", "transformer.h.", "model.layers.", "gpt_neox.layers."}) {
    if (!absl::ConsumePrefix(&name, prefix)) continue;
    const size_t dot = name.find('.');
    if (!ParseLayer(name.substr(0, dot), &hook->layer)) return false;
    const absl::string_view module = dot == absl::string_view::npos ? "" : name.substr(dot + 1);
    if (module.empty()) {
      hook->point = HookPoint::kResidPost;  // the block's output
    } else if (module == "mlp") {
      hook->point = HookPoint::kMlpOut;
    } else if (module == "attn" || module == "self_attn" || module == "attention") {
      hook->point = HookPoint::kAttnOut;
    } else {
      return false;
    }
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<HookName> ParseHookName(const std::string& name) {
  auto bad = [&]() {
    return absl::InvalidArgumentError(absl::StrCat(
        "extract.hook_name: \"", name,
        "\" is not blocks.{L}.hook_resid_pre|hook_resid_mid|hook_resid_post|attn.hook_z|"
        "hook_attn_out|hook_mlp_out|mlp.hook_post|ln2.hook_normalized|mlp.hook_in|mlp.hook_out, "
        "hidden_states.{N}, or a block's module path (layers.{L}, h.{L}, model.layers.{L}, ... "
        "optionally .mlp or .attn/.self_attn)"));
  };
  HookName hook;
  if (ParseModulePath(name, &hook)) return hook;
  std::vector<std::string> parts = absl::StrSplit(name, '.');
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
  for (const auto& [point, point_name] : kBlockHookNames) {
    if (rest == point_name) {
      hook.point = point;
      return hook;
    }
  }
  return bad();
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

std::string HookNameString(const HookName& hook) {
  if (hook.point == HookPoint::kHiddenStates) return absl::StrCat("hidden_states.", hook.layer);
  for (const auto& [point, point_name] : kBlockHookNames) {
    if (point == hook.point) return absl::StrCat("blocks.", hook.layer, ".", point_name);
  }
  return absl::StrCat("blocks.", hook.layer, ".?");  // every block point is in the table
}

bool SameActivation(const HookName& a, const HookName& b) {
  if (a.point == b.point && a.layer == b.layer) return true;
  const absl::StatusOr<int> x = HiddenStateIndex(a), y = HiddenStateIndex(b);
  return x.ok() && y.ok() && *x == *y;
}

namespace {

// (block, step within the block) in the order the native models compute them.
std::pair<int, int> ForwardPosition(const HookName& hook) {
  switch (hook.point) {
    case HookPoint::kResidPre:
    case HookPoint::kHiddenStates:
      return {hook.layer, 0};
    case HookPoint::kAttnZ:
      return {hook.layer, 1};
    case HookPoint::kAttnOut:
      return {hook.layer, 2};
    case HookPoint::kResidMid:
      return {hook.layer, 3};
    case HookPoint::kMlpIn:
      return {hook.layer, 4};
    case HookPoint::kMlpInput:
      return {hook.layer, 5};
    case HookPoint::kMlpPost:
      return {hook.layer, 6};
    case HookPoint::kMlpOutput:
      return {hook.layer, 7};
    case HookPoint::kMlpOut:
      return {hook.layer, 8};
    case HookPoint::kResidPost:
      return {hook.layer + 1, 0};  // the next block's input
  }
  return {hook.layer, 0};
}

}  // namespace

bool ComputedBefore(const HookName& a, const HookName& b) {
  return ForwardPosition(a) < ForwardPosition(b);
}

}  // namespace latentd::engine
