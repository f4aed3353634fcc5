// How latentctl shows a latent's examples to a person: as text on one terminal line, or as a
// self-contained HTML page where every token is shaded by the latent's value on it (what
// SAEDashboard and Neuronpedia draw), from one GetLatent answer.
#ifndef LATENTD_CLIENT_LATENT_VIEW_H_
#define LATENTD_CLIENT_LATENT_VIEW_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "client/steer_view.h"
#include "client/vocabulary.h"
#include "proto/latentd/v1/datasets.pb.h"

namespace latentd::client {

// The example's window as one line: each token as `vocab` decodes it (Printable, so one line),
// the example's own token between « and ». Without a vocabulary, the ids separated by spaces
// with the example's own in «».
std::string ContextLine(const v1::TopActivation& example, const Vocabulary* vocab);

struct LatentPageOptions {
  uint64_t dataset_id = 0;
  // Decodes the tokens; null shows token ids.
  const Vocabulary* vocab = nullptr;
  // The response's top list holds one row per sequence (GetLatentRequest.distinct_sequences):
  // only the heading says so.
  bool distinct_sequences = false;
  // The latents firing on the rows where this one fires (LatentsOnRows with_latent), ranked by
  // count, shown as a table under the examples; null: no such section.
  const v1::LatentsOnRowsResponse* cofiring = nullptr;
  // The same question asked of other datasets over the same rows (LatentsOnRows in_dataset_id:
  // other hooks of the same EXTRACT job), ranked by F1 (BY_F1: this latent's counterparts
  // there first): a table each, under its heading. Their latents are not linked (their pages
  // belong to other dashboards).
  struct CofiringElsewhere {
    std::string heading;  // plain text, e.g. "dataset 3 (blocks.1.hook_resid_post)"
    const v1::LatentsOnRowsResponse* cofiring = nullptr;
  };
  std::vector<CofiringElsewhere> cofiring_elsewhere;
  // What the latent's weights say (GetLatentWeights): the logits its decoder direction raises
  // and lowers most, side by side, and its nearest decoder directions; null: no such section.
  const v1::GetLatentWeightsResponse* weights = nullptr;
  // The page is one of a dashboard's (latentctl dashboard): it links to index.html beside it.
  bool in_dashboard = false;
  // A link back to the page that led here, e.g. {"../../graph.html", "the attribution graph"}
  // for a graph's node pages (latentctl graph --node_pages); an empty href: none.
  std::string back_href, back_text;
  // The latents whose pages lie beside this one (LatentPageName): their numbers become links;
  // null: none.
  const std::set<int32_t>* linked_latents = nullptr;
};

// A whole HTML page (no scripts, no external resources): the latent's statistics, its value
// histogram as inline SVG, then the top examples and each interval's samples. A token's
// background is the latent's value on it over the latent's max (from context_values; the
// example's own token alone in an answer without them, from a daemon that predates them), its
// tooltip the row, id and value.
std::string LatentHtml(const v1::GetLatentResponse& response, const LatentPageOptions& options);

// An explanation as one line: its text, then its score and source when it has them: `French
// words (score 0.8, delphi)`.
std::string ExplanationLine(const v1::LatentExplanation& explanation);

// A crosscoder latent's decoder by source (GetLatentWeightsResponse.decoder_by_source), a line
// each: "source 1 blocks.1.hook_resid_post  |W_dec| 1.41  share 0.92 ##################   cos
// with source 0 0.050" (the bar is the share, 20 characters at 1). Empty for other SAEs.
std::vector<std::string> DescribeDecoderBySource(const v1::GetLatentWeightsResponse& weights);

// The file name of a latent's page in a dashboard directory: "latent-<j>.html".
std::string LatentPageName(int32_t latent);

struct PromptPageOptions {
  uint64_t dataset_id = 0;
  // Decodes the tokens; null shows token ids.
  const Vocabulary* vocab = nullptr;
  // The latents whose pages (LatentPageName) lie beside the page: their numbers become links.
  const std::set<int32_t>* linked_latents = nullptr;
};

// A page for one EncodePrompt answer: the prompt (each token's largest latents in its tooltip),
// then a line per top latent with the prompt's tokens shaded by that latent's value on each (from
// the tokens' latent lists: ask latents_per_token large enough to hold every active latent, else
// a token where it ranks lower shows unshaded), its largest outlined.
std::string PromptHtml(const v1::EncodePromptResponse& response, const PromptPageOptions& options);

// A page for one AttributePrompt answer: the metric and the totals; the prompt with each token
// shaded by the attribution at its position (blue for the metric, red against it; the latents'
// and the error term's parts in its tooltip); then a line per top latent with the tokens
// shaded by its entries' attributions (from top_entries: ask `top` large enough to hold them,
// else its smaller entries show unshaded).
std::string AttributionHtml(const v1::AttributePromptResponse& response,
                            const PromptPageOptions& options);

// A page for one SteerPrompt answer (`request` the query that got it): the interventions and
// the KL; the prompt with each token shaded by how much better (blue) or worse (red) the steered
// run predicts it than the clean one; each intervened latent's values over the prompt (where an
// intervention applies outlined); the next token's predictions of both runs side by side and
// the largest rises and falls; both continuations, the steered tokens that differ from the
// clean run's outlined; for a sweep, the KL against the value as an SVG plot and a row per run.
std::string SteeringHtml(const v1::SteerPromptRequest& request,
                         const v1::SteerPromptResponse& response, const PromptPageOptions& options);

// A page for an AttributionGraph answer: the metric and the prompt, then the graph as SVG, one
// column per hook (earliest left, under its name what its kept nodes cover) and the output on
// the right, each node a latent at a position (its token, value, importance and label from
// `labels`, which may be null; shaded by importance over the largest), each edge coloured by
// sign (blue for, red against) and as wide as its |attribution| over the strongest into the
// same node, its figures in its tooltip; the notes under it. With `link_pattern` each latent's
// box links to its page (GraphNodeLink), e.g. its dashboard.
std::string AttributionGraphHtml(const v1::AttributionGraphResponse& graph, const Vocabulary* vocab,
                                 const GraphNodeLabels* labels = nullptr,
                                 const std::string& link_pattern = "");

struct IndexPageOptions {
  uint64_t dataset_id = 0;
  // Above the table: what the listed latents are (e.g. "the 100 most frequent latents").
  std::string heading;
  // Latent numbers link to their pages (LatentPageName) beside the index.
  bool link_pages = false;
  // Per latent, the tokens it fires on most (GetLatent top_tokens), shown in a last column so
  // that the index alone tells e.g. a " the" latent; latents without an entry show none.
  const std::map<int32_t, std::vector<v1::TokenCount>>* top_tokens = nullptr;
  // Decodes those tokens; null shows ids.
  const Vocabulary* vocab = nullptr;
  // How well the SAE reconstructs the rows (DatasetInfo.fit), under the heading; null or no
  // rows: not shown.
  const v1::SaeFit* fit = nullptr;
  // Per latent, what was written about it (SearchExplanations), in a column after the tokens;
  // null: no column.
  const std::map<int32_t, v1::LatentExplanation>* explanations = nullptr;
};

// A dashboard's index page: rows, dead latents, the SAE's fit, the log10 feature-density
// histogram (SVG), then the listed latents as a table (firings, density, mean, max).
std::string LatentIndexHtml(const v1::ListLatentsResponse& overview,
                            const IndexPageOptions& options);

// One latent's examples as one line of JSON (JSON Lines), the input auto-interpretation tools
// (delphi-style explainers and scorers) read: {"dataset_id", "latent", "firing_count",
// "density", "mean", "max", "top": [...], "intervals": [{"low", "high", "count", "examples"}],
// "silent": [...], and when it has one "explanation": {"text", "source", "score"}}, each example
// {"row", "value", "token_ids", "values"} and, with a vocabulary, "tokens" (each token's text). No
// trailing newline.
std::string LatentExamplesJson(const v1::GetLatentResponse& response, uint64_t dataset_id,
                               const Vocabulary* vocab);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_LATENT_VIEW_H_
