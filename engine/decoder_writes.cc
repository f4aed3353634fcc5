#include "engine/decoder_writes.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/circuit_tracer.h"
#include "engine/sae.h"

namespace latentd::engine {
namespace {

// The release's layer this SAE is and how many it has, when it is a cross-layer transcoder's.
const CircuitTracerLayer* CrossLayer(const SteeringModel& steering) {
  const std::optional<CircuitTracerLayer>& layer = steering.sae->config().circuit_tracer;
  if (steering.cross_layer_dir.empty() || !layer || !layer->cross_layer) return nullptr;
  return &*layer;
}

}  // namespace

std::vector<int64_t> WrittenBlocks(const SteeringModel& steering) {
  std::vector<int64_t> blocks(steering.crosscoder_sources.size());
  std::iota(blocks.begin(), blocks.end(), 0);
  std::stable_sort(blocks.begin(), blocks.end(), [&](int64_t a, int64_t b) {
    return ComputedBefore(steering.crosscoder_sources[a], steering.crosscoder_sources[b]);
  });
  return blocks;
}

std::vector<HookName> WrittenHooks(const SteeringModel& steering) {
  if (!steering.crosscoder_sources.empty()) {
    std::vector<HookName> hooks;
    for (int64_t block : WrittenBlocks(steering)) {
      hooks.push_back(steering.crosscoder_sources[block]);
    }
    return hooks;
  }
  const HookName first = steering.hook_out.value_or(steering.hook);
  std::vector<HookName> hooks = {first};
  if (const CircuitTracerLayer* clt = CrossLayer(steering)) {
    for (int later = 1; clt->layer + later < clt->n_layers; ++later) {
      hooks.push_back({first.point, first.layer + later});
    }
  }
  return hooks;
}

absl::StatusOr<std::vector<at::Tensor>> WrittenRows(const SteeringModel& steering,
                                                    const at::Tensor& latents) {
  const at::Tensor& W_dec = steering.sae->weights().W_dec;
  if (!steering.crosscoder_sources.empty()) {
    const at::Tensor rows = W_dec.index_select(0, latents);
    const int64_t width = W_dec.size(1) / static_cast<int64_t>(steering.crosscoder_sources.size());
    std::vector<at::Tensor> by_hook;
    for (int64_t block : WrittenBlocks(steering)) {
      by_hook.push_back(rows.narrow(1, block * width, width).contiguous());
    }
    return by_hook;
  }
  if (steering.diffed_source >= 0) {
    const int64_t width = W_dec.size(1) / steering.sae->config().crosscoder_sources;
    return std::vector<at::Tensor>{
        W_dec.index_select(0, latents).narrow(1, steering.diffed_source * width, width)};
  }
  const CircuitTracerLayer* clt = CrossLayer(steering);
  if (clt == nullptr) return std::vector<at::Tensor>{W_dec.index_select(0, latents)};
  const at::Tensor ids = latents.to(at::kCPU, at::kLong).contiguous();
  const std::vector<int64_t> list(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  std::vector<at::Tensor> rows;
  if (list.empty()) {
    for (size_t h = 0; h < WrittenHooks(steering).size(); ++h) {
      rows.push_back(at::zeros({0, W_dec.size(1)}, W_dec.options()));
    }
    return rows;
  }
  // [latents, layers - L, d_out]: the rows into each later layer side by side.
  ASSIGN_OR_RETURN(const at::Tensor read,
                   LoadCrossLayerDecoderRows(steering.cross_layer_dir, clt->layer, list));
  if (read.size(1) != clt->n_layers - clt->layer) {
    return absl::InvalidArgumentError(
        absl::StrCat(CircuitTracerDecoderFile(steering.cross_layer_dir, clt->layer), ": W_dec_",
                     clt->layer, " writes ", read.size(1), " layers; layer ", clt->layer,
                     " of a release of ", clt->n_layers, " writes ", clt->n_layers - clt->layer));
  }
  for (int64_t m = 0; m < read.size(1); ++m) {
    rows.push_back(read.select(1, m).contiguous().to(W_dec.device()));
  }
  return rows;
}

}  // namespace latentd::engine
