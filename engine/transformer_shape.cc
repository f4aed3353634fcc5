#include "engine/transformer_shape.h"

#include "absl/strings/str_cat.h"

namespace latentd::engine {

absl::Status CheckTransformerHook(const TransformerShape& shape, const HookName& hook) {
  if (hook.point == HookPoint::kHiddenStates) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extract.hook_name: ", shape.what,
        " takes TransformerLens names (blocks.L.hook_resid_pre, ...), not hidden_states.N"));
  }
  if (hook.layer >= shape.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("extract.hook_name: layer ", hook.layer,
                                                   " out of range, ", shape.what, " has ",
                                                   shape.n_layers, " layers"));
  }
  if (hook.point == HookPoint::kResidMid && !shape.has_resid_mid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extract.hook_name: ", shape.what,
        " adds attention and MLP to the residual stream in parallel, so it has no hook_resid_mid "
        "(blocks.L.hook_resid_pre, hook_attn_out, hook_mlp_out and hook_resid_post exist)"));
  }
  return absl::OkStatus();
}

int64_t TransformerHookWidth(const TransformerShape& shape, const HookName& hook) {
  switch (hook.point) {
    case HookPoint::kMlpPost:
      return shape.d_mlp;
    case HookPoint::kAttnZ:
      return shape.d_head > 0 ? shape.n_heads * shape.d_head : shape.d_model;
    default:
      return shape.d_model;
  }
}

absl::StatusOr<std::vector<int64_t>> TransformerHookWidths(const TransformerShape& shape,
                                                           const std::vector<HookName>& hooks) {
  if (hooks.empty()) return absl::InvalidArgumentError("extract.hook_name: no hook");
  std::vector<int64_t> widths;
  for (const HookName& hook : hooks) {
    absl::Status s = CheckTransformerHook(shape, hook);
    if (!s.ok()) return s;
    widths.push_back(TransformerHookWidth(shape, hook));
  }
  return widths;
}

int64_t TransformerActivationBytesPerToken(const TransformerShape& s, int64_t seq_len) {
  return 4 * (11 * s.d_model + 2 * s.n_heads * seq_len + 3 * s.d_mlp);
}

}  // namespace latentd::engine
