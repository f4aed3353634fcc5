#include "client/steer_view.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace latentd::client {
namespace {

namespace v1 = latentd::v1;

// A run of tokens as one string: their text joined (what the model wrote), or ids.
std::string Tokens(const google::protobuf::RepeatedField<int32_t>& ids,
                   const std::optional<Vocabulary>& vocab) {
  if (!vocab) return absl::StrJoin(ids, " ");
  std::string text;
  for (int32_t id : ids) text += vocab->Display(id);
  return absl::StrCat("\"", text, "\"");
}

}  // namespace

absl::StatusOr<std::vector<v1::LatentIntervention>> ParseInterventions(const std::string& flag) {
  std::vector<v1::LatentIntervention> out;
  for (absl::string_view item : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("--intervene: '", item, "': ", why,
                       " (LATENT:set=V, LATENT:add=V or LATENT:scale=V, "
                       "then @P+P... for positions)"));
    };
    const std::vector<absl::string_view> at = absl::StrSplit(item, absl::MaxSplits('@', 1));
    const std::vector<absl::string_view> latent_mode =
        absl::StrSplit(at[0], absl::MaxSplits(':', 1));
    if (latent_mode.size() != 2) return bad("no ':' after the latent");
    v1::LatentIntervention& in = out.emplace_back();
    int32_t latent = 0;
    if (!absl::SimpleAtoi(latent_mode[0], &latent) || latent < 0) return bad("not a latent number");
    in.set_latent(latent);
    const std::vector<absl::string_view> mode_value = absl::StrSplit(latent_mode[1], '=');
    if (mode_value.size() != 2) return bad("no '=' and value");
    if (mode_value[0] == "set") {
      in.set_mode(v1::LatentIntervention::SET);
    } else if (mode_value[0] == "add") {
      in.set_mode(v1::LatentIntervention::ADD);
    } else if (mode_value[0] == "scale") {
      in.set_mode(v1::LatentIntervention::SCALE);
    } else {
      return bad(absl::StrCat("unknown mode '", mode_value[0], "'"));
    }
    float value = 0;
    if (!absl::SimpleAtof(mode_value[1], &value) || !std::isfinite(value)) {
      return bad("the value is not a finite number");
    }
    in.set_value(value);
    if (at.size() == 2) {
      for (absl::string_view p : absl::StrSplit(at[1], '+')) {
        int32_t position = 0;
        if (!absl::SimpleAtoi(p, &position) || position < 0) {
          return bad(absl::StrCat("'", p, "' is not a position"));
        }
        in.add_positions(position);
      }
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("--intervene: names no latent");
  return out;
}

std::string DescribeIntervention(const v1::LatentIntervention& in) {
  std::string mode = absl::AsciiStrToLower(v1::LatentIntervention::Mode_Name(in.mode()));
  const std::string where =
      in.positions().empty() ? "every position"
                             : absl::StrCat(in.positions_size() == 1 ? "position " : "positions ",
                                            absl::StrJoin(in.positions(), ", "));
  return absl::StrFormat("latent %d %s %g (%s)", in.latent(), mode, in.value(), where);
}

