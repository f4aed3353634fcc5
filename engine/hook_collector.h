// Collects the hooked activations of one forward pass of a native model (gpt2_model.h,
// llama_model.h): the forward reports each hook point as it passes it and stops once every
// requested hook has its activation. It also splices: each HookSplice's hook gets its activation
// replaced where the forward reports it (the downstream loss).
#ifndef LATENTD_ENGINE_HOOK_COLLECTOR_H_
#define LATENTD_ENGINE_HOOK_COLLECTOR_H_

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "engine/hook_name.h"

namespace latentd::engine {

// One hook's activation replaced during a forward pass, by an SAE's reconstruction of it, a
// transcoder's prediction of it or zeros: how an EXTRACT job measures a downstream loss.
struct HookSplice {
  HookName hook;
  // [batch, seq, width] in the model's dtype in; [batch, seq, width of `hook`] in that dtype out.
  std::function<at::Tensor(const at::Tensor&)> replace;
  // Where `replace` reads from: this hook's activation, which the forward computes before
  // `hook` (ComputedBefore), as the forward passed it; unset: `hook`'s own (a transcoder reads
  // the MLP's input and replaces its output).
  std::optional<HookName> from;
};

// The splices of one forward pass, applied in the order the forward reaches their hooks (two on
// one hook: in this order). A splice may also only look (returning its input): a cross-layer
// transcoder's earlier layers are encoded from the pass as it goes.
using HookSplices = std::vector<HookSplice>;

class HookCollector {
 public:
  // `run_all`: never report done (a caller that wants every block to run). `splices` (may be
  // null): the hooks whose activations Capture replaces.
  HookCollector(const std::vector<HookName>& hooks, bool run_all,
                const HookSplices* splices = nullptr)
      : hooks_(hooks),
        hooked_(hooks.size()),
        remaining_(hooks.size()),
        run_all_(run_all),
        splices_(splices),
        sources_(splices != nullptr ? splices->size() : 0) {}

  // Whether Capture(layer, point, ...) would keep or replace anything: for activations a model
  // computes only to report them (ln2.hook_normalized beside the norm's output).
  bool Wants(int layer, HookPoint point) const {
    auto is = [&](const HookName& h) { return h.layer == layer && h.point == point; };
    for (size_t s = 0; splices_ != nullptr && s < splices_->size(); ++s) {
      const HookSplice& splice = (*splices_)[s];
      if (is(splice.hook) || (splice.from && is(*splice.from))) return true;
    }
    for (const HookName& h : hooks_) {
      if (is(h)) return true;
    }
    return false;
  }

  // Replaces `t` when (layer, point) is a splice's hook, then keeps it for every requested hook
  // there; true once all have theirs, when the forward can stop.
  bool Capture(int layer, HookPoint point, at::Tensor& t) {
    auto is = [&](const HookName& h) { return h.layer == layer && h.point == point; };
    for (size_t s = 0; splices_ != nullptr && s < splices_->size(); ++s) {
      const HookSplice& splice = (*splices_)[s];
      if (splice.from && is(*splice.from)) sources_[s] = t;
      if (is(splice.hook)) t = splice.replace(splice.from ? sources_[s] : t);
    }
    for (size_t i = 0; i < hooks_.size(); ++i) {
      if (hooks_[i].layer == layer && hooks_[i].point == point && !hooked_[i].defined()) {
        hooked_[i] = t;
        --remaining_;
      }
    }
    return remaining_ == 0 && !run_all_;
  }

  // The activations in the order the hooks were given.
  std::vector<at::Tensor> Take() { return std::move(hooked_); }

 private:
  const std::vector<HookName>& hooks_;
  std::vector<at::Tensor> hooked_;
  size_t remaining_;
  bool run_all_;
  const HookSplices* splices_;
  std::vector<at::Tensor> sources_;  // each splice's `from` activation, once the forward passed it
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HOOK_COLLECTOR_H_
