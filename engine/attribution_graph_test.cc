#include "engine/attribution_graph.h"

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

struct Entry {
  int64_t latent, position;
  double attribution;
};

// Passes answered from a table: per (hook, target hook, target latent, position) the entries
// and the error term; the metric's pass is (hook, -1, -1, -1). Missing: INVALID_ARGUMENT.
class FakePasses {
 public:
  using Key = std::tuple<int, int, int64_t, int64_t>;

  void Answer(Key key, std::vector<Entry> entries, double error) {
    answers_[key] = {std::move(entries), error};
  }

  absl::StatusOr<AttributionResult> operator()(int hook, const AttributionQuery& q,
                                               int target_hook) {
    asked.emplace_back(hook, q, target_hook);
    const Key key = q.target_latent
                        ? Key{hook, target_hook, q.target_latent->latent, q.target_latent->position}
                        : Key{hook, -1, -1, -1};
    auto it = answers_.find(key);
    if (it == answers_.end()) {
      return absl::InvalidArgumentError("target_latent.dataset_id: comes after the target");
    }
    AttributionResult out;
    out.prompt = {4, 8, 15, 16, 23};
    out.target_token_id = q.target_latent ? 0 : 7;
    out.metric = -1.5;
    for (const Entry& e : it->second.first) {
      out.top_entries.push_back({e.latent, e.position, 1.0f, e.attribution});
    }
    out.error_attribution = it->second.second;
    // An ablation check that measures twice what the credit predicts.
    for (int i = 0; i < q.ablate && i < static_cast<int>(out.top_entries.size()); ++i) {
      out.ablated_changes.push_back(-2 * out.top_entries[i].attribution);
    }
    return out;
  }

  std::vector<std::tuple<int, AttributionQuery, int>> asked;

 private:
  std::map<Key, std::pair<std::vector<Entry>, double>> answers_;
};

const std::vector<std::string> kHooks = {"blocks.0.hook_resid_post (dataset 1)",
                                         "blocks.1.hook_resid_post (dataset 2)",
                                         "blocks.2.hook_resid_post (dataset 3)"};

AttributionQuery Metric() {
  AttributionQuery q;
  q.token_ids = {4, 8, 15, 16, 23};
  q.target_token_id = 7;
  return q;
}

const GraphNode* Find(const AttributionGraph& g, int hook, int64_t latent, int64_t position) {
  for (const GraphNode& n : g.nodes) {
    if (n.hook == hook && n.latent == latent && n.position == position) return &n;
  }
  return nullptr;
}

// The graph's passes from the table, a latent pass per target (as the daemon's share one
// forward).
GraphPasses Calls(FakePasses& passes) {
  GraphPasses calls;
  calls.metric = [&passes](int hook, const AttributionQuery& q) { return passes(hook, q, -1); };
  calls.latents = [&passes](int hook, const AttributionQuery& q, int target_hook,
                            const std::vector<TargetLatent>& targets)
      -> absl::StatusOr<std::vector<absl::StatusOr<AttributionResult>>> {
    std::vector<absl::StatusOr<AttributionResult>> answers;
    for (const TargetLatent& t : targets) {
      AttributionQuery one = q;
      one.target_latent = t;
      answers.push_back(passes(hook, one, target_hook));
    }
    return answers;
  };
  return calls;
}