std::string DescribeSteering(uint64_t dataset_id, const v1::SteerPromptRequest& request,
                             const v1::SteerPromptResponse& r,
                             const std::optional<Vocabulary>& vocab) {
  std::string out =
      absl::StrFormat("dataset %d: a prompt of %d tokens%s\n", dataset_id, r.prompt_size(),
                      r.bos_prepended() ? " (BOS prepended, as the dataset's spec did)" : "");
  if (request.has_crosscoder_source()) {
    absl::StrAppendFormat(
        &out,
        "run by the crosscoder's source %d's model, each latent changed along its decoder's "
        "block for that model (%s)\n",
        request.crosscoder_source(),
        r.latent_values().empty()
            ? "added without its value: the other models could not run beside it"
            : "its value from every model, the others run beside it");
  }
  for (const v1::LatentIntervention& in : request.interventions()) {
    absl::StrAppend(&out, "  ", DescribeIntervention(in), "\n");
  }
  for (const v1::LatentValues& values : r.latent_values()) {
    std::vector<std::string> cells;
    for (int p = 0; p < values.values_size() && p < r.prompt_size(); ++p) {
      cells.push_back(absl::StrFormat("%s %.3g", TokenCell(r.prompt(p), vocab), values.values(p)));
    }
    absl::StrAppend(&out, "latent ", values.latent(),
                    " on the prompt: ", absl::StrJoin(cells, " | "), "\n");
  }
  absl::StrAppendFormat(&out, "\nnext token after the prompt: KL(clean || steered) %.4g nats\n",
                        r.kl_divergence());
  absl::StrAppendFormat(&out, "  %-30s %s\n", "CLEAN", "STEERED");
  const int rows = std::max(r.clean().next_size(), r.steered().next_size());
  for (int i = 0; i < rows; ++i) {
    auto cell = [&](const v1::SteeredRun& run) {
      return i < run.next_size() ? absl::StrFormat("%.4f %s", run.next(i).probability(),
                                                   TokenCell(run.next(i).token_id(), vocab))
                                 : std::string();
    };
    absl::StrAppendFormat(&out, "  %-30s %s\n", cell(r.clean()), cell(r.steered()));
  }
  for (const auto& [name, changes] :
       {std::pair{"rose most", &r.most_increased()}, std::pair{"fell most", &r.most_decreased()}}) {
    if (changes->empty()) continue;
    std::vector<std::string> cells;
    for (const v1::NextTokenChange& c : *changes) {
      cells.push_back(absl::StrFormat("%s %.4f -> %.4f", TokenCell(c.token_id(), vocab),
                                      c.clean_probability(), c.steered_probability()));
    }
    absl::StrAppend(&out, "  ", name, ": ", absl::StrJoin(cells, ", "), "\n");
  }
  if (r.clean().token_losses_size() > 0) {
    absl::StrAppendFormat(
        &out, "\nloss over the prompt (nats a token): clean %.4f, steered %.4f (%+.4f)\n",
        r.clean().mean_loss(), r.steered().mean_loss(),
        r.steered().mean_loss() - r.clean().mean_loss());
  }
  if (r.sweep_size() > 0 && request.interventions_size() > 0) {
    const v1::LatentIntervention& first = request.interventions(0);
    absl::StrAppendFormat(&out, "\nsweep of latent %d %s:\n  %-10s %-10s %-24s %s\n",
                          first.latent(),
                          absl::AsciiStrToLower(v1::LatentIntervention::Mode_Name(first.mode())),
                          "VALUE", "KL", "NEXT", "CONTINUATION");
    for (const v1::SweptRun& swept : r.sweep()) {
      const std::string next =
          swept.run().next_size() > 0
              ? absl::StrFormat("%.4f %s", swept.run().next(0).probability(),
                                TokenCell(swept.run().next(0).token_id(), vocab))
              : "";
      absl::StrAppendFormat(&out, "  %-10g %-10.4g %-24s %s\n", swept.value(),
                            swept.kl_divergence(), next, Tokens(swept.run().generated(), vocab));
    }
  }
  if (r.clean().generated_size() > 0) {
    const std::string how =
        request.temperature() > 0
            ? absl::StrFormat("sampled at temperature %g, seed %d, the same draws for both",
                              request.temperature(), request.seed())
            : "greedy";
    absl::StrAppendFormat(&out, "\ncontinuation (%d tokens, %s):\n  clean:   %s\n  steered: %s\n",
                          r.clean().generated_size(), how, Tokens(r.clean().generated(), vocab),
                          Tokens(r.steered().generated(), vocab));
  }
  return out;
}

absl::StatusOr<v1::AttributionTarget> ParseTargetLatent(const std::string& flag) {
  const std::vector<absl::string_view> at = absl::StrSplit(flag, absl::MaxSplits('@', 1));
  const std::vector<absl::string_view> dataset_latent =
      absl::StrSplit(at[0], absl::MaxSplits(':', 1));
  uint64_t dataset = 0;
  int32_t latent = 0, position = 0;
  if (at.size() != 2 || dataset_latent.size() != 2 ||
      !absl::SimpleAtoi(dataset_latent[0], &dataset) ||
      !absl::SimpleAtoi(dataset_latent[1], &latent) || latent < 0 ||
      !absl::SimpleAtoi(at[1], &position) || position < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--target_latent: '", flag, "' is not DATASET:LATENT@POSITION (e.g. 3:120@7)"));
  }
  v1::AttributionTarget target;
  target.set_dataset_id(dataset);
  target.set_latent(latent);
  target.set_position(position);
  return target;
}

