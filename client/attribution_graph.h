// An attribution graph of one prompt over an SAE suite (the SPARSE datasets of one model at
// several hooks): which latents, at which positions, drive the prediction after the prompt, and
// which latents of the hook before drive those, back to the earliest hook: the edges of a sparse
// feature circuit (Marks et al.), each an AttributePrompt answer (attribution patching, first
// order): a parent's credit for its child's value (or for the output's metric).
//
// Built client side from AttributePrompt calls (one for the output, then one per kept node of
// each later layer), so it needs nothing of the daemon beyond that RPC.
#ifndef LATENTD_CLIENT_ATTRIBUTION_GRAPH_H_
#define LATENTD_CLIENT_ATTRIBUTION_GRAPH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/vocabulary.h"
#include "proto/latentd/v1/datasets.pb.h"

namespace latentd::client {

// One hook of the suite: a dataset and how it is shown.
struct GraphLayer {
  uint64_t dataset_id = 0;
  std::string label;  // e.g. "blocks.3.hook_resid_post"
};

inline constexpr int32_t kErrorNode = -1;  // a node's latent: the SAE's error term at its layer

struct GraphNode {
  int layer = 0;  // into AttributionGraph.layers; layers.size() for the output
  // The latent (kErrorNode: the layer's SAE error, summed over positions) and where it fires;
  // the output: the metric's token (-1 for a latent target's) at the last position.
  int32_t latent = 0;
  int32_t position = 0;
  float activation = 0;
  double score = 0;  // the sum of |its edges' attributions| towards the output
};

struct GraphEdge {
  int from = 0, to = 0;    // node indices
  double attribution = 0;  // from's first-order credit for to's value (the output: its metric)
};

struct AttributionGraph {
  v1::AttributePromptResponse output;  // the last layer's answer for the metric
  std::vector<GraphLayer> layers;      // earliest hook first
  std::vector<GraphNode> nodes;        // node 0 is the output
  std::vector<GraphEdge> edges;
  std::vector<std::string> notes;  // layers that gave no edges, and why
};

// Sends one AttributePrompt request; the daemon's answer.
using AttributeCall =
    std::function<absl::StatusOr<v1::AttributePromptResponse>(const v1::AttributePromptRequest&)>;

// `layers` earliest hook first (at least one); `metric` the prompt and the output's metric
// (token_ids, target_token_id, contrast_token_id, or a target_latent; its dataset_id and top
// are set per call). The output's parents are the last layer's top entries; each layer's kept
// nodes (at most `nodes_per_layer`, by the sum of their edges' |attribution| towards the output,
// the next layer's nodes weighted by their own share) are the targets of the layer before it,
// whose top entries become their parents; each layer also gets its error node. A layer whose
// calls are refused (a transcoder's output after the next hook, a latent that is 0) is noted
// and skipped: the layer before it connects to the nodes after it. INVALID_ARGUMENT for no
// layers or nodes_per_layer < 1; the first call's error when the output's metric fails.
// `layer_done` (may be empty) hears of each layer as it is finished, with the calls made so far
// (a suite of a real model takes one call per kept node: progress for a person waiting).
absl::StatusOr<AttributionGraph> BuildAttributionGraph(
    const std::vector<GraphLayer>& layers, const v1::AttributePromptRequest& metric,
    int nodes_per_layer, const AttributeCall& attribute,
    const std::function<void(const GraphLayer& layer, int calls)>& layer_done = nullptr);

// The graph for a terminal: the metric, then per layer (latest first) its nodes with their
// strongest edges towards the output.
std::string DescribeAttributionGraph(const AttributionGraph& graph,
                                     const std::optional<Vocabulary>& vocab);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_ATTRIBUTION_GRAPH_H_
