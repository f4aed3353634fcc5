#include "client/latent_view.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/steer_view.h"

namespace latentd::client {
namespace {

std::string TokenText(int32_t id, const Vocabulary* vocab) {
  return vocab != nullptr ? vocab->Display(id) : absl::StrCat(id);
}

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// The latent's value on the window's i-th token: context_values when the answer carries them
// (a daemon older than them does not), else the example's own value on its row, 0 elsewhere.
float ValueAt(const v1::TopActivation& example, int i) {
  if (example.context_values_size() == example.context_token_ids_size()) {
    return example.context_values(i);
  }
  return example.context_start_row() + i == example.row() ? example.value() : 0.0f;
}

// One token shaded by value / max (outlined when `at`), `where` and its id and value in the
// tooltip.
void AppendToken(int32_t id, float value, double max, bool at, const std::string& where,
                 const Vocabulary* vocab, std::string* html) {
  const double alpha = max > 0 ? std::clamp(value / max, 0.0, 1.0) : 0.0;
  std::string text = HtmlEscape(TokenText(id, vocab));
  if (vocab == nullptr) text = absl::StrCat(" ", text);  // ids need a gap; text has its own
  absl::StrAppendFormat(html,
                        "<span class=\"t%s\" style=\"background:rgba(255,102,0,%.3f)\" "
                        "title=\"%s &middot; token %d &middot; value %.4g\">%s</span>",
                        at ? " at" : "", alpha, where, id, value, text);
}

// One example: its value and row, then the window's tokens, each shaded by value / max.
void AppendExample(const v1::TopActivation& example, double max, const Vocabulary* vocab,
                   std::string* html) {
  absl::StrAppendFormat(html, "<div class=\"ex\"><span class=\"v\">%.4g</span>", example.value());
  absl::StrAppendFormat(html, "<span class=\"r\">row %d</span><span class=\"ctx\">", example.row());
  for (int i = 0; i < example.context_token_ids_size(); ++i) {
    const int64_t row = example.context_start_row() + i;
    AppendToken(example.context_token_ids(i), ValueAt(example, i), max, row == example.row(),
                absl::StrCat("row ", row), vocab, html);
  }
  *html += "</span></div>\n";
}

// Equal-width bins over [lo, hi] as SVG bars, lo and hi under the axis, each bar's range and
// count in its tooltip.
void AppendBars(const google::protobuf::RepeatedField<int64_t>& counts, double lo, double hi,
                const char* label, const char* color, std::string* html) {
  if (counts.empty()) return;
  int64_t peak = 1;
  for (int64_t c : counts) peak = std::max(peak, c);
  const int bar = std::max(3, 600 / counts.size()), height = 120;
  const int width = bar * counts.size();
  absl::StrAppendFormat(html,
                        "<svg class=\"hist\" width=\"%d\" height=\"%d\" "
                        "viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"%s\">",
                        width, height + 18, width, height + 18, label);
  const double bin = (hi - lo) / counts.size();
  for (int b = 0; b < counts.size(); ++b) {
    const int h = static_cast<int>(std::lround(static_cast<double>(height) * counts[b] / peak));
    absl::StrAppendFormat(html,
                          "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\">"
                          "<title>[%.4g, %.4g): %d</title></rect>",
                          b * bar + 1, height - h, bar - 2, h, color, lo + bin * b,
                          lo + bin * (b + 1), counts[b]);
  }
  absl::StrAppendFormat(html, "<line x1=\"0\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>",
                        height, width, height);
  absl::StrAppendFormat(html,
                        "<text x=\"0\" y=\"%d\">%.4g</text><text x=\"%d\" y=\"%d\" "
                        "text-anchor=\"end\">%.4g</text></svg>\n",
                        height + 14, lo, width, height + 14, hi);
}

// A latent's number, a link to its page when the pages are siblings.
std::string LatentRef(int32_t latent, bool link) {
  return link ? absl::StrFormat("<a href=\"%s\">%d</a>", LatentPageName(latent), latent)
              : absl::StrCat(latent);
}

// A latent's number, a link when its page is among `pages` (null: none).
std::string LatentRef(int32_t latent, const std::set<int32_t>* pages) {
  return LatentRef(latent, pages != nullptr && pages->count(latent) != 0);
}

// One column of direct logits: the tokens and their logits, shaded by |logit| over the largest.
void AppendLogitTable(const char* heading,
                      const google::protobuf::RepeatedPtrField<v1::TokenLogit>& logits, float scale,
                      const char* rgb, const Vocabulary* vocab, std::string* html) {
  absl::StrAppendFormat(html, "<table><tr><th class=\"ctx\">%s</th><th>logit</th></tr>\n", heading);
  for (const v1::TokenLogit& l : logits) {
    const double alpha = scale > 0 ? std::min(1.0, std::abs(l.logit()) / double{scale}) : 0.0;
    absl::StrAppendFormat(
        html,
        "<tr><td class=\"ctx\"><span class=\"t\" style=\"background:rgba(%s,%.3f)\" "
        "title=\"id %d\">%s</span></td><td>%+.3f</td></tr>\n",
        rgb, alpha, l.token_id(), HtmlEscape(TokenText(l.token_id(), vocab)), l.logit());
  }
  *html += "</table>\n";
}

}  // namespace

std::vector<std::string> DescribeDecoderBySource(const v1::GetLatentWeightsResponse& weights) {
  std::vector<std::string> lines;
  size_t name_width = 0;
  for (const v1::SourceDecoder& d : weights.decoder_by_source()) {
    name_width = std::max(name_width, d.hook_name().size());
  }
  for (int s = 0; s < weights.decoder_by_source_size(); ++s) {
    const v1::SourceDecoder& d = weights.decoder_by_source(s);
    const int bar = static_cast<int>(std::lround(20 * std::clamp(d.share(), 0.0f, 1.0f)));
    std::string line = absl::StrFormat("source %d %-*s |W_dec| %-8.4g share %.2f %-20s", s,
                                       static_cast<int>(name_width) + 1, d.hook_name(), d.norm(),
                                       d.share(), std::string(bar, '#'));
    if (s > 0) absl::StrAppendFormat(&line, "  cos with source 0 %.3f", d.cosine_with_first());
    lines.push_back(line);
  }
  return lines;
}

namespace {

// A decoder direction's logits: raised and lowered tokens side by side, shaded by size; `whose`
// heads them ("source 1: " for a crosscoder's source); without logits, why.
void AppendLogitTables(const std::string& whose, const std::string& source,
                       const google::protobuf::RepeatedPtrField<v1::TokenLogit>& positive,
                       const google::protobuf::RepeatedPtrField<v1::TokenLogit>& negative,
                       const std::string& unavailable, const LatentPageOptions& options,
                       std::string* html) {
  if (positive.empty()) {
    if (!unavailable.empty()) {
      absl::StrAppendFormat(html, "<p>%sno logits: %s</p>\n", HtmlEscape(whose),
                            HtmlEscape(unavailable));
    }
    return;
  }
  float scale = 0;
  for (const auto* list : {&positive, &negative}) {
    for (const v1::TokenLogit& l : *list) scale = std::max(scale, std::abs(l.logit()));
  }
  absl::StrAppendFormat(
      html, "<p>%sdirect logit effect through %s</p>\n<div style=\"display:flex;gap:3em\">",
      HtmlEscape(whose), HtmlEscape(source));
  AppendLogitTable("raises", positive, scale, "110,170,240", options.vocab, html);
  AppendLogitTable("lowers", negative, scale, "250,120,120", options.vocab, html);
  *html += "</div>\n";
}

// The weights section of a latent's page (GetLatentWeights).
void AppendWeights(const v1::GetLatentWeightsResponse& w, const LatentPageOptions& options,
                   std::string* html) {
  absl::StrAppendFormat(html,
                        "<h2>From its weights</h2>\n<p>|W_dec| %.4g, |W_enc| %.4g, "
                        "cos(W_enc, W_dec) %.3f</p>\n",
                        w.decoder_norm(), w.encoder_norm(), w.encoder_decoder_cosine());
  if (w.decoder_norm_by_layer_size() > 0) {
    *html += "<p>a cross-layer transcoder's latent, |W_dec| into layer";
    for (const v1::LayerDecoderNorm& d : w.decoder_norm_by_layer()) {
      absl::StrAppendFormat(html, " %d: %.4g", d.layer(), d.norm());
    }
    *html += " (the logits sum them)</p>\n";
  }
  if (w.decoder_by_source_size() > 0) {
    *html += "<p>a crosscoder's latent, its decoder in each source:</p>\n<pre>";
    for (const std::string& line : DescribeDecoderBySource(w)) {
      *html += HtmlEscape(line) + "\n";
    }
    *html += "</pre>\n";
    for (int s = 0; s < w.decoder_by_source_size(); ++s) {
      const v1::SourceDecoder& d = w.decoder_by_source(s);
      AppendLogitTables(absl::StrFormat("source %d: ", s), d.logits_source(), d.positive_logits(),
                        d.negative_logits(), d.logits_unavailable(), options, html);
    }
  }
  if (w.decoder_by_source_size() == 0) {
    AppendLogitTables("", w.logits_source(), w.positive_logits(), w.negative_logits(),
                      w.logits_unavailable(), options, html);
  }
  if (w.neighbors_size() > 0) {
    *html +=
        "<h2>Nearest decoder directions</h2>\n<table><tr><th>latent</th><th>cosine</th></tr>\n";
    for (const v1::LatentNeighbor& n : w.neighbors()) {
      absl::StrAppendFormat(html, "<tr><td>%s</td><td>%.4f</td></tr>\n",
                            LatentRef(n.latent(), options.linked_latents), n.cosine());
    }
    *html += "</table>\n";
  }
}

constexpr char kStyle[] = R"(<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
h2{margin-top:1.5em;font-size:1.1em}
.ex{display:flex;gap:1em;align-items:baseline;margin:2px 0;font-size:14px}
.v{width:6em;text-align:right;font-variant-numeric:tabular-nums}
.r{width:8em;color:#888;font-size:12px}
.ctx{font-family:ui-monospace,monospace;white-space:pre}
.t{border-radius:2px}
.at{outline:1.5px solid #c03000}
.hist text{font-size:11px;fill:#555}
table{border-collapse:collapse;font-size:14px;font-variant-numeric:tabular-nums}
td,th{padding:2px 12px;text-align:right}
td.ctx,th.ctx{text-align:left}
.tok{background:#ffe0cc;border-radius:2px}
th{border-bottom:1px solid #ccc}
</style>
)";

// The start of a page: its head (the title, plain text, escaped here; the style) and <body>.
std::string PageHead(const std::string& title) {
  return absl::StrCat("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>",
                      HtmlEscape(title), "</title>\n", kStyle, "</head><body>\n");
}

// A "fires with" table (LatentsOnRows) under `title` (plain text), ranked as `ranking` says;
// latents in `linked` link to their pages. Precision beside fraction gives both sides of the
// co-occurrence.
void AppendCofiring(const std::string& title, const char* ranking,
                    const v1::LatentsOnRowsResponse& c, const std::set<int32_t>* linked,
                    std::string* html) {
  absl::StrAppendFormat(html,
                        "<h2>%s</h2>\n<p>latents on the %d rows where it fires "
                        "(%d read), %s; fraction: the share of those rows where the latent "
                        "fires, precision: the share of its firings on those rows</p>\n<table><tr>"
                        "<th>latent</th><th>count</th><th>fraction</th><th>mean</th>"
                        "<th>lift</th><th>precision</th><th>F1</th></tr>\n",
                        HtmlEscape(title), c.rows_selected(), c.rows_read(), ranking);
  for (const v1::RowLatent& l : c.latents()) {
    absl::StrAppendFormat(html,
                          "<tr><td>%s</td><td>%d</td><td>%.4f</td><td>%.4g</td><td>%.4g</td>"
                          "<td>%.4f</td><td>%.4f</td></tr>\n",
                          LatentRef(l.latent(), linked), l.count(), l.fraction(), l.mean(),
                          l.lift(), l.precision(), l.f1());
  }
  *html += "</table>\n";
}

}  // namespace

std::string ContextLine(const v1::TopActivation& example, const Vocabulary* vocab) {
  std::string line;
  for (int i = 0; i < example.context_token_ids_size(); ++i) {
    const bool at = example.context_start_row() + i == example.row();
    std::string text = TokenText(example.context_token_ids(i), vocab);
    if (at) text = absl::StrCat("\u00AB", text, "\u00BB");
    if (vocab == nullptr && i > 0) line += " ";
    line += text;
  }
  return line;
}

std::string ExplanationLine(const v1::LatentExplanation& explanation) {
  std::vector<std::string> about;
  if (explanation.has_score()) about.push_back(absl::StrFormat("score %.3g", explanation.score()));
  if (!explanation.source().empty()) about.push_back(explanation.source());
  return about.empty() ? explanation.text()
                       : absl::StrCat(explanation.text(), " (", absl::StrJoin(about, ", "), ")");
}

std::string LatentHtml(const v1::GetLatentResponse& response, const LatentPageOptions& options) {
  const v1::LatentStatistics& s = response.statistics();
  std::string html =
      PageHead(absl::StrFormat("dataset %d latent %d", options.dataset_id, s.latent()));
  absl::StrAppendFormat(&html, "<h1>Dataset %d &middot; latent %d</h1>\n", options.dataset_id,
                        s.latent());
  if (response.has_explanation()) {
    absl::StrAppendFormat(&html, "<p class=\"explanation\"><b>%s</b></p>\n",
                          HtmlEscape(ExplanationLine(response.explanation())));
  }
  absl::StrAppendFormat(&html,
                        "<p>fires %d times (density %.5f); mean %.4g, std %.4g, max %.4g</p>\n",
                        s.firing_count(), s.density(), s.mean(), s.stddev(), s.max());
  if (options.in_dashboard) html += "<p><a href=\"index.html\">all latents</a></p>\n";
  if (!options.back_href.empty()) {
    absl::StrAppendFormat(&html, "<p><a href=\"%s\">back to %s</a></p>\n",
                          HtmlEscape(options.back_href), HtmlEscape(options.back_text));
  }
  AppendBars(s.histogram(), s.histogram_min(), s.histogram_max(), "value histogram", "#ff6600",
             &html);
  if (response.position_histogram_size() > 0) {
    html += "<h2>Where in its sequences it fires</h2>\n";
    AppendBars(
        response.position_histogram(), 0,
        static_cast<double>(response.position_histogram_size()) * response.position_bin_width(),
        "position histogram", "#2ca02c", &html);
  }
  absl::StrAppendFormat(
      &html, "<h2>%s</h2>\n",
      options.distinct_sequences ? "Top sequences (each at its largest value)" : "Top activations");
  for (const v1::TopActivation& example : response.top()) {
    AppendExample(example, s.max(), options.vocab, &html);
  }
  for (int i = 0; i < response.intervals_size(); ++i) {
    const v1::ActivationInterval& interval = response.intervals(i);
    const bool last = i + 1 == response.intervals_size();  // includes its high end
    absl::StrAppendFormat(&html, "<h2>Interval [%.4g, %.4g%c: %d firings</h2>\n", interval.low(),
                          interval.high(), last ? ']' : ')', interval.count());
    for (const v1::TopActivation& example : interval.samples()) {
      AppendExample(example, s.max(), options.vocab, &html);
    }
  }
  if (response.silent_size() > 0) {
    absl::StrAppendFormat(&html,
                          "<h2>Silent windows</h2>\n<p>%d drawn at random where it fires on no "
                          "token: what its examples are read against</p>\n",
                          response.silent_size());
    for (const v1::TopActivation& example : response.silent()) {
      AppendExample(example, s.max(), options.vocab, &html);
    }
  }
  if (response.top_tokens_size() > 0) {
    html +=
        "<h2>Fires most on</h2>\n<table><tr><th>token</th><th>id</th><th>count</th>"
        "<th>of its firings</th><th>mean</th></tr>\n";
    for (const v1::TokenCount& t : response.top_tokens()) {
      absl::StrAppendFormat(&html,
                            "<tr><td class=\"ctx\">%s</td><td>%d</td><td>%d</td><td>%.1f%%</td>"
                            "<td>%.4g</td></tr>\n",
                            HtmlEscape(TokenText(t.token_id(), options.vocab)), t.token_id(),
                            t.count(), 100 * t.fraction(), t.mean());
    }
    html += "</table>\n";
  }
  if (options.cofiring != nullptr) {
    AppendCofiring("Fires with", "most often first", *options.cofiring, options.linked_latents,
                   &html);
  }
  for (const LatentPageOptions::CofiringElsewhere& other : options.cofiring_elsewhere) {
    AppendCofiring(absl::StrCat("Fires with, in ", other.heading),
                   "most alike first (by F1: fires there, and little elsewhere)", *other.cofiring,
                   /*linked=*/nullptr, &html);
  }
  if (options.weights != nullptr) AppendWeights(*options.weights, options, &html);
  html += "</body></html>\n";
  return html;
}

std::string PromptHtml(const v1::EncodePromptResponse& response, const PromptPageOptions& options) {
  std::string html = PageHead(absl::StrFormat("dataset %d prompt", options.dataset_id));
  absl::StrAppendFormat(&html, "<h1>Dataset %d &middot; a prompt of %d tokens</h1>\n",
                        options.dataset_id, response.tokens_size());
  if (response.bos_prepended()) html += "<p>BOS prepended, as the dataset's spec did</p>\n";
  // The prompt, each token's largest latents in its tooltip.
  html += "<p class=\"ctx\">";
  for (int r = 0; r < response.tokens_size(); ++r) {
    const v1::PromptToken& t = response.tokens(r);
    std::string latents;
    for (int e = 0; e < std::min(t.latents_size(), 5); ++e) {
      absl::StrAppendFormat(&latents, "%s%d: %.3g", e > 0 ? ", " : "", t.latents(e), t.values(e));
    }
    std::string text = HtmlEscape(TokenText(t.token_id(), options.vocab));
    if (options.vocab == nullptr) text = absl::StrCat(" ", text);
    absl::StrAppendFormat(&html,
                          "<span class=\"t\" title=\"position %d &middot; token %d &middot; "
                          "%d latents &middot; %s\">%s</span>",
                          r, t.token_id(), t.active(), latents, text);
  }
  html += "</p>\n<h2>Its top latents, each shading the tokens by its value</h2>\n";
  // Each top latent's value on every token, from one pass over the tokens' lists (0 where it is
  // not listed: it does not fire there, or ranks below the listed ones).
  std::map<int32_t, std::vector<float>> shade;
  for (const v1::PromptLatent& l : response.top_latents()) {
    shade[l.latent()].assign(response.tokens_size(), 0.0f);
  }
  for (int r = 0; r < response.tokens_size(); ++r) {
    const v1::PromptToken& t = response.tokens(r);
    for (int e = 0; e < t.latents_size(); ++e) {
      if (auto it = shade.find(t.latents(e)); it != shade.end()) it->second[r] = t.values(e);
    }
  }
  for (const v1::PromptLatent& l : response.top_latents()) {
    absl::StrAppendFormat(&html,
                          "<div class=\"ex\"><span class=\"v\">%.4g</span>"
                          "<span class=\"r\">latent %s</span><span class=\"ctx\">",
                          l.max_value(), LatentRef(l.latent(), options.linked_latents));
    const std::vector<float>& values = shade[l.latent()];
    for (int r = 0; r < response.tokens_size(); ++r) {
      AppendToken(response.tokens(r).token_id(), values[r], l.max_value(), r == l.position(),
                  absl::StrCat("position ", r), options.vocab, &html);
    }
    html += "</span></div>\n";
  }
  html += "</body></html>\n";
  return html;
}

namespace {

// What an attribution's metric is, for a heading: log p(<code>T</code>), a logit difference,
// or a latent of a dataset at a position (and its token).
std::string MetricHtml(const v1::AttributePromptResponse& r, const Vocabulary* vocab) {
  auto code = [&](int32_t id) {
    return absl::StrCat("<code>", HtmlEscape(TokenText(id, vocab)), "</code>");
  };
  if (r.has_target_latent()) {
    const v1::AttributionTarget& t = r.target_latent();
    std::string metric = absl::StrFormat("latent %d of dataset %d at position %d", t.latent(),
                                         t.dataset_id(), t.position());
    if (t.position() < r.prompt_size())
      absl::StrAppend(&metric, " (", code(r.prompt(t.position())), ")");
    return metric;
  }
  if (r.has_contrast_token_id()) {
    return absl::StrCat("logit(", code(r.target_token_id()), ") &minus; logit(",
                        code(r.contrast_token_id()), ")");
  }
  return absl::StrCat("log p(", code(r.target_token_id()), ")");
}

// One token shaded by a signed value over `scale`: blue where it is for the metric, red where
// against; `title` in the tooltip.
void AppendSignedToken(int32_t id, double value, double scale, const std::string& title,
                       const Vocabulary* vocab, std::string* html) {
  const double alpha = scale > 0 ? std::min(1.0, std::abs(value) / scale) : 0.0;
  std::string text = HtmlEscape(TokenText(id, vocab));
  if (vocab == nullptr) text = absl::StrCat(" ", text);
  absl::StrAppendFormat(html,
                        "<span class=\"t\" style=\"background:rgba(%s,%.3f)\" "
                        "title=\"%s\">%s</span>",
                        value >= 0 ? "0,102,255" : "255,51,0", alpha, title, text);
}

}  // namespace

namespace {

// The ablation check (entries with an ablated_change) as an SVG scatter: each entry's measured
// change against its first-order prediction (minus its credit), on equal axes with the
// diagonal where the two agree; the summary line above it. Nothing without a check.
void AppendAblationPlot(const v1::AttributePromptResponse& r, std::string* html) {
  std::vector<const v1::LatentAttribution*> checked;
  double most = 0;
  for (const v1::LatentAttribution& e : r.top_entries()) {
    if (!e.has_ablated_change()) continue;
    checked.push_back(&e);
    most = std::max({most, std::abs(e.attribution()), std::abs(e.ablated_change())});
  }
  if (checked.empty()) return;
  if (most <= 0) most = 1;
  absl::StrAppendFormat(html,
                        "<h2>Ablation check</h2>\n<p>%s. Each dot an entry taken out of a "
                        "run of its own: across, the change its credit predicts (minus it); up, "
                        "the change measured. On the diagonal the first-order credit holds.</p>\n",
                        HtmlEscape(AblationSummary(r)));
  const int side = 300, margin = 40;
  auto at = [&](double v) { return margin + (side - margin - 8) * (v + most) / (2 * most); };
  auto up = [&](double v) { return 8 + (side - margin - 8) * (most - v) / (2 * most); };
  absl::StrAppendFormat(html,
                        "<svg class=\"hist\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                        "role=\"img\" aria-label=\"measured against predicted change\">",
                        side, side, side, side);
  absl::StrAppendFormat(html,
                        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" "
                        "stroke-dasharray=\"4 3\"/>"
                        "<line x1=\"%.1f\" y1=\"8\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                        "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>",
                        at(-most), up(-most), at(most), up(most), at(0), at(0), up(-most), margin,
                        up(0), side - 8, up(0));
  for (const v1::LatentAttribution* e : checked) {
    absl::StrAppendFormat(html,
                          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#ff6600\">"
                          "<title>latent %d at %d: predicted %+.4g, measured %+.4g</title>"
                          "</circle>",
                          at(-e->attribution()), up(e->ablated_change()), e->latent(),
                          e->position(), -e->attribution(), e->ablated_change());
  }
  absl::StrAppendFormat(html,
                        "<text x=\"%d\" y=\"%d\">%+.3g</text>"
                        "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%+.3g</text>"
                        "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">predicted (minus the "
                        "credit)</text>"
                        "<text x=\"12\" y=\"%d\" transform=\"rotate(-90 12 %d)\" "
                        "text-anchor=\"middle\">measured</text></svg>\n",
                        margin, side - margin + 14, -most, side - 8, side - margin + 14, most,
                        (margin + side) / 2, side - 6, (side - margin) / 2, (side - margin) / 2);
}

}  // namespace

std::string AttributionHtml(const v1::AttributePromptResponse& r,
                            const PromptPageOptions& options) {
  const Vocabulary* vocab = options.vocab;
  std::string html = PageHead(absl::StrFormat("dataset %d attribution", options.dataset_id));
  absl::StrAppendFormat(&html, "<h1>Dataset %d &middot; what drives %s = %.4f</h1>\n",
                        options.dataset_id, MetricHtml(r, vocab), r.metric());
  absl::StrAppendFormat(&html,
                        "<p>Contributions to first order (removing one moves the metric by about "
                        "minus it): the latents %+.4f, the SAE's error term %+.4f. Blue: for the "
                        "metric; red: against it.%s</p>\n",
                        r.latent_attribution(), r.error_attribution(),
                        r.bos_prepended() ? " BOS prepended, as the dataset's spec did." : "");
  // The prompt by position: the latents' and the error's parts together.
  double scale = 0;
  std::vector<double> total(r.prompt_size(), 0.0);
  for (int p = 0; p < r.prompt_size(); ++p) {
    if (p < r.latent_attribution_by_position_size())
      total[p] += r.latent_attribution_by_position(p);
    if (p < r.error_attribution_by_position_size()) total[p] += r.error_attribution_by_position(p);
    scale = std::max(scale, std::abs(total[p]));
  }
  html += "<h2>By position</h2>\n<p class=\"ctx\">";
  for (int p = 0; p < r.prompt_size(); ++p) {
    AppendSignedToken(
        r.prompt(p), total[p], scale,
        absl::StrFormat(
            "position %d &middot; token %d &middot; latents %+.4f &middot; error "
            "%+.4f",
            p, r.prompt(p),
            p < r.latent_attribution_by_position_size() ? r.latent_attribution_by_position(p) : 0.0,
            p < r.error_attribution_by_position_size() ? r.error_attribution_by_position(p) : 0.0),
        vocab, &html);
  }
  html += "</p>\n<h2>Top latents, each shading the tokens by its attribution there</h2>\n";
  std::map<int32_t, std::vector<double>> by_latent;
  std::map<int32_t, std::vector<float>> values;
  for (const v1::LatentAttribution& l : r.top_latents()) {
    by_latent[l.latent()].assign(r.prompt_size(), 0.0);
    values[l.latent()].assign(r.prompt_size(), 0.0f);
  }
  double entry_scale = 0;
  for (const v1::LatentAttribution& e : r.top_entries()) {
    auto it = by_latent.find(e.latent());
    if (it == by_latent.end() || e.position() < 0 || e.position() >= r.prompt_size()) continue;
    it->second[e.position()] = e.attribution();
    values[e.latent()][e.position()] = e.activation();
    entry_scale = std::max(entry_scale, std::abs(e.attribution()));
  }
  for (const v1::LatentAttribution& l : r.top_latents()) {
    absl::StrAppendFormat(&html,
                          "<div class=\"ex\"><span class=\"v\">%+.4g</span>"
                          "<span class=\"r\">latent %s</span><span class=\"ctx\">",
                          l.attribution(), LatentRef(l.latent(), options.linked_latents));
    for (int p = 0; p < r.prompt_size(); ++p) {
      AppendSignedToken(
          r.prompt(p), by_latent[l.latent()][p], entry_scale,
          absl::StrFormat("position %d &middot; value %.4g &middot; attribution %+.4g", p,
                          values[l.latent()][p], by_latent[l.latent()][p]),
          vocab, &html);
    }
    html += "</span></div>\n";
  }
  AppendAblationPlot(r, &html);
  html += "</body></html>\n";
  return html;
}

namespace {

// The next-token predictions of the two runs side by side, a row per rank.
void AppendNextTokens(const v1::SteerPromptResponse& r, const Vocabulary* vocab,
                      std::string* html) {
  *html +=
      "<table><tr><th>rank</th><th class=\"ctx\">clean</th><th>p</th>"
      "<th class=\"ctx\">steered</th><th>p</th></tr>\n";
  const int ranks = std::max(r.clean().next_size(), r.steered().next_size());
  for (int i = 0; i < ranks; ++i) {
    absl::StrAppendFormat(html, "<tr><td>%d</td>", i + 1);
    for (const v1::SteeredRun* run : {&r.clean(), &r.steered()}) {
      if (i < run->next_size()) {
        absl::StrAppendFormat(html, "<td class=\"ctx\">%s</td><td>%.4f</td>",
                              HtmlEscape(TokenText(run->next(i).token_id(), vocab)),
                              run->next(i).probability());
      } else {
        *html += "<td></td><td></td>";
      }
    }
    *html += "</tr>\n";
  }
  *html += "</table>\n";
}

void AppendChanges(const char* heading,
                   const google::protobuf::RepeatedPtrField<v1::NextTokenChange>& changes,
                   const Vocabulary* vocab, std::string* html) {
  if (changes.empty()) return;
  absl::StrAppendFormat(html,
                        "<h3>%s</h3>\n<table><tr><th class=\"ctx\">token</th><th>clean p</th>"
                        "<th>steered p</th></tr>\n",
                        heading);
  for (const v1::NextTokenChange& c : changes) {
    absl::StrAppendFormat(html, "<tr><td class=\"ctx\">%s</td><td>%.4f</td><td>%.4f</td></tr>\n",
                          HtmlEscape(TokenText(c.token_id(), vocab)), c.clean_probability(),
                          c.steered_probability());
  }
  *html += "</table>\n";
}

// A run's continuation: its generated tokens, those that differ from `reference`'s at the same
// step outlined (none when reference is null).
void AppendContinuation(const std::string& label, const v1::SteeredRun& run,
                        const v1::SteeredRun* reference, const Vocabulary* vocab,
                        std::string* html) {
  absl::StrAppendFormat(html, "<div class=\"ex\"><span class=\"r\">%s</span><span class=\"ctx\">",
                        HtmlEscape(label));
  for (int i = 0; i < run.generated_size(); ++i) {
    const bool differs = reference != nullptr && (i >= reference->generated_size() ||
                                                  reference->generated(i) != run.generated(i));
    std::string text = HtmlEscape(TokenText(run.generated(i), vocab));
    if (vocab == nullptr) text = absl::StrCat(" ", text);
    absl::StrAppendFormat(html,
                          "<span class=\"t%s\" title=\"new token %d &middot; id %d\">%s</span>",
                          differs ? " at" : "", i + 1, run.generated(i), text);
  }
  *html += "</span></div>\n";
}

// The KL of each run of a sweep (and of the request's own value) against the value, as an SVG
// line plot: where the intervention starts to turn the prediction.
void AppendSweepPlot(const v1::SteerPromptRequest& request, const v1::SteerPromptResponse& r,
                     std::string* html) {
  std::vector<std::pair<double, double>> points;  // (value, KL)
  for (const v1::SweptRun& s : r.sweep()) points.emplace_back(s.value(), s.kl_divergence());
  if (!request.interventions().empty()) {
    points.emplace_back(request.interventions(0).value(), r.kl_divergence());
  }
  std::sort(points.begin(), points.end());
  double lo = points.front().first, hi = points.back().first, top = 0;
  for (const auto& [value, kl] : points) top = std::max(top, kl);
  if (hi == lo) hi = lo + 1;
  if (top <= 0) top = 1;
  const int width = 480, height = 160, left = 48, bottom = 20;
  auto x = [&](double v) { return left + (width - left - 8) * (v - lo) / (hi - lo); };
  auto y = [&](double kl) { return 8 + (height - bottom - 8) * (1 - kl / top); };
  absl::StrAppendFormat(html,
                        "<svg class=\"hist\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                        "role=\"img\" aria-label=\"KL against the value\">",
                        width, height, width, height);
  absl::StrAppendFormat(html,
                        "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>"
                        "<line x1=\"%d\" y1=\"8\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>",
                        left, height - bottom, width - 8, height - bottom, left, left,
                        height - bottom);
  std::string path;
  for (const auto& [value, kl] : points) {
    absl::StrAppendFormat(&path, "%s%.1f,%.1f", path.empty() ? "" : " ", x(value), y(kl));
  }
  absl::StrAppendFormat(html, "<polyline points=\"%s\" fill=\"none\" stroke=\"#0066ff\"/>", path);
  for (const auto& [value, kl] : points) {
    absl::StrAppendFormat(html,
                          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#0066ff\">"
                          "<title>value %g: KL %.4g nats</title></circle>",
                          x(value), y(kl), value, kl);
  }
  absl::StrAppendFormat(html,
                        "<text x=\"%d\" y=\"%d\">%g</text>"
                        "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%g</text>"
                        "<text x=\"%d\" y=\"14\" text-anchor=\"end\">%.3g</text>"
                        "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">0</text>"
                        "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">KL (nats) "
                        "against the value</text></svg>\n",
                        left, height - 4, lo, width - 8, height - 4, hi, left - 4, top, left - 4,
                        height - bottom, (left + width) / 2, height - 4);
}

}  // namespace

std::string SteeringHtml(const v1::SteerPromptRequest& request, const v1::SteerPromptResponse& r,
                         const PromptPageOptions& options) {
  const Vocabulary* vocab = options.vocab;
  std::string html = PageHead(absl::StrFormat("dataset %d steering", options.dataset_id));
  absl::StrAppendFormat(&html, "<h1>Dataset %d &middot; steering</h1>\n<ul>\n", options.dataset_id);
  for (const v1::LatentIntervention& in : request.interventions()) {
    absl::StrAppend(&html, "<li>", HtmlEscape(DescribeIntervention(in)), "</li>\n");
  }
  absl::StrAppendFormat(&html,
                        "</ul>\n<p>KL(clean || steered) of the next token after the prompt: "
                        "%.4g nats.%s</p>\n",
                        r.kl_divergence(),
                        r.bos_prepended() ? " BOS prepended, as the dataset's spec did." : "");

  // Token s + 1 is what position s predicts: shaded by the clean loss minus the steered one.
  const v1::SteeredRun& clean = r.clean();
  const v1::SteeredRun& steered = r.steered();
  absl::StrAppendFormat(&html,
                        "<h2>The prompt's loss</h2>\n<p>Each token shaded by how much better "
                        "(blue) or worse (red) the steered run predicts it; mean loss clean %.4f, "
                        "steered %.4f nats.</p>\n<p class=\"ctx\">",
                        clean.mean_loss(), steered.mean_loss());
  double scale = 0;
  const int predicted = std::min(clean.token_losses_size(), steered.token_losses_size());
  for (int s = 0; s < predicted; ++s) {
    scale = std::max(scale, double{std::abs(clean.token_losses(s) - steered.token_losses(s))});
  }
  for (int p = 0; p < r.prompt_size(); ++p) {
    if (p == 0 || p - 1 >= predicted) {
      AppendSignedToken(r.prompt(p), 0, scale, absl::StrFormat("position %d", p), vocab, &html);
      continue;
    }
    const float a = clean.token_losses(p - 1), b = steered.token_losses(p - 1);
    AppendSignedToken(
        r.prompt(p), a - b, scale,
        absl::StrFormat("position %d &middot; loss clean %.4f, steered %.4f", p, a, b), vocab,
        &html);
  }
  html += "</p>\n";

  if (!r.latent_values().empty()) {
    html += "<h2>The intervened latents on the prompt (clean run)</h2>\n";
  }
  for (const v1::LatentValues& values : r.latent_values()) {
    std::set<int> applied;  // positions an intervention on this latent names (all: none named)
    bool everywhere = false;
    for (const v1::LatentIntervention& in : request.interventions()) {
      if (in.latent() != values.latent()) continue;
      everywhere |= in.positions().empty();
      applied.insert(in.positions().begin(), in.positions().end());
    }
    double max = 0;
    for (float v : values.values()) max = std::max(max, double{v});
    absl::StrAppendFormat(&html,
                          "<div class=\"ex\"><span class=\"v\">%.4g</span>"
                          "<span class=\"r\">latent %s</span><span class=\"ctx\">",
                          max, LatentRef(values.latent(), options.linked_latents));
    for (int p = 0; p < r.prompt_size() && p < values.values_size(); ++p) {
      AppendToken(r.prompt(p), values.values(p), max, !everywhere && applied.count(p) != 0,
                  absl::StrCat("position ", p), vocab, &html);
    }
    html += "</span></div>\n";
  }

  html += "<h2>The next token</h2>\n";
  AppendNextTokens(r, vocab, &html);
  AppendChanges("Rose most", r.most_increased(), vocab, &html);
  AppendChanges("Fell most", r.most_decreased(), vocab, &html);

  if (clean.generated_size() > 0) {
    absl::StrAppendFormat(&html,
                          "<h2>Continuations (%d tokens, %s)</h2>\n<p>Outlined: where a "
                          "steered run's token differs from the clean run's.</p>\n",
                          clean.generated_size(),
                          request.temperature() > 0
                              ? absl::StrFormat("sampled at temperature %g, seed %d",
                                                request.temperature(), request.seed())
                              : "greedy");
    AppendContinuation("clean", clean, nullptr, vocab, &html);
    AppendContinuation("steered", steered, &clean, vocab, &html);
  }
  if (!r.sweep().empty()) {
    const std::string swept = request.interventions().empty()
                                  ? ""
                                  : HtmlEscape(DescribeIntervention(request.interventions(0)));
    absl::StrAppendFormat(&html, "<h2>Sweep of the first intervention (%s)</h2>\n", swept);
    AppendSweepPlot(request, r, &html);
    html +=
        "<table><tr><th>value</th><th>KL</th><th class=\"ctx\">next token</th><th>p</th>"
        "<th>mean loss</th></tr>\n";
    for (const v1::SweptRun& s : r.sweep()) {
      const bool any = s.run().next_size() > 0;
      absl::StrAppendFormat(
          &html,
          "<tr><td>%g</td><td>%.4g</td><td class=\"ctx\">%s</td><td>%s</td><td>%.4f</td></tr>\n",
          s.value(), s.kl_divergence(),
          any ? HtmlEscape(TokenText(s.run().next(0).token_id(), vocab)) : "",
          any ? absl::StrFormat("%.4f", s.run().next(0).probability()) : "", s.run().mean_loss());
    }
    html += "</table>\n";
    for (const v1::SweptRun& s : r.sweep()) {
      if (s.run().generated_size() == 0) break;
      AppendContinuation(absl::StrFormat("value %g", s.value()), s.run(), &clean, vocab, &html);
    }
  }
  html += "</body></html>\n";
  return html;
}

namespace {

// `text` cut to at most `bytes` bytes at a UTF-8 character's start, "…" marking a cut.
std::string Shortened(const std::string& text, size_t bytes) {
  if (text.size() <= bytes) return text;
  size_t cut = bytes;
  while (cut > 0 && (static_cast<uint8_t>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(text.substr(0, cut), "\u2026");
}

}  // namespace

std::string AttributionGraphHtml(const v1::AttributionGraphResponse& g, const Vocabulary* vocab,
                                 const GraphNodeLabels* labels, const std::string& link_pattern) {
  const v1::AttributePromptResponse& o = g.output();
  std::string html = PageHead("attribution graph");
  absl::StrAppendFormat(&html, "<h1>Attribution graph of %s = %.4f</h1>\n", MetricHtml(o, vocab),
                        o.metric());
  html += "<p class=\"ctx\">";
  for (int p = 0; p < o.prompt_size(); ++p) {
    absl::StrAppendFormat(&html, "<span class=\"t\" title=\"position %d\">%s</span>", p,
                          HtmlEscape(TokenText(o.prompt(p), vocab)));
  }
  html +=
      "</p>\n<p>Each edge: the parent's first-order credit for the child's value (for the output: "
      "its metric); blue for, red against, as wide as its share of the strongest edge into the "
      "same child. A node's shade: the share of the output that flows through it.</p>\n";

  // Columns: the hooks, then the output; rows: the nodes by position, the error node last.
  const int columns = g.hooks_size() + 1;
  std::vector<std::vector<int>> column(columns);
  for (int n = 0; n < g.nodes_size(); ++n) {
    column[std::clamp(g.nodes(n).hook(), 0, columns - 1)].push_back(n);
  }
  for (std::vector<int>& c : column) {
    std::sort(c.begin(), c.end(), [&](int a, int b) {
      const v1::GraphNode &x = g.nodes(a), &y = g.nodes(b);
      if ((x.latent() < 0) != (y.latent() < 0)) return y.latent() < 0;
      return x.position() != y.position() ? x.position() < y.position() : x.latent() < y.latent();
    });
  }
  bool labelled = false;  // a third line in every box when any node has a label
  for (int n = 1; n < g.nodes_size() && !labelled; ++n) {
    labelled = !GraphNodeLabel(g, n, labels).empty();
  }
  constexpr int kWidth = 170, kColumn = 230, kTop = 52;
  const int kHeight = labelled ? 52 : 38, kRow = kHeight + 12;
  std::vector<std::pair<int, int>> at(g.nodes_size());  // each node's box corner
  size_t rows = 1;
  for (int c = 0; c < columns; ++c) {
    rows = std::max(rows, column[c].size());
    for (size_t r = 0; r < column[c].size(); ++r) {
      at[column[c][r]] = {10 + c * kColumn, kTop + static_cast<int>(r) * kRow};
    }
  }
  const int width = 10 + columns * kColumn, height = kTop + static_cast<int>(rows) * kRow;
  absl::StrAppendFormat(&html,
                        "<svg width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
                        "aria-label=\"attribution graph\" style=\"font-size:12px\">\n",
                        width, height, width, height);
  for (int c = 0; c < columns; ++c) {
    absl::StrAppendFormat(&html, "<text x=\"%d\" y=\"20\" font-weight=\"bold\">%s</text>\n",
                          10 + c * kColumn,
                          c + 1 == columns ? "output" : HtmlEscape(g.hooks(c).hook_name()));
    if (c + 1 == columns) continue;
    const v1::GraphHook& hook = g.hooks(c);
    const double reaching =
        hook.kept_importance() + hook.error_importance() + hook.dropped_importance();
    if (reaching > 0) {  // the coverage in brief under the name, in words in the tooltip
      absl::StrAppendFormat(
          &html,
          "<text x=\"%d\" y=\"36\" fill=\"#555\"><title>%s</title>kept %.0f%% &#183; error "
          "%.0f%% &#183; not kept %.0f%%</text>\n",
          10 + c * kColumn, HtmlEscape(HookCoverageText(hook)),
          100 * hook.kept_importance() / reaching, 100 * hook.error_importance() / reaching,
          100 * hook.dropped_importance() / reaching);
    }
  }
  auto valid = [&](int n) { return n >= 0 && n < g.nodes_size(); };
  std::vector<double> strongest_into(g.nodes_size(), 0.0);
  for (const v1::GraphEdge& e : g.edges()) {
    if (valid(e.to_node())) {
      strongest_into[e.to_node()] =
          std::max(strongest_into[e.to_node()], std::abs(e.attribution()));
    }
  }
  auto name = [&](int n) {
    const v1::GraphNode& node = g.nodes(n);
    if (n == 0) return std::string("output");
    if (node.latent() < 0) {
      return absl::StrCat("error of ",
                          node.hook() < g.hooks_size() ? g.hooks(node.hook()).hook_name() : "");
    }
    return absl::StrFormat("#%d@%d", node.latent(), node.position());
  };
  for (const v1::GraphEdge& e : g.edges()) {
    if (!valid(e.from_node()) || !valid(e.to_node())) continue;
    const auto [x1, y1] = at[e.from_node()];
    const auto [x2, y2] = at[e.to_node()];
    const double into = strongest_into[e.to_node()];
    const double share = into > 0 ? std::abs(e.attribution()) / into : 0.0;
    const int from_x = x1 + kWidth, mid = (from_x + x2) / 2;
    absl::StrAppendFormat(
        &html,
        "<path d=\"M%d %d C%d %d %d %d %d %d\" fill=\"none\" stroke=\"%s\" "
        "stroke-width=\"%.2f\" stroke-opacity=\"0.6\"><title>%s &#8594; %s: "
        "%+.4g%s</title></path>\n",
        from_x, y1 + kHeight / 2, mid, y1 + kHeight / 2, mid, y2 + kHeight / 2, x2,
        y2 + kHeight / 2, e.attribution() >= 0 ? "#0066ff" : "#ff3300", 0.5 + 5 * share,
        HtmlEscape(name(e.from_node())), HtmlEscape(name(e.to_node())), e.attribution(),
        e.has_ablated_change()
            ? absl::StrFormat(" &#183; taken out, it moves by %+.4g", e.ablated_change())
            : "");
  }
  double most = 0;  // the largest importance but the output's (1), which shades fully
  for (int n = 1; n < g.nodes_size(); ++n) most = std::max(most, g.nodes(n).importance());
  for (int n = 0; n < g.nodes_size(); ++n) {
    const v1::GraphNode& node = g.nodes(n);
    const auto [x, y] = at[n];
    std::string first, second, label = GraphNodeLabel(g, n, labels);
    if (n == 0) {
      first = "output";
      second = absl::StrFormat("%.4g", o.metric());
    } else if (node.latent() < 0) {
      first = "SAE error";
      second = "all positions";
    } else {
      first = absl::StrFormat("#%d @%d", node.latent(), node.position());
      const int32_t token = node.position() >= 0 && node.position() < o.prompt_size()
                                ? o.prompt(node.position())
                                : -1;
      second = absl::StrFormat("%s = %.3g", TokenText(token, vocab), node.activation());
    }
    // The label whole in the tooltip, cut to the box's width inside it.
    const std::string title =
        label.empty() ? name(n) : absl::StrCat(name(n), " (fires most on ", label, ")");
    const std::string shown = Shortened(label, 26);
    // SVG 2's <a href> (the page is HTML5: no xlink namespace needed).
    const std::string link = GraphNodeLink(g, n, link_pattern);
    if (!link.empty()) absl::StrAppend(&html, "<a href=\"", HtmlEscape(link), "\">");
    absl::StrAppendFormat(
        &html,
        "<g><title>%s &#183; importance %.3f</title><rect x=\"%d\" y=\"%d\" width=\"%d\" "
        "height=\"%d\" rx=\"4\" fill=\"rgba(255,102,0,%.3f)\" stroke=\"#999\"/>"
        "<text x=\"%d\" y=\"%d\">%s</text><text x=\"%d\" y=\"%d\" "
        "font-family=\"monospace\">%s</text>",
        HtmlEscape(title), node.importance(), x, y, kWidth, kHeight,
        n == 0 || most <= 0 ? 0.8 : 0.8 * node.importance() / most, x + 6, y + 15,
        HtmlEscape(first), x + 6, y + 31, HtmlEscape(second));
    if (!shown.empty()) {
      absl::StrAppendFormat(&html, "<text x=\"%d\" y=\"%d\" fill=\"#444\">%s</text>", x + 6, y + 46,
                            HtmlEscape(shown));
    }
    html += link.empty() ? "</g>\n" : "</g></a>\n";
  }
  html += "</svg>\n";
  if (std::string checked = GraphAblationSummary(g); !checked.empty()) {
    absl::StrAppend(&html, "<p>", HtmlEscape(checked),
                    " (each checked edge's tooltip says what "
                    "taking its parent out measured)</p>\n");
  }
  if (std::string circuit = CircuitAblationText(g); !circuit.empty()) {
    absl::StrAppend(&html, "<p><b>", HtmlEscape(circuit), "</b></p>\n");
  }
  for (const std::string& note : g.notes()) {
    absl::StrAppend(&html, "<p>Note: ", HtmlEscape(note), "</p>\n");
  }
  html += "</body></html>\n";
  return html;
}

std::string LatentPageName(int32_t latent) { return absl::StrCat("latent-", latent, ".html"); }

std::string LatentIndexHtml(const v1::ListLatentsResponse& overview,
                            const IndexPageOptions& options) {
  std::string html = PageHead(absl::StrFormat("dataset %d latents", options.dataset_id));
  absl::StrAppendFormat(&html, "<h1>Dataset %d &middot; %d latents</h1>\n", options.dataset_id,
                        overview.d_sae());
  const double dead_share =
      overview.d_sae() > 0 ? 100.0 * overview.dead_latents() / overview.d_sae() : 0.0;
  absl::StrAppendFormat(&html, "<p>%d rows; %d dead latents (%.2f%%); %d match the filter</p>\n",
                        overview.rows(), overview.dead_latents(), dead_share, overview.matching());
  if (options.fit != nullptr && options.fit->rows() > 0) {
    const std::string& predicted = options.fit->predicted_hook();
    absl::StrAppendFormat(&html,
                          "<p>%s with explained variance %.4f, MSE %.4g, cosine %.4f (over %d "
                          "rows)</p>\n",
                          predicted.empty()
                              ? std::string("the SAE reconstructs the hook")
                              : absl::StrCat("the transcoder predicts ", HtmlEscape(predicted)),
                          options.fit->explained_variance(), options.fit->mse(),
                          options.fit->cosine_similarity(), options.fit->rows());
  }
  html += "<h2>log10 feature density of the latents that fired</h2>\n";
  AppendBars(overview.log10_density_histogram(), overview.log10_density_min(), 0.0,
             "log10 density histogram", "#1f77b4", &html);
  absl::StrAppendFormat(
      &html,
      "<h2>%s</h2>\n<table><tr><th>latent</th><th>firings</th><th>density</th>"
      "<th>mean</th><th>max</th>%s</tr>\n",
      HtmlEscape(options.heading),
      absl::StrCat(options.top_tokens != nullptr ? "<th class=\"ctx\">fires most on</th>" : "",
                   options.explanations != nullptr ? "<th>explanation</th>" : ""));
  for (const v1::LatentSummary& l : overview.latents()) {
    absl::StrAppendFormat(&html,
                          "<tr><td>%s</td><td>%d</td><td>%.4g</td><td>%.4g</td><td>%.4g</td>",
                          LatentRef(l.latent(), options.link_pages), l.firing_count(), l.density(),
                          l.mean(), l.max());
    if (options.top_tokens != nullptr) {
      // "token (share of its firings)", the three commonest.
      std::vector<std::string> shown;
      const auto it = options.top_tokens->find(l.latent());
      if (it != options.top_tokens->end()) {
        for (size_t i = 0; i < std::min<size_t>(3, it->second.size()); ++i) {
          const v1::TokenCount& t = it->second[i];
          shown.push_back(absl::StrFormat("<span class=\"tok\">%s</span> %.0f%%",
                                          HtmlEscape(TokenText(t.token_id(), options.vocab)),
                                          100 * t.fraction()));
        }
      }
      absl::StrAppendFormat(&html, "<td class=\"ctx\">%s</td>", absl::StrJoin(shown, ", "));
    }
    if (options.explanations != nullptr) {
      const auto it = options.explanations->find(l.latent());
      absl::StrAppendFormat(
          &html, "<td>%s</td>",
          it == options.explanations->end() ? "" : HtmlEscape(ExplanationLine(it->second)));
    }
    html += "</tr>\n";
  }
  html += "</table>\n</body></html>\n";
  return html;
}

std::string LatentExamplesJson(const v1::GetLatentResponse& response, uint64_t dataset_id,
                               const Vocabulary* vocab) {
  auto example = [&](const v1::TopActivation& t) {
    nlohmann::json e = {
        {"row", t.row()},
        {"value", t.value()},
        {"token_ids",
         std::vector<int32_t>(t.context_token_ids().begin(), t.context_token_ids().end())},
        {"values", std::vector<float>(t.context_values().begin(), t.context_values().end())}};
    if (vocab != nullptr) {
      // Each token's exact text (newlines and all: an explainer reads it as the model did);
      // null for an id the vocabulary lacks.
      nlohmann::json tokens = nlohmann::json::array();
      for (int32_t id : t.context_token_ids()) {
        const std::optional<std::string> bytes = vocab->Bytes(id);
        tokens.push_back(bytes ? nlohmann::json(*bytes) : nlohmann::json(nullptr));
      }
      e["tokens"] = std::move(tokens);
    }
    return e;
  };
  auto examples = [&](const auto& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const v1::TopActivation& t : list) out.push_back(example(t));
    return out;
  };
  const v1::LatentStatistics& s = response.statistics();
  nlohmann::json line = {{"dataset_id", dataset_id},
                         {"latent", s.latent()},
                         {"firing_count", s.firing_count()},
                         {"density", s.density()},
                         {"mean", s.mean()},
                         {"max", s.max()},
                         {"top", examples(response.top())},
                         {"silent", examples(response.silent())}};
  nlohmann::json intervals = nlohmann::json::array();
  for (const v1::ActivationInterval& interval : response.intervals()) {
    intervals.push_back({{"low", interval.low()},
                         {"high", interval.high()},
                         {"count", interval.count()},
                         {"examples", examples(interval.samples())}});
  }
  line["intervals"] = std::move(intervals);
  if (response.has_explanation()) {
    // The explanation already written, to be scored again or replaced.
    const v1::LatentExplanation& e = response.explanation();
    line["explanation"] = {{"text", e.text()}, {"source", e.source()}};
    if (e.has_score()) line["explanation"]["score"] = e.score();
  }
  // Invalid UTF-8 in a token's text (a byte-level piece) is replaced, not an exception.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace latentd::client