absl::StatusOr<std::vector<v1::DatasetInterventions>> ParseMoreInterventions(
    const std::string& flag) {
  std::vector<v1::DatasetInterventions> out;
  for (absl::string_view part : absl::StrSplit(flag, ';', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> halves = absl::StrSplit(part, absl::MaxSplits('=', 1));
    uint64_t dataset = 0;
    if (halves.size() != 2 || !absl::SimpleAtoi(halves[0], &dataset)) {
      return absl::InvalidArgumentError(absl::StrCat("--more_interventions: '", part,
                                                     "' is not DATASET=ITEMS (e.g. 3=40:set=0@3)"));
    }
    auto items = ParseInterventions(std::string(halves[1]));
    if (!items.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--more_interventions: dataset ", dataset, ": ", items.status().message()));
    }
    v1::DatasetInterventions& d = out.emplace_back();
    d.set_dataset_id(dataset);
    d.mutable_interventions()->Assign(items->begin(), items->end());
  }
  return out;
}

std::string AttributionMetric(const v1::AttributePromptResponse& r,
                              const std::optional<Vocabulary>& vocab) {
  if (r.has_target_latent()) {
    const v1::AttributionTarget& t = r.target_latent();
    return absl::StrFormat("latent %d of dataset %d at position %d%s", t.latent(), t.dataset_id(),
                           t.position(),
                           t.position() < r.prompt_size()
                               ? absl::StrCat(" (", TokenCell(r.prompt(t.position()), vocab), ")")
                               : "");
  }
  return r.has_contrast_token_id()
             ? absl::StrFormat("logit(%s) - logit(%s)", TokenCell(r.target_token_id(), vocab),
                               TokenCell(r.contrast_token_id(), vocab))
             : absl::StrFormat("log p(%s)", TokenCell(r.target_token_id(), vocab));
}

std::string DescribeAttribution(uint64_t dataset_id, const v1::AttributePromptResponse& r,
                                const std::optional<Vocabulary>& vocab) {
  const std::string metric = AttributionMetric(r, vocab);
  std::string out = absl::StrFormat(
      "dataset %d: a prompt of %d tokens%s\nmetric %s = %.4f\n"
      "contributions to first order (removing one moves the metric by about minus it): the "
      "latents %+.4f, the SAE's error term %+.4f\n",
      dataset_id, r.prompt_size(),
      r.bos_prepended() ? " (BOS prepended, as the dataset's spec did)" : "", metric, r.metric(),
      r.latent_attribution(), r.error_attribution());
  absl::StrAppendFormat(&out, "\n  %-4s %-20s %-10s %s\n", "POS", "TOKEN", "LATENTS", "ERROR");
  for (int p = 0; p < r.prompt_size(); ++p) {
    absl::StrAppendFormat(&out, "  %-4d %-20s %-10s %s\n", p, TokenCell(r.prompt(p), vocab),
                          p < r.latent_attribution_by_position_size()
                              ? absl::StrFormat("%+.4f", r.latent_attribution_by_position(p))
                              : "",
                          p < r.error_attribution_by_position_size()
                              ? absl::StrFormat("%+.4f", r.error_attribution_by_position(p))
                              : "");
  }
  absl::StrAppendFormat(&out, "\nlatents, summed over positions:\n  %-8s %-12s %s\n", "LATENT",
                        "ATTRIBUTION", "LARGEST AT (value)");
  for (const v1::LatentAttribution& l : r.top_latents()) {
    absl::StrAppendFormat(
        &out, "  %-8d %-+12.4f %d %s (%.3g)\n", l.latent(), l.attribution(), l.position(),
        l.position() < r.prompt_size() ? TokenCell(r.prompt(l.position()), vocab) : "",
        l.activation());
  }
  int checked = 0;
  for (const v1::LatentAttribution& e : r.top_entries()) checked += e.has_ablated_change();
  absl::StrAppendFormat(&out, "\nentries:\n  %-8s %-4s %-20s %-10s %-12s%s\n", "LATENT", "POS",
                        "TOKEN", "VALUE", "ATTRIBUTION", checked > 0 ? " ABLATED (measured)" : "");
  for (const v1::LatentAttribution& e : r.top_entries()) {
    absl::StrAppendFormat(
        &out, "  %-8d %-4d %-20s %-10.4g %-+12.4f%s\n", e.latent(), e.position(),
        e.position() < r.prompt_size() ? TokenCell(r.prompt(e.position()), vocab) : "",
        e.activation(), e.attribution(),
        e.has_ablated_change() ? absl::StrFormat(" %+.4f", e.ablated_change()) : "");
  }
  if (checked > 0) absl::StrAppend(&out, "\n", AblationSummary(r), "\n");
  return out;
}

namespace {

// `checked` (e.g. "the top 8 entries") against (first-order prediction, measured change) pairs:
// how often the signs agree, the median of measured over predicted (1 where first order holds;
// free of the pairs' units) and, with `correlation` and three or more pairs in one unit, their
// correlation; empty without pairs.
std::string AgreementLine(const std::string& checked,
                          const std::vector<std::pair<double, double>>& pairs, bool correlation) {
  if (pairs.empty()) return "";
  int agree = 0;
  double mx = 0, my = 0;
  for (const auto& [x, y] : pairs) {
    agree += (x > 0) == (y > 0);
    mx += x / pairs.size();
    my += y / pairs.size();
  }
  double sxy = 0, sxx = 0, syy = 0;
  for (const auto& [x, y] : pairs) {
    sxy += (x - mx) * (y - my);
    sxx += (x - mx) * (x - mx);
    syy += (y - my) * (y - my);
  }
  std::string out = absl::StrFormat(
      "ablation check of %s: the measured change has the sign the credit predicts for %d of "
      "them",
      checked, agree);
  std::vector<double> ratios;
  for (const auto& [x, y] : pairs) {
    if (x != 0) ratios.push_back(y / x);
  }
  if (!ratios.empty()) {
    std::nth_element(ratios.begin(), ratios.begin() + ratios.size() / 2, ratios.end());
    absl::StrAppendFormat(&out, "; measured / predicted, median %.3g", ratios[ratios.size() / 2]);
  }
  if (correlation && pairs.size() >= 3 && sxx > 0 && syy > 0) {
    absl::StrAppendFormat(&out, "; correlation with minus the credit %.3f",
                          sxy / std::sqrt(sxx * syy));
  }
  return out;
}

}  // namespace

std::string AblationSummary(const v1::AttributePromptResponse& r) {
  // Each checked entry's measured change beside its first-order prediction, minus its credit.
  std::vector<std::pair<double, double>> pairs;
  for (const v1::LatentAttribution& e : r.top_entries()) {
    if (e.has_ablated_change()) pairs.emplace_back(-e.attribution(), e.ablated_change());
  }
  return AgreementLine(absl::StrCat("the top ", pairs.size(), " entries"), pairs,
                       /*correlation=*/true);
}

std::string CircuitAblationText(const v1::AttributionGraphResponse& g) {
  if (!g.has_circuit_ablated_change()) return "";
  const double metric = g.output().metric();
  return absl::StrFormat(
      "the graph's %d latents taken out together move the metric by %+.4g (%.4f -> %.4f)",
      g.circuit_latents(), g.circuit_ablated_change(), metric, metric + g.circuit_ablated_change());
}

std::string GraphAblationSummary(const v1::AttributionGraphResponse& g) {
  std::vector<std::pair<double, double>> pairs;
  for (const v1::GraphEdge& e : g.edges()) {
    if (e.has_ablated_change()) pairs.emplace_back(-e.attribution(), e.ablated_change());
  }
  // (Edges into different children measure different units: no correlation across them.)
  return AgreementLine(absl::StrCat(pairs.size(), " edges"), pairs, /*correlation=*/false);
}

std::optional<std::pair<uint64_t, int32_t>> GraphNodeLatent(const v1::AttributionGraphResponse& g,
                                                            int n) {
  if (n <= 0 || n >= g.nodes_size()) return std::nullopt;
  const v1::GraphNode& node = g.nodes(n);
  if (node.latent() < 0 || node.hook() < 0 || node.hook() >= g.hooks_size()) return std::nullopt;
  return std::pair{g.hooks(node.hook()).dataset_id(), node.latent()};
}

std::string GraphNodeLabel(const v1::AttributionGraphResponse& g, int n,
                           const GraphNodeLabels* labels) {
  const auto latent = GraphNodeLatent(g, n);
  if (labels == nullptr || !latent) return "";
  auto it = labels->find(*latent);
  return it == labels->end() ? "" : it->second;
}

std::string GraphNodeLink(const v1::AttributionGraphResponse& g, int n,
                          const std::string& pattern) {
  const auto latent = GraphNodeLatent(g, n);
  if (pattern.empty() || !latent) return "";
  return absl::StrReplaceAll(pattern, {{"{dataset}", absl::StrCat(latent->first)},
                                       {"{latent}", absl::StrCat(latent->second)}});
}

std::string HookCoverageText(const v1::GraphHook& hook) {
  const double total = hook.kept_importance() + hook.error_importance() + hook.dropped_importance();
  if (total <= 0) return "";
  return absl::StrFormat(
      "%d kept node%s: %.0f%% of what reaches the hook; SAE error %.0f%%, not kept %.0f%%",
      hook.kept_nodes(), hook.kept_nodes() == 1 ? "" : "s", 100 * hook.kept_importance() / total,
      100 * hook.error_importance() / total, 100 * hook.dropped_importance() / total);
}

std::string DescribeAttributionGraph(const v1::AttributionGraphResponse& g,
                                     const std::optional<Vocabulary>& vocab,
                                     const GraphNodeLabels* labels) {
  const v1::AttributePromptResponse& o = g.output();
  std::string out = absl::StrFormat(
      "attribution graph of %s = %.4f over %d hooks\n(importance: the share of the output that "
      "flows through a node, along the edges' |attribution|)\n",
      AttributionMetric(o, vocab), o.metric(), g.hooks_size());
  // Each node's edges towards the output, strongest first.
  std::vector<std::vector<const v1::GraphEdge*>> out_edges(g.nodes_size());
  for (const v1::GraphEdge& e : g.edges()) {
    if (e.from_node() >= 0 && e.from_node() < g.nodes_size() && e.to_node() >= 0 &&
        e.to_node() < g.nodes_size()) {
      out_edges[e.from_node()].push_back(&e);
    }
  }
  for (int hook = g.hooks_size() - 1; hook >= 0; --hook) {
    absl::StrAppendFormat(&out, "\n%s (dataset %d):\n", g.hooks(hook).hook_name(),
                          g.hooks(hook).dataset_id());
    if (std::string coverage = HookCoverageText(g.hooks(hook)); !coverage.empty()) {
      absl::StrAppend(&out, "  (", coverage, ")\n");
    }
    for (int n = 0; n < g.nodes_size(); ++n) {
      const v1::GraphNode& node = g.nodes(n);
      if (node.hook() != hook) continue;
      std::vector<const v1::GraphEdge*>& edges = out_edges[n];
      std::sort(edges.begin(), edges.end(), [](const v1::GraphEdge* a, const v1::GraphEdge* b) {
        return std::abs(a->attribution()) > std::abs(b->attribution());
      });
      std::vector<std::string> to;
      for (const v1::GraphEdge* e : edges) {
        if (to.size() == 4) break;
        const v1::GraphNode& child = g.nodes(e->to_node());
        to.push_back(absl::StrFormat(
            "%s %+.3g%s",
            e->to_node() == 0 ? "output"
                              : absl::StrFormat("#%d@%d", child.latent(), child.position()),
            e->attribution(),
            e->has_ablated_change() ? absl::StrFormat(" (ablated %+.3g)", e->ablated_change())
                                    : ""));
      }
      const std::string what =
          node.latent() < 0
              ? "error"
              : absl::StrFormat(
                    "#%d @%d %s (%.3g)", node.latent(), node.position(),
                    TokenCell(node.position() < o.prompt_size() ? o.prompt(node.position()) : -1,
                              vocab),
                    node.activation());
      absl::StrAppendFormat(&out, "  %-36s importance %.3f  -> %s\n", what, node.importance(),
                            absl::StrJoin(to, ", "));
      if (std::string label = GraphNodeLabel(g, n, labels); !label.empty()) {
        absl::StrAppend(&out, "      fires most on ", label, "\n");
      }
    }
  }
  if (std::string checked = GraphAblationSummary(g); !checked.empty()) {
    absl::StrAppend(&out, "\n", checked, "\n");
  }
  if (std::string circuit = CircuitAblationText(g); !circuit.empty()) {
    absl::StrAppend(&out, circuit, "\n");
  }
  for (const std::string& note : g.notes()) absl::StrAppend(&out, "\nnote: ", note, "\n");
  return out;
}

namespace {

// Text inside a DOT string: quotes and backslashes escaped, one line.
std::string DotText(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c == '\n' ? ' ' : c);
  }
  return out;
}

}  // namespace

