#include "client/latent_view.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

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

// The latent's value on the window's i-th token: context_values where the dataset keeps them,
// else the example's own value on its row and nothing elsewhere.
float ValueAt(const v1::TopActivation& example, int i) {
  if (example.context_values_size() == example.context_token_ids_size()) {
    return example.context_values(i);
  }
  return example.context_start_row() + i == example.row() ? example.value() : 0.0f;
}

// One example: its value and row, then the window's tokens, each shaded by value / max.
void AppendExample(const v1::TopActivation& example, double max, const Vocabulary* vocab,
                   std::string* html) {
  absl::StrAppendFormat(html, "<div class=\"ex\"><span class=\"v\">%.4g</span>", example.value());
  absl::StrAppendFormat(html, "<span class=\"r\">row %d</span><span class=\"ctx\">", example.row());
  for (int i = 0; i < example.context_token_ids_size(); ++i) {
    const int64_t row = example.context_start_row() + i;
    const int32_t id = example.context_token_ids(i);
    const float value = ValueAt(example, i);
    const double alpha = max > 0 ? std::clamp(value / max, 0.0, 1.0) : 0.0;
    std::string text = HtmlEscape(TokenText(id, vocab));
    if (vocab == nullptr) text = absl::StrCat(" ", text);  // ids need a gap; text has its own
    absl::StrAppendFormat(html,
                          "<span class=\"t%s\" style=\"background:rgba(255,102,0,%.3f)\" "
                          "title=\"row %d &middot; token %d &middot; value %.4g\">%s</span>",
                          row == example.row() ? " at" : "", alpha, row, id, value, text);
  }
  *html += "</span></div>\n";
}

// The histogram of nonzero values as SVG bars, min and max under the axis.
void AppendHistogram(const v1::LatentStatistics& s, std::string* html) {
  if (s.histogram_size() == 0) return;
  int64_t peak = 1;
  for (int64_t c : s.histogram()) peak = std::max(peak, c);
  const int bar = 12, height = 120, width = bar * s.histogram_size();
  absl::StrAppendFormat(html,
                        "<svg class=\"hist\" width=\"%d\" height=\"%d\" "
                        "viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"value histogram\">",
                        width, height + 18, width, height + 18);
  const double bin = (s.histogram_max() - s.histogram_min()) / s.histogram_size();
  for (int b = 0; b < s.histogram_size(); ++b) {
    const int h =
        static_cast<int>(std::lround(static_cast<double>(height) * s.histogram(b) / peak));
    absl::StrAppendFormat(html,
                          "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#ff6600\">"
                          "<title>[%.4g, %.4g): %d</title></rect>",
                          b * bar + 1, height - h, bar - 2, h, s.histogram_min() + bin * b,
                          s.histogram_min() + bin * (b + 1), s.histogram(b));
  }
  absl::StrAppendFormat(html, "<line x1=\"0\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>",
                        height, width, height);
  absl::StrAppendFormat(html,
                        "<text x=\"0\" y=\"%d\">%.4g</text><text x=\"%d\" y=\"%d\" "
                        "text-anchor=\"end\">%.4g</text></svg>\n",
                        height + 14, s.histogram_min(), width, height + 14, s.histogram_max());
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
</style>
)";

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

std::string LatentHtml(const v1::GetLatentResponse& response, const LatentPageOptions& options) {
  const v1::LatentStatistics& s = response.statistics();
  std::string html = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">";
  absl::StrAppendFormat(&html, "<title>dataset %d latent %d</title>\n", options.dataset_id,
                        s.latent());
  html += kStyle;
  html += "</head><body>\n";
  absl::StrAppendFormat(&html, "<h1>Dataset %d &middot; latent %d</h1>\n", options.dataset_id,
                        s.latent());
  absl::StrAppendFormat(&html,
                        "<p>fires %d times (density %.5f); mean %.4g, std %.4g, max %.4g</p>\n",
                        s.firing_count(), s.density(), s.mean(), s.stddev(), s.max());
  AppendHistogram(s, &html);
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
  html += "</body></html>\n";
  return html;
}

}  // namespace latentd::client
