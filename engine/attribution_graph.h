// An attribution graph of one prompt over an SAE suite (datasets of one model at several hooks,
// earliest first): which latents, at which positions, drive the prediction after the prompt, and
// which latents of the hook before drive those, back to the earliest hook: the edges of a sparse
// feature circuit (Marks et al.), each from one AttributePrompt pass (attribution.h: a parent's
// first-order credit for its child's value, or for the output's metric).
//
//   1. the metric at the last hook: its top entries are the output's parents;
//   2. a node's importance is the share of the output flowing through it: an edge's share of its
//      child is |attribution| over the child's listed credits and SAE error term, times the
//      child's importance (the output's is 1); `per_hook` parents are kept per hook by
//      importance, and the hook's SAE error term is one more node;
//   3. each kept node is the target latent of a pass at the hook before it, whose top entries
//      are its parents; a hook whose passes are all refused is noted and skipped (the hook
//      before it explains the same nodes).
//
// Torch-free: the passes come through callbacks (DatasetModels' AttributePrompt and
// AttributeToLatents in the daemon, a table in tests); the passes of one hook share a forward.
#ifndef LATENTD_ENGINE_ATTRIBUTION_GRAPH_H_
#define LATENTD_ENGINE_ATTRIBUTION_GRAPH_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/attribution.h"

namespace latentd::engine {

inline constexpr int kMaxGraphHooks = 64;
inline constexpr int kMaxGraphNodesPerHook = 64;
inline constexpr int64_t kGraphErrorNode = -1;  // a node's latent: its hook's SAE error term

struct GraphNode {
  int hook = 0;  // 0 the earliest; the hooks' count for the output (node 0)
  // The latent (kGraphErrorNode: the hook's SAE error, every position) and where it fires; the
  // output: -1 at the prompt's last position.
  int64_t latent = 0;
  int64_t position = 0;
  float activation = 0;  // the latent's value there; the output: the metric
  double importance = 0;
};

struct GraphEdge {
  int from = 0, to = 0;    // into AttributionGraph.nodes
  double attribution = 0;  // from's first-order credit for to's value (the output: its metric)
  // With GraphOptions::ablate, when `from` is among `to`'s checked parents: to's value (the
  // output's metric) changes by this with `from` taken out of a run of its own (attribution.h's
  // ablation check); NaN otherwise.
  double ablated_change = std::numeric_limits<double>::quiet_NaN();
};

// Where the output's share reaching one hook goes (each a share of the output, like a node's
// importance): kept + error + dropped is the importance of the answered nodes after it (the
// output's 1 at the last hook), so kept over that sum says how much of what the hook explains
// the graph shows, and kept at the earliest hook how much of the output reaches it through
// latents alone. All 0 for a hook without edges.
struct HookCoverage {
  int kept_nodes = 0;
  double kept = 0;     // by the kept nodes
  double error = 0;    // by the hook's SAE error node
  double dropped = 0;  // by latents found but not kept (per_hook, min_importance, node_threshold)
};

struct AttributionGraph {
  AttributionResult output;  // the last hook's pass for the metric
  std::vector<GraphNode> nodes;
  std::vector<GraphEdge> edges;
  std::vector<HookCoverage> coverage;  // per hook, earliest first
  std::vector<std::string> notes;      // hooks without edges, and why
};

struct GraphOptions {
  int per_hook = 4;  // nodes kept per hook, in [1, kMaxGraphNodesPerHook]
  // A node whose importance (its share of the output) is below this is not kept, however few
  // its hook keeps: a graph of a deep suite spends no passes on what barely matters. 0: none.
  double min_importance = 0;
  // Each hook keeps, by importance, the fewest nodes that together carry at least this share of
  // what its latents carry (circuit-tracer's node threshold, per hook), at most per_hook: a hook
  // where a few latents carry nearly everything keeps only those. 1: per_hook alone.
  double node_threshold = 1;
  // The ablation check of the edges: every pass takes each of its per_hook strongest parents out
  // of a run of its own (a batch per child, as far as the child's hook) and measures the
  // child's value (the output's metric); the edges from those parents carry the change.
  bool ablate = false;
};

// The passes a graph asks for.
struct GraphPasses {
  // The metric's pass at `hook` (attribution.h's AttributePrompt).
  std::function<absl::StatusOr<AttributionResult>(int hook, const AttributionQuery& query)> metric;
  // Passes at `hook` to `targets`, latents of hook `target_hook`'s SAE, sharing one forward
  // pass (AttributeToLatents): one answer per target.
  std::function<absl::StatusOr<std::vector<absl::StatusOr<AttributionResult>>>(
      int hook, const AttributionQuery& query, int target_hook,
      const std::vector<TargetLatent>& targets)>
      latents;
};

// `hook_labels` name the hooks earliest first (for the notes); `metric` is the prompt and the
// output's metric (its top is set per pass). `hook_done` (may be empty) hears of each hook as
// its passes finish (latest first), with the passes (one per target) made so far: progress
// for a person waiting. INVALID_ARGUMENT naming per_hook outside [1, kMaxGraphNodesPerHook],
// min_importance outside [0, 1], node_threshold outside (0, 1] or no hooks; the metric's pass's
// error as it is; CANCELLED as a pass says it.
absl::StatusOr<AttributionGraph> BuildAttributionGraph(
    const std::vector<std::string>& hook_labels, const AttributionQuery& metric,
    const GraphOptions& options, const GraphPasses& passes,
    const std::function<void(int hook, int passes)>& hook_done = nullptr);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_ATTRIBUTION_GRAPH_H_