std::string AttributionGraphDot(const v1::AttributionGraphResponse& g,
                                const std::optional<Vocabulary>& vocab,
                                const GraphNodeLabels* labels, const std::string& link_pattern) {
  const v1::AttributePromptResponse& o = g.output();
  std::string out = "digraph attribution {\n  rankdir=LR;\n  node [shape=box, style=rounded];\n";
  absl::StrAppendFormat(&out, "  n0 [label=\"output\\n%s = %.4g\"];\n",
                        DotText(AttributionMetric(o, vocab)), o.metric());
  for (int hook = 0; hook < g.hooks_size(); ++hook) {
    std::string coverage = HookCoverageText(g.hooks(hook));
    if (!coverage.empty()) coverage = absl::StrCat("\\n", DotText(coverage));
    absl::StrAppendFormat(&out, "  subgraph cluster_%d {\n    label=\"%s (dataset %d)%s\";\n", hook,
                          DotText(g.hooks(hook).hook_name()), g.hooks(hook).dataset_id(), coverage);
    for (int n = 1; n < g.nodes_size(); ++n) {
      const v1::GraphNode& node = g.nodes(n);
      if (node.hook() != hook) continue;
      const std::string what =
          node.latent() < 0
              ? std::string("SAE error")
              : absl::StrFormat(
                    "#%d @%d\\n%s = %.3g", node.latent(), node.position(),
                    DotText(TokenCell(
                        node.position() < o.prompt_size() ? o.prompt(node.position()) : -1, vocab)),
                    node.activation());
      std::string label = GraphNodeLabel(g, n, labels);
      if (!label.empty()) label = absl::StrCat("\\n", DotText(label));
      std::string link = GraphNodeLink(g, n, link_pattern);
      if (!link.empty()) link = absl::StrCat(", URL=\"", DotText(link), "\"");
      absl::StrAppendFormat(&out, "    n%d [label=\"%s\\nimportance %.3f%s\"%s];\n", n, what,
                            node.importance(), label, link);
    }
    out += "  }\n";
  }
  std::vector<double> strongest_into(g.nodes_size(), 0.0);
  auto valid = [&](int n) { return n >= 0 && n < g.nodes_size(); };
  for (const v1::GraphEdge& e : g.edges()) {
    if (valid(e.to_node())) {
      strongest_into[e.to_node()] =
          std::max(strongest_into[e.to_node()], std::abs(e.attribution()));
    }
  }
  for (const v1::GraphEdge& e : g.edges()) {
    if (!valid(e.from_node()) || !valid(e.to_node())) continue;
    const double into = strongest_into[e.to_node()];
    absl::StrAppendFormat(
        &out, "  n%d -> n%d [color=\"%s\", penwidth=%.2f, label=\"%+.3g%s\"];\n", e.from_node(),
        e.to_node(), e.attribution() >= 0 ? "#0066ff" : "#ff3300",
        0.5 + 4 * (into > 0 ? std::abs(e.attribution()) / into : 0.0), e.attribution(),
        e.has_ablated_change() ? absl::StrFormat(" (ablated %+.3g)", e.ablated_change()) : "");
  }
  out += "}\n";
  return out;
}

}  // namespace latentd::client
