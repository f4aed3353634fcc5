// Collects the hooked activations of one forward pass of a native model (gpt2_model.h,
// llama_model.h): the forward reports each hook point as it passes it and stops once every
// requested hook has its activation.
#ifndef LATENTD_ENGINE_HOOK_COLLECTOR_H_
#define LATENTD_ENGINE_HOOK_COLLECTOR_H_

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "engine/hook_name.h"

namespace latentd::engine {

class HookCollector {
 public:
  // `run_all`: never report done (a caller that wants every block to run).
  HookCollector(const std::vector<HookName>& hooks, bool run_all)
      : hooks_(hooks), hooked_(hooks.size()), remaining_(hooks.size()), run_all_(run_all) {}

  // Keeps `t` for every requested hook at (layer, point); true once all have theirs, when the
  // forward can stop.
  bool Capture(int layer, HookPoint point, const at::Tensor& t) {
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
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HOOK_COLLECTOR_H_
