#include "client/attribution_graph.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace latentd::client {
namespace {

namespace v1 = latentd::v1;

struct Entry {
  int32_t latent, position;
  double attribution;
};

// A daemon that answers from a table: per (dataset, target) the entries and the error term;
// the target is (0, -1, -1) for the token metric. Missing: INVALID_ARGUMENT.
class FakeDaemon {
 public:
  using Key = std::tuple<uint64_t, uint64_t, int32_t, int32_t>;

  void Answer(Key key, std::vector<Entry> entries, double error) {
    answers_[key] = {std::move(entries), error};
  }

  absl::StatusOr<v1::AttributePromptResponse> operator()(const v1::AttributePromptRequest& r) {
    requests.push_back(r);
    const Key key = r.has_target_latent()
                        ? Key{r.dataset_id(), r.target_latent().dataset_id(),
                              r.target_latent().latent(), r.target_latent().position()}
                        : Key{r.dataset_id(), 0, -1, -1};
    auto it = answers_.find(key);
    if (it == answers_.end()) {
      return absl::InvalidArgumentError("target_latent.dataset_id: comes after the target");
    }
    v1::AttributePromptResponse out;
    for (int32_t t : {4, 8, 15, 16, 23}) out.add_prompt(t);
    out.set_target_token_id(r.has_target_latent() ? 0 : 7);
    if (r.has_target_latent()) *out.mutable_target_latent() = r.target_latent();
    out.set_metric(-1.5);
    for (const Entry& e : it->second.first) {
      v1::LatentAttribution* a = out.add_top_entries();
      a->set_latent(e.latent);
      a->set_position(e.position);
      a->set_activation(1.0f);
      a->set_attribution(e.attribution);
    }
    out.set_error_attribution(it->second.second);
    return out;
  }

  std::vector<v1::AttributePromptRequest> requests;

