// latentctl steer, attribute and graph: the --intervene flag's language, and the terminal views
// of a SteerPrompt answer (both runs side by side), an AttributePrompt answer and an
// AttributionGraph answer.
#ifndef LATENTD_CLIENT_STEER_VIEW_H_
#define LATENTD_CLIENT_STEER_VIEW_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/vocabulary.h"
#include "proto/latentd/v1/datasets.pb.h"

namespace latentd::client {

// "J:MODE=V[@P+P...]" items joined by commas, MODE one of set, add, scale: "17:add=8" (steer
// along latent 17's decoder direction at every position), "40:set=0@3+4" (ablate latent 40 at
// positions 3 and 4), "9:scale=2". INVALID_ARGUMENT naming the item otherwise.
absl::StatusOr<std::vector<latentd::v1::LatentIntervention>> ParseInterventions(
    const std::string& flag);

// "D=ITEMS;D=ITEMS": per other dataset D (of the same model), ParseInterventions' ITEMS, e.g.
// "3=40:set=0@3;4=12:add=4" (latentctl steer --more_interventions). INVALID_ARGUMENT naming
// the flag and the part otherwise.
absl::StatusOr<std::vector<latentd::v1::DatasetInterventions>> ParseMoreInterventions(
    const std::string& flag);

// "D:J@P": latent J of dataset D at prompt position P, the target of latent-to-latent
// attribution (latentctl attribute --target_latent). INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<latentd::v1::AttributionTarget> ParseTargetLatent(const std::string& flag);

// What an attribution's metric is, in words: "log p(TOKEN)", "logit(A) - logit(B)", or "latent J
// of dataset D at position P (TOKEN)".
std::string AttributionMetric(const latentd::v1::AttributePromptResponse& response,
                              const std::optional<Vocabulary>& vocab);

// "latent 17 add 8 (every position)", "latent 40 set 0 (positions 3, 4)".
std::string DescribeIntervention(const latentd::v1::LatentIntervention& intervention);

// The answer for a terminal: the interventions, each latent's values over the prompt, the next
// token's predictions of both runs side by side with the KL and the largest changes, the
// prompt's loss, a sweep's runs (a line per value: KL, top next token, continuation), and both
// continuations. Tokens as text with a vocabulary, else as ids.
std::string DescribeSteering(uint64_t dataset_id, const latentd::v1::SteerPromptRequest& request,
                             const latentd::v1::SteerPromptResponse& response,
                             const std::optional<Vocabulary>& vocab);

// The answer for a terminal: the metric, the latents' and the error term's totals, per position,
// the top latents (summed over positions) and the top entries, largest first.
std::string DescribeAttribution(uint64_t dataset_id,
                                const latentd::v1::AttributePromptResponse& response,
                                const std::optional<Vocabulary>& vocab);

// What a graph's latents are known for, e.g. the tokens each fires on most over its dataset
// (latentctl graph asks GetLatent): a short label per (dataset id, latent), shown with the node.
using GraphNodeLabels = std::map<std::pair<uint64_t, int32_t>, std::string>;

// Node n's latent as (its hook's dataset id, latent); nullopt for the output, an error node or
// an index out of range.
std::optional<std::pair<uint64_t, int32_t>> GraphNodeLatent(
    const latentd::v1::AttributionGraphResponse& graph, int n);

// Node n's label from `labels` (may be null): empty for the output, an error node or a latent
// without one.
std::string GraphNodeLabel(const latentd::v1::AttributionGraphResponse& graph, int n,
                           const GraphNodeLabels* labels);

// Where node n's page is: `pattern` with {dataset} and {latent} replaced, e.g.
// "board-{dataset}/latent-{latent}.html" for the pages `latentctl dashboard` writes; empty for
// the output, an error node or an empty pattern.
std::string GraphNodeLink(const latentd::v1::AttributionGraphResponse& graph, int n,
                          const std::string& pattern);

// Where the output's share reaching a hook goes, in words: "4 kept nodes: 61% of what reaches
// the hook; SAE error 27%, not kept 12%"; empty for a hook without edges.
std::string HookCoverageText(const latentd::v1::GraphHook& hook);

// The ablation check of an AttributePrompt answer in a line: for the top entries with an
// ablated_change, in how many the measured change has the sign of minus the credit, the median
// of measured over minus the credit, and (three or more) their correlation; empty without any.
std::string AblationSummary(const latentd::v1::AttributePromptResponse& response);

// The same over an AttributionGraph answer's checked edges ("ablation check of 24 edges: ..."),
// without the correlation (edges into different children measure different units).
std::string GraphAblationSummary(const latentd::v1::AttributionGraphResponse& graph);

// With the graph's circuit check: "the graph's 9 latents taken out together move the metric by
// +0.02305 (-7.0457 -> -7.0226)"; empty without one.
std::string CircuitAblationText(const latentd::v1::AttributionGraphResponse& graph);

// An AttributionGraph answer for a terminal: the metric, then per hook (latest first) what its
// kept nodes cover and its nodes with their importance, label and strongest edges towards the
// output, then the notes.
std::string DescribeAttributionGraph(const latentd::v1::AttributionGraphResponse& graph,
                                     const std::optional<Vocabulary>& vocab,
                                     const GraphNodeLabels* labels = nullptr);

// The same graph as Graphviz DOT (`dot -Tsvg graph.dot`, or an editor): a cluster per hook, left
// to right towards the output, labelled with its coverage; each node labelled with its latent,
// position, token, importance and label; each edge blue (for) or red (against), its width its
// share of the strongest edge into the same node, its label the attribution; with
// `link_pattern`, each latent's URL its page (GraphNodeLink).
std::string AttributionGraphDot(const latentd::v1::AttributionGraphResponse& graph,
                                const std::optional<Vocabulary>& vocab,
                                const GraphNodeLabels* labels = nullptr,
                                const std::string& link_pattern = "");

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_STEER_VIEW_H_
