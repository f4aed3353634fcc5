#include "client/steer_view.h"

#include <tuple>

#include "gtest/gtest.h"

namespace latentd::client {
namespace {

namespace v1 = latentd::v1;

TEST(SteerViewTest, InterventionsParseEachModeAndPositions) {
  auto parsed = ParseInterventions("17:add=8, 40:set=0@3+4,9:scale=-0.5");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 3u);
  EXPECT_EQ((*parsed)[0].latent(), 17);
  EXPECT_EQ((*parsed)[0].mode(), v1::LatentIntervention::ADD);
  EXPECT_EQ((*parsed)[0].value(), 8.0f);
  EXPECT_TRUE((*parsed)[0].positions().empty());
  EXPECT_EQ((*parsed)[1].mode(), v1::LatentIntervention::SET);
  ASSERT_EQ((*parsed)[1].positions_size(), 2);
  EXPECT_EQ((*parsed)[1].positions(1), 4);
  EXPECT_EQ((*parsed)[2].mode(), v1::LatentIntervention::SCALE);
  EXPECT_EQ((*parsed)[2].value(), -0.5f);
  EXPECT_EQ(DescribeIntervention((*parsed)[0]), "latent 17 add 8 (every position)");
  EXPECT_EQ(DescribeIntervention((*parsed)[1]), "latent 40 set 0 (positions 3, 4)");
}

TEST(SteerViewTest, OtherDatasetsInterventionsParsePerDataset) {
  auto more = ParseMoreInterventions("3=40:set=0@3;4=12:add=4,7:scale=2");
  ASSERT_TRUE(more.ok()) << more.status();
  ASSERT_EQ(more->size(), 2u);
  EXPECT_EQ((*more)[0].dataset_id(), 3u);
  ASSERT_EQ((*more)[0].interventions_size(), 1);
  EXPECT_EQ((*more)[0].interventions(0).latent(), 40);
  EXPECT_EQ((*more)[0].interventions(0).positions(0), 3);
  EXPECT_EQ((*more)[1].dataset_id(), 4u);
  EXPECT_EQ((*more)[1].interventions_size(), 2);
  EXPECT_EQ((*more)[1].interventions(1).mode(), v1::LatentIntervention::SCALE);
  EXPECT_TRUE(ParseMoreInterventions("")->empty());
  for (const char* bad : {"3:40:set=0", "x=40:set=0", "3=40:jump=1"}) {
    auto refused = ParseMoreInterventions(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find("--more_interventions"), std::string::npos) << bad;
  }
}

TEST(SteerViewTest, BadInterventionsNameTheItem) {
  for (const char* flag : {"", "17", "x:add=1", "-1:add=1", "17:mul=2", "17:add", "17:add=x",
                           "17:add=inf", "17:set=0@", "17:set=0@1+y", "17:set=0@-2"}) {
    auto parsed = ParseInterventions(flag);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(parsed.status().message().find("--intervene"), std::string::npos) << flag;
  }
  EXPECT_NE(ParseInterventions("1:add=1,17:mul=2").status().message().find("'17:mul=2'"),
            std::string::npos);
}

TEST(SteerViewTest, TheAnswerShowsBothRunsSideBySide) {
  auto vocab = Vocabulary::Parse("The\n cat\n sat\n dog\n barked\n");
  ASSERT_TRUE(vocab.ok());
  v1::SteerPromptRequest request;
  request.set_new_tokens(2);
  *request.add_interventions() = (*ParseInterventions("3:add=8"))[0];
  v1::SteerPromptResponse r;
  for (int32_t t : {0, 1}) r.add_prompt(t);
  v1::LatentValues* values = r.add_latent_values();
  values->set_latent(3);
  values->add_values(0);
  values->add_values(1.5f);
  r.set_kl_divergence(0.25);
  for (auto [run, next, p, loss] : {std::tuple{r.mutable_clean(), 2, 0.6f, 3.0},
                                    std::tuple{r.mutable_steered(), 3, 0.7f, 3.5}}) {
    v1::TokenProbability* top = run->add_next();
    top->set_token_id(next);
    top->set_probability(p);
    run->add_token_losses(static_cast<float>(loss));
    run->set_mean_loss(loss);
    run->add_generated(next);
    run->add_generated(next == 2 ? 1 : 4);
  }
  v1::NextTokenChange* rose = r.add_most_increased();
  rose->set_token_id(3);
  rose->set_clean_probability(0.01f);
  rose->set_steered_probability(0.7f);
  v1::SweptRun* swept = r.add_sweep();
  swept->set_value(16);
  swept->set_kl_divergence(1.5);
  swept->mutable_run()->add_next()->set_token_id(4);
  swept->mutable_run()->mutable_next(0)->set_probability(0.9f);
  swept->mutable_run()->add_generated(4);
  swept->mutable_run()->add_generated(4);
  const std::string text = DescribeSteering(7, request, r, *vocab);
  EXPECT_NE(text.find("sweep of latent 3 add:"), std::string::npos) << text;
  EXPECT_NE(text.find("  16         1.5        0.9000 \" barked\"         \" barked barked\""),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("dataset 7: a prompt of 2 tokens\n"), std::string::npos) << text;
  EXPECT_NE(text.find("latent 3 add 8 (every position)"), std::string::npos) << text;
  EXPECT_NE(text.find("latent 3 on the prompt: \"The\" 0 | \" cat\" 1.5"), std::string::npos)
      << text;
  EXPECT_NE(text.find("KL(clean || steered) 0.25 nats"), std::string::npos) << text;
  EXPECT_NE(text.find("0.6000 \" sat\""), std::string::npos) << text;
  EXPECT_NE(text.find("0.7000 \" dog\""), std::string::npos) << text;
  EXPECT_NE(text.find("rose most: \" dog\" 0.0100 -> 0.7000"), std::string::npos) << text;
  EXPECT_NE(text.find("clean 3.0000, steered 3.5000 (+0.5000)"), std::string::npos) << text;
  EXPECT_NE(text.find("continuation (2 tokens, greedy)"), std::string::npos) << text;
  EXPECT_NE(text.find("clean:   \" sat cat\""), std::string::npos) << text;
  EXPECT_NE(text.find("steered: \" dog barked\""), std::string::npos) << text;
  // Without a vocabulary: ids.
  const std::string ids = DescribeSteering(7, request, r, std::nullopt);
  EXPECT_NE(ids.find("steered: 3 4"), std::string::npos) << ids;
  // A model-diffing crosscoder steering one model: with the latents' values the others ran
  // beside it; without, its latents were added alone.
  request.set_crosscoder_source(1);
  const std::string beside = DescribeSteering(7, request, r, std::nullopt);
  EXPECT_NE(beside.find("run by the crosscoder's source 1's model, each latent changed along its "
                        "decoder's block for that model (its value from every model, the others "
                        "run beside it)"),
            std::string::npos)
      << beside;
  r.clear_latent_values();
  const std::string alone = DescribeSteering(7, request, r, std::nullopt);
  EXPECT_NE(alone.find("(added without its value: the other models could not run beside it)"),
            std::string::npos)
      << alone;
}

TEST(SteerViewTest, AnAttributionShowsTotalsPositionsLatentsAndEntries) {
  auto vocab = Vocabulary::Parse("The\n cat\n sat\n dog\n");
  ASSERT_TRUE(vocab.ok());
  v1::AttributePromptResponse r;
  r.add_prompt(0);
  r.add_prompt(1);
  r.set_target_token_id(2);
  r.set_metric(-1.25);
  r.set_latent_attribution(0.75);
  r.set_error_attribution(-0.125);
  r.add_latent_attribution_by_position(0.25);
  r.add_latent_attribution_by_position(0.5);
  r.add_error_attribution_by_position(0);
  r.add_error_attribution_by_position(-0.125);
  v1::LatentAttribution* l = r.add_top_latents();
  l->set_latent(17);
  l->set_position(1);
  l->set_activation(2.5f);
  l->set_attribution(0.5);
  *r.add_top_entries() = *l;
  std::string text = DescribeAttribution(3, r, *vocab);
  EXPECT_NE(text.find("metric log p(\" sat\") = -1.2500"), std::string::npos) << text;
  EXPECT_NE(text.find("the latents +0.7500, the SAE's error term -0.1250"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  1    \" cat\"               +0.5000    -0.1250"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  17       +0.5000      1 \" cat\" (2.5)"), std::string::npos) << text;
  EXPECT_NE(text.find("  17       1    \" cat\"               2.5        +0.5000"),
            std::string::npos)
      << text;
  r.set_contrast_token_id(3);
  text = DescribeAttribution(3, r, *vocab);
  EXPECT_NE(text.find("metric logit(\" sat\") - logit(\" dog\") = -1.2500"), std::string::npos)
      << text;
  // A latent as the target: named with its dataset, position and token.
  auto target = ParseTargetLatent("4:120@1");
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->dataset_id(), 4u);
  EXPECT_EQ(target->latent(), 120);
  EXPECT_EQ(target->position(), 1);
  *r.mutable_target_latent() = *target;
  text = DescribeAttribution(3, r, *vocab);
  EXPECT_NE(text.find("metric latent 120 of dataset 4 at position 1 (\" cat\") = -1.2500"),
            std::string::npos)
      << text;
  for (const char* bad : {"4:120", "4@1", "x:1@2", "4:-1@2", "4:1@", "4:1@-2"}) {
    auto parsed = ParseTargetLatent(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("--target_latent"), std::string::npos);
  }
  EXPECT_EQ(text.find("ABLATED"), std::string::npos);  // no check asked: no column
}

