#include "client/attribution_graph.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace latentd::client {
namespace {

namespace v1 = latentd::v1;

// A parent found for one layer: its edges to the layer after it and the share of the output it
// carries through them.
struct Candidate {
  float activation = 0;
  double importance = 0;
  std::vector<std::pair<int, double>> edges;  // (child node, attribution)
};

// "#120 @7 " Paris" (3.2)", the error node "error", the output "output".
std::string NodeName(const AttributionGraph& g, const GraphNode& n,
                     const std::optional<Vocabulary>& vocab) {
  if (n.layer == static_cast<int>(g.layers.size())) return "output";
  if (n.latent == kErrorNode) return "error";
  const int32_t token = n.position < g.output.prompt_size() ? g.output.prompt(n.position) : -1;
  return absl::StrFormat("#%d @%d %s (%.3g)", n.latent, n.position, TokenCell(token, vocab),
                         n.activation);
}

}  // namespace

absl::StatusOr<AttributionGraph> BuildAttributionGraph(
    const std::vector<GraphLayer>& layers, const v1::AttributePromptRequest& metric,
    int nodes_per_layer, const AttributeCall& attribute,
    const std::function<void(const GraphLayer& layer, int calls)>& layer_done) {
  if (layers.empty()) return absl::InvalidArgumentError("an attribution graph needs a layer");
  if (nodes_per_layer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("nodes per layer: ", nodes_per_layer, ", must be at least 1"));
  }
  AttributionGraph g;
  g.layers = layers;
  const int out_layer = static_cast<int>(layers.size());
  // Each call lists more entries than a layer keeps: a parent strong for several children but
  // not the strongest of any one still shows.
  const int listed = std::max(20, 4 * nodes_per_layer);
  std::vector<int> targets = {0};
  int calls = 0;
  g.nodes.push_back({out_layer, -1, 0, 0, 1.0});
  for (int layer = out_layer - 1; layer >= 0; --layer) {
    std::map<std::pair<int32_t, int32_t>, Candidate> found;  // by (latent, position)
    Candidate error;
    std::string refused;
    bool answered = false;
    for (int target : targets) {
      v1::AttributePromptRequest request = metric;
      request.set_dataset_id(layers[layer].dataset_id);
      request.set_top(listed);
      if (target != 0) {
        const GraphNode& t = g.nodes[target];
        request.clear_target_token_id();
        request.clear_contrast_token_id();
        v1::AttributionTarget* to = request.mutable_target_latent();
        to->set_dataset_id(layers[t.layer].dataset_id);
        to->set_latent(t.latent);
        to->set_position(t.position);
      }
      absl::StatusOr<v1::AttributePromptResponse> answer = attribute(request);
      ++calls;
      if (!answer.ok()) {
        if (target == 0 && layer == out_layer - 1) return answer.status();  // the metric itself
        refused = std::string(answer.status().message());
        continue;
      }
      answered = true;
      if (target == 0) {
        g.output = *answer;
        GraphNode& out = g.nodes[0];
        out.latent = answer->has_target_latent() ? -1 : answer->target_token_id();
        out.position = answer->prompt_size() - 1;
        out.activation = static_cast<float>(answer->metric());
      }
      // Each parent's share of this child: |its credit| over the child's listed credits and
      // error term, times the child's own share of the output.
      double total = std::abs(answer->error_attribution());
      for (const v1::LatentAttribution& e : answer->top_entries())
        total += std::abs(e.attribution());
      const double share = total > 0 ? g.nodes[target].score / total : 0.0;
      for (const v1::LatentAttribution& e : answer->top_entries()) {
        Candidate& c = found[{e.latent(), e.position()}];
        c.activation = e.activation();
        c.importance += share * std::abs(e.attribution());
        c.edges.emplace_back(target, e.attribution());
      }
      error.importance += share * std::abs(answer->error_attribution());
      error.edges.emplace_back(target, answer->error_attribution());
    }
    if (layer_done) layer_done(layers[layer], calls);
    if (!answered) {
      g.notes.push_back(absl::StrCat(layers[layer].label, " (dataset ", layers[layer].dataset_id,
                                     "): no edges: ", refused));
      continue;  // the layer before connects to the same targets
    }
    std::vector<std::pair<std::pair<int32_t, int32_t>, const Candidate*>> ranked;
    for (const auto& [key, c] : found) ranked.emplace_back(key, &c);
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
      return a.second->importance > b.second->importance;
    });
    if (static_cast<int>(ranked.size()) > nodes_per_layer) ranked.resize(nodes_per_layer);
    std::vector<int> kept;
    auto add = [&](int32_t latent, int32_t position, const Candidate& c) {
      const int index = static_cast<int>(g.nodes.size());
      g.nodes.push_back({layer, latent, position, c.activation, c.importance});
      for (const auto& [child, attribution] : c.edges)
        g.edges.push_back({index, child, attribution});
      return index;
    };
    for (const auto& [key, c] : ranked) kept.push_back(add(key.first, key.second, *c));
    add(kErrorNode, -1, error);
    targets = kept;
    if (targets.empty()) break;  // nothing fires upstream of the kept nodes
  }
  return g;
}