// The output's parents are the last hook's entries; each kept node's parents the hook before
// it; nodes are kept by the share of the output flowing through them.
TEST(AttributionGraphTest, EachHookExplainsTheNodesKeptAfterIt) {
  FakePasses passes;
  passes.Answer({2, -1, -1, -1}, {{10, 4, 2.0}, {11, 3, -1.0}, {12, 2, 0.1}}, 1.0);
  passes.Answer({1, 2, 10, 4}, {{20, 4, 1.0}, {21, 1, 0.5}}, 0.5);
  passes.Answer({1, 2, 11, 3}, {{21, 1, -2.0}}, 0.0);
  passes.Answer({0, 1, 21, 1}, {{30, 0, 0.25}}, 0.0);
  passes.Answer({0, 1, 20, 4}, {{31, 2, 1.0}}, 1.0);
  std::vector<std::pair<int, int>> done;  // (hook, passes so far)
  auto g = BuildAttributionGraph(kHooks, Metric(), {2}, Calls(passes),
                                 [&](int hook, int made) { done.emplace_back(hook, made); });
  ASSERT_TRUE(g.ok()) << g.status();
  // Progress: the last hook after the metric's pass, then two passes a hook (its kept nodes).
  EXPECT_EQ(done, (std::vector<std::pair<int, int>>{{2, 1}, {1, 3}, {0, 5}}));
  EXPECT_EQ(g->nodes[0].hook, 3);  // the output, at the last position, its metric as value
  EXPECT_EQ(g->nodes[0].position, 4);
  EXPECT_EQ(g->nodes[0].activation, -1.5f);
  // Last hook: 10@4 carries 2 / 4.1 of the output, 11@3 1 / 4.1; 12@2 is not kept.
  const GraphNode* a = Find(*g, 2, 10, 4);
  const GraphNode* b = Find(*g, 2, 11, 3);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_NEAR(a->importance, 2 / 4.1, 1e-9);
  EXPECT_NEAR(b->importance, 1 / 4.1, 1e-9);
  EXPECT_EQ(Find(*g, 2, 12, 2), nullptr);
  EXPECT_NEAR(Find(*g, 2, kGraphErrorNode, -1)->importance, 1 / 4.1, 1e-9);
  // Hook 1: 21@1 gets a quarter of 10@4's share (0.5 of 2) and all of 11@3's.
  const GraphNode* c = Find(*g, 1, 21, 1);
  ASSERT_NE(c, nullptr);
  EXPECT_NEAR(c->importance, (2 / 4.1) * 0.25 + 1 / 4.1, 1e-9);
  EXPECT_NEAR(Find(*g, 1, 20, 4)->importance, (2 / 4.1) * 0.5, 1e-9);
  std::map<int64_t, double> to;  // its edges, to both children
  const int c_index = static_cast<int>(c - g->nodes.data());
  for (const GraphEdge& e : g->edges) {
    if (e.from == c_index) to[g->nodes[e.to].latent] = e.attribution;
  }
  EXPECT_EQ(to, (std::map<int64_t, double>{{10, 0.5}, {11, -2.0}}));
  EXPECT_NE(Find(*g, 0, 30, 0), nullptr);
  EXPECT_NE(Find(*g, 0, 31, 2), nullptr);
  // The passes: the metric at the last hook, then latent targets of the hook after.
  ASSERT_EQ(passes.asked.size(), 5u);
  const auto& [first_hook, first_query, first_target] = passes.asked[0];
  EXPECT_EQ(first_hook, 2);
  EXPECT_EQ(first_target, -1);
  EXPECT_EQ(first_query.target_token_id, 7);
  EXPECT_FALSE(first_query.target_latent.has_value());
  for (size_t i = 1; i < passes.asked.size(); ++i) {
    const auto& [hook, query, target_hook] = passes.asked[i];
    EXPECT_FALSE(query.target_token_id.has_value()) << i;
    EXPECT_EQ(target_hook, hook + 1) << i;
    EXPECT_EQ(query.top, 20) << i;
  }
  EXPECT_TRUE(g->notes.empty());
  // Where the output goes at each hook: at the last, 3 / 4.1 kept, 0.1 / 4.1 dropped (12@2),
  // 1 / 4.1 through the error; at hook 1 the kept nodes' 3 / 4.1 splits into both parents
  // (kept) and the error's quarter of 10@4's share.
  ASSERT_EQ(g->coverage.size(), 3u);
  EXPECT_EQ(g->coverage[2].kept_nodes, 2);
  EXPECT_NEAR(g->coverage[2].kept, 3 / 4.1, 1e-9);
  EXPECT_NEAR(g->coverage[2].dropped, 0.1 / 4.1, 1e-9);
  EXPECT_NEAR(g->coverage[2].error, 1 / 4.1, 1e-9);
  EXPECT_NEAR(g->coverage[1].kept, 3 / 4.1 - (2 / 4.1) * 0.25, 1e-9);
  EXPECT_NEAR(g->coverage[1].error, (2 / 4.1) * 0.25, 1e-9);
  EXPECT_NEAR(g->coverage[1].dropped, 0, 1e-12);

  // With a floor on importance: 11@3 (1 / 4.1 = 0.24) is not kept at 0.3, nor asked about.
  FakePasses floored;
  floored.Answer({2, -1, -1, -1}, {{10, 4, 2.0}, {11, 3, -1.0}, {12, 2, 0.1}}, 1.0);
  floored.Answer({1, 2, 10, 4}, {{20, 4, 1.0}, {21, 1, 0.5}}, 0.5);
  GraphOptions options;
  options.per_hook = 2;
  options.min_importance = 0.3;
  auto pruned = BuildAttributionGraph(kHooks, Metric(), options, Calls(floored));
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_NE(Find(*pruned, 2, 10, 4), nullptr);
  EXPECT_EQ(Find(*pruned, 2, 11, 3), nullptr);
  for (const auto& [hook, query, target_hook] : floored.asked) {
    EXPECT_FALSE(query.target_latent && query.target_latent->latent == 11);
  }
  // 20@4 carries 0.488 / 2 = 0.24 of the output, below the floor too.
  EXPECT_EQ(Find(*pruned, 1, 20, 4), nullptr);
  options.min_importance = 1.5;
  EXPECT_EQ(BuildAttributionGraph(kHooks, Metric(), options, Calls(floored)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// node_threshold keeps the fewest nodes carrying that share of what a hook's latents carry
// (never more than per_hook); its coverage says what the cut dropped.
TEST(AttributionGraphTest, NodeThresholdKeepsTheFewestNodesCarryingItsShare) {
  FakePasses passes;
  passes.Answer({2, -1, -1, -1}, {{10, 4, 2.0}, {11, 3, -1.0}, {12, 2, 0.1}}, 1.0);
  GraphOptions options;
  options.per_hook = 3;
  // The latents carry 3.1 / 4.1: 10@4 alone (2 / 4.1) reaches 60% of that, not 70%.
  options.node_threshold = 0.6;
  auto few = BuildAttributionGraph(kHooks, Metric(), options, Calls(passes));
  ASSERT_TRUE(few.ok()) << few.status();
  EXPECT_NE(Find(*few, 2, 10, 4), nullptr);
  EXPECT_EQ(Find(*few, 2, 11, 3), nullptr);
  EXPECT_EQ(few->coverage[2].kept_nodes, 1);
  EXPECT_NEAR(few->coverage[2].kept, 2 / 4.1, 1e-9);
  EXPECT_NEAR(few->coverage[2].dropped, 1.1 / 4.1, 1e-9);
  options.node_threshold = 0.7;
  auto more = BuildAttributionGraph(kHooks, Metric(), options, Calls(passes));
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(more->coverage[2].kept_nodes, 2);
  EXPECT_NE(Find(*more, 2, 11, 3), nullptr);
  EXPECT_EQ(Find(*more, 2, 12, 2), nullptr);
  options.per_hook = 1;  // the cap holds whatever the threshold asks
  auto capped = BuildAttributionGraph(kHooks, Metric(), options, Calls(passes));
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->coverage[2].kept_nodes, 1);
  for (double bad : {0.0, -0.5, 1.5}) {
    options.node_threshold = bad;
    auto refused = BuildAttributionGraph(kHooks, Metric(), options, Calls(passes));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find("node_threshold"), std::string::npos) << bad;
  }
}

// With ablate, every pass checks as many entries as a hook keeps, and the edges from those
// parents carry the measured change of their child (the output's metric, or a latent).
TEST(AttributionGraphTest, TheEdgesCarryTheirAblationCheck) {
  FakePasses passes;
  passes.Answer({2, -1, -1, -1}, {{10, 4, 2.0}, {11, 3, -1.0}, {12, 2, 0.1}}, 1.0);
  passes.Answer({1, 2, 10, 4}, {{20, 4, 1.0}}, 0.5);
  passes.Answer({1, 2, 11, 3}, {{21, 1, -2.0}}, 0.0);
  GraphOptions options;
  options.per_hook = 2;
  options.ablate = true;
  auto g = BuildAttributionGraph(kHooks, Metric(), options, Calls(passes));
  ASSERT_TRUE(g.ok()) << g.status();
  // (from latent, to latent) -> the edge's ablated change; the output is latent -1.
  std::map<std::pair<int64_t, int64_t>, double> measured;
  int unmeasured = 0;
  for (const GraphEdge& e : g->edges) {
    if (std::isnan(e.ablated_change)) {
      ++unmeasured;
      EXPECT_EQ(g->nodes[e.from].latent, kGraphErrorNode);  // only error terms go unchecked
      continue;
    }
    measured[{g->nodes[e.from].latent, g->nodes[e.to].latent}] = e.ablated_change;
  }
  // The fake measures twice what the credit predicts, minus twice the attribution.
  EXPECT_EQ(measured, (std::map<std::pair<int64_t, int64_t>, double>{
                          {{10, -1}, -4.0}, {{11, -1}, 2.0}, {{20, 10}, -2.0}, {{21, 11}, 4.0}}));
  EXPECT_EQ(unmeasured, 3);  // the error nodes' edges: to the output, to 10@4 and to 11@3
  ASSERT_GE(passes.asked.size(), 3u);
  for (const auto& [hook, query, target_hook] : passes.asked) EXPECT_EQ(query.ablate, 2);
  // Without it, none.
  options.ablate = false;
  passes.asked.clear();
  auto plain = BuildAttributionGraph(kHooks, Metric(), options, Calls(passes));
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (const GraphEdge& e : plain->edges) EXPECT_TRUE(std::isnan(e.ablated_change));
  for (const auto& [hook, query, target_hook] : passes.asked) EXPECT_EQ(query.ablate, 0);
}

// A hook whose passes are all refused is noted and skipped: the one before it explains the
// nodes after it. A refused metric is the graph's error; so are bad arguments.
TEST(AttributionGraphTest, ARefusedHookIsSkippedAndARefusedMetricFails) {
  FakePasses passes;
  passes.Answer({2, -1, -1, -1}, {{10, 4, 2.0}}, 0.0);
  passes.Answer({0, 2, 10, 4}, {{30, 0, 0.5}}, 0.0);
  auto g = BuildAttributionGraph(kHooks, Metric(), {3}, Calls(passes));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->notes.size(), 1u);
  EXPECT_EQ(g->notes[0],
            "blocks.1.hook_resid_post (dataset 2): no edges: target_latent.dataset_id: comes "
            "after the target");
  const GraphNode* first = Find(*g, 0, 30, 0);
  ASSERT_NE(first, nullptr);
  EXPECT_NEAR(first->importance, 1.0, 1e-9);

  FakePasses silent;
  EXPECT_EQ(BuildAttributionGraph(kHooks, Metric(), {3}, Calls(silent)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildAttributionGraph({}, Metric(), {3}, Calls(passes)).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (int bad : {0, kMaxGraphNodesPerHook + 1}) {
    auto refused = BuildAttributionGraph(kHooks, Metric(), {bad}, Calls(passes));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find("per_hook"), std::string::npos);
  }
}

}  // namespace
}  // namespace latentd::engine