// The ablation check: each checked entry's measured change beside its credit, and a line on
// how far the first-order credit held.
TEST(SteerViewTest, AnAblationCheckShowsTheMeasuredChanges) {
  v1::AttributePromptResponse r;
  r.add_prompt(0);
  r.add_prompt(1);
  r.set_target_token_id(1);
  // Minus the credits 1, -2, 3, 4; measured 0.5, 1, 2.5, 3 (one sign wrong).
  for (const auto& [latent, attribution, measured] : std::vector<std::tuple<int, double, double>>{
           {5, -1, 0.5}, {6, 2, 1}, {7, -3, 2.5}, {8, -4, 3}}) {
    v1::LatentAttribution* e = r.add_top_entries();
    e->set_latent(latent);
    e->set_position(1);
    e->set_activation(1);
    e->set_attribution(attribution);
    e->set_ablated_change(measured);
  }
  r.add_top_entries()->set_latent(9);  // not checked
  const std::string text = DescribeAttribution(3, r, std::nullopt);
  EXPECT_NE(text.find("ATTRIBUTION  ABLATED (measured)"), std::string::npos) << text;
  EXPECT_NE(text.find("  6        1    1                    1          +2.0000      +1.0000\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  9        0    0                    0          +0.0000     \n"),
            std::string::npos)
      << text;
  // x = 1, -2, 3, 4 and y = 0.5, 1, 2.5, 3: ratios 0.5, -0.5, 0.833, 0.75 (median, the upper
  // middle, 0.75); r = 7.5 / sqrt(21 x 4.25) = 0.794 (sxy, sxx, syy about the means 1.5, 1.75).
  EXPECT_NE(text.find("ablation check of the top 4 entries: the measured change has the sign "
                      "the credit predicts for 3 of them; measured / predicted, median 0.75; "
                      "correlation with minus the credit 0.794"),
            std::string::npos)
      << text;
}