std::string DescribeAttributionGraph(const AttributionGraph& g,
                                     const std::optional<Vocabulary>& vocab) {
  const v1::AttributePromptResponse& o = g.output;
  std::string metric;
  if (o.has_target_latent()) {
    metric = absl::StrFormat("latent %d of dataset %d at position %d", o.target_latent().latent(),
                             o.target_latent().dataset_id(), o.target_latent().position());
  } else if (o.has_contrast_token_id()) {
    metric = absl::StrFormat("logit(%s) - logit(%s)", TokenCell(o.target_token_id(), vocab),
                             TokenCell(o.contrast_token_id(), vocab));
  } else {
    metric = absl::StrFormat("log p(%s)", TokenCell(o.target_token_id(), vocab));
  }
  std::string out = absl::StrFormat(
      "attribution graph of %s = %.4f over %d hooks\n(importance: the share of the output that "
      "flows through a node, along the edges' |attribution|)\n",
      metric, o.metric(), g.layers.size());
  // Each node's edges towards the output, strongest first.
  std::vector<std::vector<const GraphEdge*>> out_edges(g.nodes.size());
  for (const GraphEdge& e : g.edges) out_edges[e.from].push_back(&e);
  for (int layer = static_cast<int>(g.layers.size()) - 1; layer >= 0; --layer) {
    std::vector<size_t> here;
    for (size_t n = 0; n < g.nodes.size(); ++n) {
      if (g.nodes[n].layer == layer) here.push_back(n);
    }
    if (here.empty()) continue;
    absl::StrAppendFormat(&out, "\n%s (dataset %d):\n", g.layers[layer].label,
                          g.layers[layer].dataset_id);
    for (size_t n : here) {
      std::vector<const GraphEdge*>& edges = out_edges[n];
      std::sort(edges.begin(), edges.end(), [](const GraphEdge* a, const GraphEdge* b) {
        return std::abs(a->attribution) > std::abs(b->attribution);
      });
      std::vector<std::string> to;
      for (const GraphEdge* e : edges) {
        if (to.size() == 4) break;
        const GraphNode& child = g.nodes[e->to];
        to.push_back(absl::StrFormat(
            "%s %+.3g",
            e->to == 0 ? "output" : absl::StrFormat("#%d@%d", child.latent, child.position),
            e->attribution));
      }
      absl::StrAppendFormat(&out, "  %-36s importance %.3f  -> %s\n",
                            NodeName(g, g.nodes[n], vocab), g.nodes[n].score,
                            absl::StrJoin(to, ", "));
    }
  }
  for (const std::string& note : g.notes) absl::StrAppend(&out, "\nnote: ", note, "\n");
  return out;
}

}  // namespace latentd::client