 private:
  std::map<Key, std::pair<std::vector<Entry>, double>> answers_;
};

const std::vector<GraphLayer> kLayers = {{1, "blocks.0.hook_resid_post"},
                                         {2, "blocks.1.hook_resid_post"},
                                         {3, "blocks.2.hook_resid_post"}};

v1::AttributePromptRequest Metric() {
  v1::AttributePromptRequest r;
  for (int32_t t : {4, 8, 15, 16, 23}) r.add_token_ids(t);
  r.set_target_token_id(7);
  return r;
}

const GraphNode* Find(const AttributionGraph& g, int layer, int32_t latent, int32_t position) {
  for (const GraphNode& n : g.nodes) {
    if (n.layer == layer && n.latent == latent && n.position == position) return &n;
  }
  return nullptr;
}

// The output's parents are the last layer's entries; each kept node's parents the layer before
// it; nodes are kept by the share of the output flowing through them.
TEST(AttributionGraphTest, EachLayerExplainsTheNodesKeptAfterIt) {
  FakeDaemon daemon;
  daemon.Answer({3, 0, -1, -1}, {{10, 4, 2.0}, {11, 3, -1.0}, {12, 2, 0.1}}, 1.0);
  daemon.Answer({2, 3, 10, 4}, {{20, 4, 1.0}, {21, 1, 0.5}}, 0.5);
  daemon.Answer({2, 3, 11, 3}, {{21, 1, -2.0}}, 0.0);
  daemon.Answer({1, 2, 21, 1}, {{30, 0, 0.25}}, 0.0);
  daemon.Answer({1, 2, 20, 4}, {{31, 2, 1.0}}, 1.0);
  std::vector<std::pair<uint64_t, int>> done;  // (layer's dataset, calls so far)
  auto g = BuildAttributionGraph(
      kLayers, Metric(), 2, [&](const v1::AttributePromptRequest& r) { return daemon(r); },
      [&](const GraphLayer& layer, int calls) { done.emplace_back(layer.dataset_id, calls); });
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->nodes[0].latent, 7);  // the output: the target token at the last position
  EXPECT_EQ(g->nodes[0].position, 4);
  // Last layer: 10@4 carries 2 / 4.1 of the output, 11@3 1 / 4.1; 12@2 is not kept.
  const GraphNode* a = Find(*g, 2, 10, 4);
  const GraphNode* b = Find(*g, 2, 11, 3);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_NEAR(a->score, 2 / 4.1, 1e-9);
  EXPECT_NEAR(b->score, 1 / 4.1, 1e-9);
  EXPECT_EQ(Find(*g, 2, 12, 2), nullptr);
  EXPECT_NEAR(Find(*g, 2, kErrorNode, -1)->score, 1 / 4.1, 1e-9);
  // Layer 1: 21@1 gets half of 10@4's share through 0.5 of 2 and all of 11@3's.
  const GraphNode* c = Find(*g, 1, 21, 1);
  ASSERT_NE(c, nullptr);
  EXPECT_NEAR(c->score, (2 / 4.1) * 0.25 + 1 / 4.1, 1e-9);
  EXPECT_NEAR(Find(*g, 1, 20, 4)->score, (2 / 4.1) * 0.5, 1e-9);
  // Its edges: to both children, with their attributions.
  std::map<int32_t, double> to;
  const int c_index = static_cast<int>(c - g->nodes.data());
  for (const GraphEdge& e : g->edges) {
    if (e.from == c_index) to[g->nodes[e.to].latent] = e.attribution;
  }
  EXPECT_EQ(to, (std::map<int32_t, double>{{10, 0.5}, {11, -2.0}}));
  EXPECT_NE(Find(*g, 0, 30, 0), nullptr);
  EXPECT_NE(Find(*g, 0, 31, 2), nullptr);
  // The requests: the metric at the last layer, latent targets of the layer after elsewhere.
  ASSERT_GE(daemon.requests.size(), 5u);
  EXPECT_EQ(daemon.requests[0].dataset_id(), 3u);
  EXPECT_EQ(daemon.requests[0].target_token_id(), 7);
  EXPECT_FALSE(daemon.requests[0].has_target_latent());
  for (size_t i = 1; i < daemon.requests.size(); ++i) {
    EXPECT_FALSE(daemon.requests[i].has_target_token_id()) << i;
    EXPECT_EQ(daemon.requests[i].target_latent().dataset_id(), daemon.requests[i].dataset_id() + 1)
        << i;
  }
  EXPECT_TRUE(g->notes.empty());
  // Progress: the last layer after the output's call, then two calls a layer (its kept nodes).
  EXPECT_EQ(done, (std::vector<std::pair<uint64_t, int>>{{3, 1}, {2, 3}, {1, 5}}));
  const std::string text = DescribeAttributionGraph(*g, std::nullopt);
  EXPECT_NE(text.find("attribution graph of log p(7) = -1.5000 over 3 hooks"), std::string::npos)
      << text;
  EXPECT_NE(text.find("#21 @1 8 (1)"), std::string::npos) << text;
  EXPECT_NE(text.find("-> #11@3 -2, #10@4 +0.5"), std::string::npos) << text;
  EXPECT_NE(text.find("-> output +2"), std::string::npos) << text;
}

// A layer whose calls are all refused is noted and skipped: the one before it explains the
// nodes after it. A refused metric is the graph's error.
TEST(AttributionGraphTest, ARefusedLayerIsSkippedAndARefusedMetricFails) {
  FakeDaemon daemon;
  daemon.Answer({3, 0, -1, -1}, {{10, 4, 2.0}}, 0.0);
  daemon.Answer({1, 3, 10, 4}, {{30, 0, 0.5}}, 0.0);
  auto call = [&](const v1::AttributePromptRequest& r) { return daemon(r); };
  auto g = BuildAttributionGraph(kLayers, Metric(), 3, call);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->notes.size(), 1u);
  EXPECT_NE(g->notes[0].find("blocks.1.hook_resid_post (dataset 2): no edges: "
                             "target_latent.dataset_id: comes after the target"),
            std::string::npos)
      << g->notes[0];
  const GraphNode* first = Find(*g, 0, 30, 0);
  ASSERT_NE(first, nullptr);
  EXPECT_NEAR(first->score, 1.0, 1e-9);

  FakeDaemon silent;
  auto refused = BuildAttributionGraph(
      kLayers, Metric(), 3, [&](const v1::AttributePromptRequest& r) { return silent(r); });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildAttributionGraph({}, Metric(), 3, call).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildAttributionGraph(kLayers, Metric(), 0, call).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace latentd::client
