#include "engine/attribution_graph.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

// A parent found at one hook: its edges to the hook after it and the share of the output it
// carries through them.
struct Candidate {
  float activation = 0;
  double importance = 0;
  std::vector<GraphEdge> edges;  // `from` unset until the parent is kept
};

}  // namespace

absl::StatusOr<AttributionGraph> BuildAttributionGraph(
    const std::vector<std::string>& hook_labels, const AttributionQuery& metric,
    const GraphOptions& options, const GraphPasses& passes,
    const std::function<void(int hook, int passes)>& hook_done) {
  const int hooks = static_cast<int>(hook_labels.size());
  const int per_hook = options.per_hook;
  if (hooks < 1) return absl::InvalidArgumentError("dataset_ids: an attribution graph needs one");
  if (per_hook < 1 || per_hook > kMaxGraphNodesPerHook) {
    return absl::InvalidArgumentError(
        absl::StrCat("per_hook: ", per_hook, " outside [1, ", kMaxGraphNodesPerHook, "]"));
  }
  if (!(options.min_importance >= 0 && options.min_importance <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_importance: ", options.min_importance, " outside [0, 1]"));
  }
  if (!(options.node_threshold > 0 && options.node_threshold <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_threshold: ", options.node_threshold, " outside (0, 1]"));
  }
  AttributionGraph g;
  g.coverage.resize(hooks);
  // Each pass lists more entries than a hook keeps: a parent strong for several children but
  // not the strongest of any one still shows.
  AttributionQuery query = metric;
  query.top = std::max(20, 4 * per_hook);
  // A child's strongest parents are its strongest entries, so checking per_hook of them checks
  // every parent a child alone would keep.
  query.ablate = options.ablate ? per_hook : 0;
  // The output first: the metric's pass at the last hook.
  ASSIGN_OR_RETURN(g.output, passes.metric(hooks - 1, query));
  int made = 1;
  g.nodes.push_back({hooks, -1, static_cast<int64_t>(g.output.prompt.size()) - 1,
                     static_cast<float>(g.output.metric), 1.0});
  // From then on the passes' metrics are the kept nodes' values.
  query.target_token_id.reset();
  query.contrast_token_id.reset();
  query.target_latent.reset();
  std::vector<int> targets = {0};
  for (int hook = hooks - 1; hook >= 0; --hook) {
    // The answers for this hook's parents: one per target (the output's, the first time).
    std::vector<absl::StatusOr<AttributionResult>> answers;
    if (targets.front() == 0) {
      answers.push_back(g.output);
    } else {
      std::vector<TargetLatent> latents;
      for (int t : targets) latents.push_back({g.nodes[t].latent, g.nodes[t].position});
      absl::StatusOr<std::vector<absl::StatusOr<AttributionResult>>> asked =
          passes.latents(hook, query, g.nodes[targets.front()].hook, latents);
      made += static_cast<int>(latents.size());
      if (!asked.ok() && absl::IsCancelled(asked.status())) return asked.status();
      if (asked.ok()) {
        answers = *std::move(asked);
      } else {
        answers.assign(targets.size(), asked.status());
      }
    }
    std::map<std::pair<int64_t, int64_t>, Candidate> found;  // by (latent, position)
    Candidate error;
    std::string refused;
    bool answered = false;
    for (size_t i = 0; i < targets.size(); ++i) {
      const absl::StatusOr<AttributionResult>& answer = answers[i];
      if (!answer.ok()) {
        refused = std::string(answer.status().message());
        continue;
      }
      answered = true;
      // Each parent's share of this child: |its credit| over the child's listed credits and
      // error term, times the child's own share of the output.
      double total = std::abs(answer->error_attribution);
      for (const LatentAttribution& e : answer->top_entries) total += std::abs(e.attribution);
      const double share = total > 0 ? g.nodes[targets[i]].importance / total : 0.0;
      for (size_t k = 0; k < answer->top_entries.size(); ++k) {
        const LatentAttribution& e = answer->top_entries[k];
        Candidate& c = found[{e.latent, e.position}];
        c.activation = e.activation;
        c.importance += share * std::abs(e.attribution);
        GraphEdge& edge = c.edges.emplace_back();
        edge.to = targets[i];
        edge.attribution = e.attribution;
        if (k < answer->ablated_changes.size()) edge.ablated_change = answer->ablated_changes[k];
      }
      error.importance += share * std::abs(answer->error_attribution);
      GraphEdge& edge = error.edges.emplace_back();
      edge.to = targets[i];
      edge.attribution = answer->error_attribution;
    }
    if (hook_done) hook_done(hook, made);
    if (!answered) {
      g.notes.push_back(absl::StrCat(hook_labels[hook], ": no edges: ", refused));
      continue;  // the hook before explains the same targets
    }
    std::vector<std::pair<std::pair<int64_t, int64_t>, const Candidate*>> ranked;
    for (const auto& [key, c] : found) ranked.emplace_back(key, &c);
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
      return a.second->importance > b.second->importance;
    });
    double found_importance = 0;
    for (const auto& entry : ranked) found_importance += entry.second->importance;
    size_t keep = 0;
    for (double carried = 0;
         keep < ranked.size() && static_cast<int>(keep) < per_hook &&
         ranked[keep].second->importance >= options.min_importance &&
         (options.node_threshold >= 1 || carried < options.node_threshold * found_importance);
         ++keep) {
      carried += ranked[keep].second->importance;
    }
    ranked.resize(keep);
    HookCoverage& coverage = g.coverage[hook];
    coverage.kept_nodes = static_cast<int>(keep);
    for (const auto& entry : ranked) coverage.kept += entry.second->importance;
    coverage.error = error.importance;
    coverage.dropped = std::max(0.0, found_importance - coverage.kept);
    auto add = [&](int64_t latent, int64_t position, const Candidate& c) {
      const int index = static_cast<int>(g.nodes.size());
      g.nodes.push_back({hook, latent, position, c.activation, c.importance});
      for (GraphEdge edge : c.edges) {
        edge.from = index;
        g.edges.push_back(edge);
      }
      return index;
    };
    std::vector<int> kept;
    for (const auto& [key, c] : ranked) kept.push_back(add(key.first, key.second, *c));
    add(kGraphErrorNode, -1, error);
    targets = kept;
    if (targets.empty()) break;  // nothing fires upstream of the kept nodes
  }
  return g;
}

}  // namespace latentd::engine