// The graph for a terminal: per hook, latest first, each node with its strongest edges.
TEST(SteerViewTest, AnAttributionGraphListsEachHooksNodesAndEdges) {
  v1::AttributionGraphResponse g;
  v1::GraphHook* hook = g.add_hooks();
  hook->set_dataset_id(6);
  hook->set_hook_name("blocks.1.hook_resid_post");
  hook->set_kept_nodes(1);
  hook->set_kept_importance(0.5);
  hook->set_error_importance(0.25);
  hook->set_dropped_importance(0.25);
  for (int t : {1, 2, 3}) g.mutable_output()->add_prompt(t);
  g.mutable_output()->set_target_token_id(3);
  g.mutable_output()->set_metric(-0.5);
  g.add_nodes()->set_hook(1);  // the output
  v1::GraphNode* latent = g.add_nodes();
  latent->set_latent(40);
  latent->set_position(2);
  latent->set_activation(3.0f);
  latent->set_importance(0.5);
  v1::GraphNode* error = g.add_nodes();
  error->set_latent(-1);
  error->set_position(-1);
  error->set_importance(0.25);
  for (const auto& [from, attribution] : {std::pair{1, 2.0}, std::pair{2, -1.0}}) {
    v1::GraphEdge* e = g.add_edges();
    e->set_from_node(from);
    e->set_attribution(attribution);
  }
  g.add_notes("blocks.0.hook_resid_post (dataset 5): no edges: why");
  auto vocab = Vocabulary::Parse("a\nb\n cat\n sat\n");
  ASSERT_TRUE(vocab.ok());
  // Latent 40 of dataset 6 labelled; a label for another dataset's latent 40 is not its.
  const GraphNodeLabels labels = {{{6, 40}, "\" cat\" 60%"}, {{5, 40}, "not this one"}};
  const std::string text = DescribeAttributionGraph(g, *vocab, &labels);
  EXPECT_NE(text.find("attribution graph of log p(\" sat\") = -0.5000 over 1 hooks"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("blocks.1.hook_resid_post (dataset 6):\n  (1 kept node: 50% of what "
                      "reaches the hook; SAE error 25%, not kept 25%)\n  #40 @2 \" sat\" (3)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("importance 0.500  -> output +2\n      fires most on \" cat\" 60%\n  error"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("not this one"), std::string::npos) << text;
  EXPECT_NE(text.find("importance 0.250  -> output -1"), std::string::npos) << text;
  EXPECT_NE(text.find("note: blocks.0.hook_resid_post (dataset 5): no edges: why"),
            std::string::npos);
  // As DOT: the hook's cluster with its nodes, the edges coloured by sign, as wide as their
  // share of the strongest into the output.
  const std::string dot = AttributionGraphDot(g, *vocab, &labels);
  EXPECT_NE(dot.find("n0 [label=\"output\\nlog p(\\\" sat\\\") = -0.5\"];"), std::string::npos)
      << dot;
  EXPECT_NE(dot.find("subgraph cluster_0 {\n    label=\"blocks.1.hook_resid_post (dataset 6)\\n1 "
                     "kept node: 50% of what reaches the hook; SAE error 25%, not kept 25%\";\n"
                     "    n1 [label=\"#40 @2\\n\\\" sat\\\" = 3\\nimportance 0.500\\n\\\" "
                     "cat\\\" 60%\"];"),
            std::string::npos)
      << dot;
  // With a link pattern each latent's node carries its page's URL; the output and the error
  // node none.
  const std::string linked = AttributionGraphDot(g, *vocab, nullptr, "b{dataset}/l-{latent}.html");
  EXPECT_NE(linked.find("importance 0.500\", URL=\"b6/l-40.html\"];"), std::string::npos) << linked;
  EXPECT_EQ(linked.find("URL", linked.find("n2 [")), std::string::npos) << linked;
  EXPECT_EQ(GraphNodeLink(g, 0, "b{dataset}/l-{latent}.html"), "");
  // An edge with its ablation check says what taking its parent out measured.
  g.mutable_edges(0)->set_ablated_change(-2.5);
  const std::string checked = DescribeAttributionGraph(g, *vocab);
  EXPECT_NE(checked.find("importance 0.500  -> output +2 (ablated -2.5)\n"), std::string::npos);
  EXPECT_NE(checked.find("\nablation check of 1 edges: the measured change has the sign the "
                         "credit predicts for 1 of them; measured / predicted, median 1.25\n"),
            std::string::npos)
      << checked;
  EXPECT_NE(AttributionGraphDot(g, *vocab).find("n1 -> n0 [color=\"#0066ff\", penwidth=4.50, "
                                                "label=\"+2 (ablated -2.5)\"];"),
            std::string::npos);
  g.mutable_edges(0)->clear_ablated_change();
  // The circuit check: the graph's latents taken out together.
  g.set_circuit_ablated_change(-1.25);
  g.set_circuit_latents(1);
  EXPECT_NE(DescribeAttributionGraph(g, *vocab).find(
                "the graph's 1 latents taken out together move the metric by -1.25 (-0.5000 -> "
                "-1.7500)\n"),
            std::string::npos);
  g.clear_circuit_ablated_change();
  g.clear_circuit_latents();
  // Without coverage or labels (an older daemon's answer) the cluster and node say no more.
  g.mutable_hooks(0)->clear_kept_importance();
  g.mutable_hooks(0)->clear_error_importance();
  g.mutable_hooks(0)->clear_dropped_importance();
  EXPECT_NE(AttributionGraphDot(g, *vocab).find(
                "label=\"blocks.1.hook_resid_post (dataset 6)\";\n    n1 [label=\"#40 @2\\n\\\" "
                "sat\\\" = 3\\nimportance 0.500\"];"),
            std::string::npos);
  EXPECT_NE(dot.find("n1 -> n0 [color=\"#0066ff\", penwidth=4.50, label=\"+2\"];"),
            std::string::npos)
      << dot;
  EXPECT_NE(dot.find("n2 -> n0 [color=\"#ff3300\", penwidth=2.50, label=\"-1\"];"),
            std::string::npos)
      << dot;
}

}  // namespace
}  // namespace latentd::client
