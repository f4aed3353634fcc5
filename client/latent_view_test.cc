#include "client/latent_view.h"

#include <nlohmann/json.hpp>
#include <regex>
#include <tuple>

#include "gtest/gtest.h"

namespace latentd::client {
namespace {

// Latent 7 of dataset 3: max 4, one top example at row 12 whose window is rows 10..13.
v1::GetLatentResponse Response() {
  v1::GetLatentResponse r;
  v1::LatentStatistics* s = r.mutable_statistics();
  s->set_latent(7);
  s->set_firing_count(9);
  s->set_max(4.0);
  s->set_histogram_min(1.0);
  s->set_histogram_max(4.0);
  for (int64_t c : {1, 0, 4}) s->add_histogram(c);
  v1::TopActivation* t = r.add_top();
  t->set_row(12);
  t->set_value(4.0f);
  t->set_token_id(2);
  t->set_context_start_row(10);
  for (int32_t id : {0, 1, 2, 3}) t->add_context_token_ids(id);
  for (float v : {0.0f, 1.0f, 4.0f, 0.0f}) t->add_context_values(v);
  v1::ActivationInterval* iv = r.add_intervals();
  iv->set_low(1.0f);
  iv->set_high(4.0f);
  iv->set_count(9);
  *iv->add_samples() = *t;
  return r;
}

std::vector<std::string> All(const std::string& text, const std::string& pattern) {
  std::vector<std::string> found;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    found.push_back((*it)[1]);
  }
  return found;
}

TEST(LatentViewTest, ContextLineDecodesAndMarksTheRow) {
  auto vocab = Vocabulary::Parse("The\n cat\n sat\n");
  ASSERT_TRUE(vocab.ok());
  const v1::TopActivation t = Response().top(0);
  EXPECT_EQ(ContextLine(t, &*vocab), "The cat\u00AB sat\u00BB<id 3>");
  EXPECT_EQ(ContextLine(t, nullptr), "0 1 \u00AB2\u00BB 3");
}

TEST(LatentViewTest, HtmlShadesEveryTokenByItsValue) {
  auto vocab = Vocabulary::Parse("<b>\n cat\n & dog\n\"q\"\n");
  ASSERT_TRUE(vocab.ok());
  const std::string html = LatentHtml(Response(), {3, &*vocab, false});
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("Dataset 3 &middot; latent 7"), std::string::npos);
  EXPECT_NE(html.find("Top activations"), std::string::npos);
  EXPECT_NE(html.find("Interval [1, 4]: 9 firings"), std::string::npos);
  // Two examples of four tokens: shades value / max, token text escaped, the row outlined.
  EXPECT_EQ(All(html, R"re(rgba\(255,102,0,([0-9.]+)\))re"),
            (std::vector<std::string>{"0.000", "0.250", "1.000", "0.000", "0.000", "0.250", "1.000",
                                      "0.000"}));
  EXPECT_EQ(All(html, R"re(<span class="t[^"]*"[^>]*>([^<]*)</span>)re"),
            (std::vector<std::string>{"&lt;b&gt;", " cat", " &amp; dog", "&quot;q&quot;",
                                      "&lt;b&gt;", " cat", " &amp; dog", "&quot;q&quot;"}));
  EXPECT_EQ(All(html, R"re(<span class="t at"[^>]*title="([^"]*)")re"),
            (std::vector<std::string>(2, "row 12 &middot; token 2 &middot; value 4")));
  EXPECT_EQ(html.find("<b>"), std::string::npos);  // nothing from the vocabulary unescaped
  // The histogram: one bar a bin, the tallest the full height.
  EXPECT_EQ(All(html, R"re(<rect [^>]*height="(\d+)")re"),
            (std::vector<std::string>{"30", "0", "120"}));
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST(LatentViewTest, TheTokensItFiresOnAreATable) {
  v1::GetLatentResponse r = Response();
  v1::TokenCount* t = r.add_top_tokens();
  t->set_token_id(2);
  t->set_count(6);
  t->set_fraction(6.0 / 9);
  t->set_mean(3.5);
  auto vocab = Vocabulary::Parse("a\nb\n<sat>\n");
  ASSERT_TRUE(vocab.ok());
  const std::string html = LatentHtml(r, {3, &*vocab, false});
  EXPECT_NE(html.find("<h2>Fires most on</h2>"), std::string::npos);
  EXPECT_NE(html.find("<tr><td class=\"ctx\">&lt;sat&gt;</td><td>2</td><td>6</td><td>66.7%</td>"
                      "<td>3.5</td></tr>"),
            std::string::npos)
      << html;
  EXPECT_EQ(LatentHtml(Response(), {3, nullptr, false}).find("Fires most on"), std::string::npos);
}

TEST(LatentViewTest, PositionsAreBarsOverTheSequence) {
  v1::GetLatentResponse r = Response();
  for (int64_t c : {8, 2, 0, 4}) r.add_position_histogram(c);
  r.set_position_bin_width(32);  // sequences of 128 positions
  const std::string html = LatentHtml(r, {3, nullptr, false});
  const size_t at = html.find("<h2>Where in its sequences it fires</h2>");
  ASSERT_NE(at, std::string::npos);
  const std::string bars = html.substr(at, html.find("</svg>", at) - at);
  EXPECT_EQ(All(bars, R"re(<rect [^>]*height="(\d+)")re"),
            (std::vector<std::string>{"120", "30", "0", "60"}));
  EXPECT_NE(bars.find(">128</text>"), std::string::npos);
  EXPECT_EQ(LatentHtml(Response(), {3, nullptr, false}).find("Where in its"), std::string::npos);
}

TEST(LatentViewTest, WithoutContextValuesOnlyTheRowIsShaded) {
  v1::GetLatentResponse r = Response();
  r.mutable_top(0)->clear_context_values();
  r.clear_intervals();
  const std::string html = LatentHtml(r, {3, nullptr, true});
  EXPECT_NE(html.find("Top sequences"), std::string::npos);
  EXPECT_EQ(All(html, R"re(rgba\(255,102,0,([0-9.]+)\))re"),
            (std::vector<std::string>{"0.000", "0.000", "1.000", "0.000"}));
  EXPECT_EQ(All(html, R"re(<span class="t[^"]*"[^>]*>([^<]*)</span>)re"),
            (std::vector<std::string>{" 0", " 1", " 2", " 3"}));
}

TEST(LatentViewTest, WeightsShowLogitsSideBySideAndNeighbours) {
  auto vocab = Vocabulary::Parse("a\n<b>\n the\n");
  ASSERT_TRUE(vocab.ok());
  v1::GetLatentWeightsResponse w;
  w.set_decoder_norm(1.0f);
  w.set_encoder_norm(0.5f);
  w.set_encoder_decoder_cosine(0.875f);
  w.set_logits_source("embed.W_E (tied)");
  v1::TokenLogit* up = w.add_positive_logits();
  up->set_token_id(2);
  up->set_logit(2.0f);
  v1::TokenLogit* down = w.add_negative_logits();
  down->set_token_id(1);
  down->set_logit(-1.0f);
  v1::LatentNeighbor* n = w.add_neighbors();
  n->set_latent(11);
  n->set_cosine(0.9f);
  n = w.add_neighbors();
  n->set_latent(12);
  n->set_cosine(0.5f);
  const std::set<int32_t> with_pages{11};
  LatentPageOptions options{3, &*vocab, false};
  options.weights = &w;
  options.linked_latents = &with_pages;
  const std::string page = LatentHtml(Response(), options);
  EXPECT_NE(page.find("cos(W_enc, W_dec) 0.875"), std::string::npos);
  EXPECT_NE(page.find("direct logit effect through embed.W_E (tied)"), std::string::npos);
  // Raised tokens in blue at full strength for the largest |logit|, lowered ones in red at half.
  EXPECT_EQ(All(page, R"re(rgba\(110,170,240,([0-9.]+)\)" title="id 2"> the<)re"),
            std::vector<std::string>{"1.000"});
  EXPECT_EQ(All(page, R"re(rgba\(250,120,120,([0-9.]+)\)" title="id 1">&lt;b&gt;<)re"),
            std::vector<std::string>{"0.500"});
  EXPECT_NE(page.find("<td>+2.000</td>"), std::string::npos);
  EXPECT_NE(page.find("<td>-1.000</td>"), std::string::npos);
  EXPECT_NE(page.find("<tr><td><a href=\"latent-11.html\">11</a></td><td>0.9000</td>"),
            std::string::npos);
  EXPECT_NE(page.find("<tr><td>12</td><td>0.5000</td>"), std::string::npos);

  // Without logits the page says why.
  w.clear_positive_logits();
  w.clear_negative_logits();
  w.set_logits_source("");
  w.set_logits_unavailable("the model <m> changed");
  const std::string without = LatentHtml(Response(), options);
  EXPECT_EQ(without.find("direct logit effect"), std::string::npos);
  EXPECT_NE(without.find("no logits: the model &lt;m&gt; changed"), std::string::npos);
  EXPECT_NE(without.find("Nearest decoder directions"), std::string::npos);
}

// A crosscoder's latent: a line per source with its norm, its share as a bar and, past the
// first, its decoder's cosine with the first's; on the page as on the terminal.
TEST(LatentViewTest, ACrosscodersLatentShowsItsDecoderBySource) {
  v1::GetLatentWeightsResponse w;
  for (const auto& [hook, norm, share, cosine] :
       {std::tuple{"blocks.1.hook_resid_post", 0.125f, 0.08f, 1.0f},
        std::tuple{"blocks.1.hook_resid_post<chat>", 1.4375f, 0.92f, 0.05f}}) {
    v1::SourceDecoder* d = w.add_decoder_by_source();
    d->set_hook_name(hook);
    d->set_norm(norm);
    d->set_share(share);
    d->set_cosine_with_first(cosine);
  }
  const std::vector<std::string> lines = DescribeDecoderBySource(w);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(
      lines[0],
      "source 0 blocks.1.hook_resid_post        |W_dec| 0.125    share 0.08 ##                  ");
  EXPECT_EQ(lines[1],
            "source 1 blocks.1.hook_resid_post<chat>  |W_dec| 1.438    share 0.92 "
            "##################    cos with source 0 0.050");
  w.mutable_decoder_by_source(0)->set_logits_unavailable("the model <m> changed");
  v1::TokenLogit* up = w.mutable_decoder_by_source(1)->add_positive_logits();
  up->set_token_id(7);
  up->set_logit(2.0f);
  w.mutable_decoder_by_source(1)->set_logits_source("embed.W_E (tied)");
  LatentPageOptions options{3, nullptr, false};
  options.weights = &w;
  const std::string page = LatentHtml(Response(), options);
  EXPECT_NE(page.find("a crosscoder's latent, its decoder in each source:"), std::string::npos);
  EXPECT_NE(page.find("source 1 blocks.1.hook_resid_post&lt;chat&gt;"), std::string::npos);
  // Each source's logits, under its own heading.
  EXPECT_NE(page.find("<p>source 0: no logits: the model &lt;m&gt; changed</p>"),
            std::string::npos);
  EXPECT_NE(page.find("<p>source 1: direct logit effect through embed.W_E (tied)</p>"),
            std::string::npos);
  EXPECT_NE(page.find("title=\"id 7\""), std::string::npos);
  EXPECT_TRUE(DescribeDecoderBySource(v1::GetLatentWeightsResponse()).empty());
}

TEST(LatentViewTest, APromptPageShadesItsTokensByEachTopLatent) {
  auto vocab = Vocabulary::Parse("a\n b\n<c>\n");
  ASSERT_TRUE(vocab.ok());
  v1::EncodePromptResponse r;
  r.set_bos_prepended(true);
  // Latent 5 fires 2.0 on position 1 and 1.0 on position 2; latent 6 only on position 0.
  const std::vector<std::vector<std::pair<int32_t, float>>> fires = {
      {{6, 0.5f}}, {{5, 2.0f}}, {{5, 1.0f}, {6, 0.25f}}};
  for (int p = 0; p < 3; ++p) {
    v1::PromptToken* t = r.add_tokens();
    t->set_token_id(p);
    t->set_active(static_cast<int32_t>(fires[p].size()));
    for (const auto& [latent, value] : fires[p]) {
      t->add_latents(latent);
      t->add_values(value);
    }
  }
  v1::PromptLatent* five = r.add_top_latents();
  five->set_latent(5);
  five->set_max_value(2.0f);
  five->set_position(1);
  five->set_positions(2);
  v1::PromptLatent* six = r.add_top_latents();
  six->set_latent(6);
  six->set_max_value(0.5f);
  six->set_position(0);
  six->set_positions(2);
  const std::set<int32_t> pages{6};
  const std::string page = PromptHtml(r, {3, &*vocab, &pages});
  EXPECT_NE(page.find("a prompt of 3 tokens"), std::string::npos);
  EXPECT_NE(page.find("BOS prepended"), std::string::npos);
  EXPECT_NE(page.find("position 2 &middot; token 2 &middot; 2 latents &middot; 5: 1, 6: 0.25\">"
                      "&lt;c&gt;</span>"),
            std::string::npos);
  // One line per top latent: its shading over the three tokens, its largest outlined.
  EXPECT_EQ(All(page, R"re(rgba\(255,102,0,([0-9.]+)\)" title="position)re"),
            (std::vector<std::string>{"0.000", "1.000", "0.500", "1.000", "0.000", "0.500"}));
  EXPECT_EQ(All(page, R"re(<span class="t at"[^>]*title="(position \d))re"),
            (std::vector<std::string>{"position 1", "position 0"}));
  // Only latent 6 has a page beside this one.
  EXPECT_NE(page.find("latent 5</span>"), std::string::npos);
  EXPECT_NE(page.find("latent <a href=\"latent-6.html\">6</a></span>"), std::string::npos);
}

TEST(LatentViewTest, DashboardPagesLinkToEachOther) {
  v1::LatentsOnRowsResponse cofiring;
  cofiring.set_rows_selected(9);
  cofiring.set_rows_read(9);
  v1::RowLatent* with = cofiring.add_latents();
  with->set_latent(11);
  with->set_count(6);
  with->set_fraction(6.0 / 9);
  with->set_lift(3.5);
  with->set_precision(0.75);
  with->set_f1(2 * 0.75 * (6.0 / 9) / (0.75 + 6.0 / 9));
  v1::RowLatent* without_page = cofiring.add_latents();
  without_page->set_latent(12);
  without_page->set_count(2);
  const std::set<int32_t> with_pages{7, 11};
  LatentPageOptions options{3, nullptr, false};
  options.cofiring = &cofiring;
  options.in_dashboard = true;
  options.linked_latents = &with_pages;
  const std::string page = LatentHtml(Response(), options);
  EXPECT_NE(page.find("<a href=\"index.html\">"), std::string::npos);
  EXPECT_NE(page.find("latents on the 9 rows where it fires (9 read), most often first"),
            std::string::npos);
  EXPECT_NE(page.find("<td>3.5</td><td>0.7500</td><td>0.7059</td></tr>"), std::string::npos);
  EXPECT_EQ(All(page, R"re(<tr><td><a href="([^"]+)">11</a></td><td>6</td><td>0.6667</td>)re"),
            std::vector<std::string>{"latent-11.html"});
  EXPECT_NE(page.find("<tr><td>12</td><td>2</td>"), std::string::npos);  // no page: no link
  // Another hook's dataset over the same rows: its own table, its latents never linked (their
  // pages are another dashboard's), its heading escaped.
  v1::LatentsOnRowsResponse other;
  other.set_rows_selected(9);
  other.set_rows_read(9);
  v1::RowLatent* in_other = other.add_latents();
  in_other->set_latent(11);
  in_other->set_count(4);
  options.cofiring_elsewhere.push_back({"dataset 4 (l<1>, blocks.1.hook_resid_post)", &other});
  const std::string with_other = LatentHtml(Response(), options);
  EXPECT_NE(with_other.find("<h2>Fires with, in dataset 4 (l&lt;1&gt;, blocks.1.hook_resid_post)"
                            "</h2>"),
            std::string::npos);
  EXPECT_NE(with_other.find("<tr><td>11</td><td>4</td>"), std::string::npos);
  EXPECT_NE(with_other.find("(9 read), most alike first (by F1"), std::string::npos);
  EXPECT_EQ(All(with_other, R"re(<a href="(latent-11.html)">)re").size(), 1u);  // the own table's
  options.cofiring_elsewhere.clear();
  // Outside a dashboard the same table names latents without links.
  options.in_dashboard = false;
  options.linked_latents = nullptr;
  const std::string alone = LatentHtml(Response(), options);
  EXPECT_EQ(alone.find("<a href"), std::string::npos);
  options.back_href = "../../graph.html";
  options.back_text = "the <graph>";
  EXPECT_NE(LatentHtml(Response(), options)
                .find("<p><a href=\"../../graph.html\">back to the &lt;graph&gt;</a></p>"),
            std::string::npos);
  options.back_href.clear();
  EXPECT_NE(alone.find("<tr><td>11</td><td>6</td>"), std::string::npos);

  v1::ListLatentsResponse overview;
  overview.set_rows(1000);
  overview.set_d_sae(8);
  overview.set_dead_latents(2);
  overview.set_matching(6);
  overview.set_log10_density_min(-3);
  for (int64_t c : {1, 3, 2}) overview.add_log10_density_histogram(c);
  for (int32_t l : {5, 0}) {
    v1::LatentSummary* s = overview.add_latents();
    s->set_latent(l);
    s->set_firing_count(100 - l);
    s->set_density((100 - l) / 1000.0);
  }
  std::map<int32_t, std::vector<v1::TokenCount>> tokens;
  v1::TokenCount the;
  the.set_token_id(1);
  the.set_fraction(0.75);
  tokens[5] = {the, the, the, the};  // only the first three are shown
  auto vocab = Vocabulary::Parse("a\n the\n");
  ASSERT_TRUE(vocab.ok());
  const std::string index =
      LatentIndexHtml(overview, {3, "the 2 <most> frequent", true, &tokens, &*vocab});
  EXPECT_NE(index.find("<td class=\"ctx\"><span class=\"tok\"> the</span> 75%, "
                       "<span class=\"tok\"> the</span> 75%, "
                       "<span class=\"tok\"> the</span> 75%</td></tr>"),
            std::string::npos)
      << index;
  EXPECT_NE(index.find("<td class=\"ctx\"></td></tr>"), std::string::npos);  // latent 0: none
  EXPECT_NE(index.find("1000 rows; 2 dead latents (25.00%); 6 match the filter"),
            std::string::npos);
  EXPECT_NE(index.find("the 2 &lt;most&gt; frequent"), std::string::npos);
  EXPECT_EQ(All(index, R"re(<td><a href="([^"]+)">)re"),
            (std::vector<std::string>{"latent-5.html", "latent-0.html"}));
  EXPECT_EQ(All(index, R"re(<rect [^>]*height="(\d+)")re"),
            (std::vector<std::string>{"40", "120", "80"}));
  EXPECT_NE(index.find(">-3</text>"), std::string::npos);          // the axis from log10(1 / rows)
  EXPECT_EQ(index.find("explained variance"), std::string::npos);  // no fit given
  // The SAE's fit, where the dataset has one.
  v1::SaeFit fit;
  fit.set_rows(1000);
  fit.set_explained_variance(0.8125);
  fit.set_mse(0.002);
  fit.set_cosine_similarity(0.9);
  const std::string with_fit =
      LatentIndexHtml(overview, {3, "the 2 frequent", true, nullptr, nullptr, &fit});
  EXPECT_NE(with_fit.find("explained variance 0.8125, MSE 0.002, cosine 0.9000 (over 1000 rows)"),
            std::string::npos)
      << with_fit;
  EXPECT_NE(with_fit.find("the SAE reconstructs the hook"), std::string::npos);
  fit.set_predicted_hook("blocks.1.hook_mlp_out");  // a transcoder's
  const std::string transcoder =
      LatentIndexHtml(overview, {3, "the 2 frequent", true, nullptr, nullptr, &fit});
  EXPECT_NE(transcoder.find("the transcoder predicts blocks.1.hook_mlp_out with explained "
                            "variance 0.8125"),
            std::string::npos)
      << transcoder;
  EXPECT_EQ(LatentPageName(42), "latent-42.html");
}

// What was written about a latent: a line under the page's title, and a column of the index.
TEST(LatentViewTest, ExplanationsStandOnThePageAndInTheIndex) {
  v1::LatentExplanation e;
  e.set_latent(5);
  e.set_text("<b>French</b> words");
  EXPECT_EQ(ExplanationLine(e), "<b>French</b> words");
  e.set_source("delphi");
  EXPECT_EQ(ExplanationLine(e), "<b>French</b> words (delphi)");
  e.set_score(0.8125);
  EXPECT_EQ(ExplanationLine(e), "<b>French</b> words (score 0.812, delphi)");

  v1::GetLatentResponse response;
  response.mutable_statistics()->set_latent(5);
  LatentPageOptions options;
  options.dataset_id = 3;
  EXPECT_EQ(LatentHtml(response, options).find("class=\"explanation\""), std::string::npos);
  *response.mutable_explanation() = e;
  const std::string page = LatentHtml(response, options);
  const size_t title = page.find("<h1>");
  const size_t line = page.find(
      "<p class=\"explanation\"><b>&lt;b&gt;French&lt;/b&gt; words (score 0.812, delphi)</b></p>");
  ASSERT_NE(line, std::string::npos) << page;
  EXPECT_LT(title, line);

  v1::ListLatentsResponse overview;
  overview.set_rows(10);
  overview.set_d_sae(8);
  for (int32_t l : {5, 0}) overview.add_latents()->set_latent(l);
  std::map<int32_t, v1::LatentExplanation> explanations = {{5, e}};
  IndexPageOptions index{3, "two", false};
  EXPECT_EQ(LatentIndexHtml(overview, index).find("<th>explanation</th>"), std::string::npos);
  index.explanations = &explanations;
  const std::string html = LatentIndexHtml(overview, index);
  EXPECT_NE(html.find("<th>explanation</th>"), std::string::npos);
  EXPECT_NE(html.find("<td>&lt;b&gt;French&lt;/b&gt; words (score 0.812, delphi)</td></tr>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<td></td></tr>"), std::string::npos);  // latent 0 has none
}

// One JSON line per latent for auto-interpretation: everything the answer holds, token texts
// exactly as the vocabulary has them (a newline stays a newline), silent windows included.
TEST(LatentViewTest, ExamplesAreOneJsonLineWithTheTokensText) {
  v1::GetLatentResponse r = Response();
  v1::TopActivation* quiet = r.add_silent();
  quiet->set_row(40);
  for (int32_t id : {3, 1, 9}) quiet->add_context_token_ids(id);
  for (int i = 0; i < 3; ++i) quiet->add_context_values(0.0f);
  auto vocab = Vocabulary::Parse(R"(["a", "b\nc", "\u00e9", "<d>"])");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  const std::string line = LatentExamplesJson(r, 3, &*vocab);
  EXPECT_EQ(line.find('\n'), std::string::npos);  // one line
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["dataset_id"], 3);
  EXPECT_EQ(j["latent"], 7);
  EXPECT_EQ(j["firing_count"], 9);
  ASSERT_EQ(j["top"].size(), 1u);
  EXPECT_EQ(j["top"][0]["row"], 12);
  EXPECT_EQ(j["top"][0]["token_ids"], nlohmann::json({0, 1, 2, 3}));
  EXPECT_EQ(j["top"][0]["values"], nlohmann::json({0.0, 1.0, 4.0, 0.0}));
  EXPECT_EQ(j["top"][0]["tokens"], nlohmann::json({"a", "b\nc", "\u00e9", "<d>"}));
  ASSERT_EQ(j["intervals"].size(), 1u);
  EXPECT_EQ(j["intervals"][0]["count"], 9);
  EXPECT_EQ(j["intervals"][0]["examples"][0]["row"], 12);
  ASSERT_EQ(j["silent"].size(), 1u);
  EXPECT_EQ(j["silent"][0]["row"], 40);
  EXPECT_EQ(j["silent"][0]["tokens"], nlohmann::json({"<d>", "b\nc", nullptr}));  // 9: unknown
  // Without a vocabulary: ids and values only.
  const nlohmann::json bare = nlohmann::json::parse(LatentExamplesJson(r, 3, nullptr));
  EXPECT_FALSE(bare["top"][0].contains("tokens"));
  EXPECT_FALSE(bare.contains("explanation"));
  // A latent already explained carries it, to be scored again or replaced.
  r.mutable_explanation()->set_text("digits");
  r.mutable_explanation()->set_source("delphi");
  const nlohmann::json explained = nlohmann::json::parse(LatentExamplesJson(r, 3, nullptr));
  EXPECT_EQ(explained["explanation"], nlohmann::json({{"text", "digits"}, {"source", "delphi"}}));
  r.mutable_explanation()->set_score(0.5);
  EXPECT_EQ(nlohmann::json::parse(LatentExamplesJson(r, 3, nullptr))["explanation"]["score"], 0.5);
}

// The attribution page: the metric, positions shaded by sign (blue for, red against), a line
// per top latent with its entries' attributions at their tokens, links to dashboard pages.
TEST(LatentViewTest, AnAttributionPageShadesThePromptBySign) {
  v1::AttributePromptResponse r;
  for (int32_t t : {0, 1, 2}) r.add_prompt(t);
  r.set_target_token_id(2);
  r.set_contrast_token_id(1);
  r.set_metric(1.5);
  r.set_latent_attribution(0.5);
  r.set_error_attribution(-0.25);
  for (double a : {0.0, 1.0, -0.5}) r.add_latent_attribution_by_position(a);
  for (double a : {0.0, 0.0, 0.25}) r.add_error_attribution_by_position(a);
  v1::LatentAttribution* l = r.add_top_latents();
  l->set_latent(9);
  l->set_attribution(0.5);
  for (auto [position, attribution] : {std::pair{1, 1.0}, std::pair{2, -0.5}}) {
    v1::LatentAttribution* e = r.add_top_entries();
    e->set_latent(9);
    e->set_position(position);
    e->set_activation(3.0f);
    e->set_attribution(attribution);
  }
  auto vocab = Vocabulary::Parse("a\nb\n<c>\n");
  ASSERT_TRUE(vocab.ok());
  const std::set<int32_t> pages = {9};
  const std::string html = AttributionHtml(r, {4, &*vocab, &pages});
  EXPECT_NE(html.find("what drives logit(<code>&lt;c&gt;</code>) &minus; logit(<code>b</code>) = "
                      "1.5000"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("the latents +0.5000, the SAE's error term -0.2500"), std::string::npos);
  // Position 1 is the largest (1.0): full blue; position 2 (-0.5 + 0.25) a quarter red.
  EXPECT_NE(html.find("rgba(0,102,255,1.000)\" title=\"position 1 &middot; token 1 &middot; "
                      "latents +1.0000 &middot; error +0.0000\">b</span>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("rgba(255,51,0,0.250)\" title=\"position 2"), std::string::npos) << html;
  EXPECT_NE(html.find("<a href=\"latent-9.html\">9</a>"), std::string::npos) << html;
  EXPECT_NE(html.find("rgba(255,51,0,0.500)\" title=\"position 2 &middot; value 3 &middot; "
                      "attribution -0.5\">&lt;c&gt;</span>"),
            std::string::npos)
      << html;
  // A latent as the target.
  r.mutable_target_latent()->set_dataset_id(6);
  r.mutable_target_latent()->set_latent(12);
  r.mutable_target_latent()->set_position(2);
  EXPECT_NE(AttributionHtml(r, {4, &*vocab, &pages})
                .find("what drives latent 12 of dataset 6 at position 2 (<code>&lt;c&gt;</code>) = "
                      "1.5000"),
            std::string::npos);
  EXPECT_EQ(html.find("Ablation check"), std::string::npos);  // none asked: no plot
  // The ablation check: a dot per checked entry, across at minus its credit, up at the measured
  // change, on equal axes of +-1 (the largest of both); the diagonal dashed.
  r.mutable_top_entries(0)->set_ablated_change(-0.5);
  r.mutable_top_entries(1)->set_ablated_change(0.25);
  const std::string checked = AttributionHtml(r, {4, &*vocab, &pages});
  EXPECT_NE(
      checked.find(
          "<h2>Ablation check</h2>\n<p>ablation check of the top 2 entries: the "
          "measured change has the sign the credit predicts for 2 of them; measured / predicted, "
          "median 0.5."),
      std::string::npos)
      << checked;
  // Side 300, margin 40: x(v) = 40 + 252 (v + 1) / 2, y(v) = 8 + 252 (1 - v) / 2.
  EXPECT_NE(checked.find("<circle cx=\"40.0\" cy=\"197.0\" r=\"3.5\" fill=\"#ff6600\"><title>"
                         "latent 9 at 1: predicted -1, measured -0.5</title></circle>"),
            std::string::npos)
      << checked;
  EXPECT_NE(checked.find("<circle cx=\"229.0\" cy=\"102.5\""), std::string::npos) << checked;
  EXPECT_NE(checked.find("<line x1=\"40.0\" y1=\"260.0\" x2=\"292.0\" y2=\"8.0\" "
                         "stroke=\"#999\" stroke-dasharray=\"4 3\"/>"),
            std::string::npos)
      << checked;
}

// The steering page: the loss change shades each predicted token (blue: the steered run
// predicts it better), the intervened latent's values with its named position outlined, the
// steered tokens that part from the clean continuation outlined, a sweep's KL plotted in value
// order with the request's own run among the points.
TEST(LatentViewTest, ASteeringPageShowsTheLossChangeAndTheRunsSideBySide) {
  v1::SteerPromptRequest request;
  v1::LatentIntervention* in = request.add_interventions();
  in->set_latent(9);
  in->set_mode(v1::LatentIntervention::SET);
  in->set_value(4);
  in->add_positions(1);
  v1::SteerPromptResponse r;
  for (int t : {0, 1, 2}) r.add_prompt(t);
  for (float l : {1.0f, 2.0f}) r.mutable_clean()->add_token_losses(l);
  for (float l : {0.5f, 2.25f}) r.mutable_steered()->add_token_losses(l);
  r.mutable_clean()->set_mean_loss(1.5);
  r.mutable_steered()->set_mean_loss(1.375);
  for (int t : {2, 1}) r.mutable_clean()->add_generated(t);
  for (int t : {2, 0}) r.mutable_steered()->add_generated(t);
  auto next = [](v1::SteeredRun* run, int id, float p) {
    v1::TokenProbability* n = run->add_next();
    n->set_token_id(id);
    n->set_probability(p);
  };
  next(r.mutable_clean(), 1, 0.5f);
  next(r.mutable_steered(), 2, 0.75f);
  r.set_kl_divergence(0.125);
  v1::LatentValues* values = r.add_latent_values();
  values->set_latent(9);
  for (float v : {0.0f, 2.0f, 1.0f}) values->add_values(v);
  for (float value : {8.0f, 0.0f}) {
    v1::SweptRun* s = r.add_sweep();
    s->set_value(value);
    s->set_kl_divergence(value / 4);
    next(s->mutable_run(), 2, 0.5f);
  }
  auto vocab = Vocabulary::Parse("a\nb\n<c>\n");
  ASSERT_TRUE(vocab.ok());
  const std::set<int32_t> pages = {9};
  const std::string html = SteeringHtml(request, r, {4, &*vocab, &pages});
  EXPECT_NE(html.find("<li>latent 9 set 4 (position 1)</li>"), std::string::npos) << html;
  EXPECT_NE(html.find("0.125 nats"), std::string::npos);
  // Token 1 is predicted 0.5 nats better (the largest change): full blue; token 2 0.25 worse.
  EXPECT_NE(html.find("rgba(0,102,255,1.000)\" title=\"position 1 &middot; loss clean 1.0000, "
                      "steered 0.5000\">b</span>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("rgba(255,51,0,0.500)\" title=\"position 2 &middot; loss clean 2.0000, "
                      "steered 2.2500\">&lt;c&gt;</span>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("mean loss clean 1.5000, steered 1.3750"), std::string::npos);
  // The latent's values over the prompt, position 1 (where the intervention applies) outlined.
  EXPECT_NE(html.find("<a href=\"latent-9.html\">9</a>"), std::string::npos);
  EXPECT_NE(html.find("<span class=\"t at\" style=\"background:rgba(255,102,0,1.000)\" "
                      "title=\"position 1 &middot; token 1 &middot; value 2\">b</span>"),
            std::string::npos)
      << html;
  // The next token side by side; the steered continuation's second token parts from the clean.
  EXPECT_NE(html.find("<td>1</td><td class=\"ctx\">b</td><td>0.5000</td><td class=\"ctx\">"
                      "&lt;c&gt;</td><td>0.7500</td>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<span class=\"t\" title=\"new token 1 &middot; id 2\">&lt;c&gt;</span>"
                      "<span class=\"t at\" title=\"new token 2 &middot; id 0\">a</span>"),
            std::string::npos)
      << html;
  // The sweep: values 0, 4 (the request's own) and 8 in order along the plot's line.
  const size_t plot = html.find("<polyline points=\"");
  ASSERT_NE(plot, std::string::npos) << html;
  EXPECT_NE(html.find("<title>value 0: KL 0 nats</title>"), std::string::npos);
  EXPECT_LT(html.find("<title>value 0:"), html.find("<title>value 4: KL 0.125 nats</title>"));
  EXPECT_LT(html.find("<title>value 4:"), html.find("<title>value 8: KL 2 nats</title>"));
  EXPECT_NE(html.find("<tr><td>8</td><td>2</td><td class=\"ctx\">&lt;c&gt;</td><td>0.5000</td>"),
            std::string::npos)
      << html;
}

// A graph over two hooks: the output, latent 40 at position 2 of blocks.1 and its error node,
// latent 7 at position 1 of blocks.0.
v1::AttributionGraphResponse SmallGraph() {
  v1::AttributionGraphResponse g;
  for (const auto& [id, hook] :
       {std::pair{5, "blocks.0.hook_resid_post"}, std::pair{6, "blocks.1.hook_resid_post"}}) {
    v1::GraphHook* h = g.add_hooks();
    h->set_dataset_id(id);
    h->set_hook_name(hook);
  }
  for (int t : {0, 1, 2}) g.mutable_output()->add_prompt(t);
  g.mutable_output()->set_target_token_id(2);
  g.mutable_output()->set_metric(-0.5);
  for (const auto& [hook, latent, position, activation, importance] :
       std::vector<std::tuple<int, int, int, float, double>>{{2, -1, 2, -0.5f, 1.0},
                                                             {1, 40, 2, 3.0f, 0.5},
                                                             {1, -1, -1, 0, 0.25},
                                                             {0, 7, 1, 1.5f, 0.125}}) {
    v1::GraphNode* n = g.add_nodes();
    n->set_hook(hook);
    n->set_latent(latent);
    n->set_position(position);
    n->set_activation(activation);
    n->set_importance(importance);
  }
  for (const auto& [from, to, attribution] :
       std::vector<std::tuple<int, int, double>>{{1, 0, 2.0}, {2, 0, -1.0}, {3, 1, 0.5}}) {
    v1::GraphEdge* e = g.add_edges();
    e->set_from_node(from);
    e->set_to_node(to);
    e->set_attribution(attribution);
  }
  g.add_notes("a <note>");
  return g;
}

// The graph page: a column per hook and the output, each node's box at its column, each edge a
// path coloured by sign and as wide as its share of the strongest into its child.
TEST(LatentViewTest, AnAttributionGraphIsDrawnColumnByColumn) {
  const v1::AttributionGraphResponse g = SmallGraph();
  auto vocab = Vocabulary::Parse("a\nb\n<c>\n");
  ASSERT_TRUE(vocab.ok());
  const std::string html = AttributionGraphHtml(g, &*vocab);
  EXPECT_NE(html.find("<h1>Attribution graph of log p(<code>&lt;c&gt;</code>) = -0.5000</h1>"),
            std::string::npos)
      << html;
  // Columns 10, 240, 470: blocks.0, blocks.1, the output.
  EXPECT_NE(html.find("<text x=\"240\" y=\"20\" font-weight=\"bold\">blocks.1.hook_resid_post"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<title>#40@2 &#183; importance 0.500</title><rect x=\"240\" y=\"52\""),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<text x=\"246\" y=\"83\" font-family=\"monospace\">&lt;c&gt; = 3</text>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<title>#7@1 &#183; importance 0.125</title><rect x=\"10\" y=\"52\""),
            std::string::npos)
      << html;
  // The error node below the latent; the output fully shaded, the others by their importance
  // over the largest (0.5).
  EXPECT_NE(html.find("importance 0.250</title><rect x=\"240\" y=\"102\" width=\"170\" "
                      "height=\"38\" rx=\"4\" fill=\"rgba(255,102,0,0.400)\""),
            std::string::npos)
      << html;
  // Edges: the latent's into the output at full width, blue; the error's half as wide, red.
  EXPECT_NE(html.find("stroke=\"#0066ff\" stroke-width=\"5.50\" stroke-opacity=\"0.6\">"
                      "<title>#40@2 &#8594; output: +2</title>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("stroke=\"#ff3300\" stroke-width=\"3.00\" stroke-opacity=\"0.6\">"
                      "<title>error of blocks.1.hook_resid_post &#8594; output: -1</title>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<p>Note: a &lt;note&gt;</p>"), std::string::npos);
  // No coverage in the answer: no line under the hooks' names; no labels: two lines a box.
  EXPECT_EQ(html.find("kept "), std::string::npos);
  EXPECT_EQ(html.find("y=\"98\""), std::string::npos);
}

// With its coverage, a hook's column says under its name where what reaches it goes; with
// labels, each latent's box grows a third line (cut to the box, whole in its tooltip).
TEST(LatentViewTest, AGraphPageShowsCoverageAndNodeLabels) {
  v1::AttributionGraphResponse g = SmallGraph();
  v1::GraphHook* hook = g.mutable_hooks(1);
  hook->set_kept_nodes(1);
  hook->set_kept_importance(0.5);
  hook->set_error_importance(0.25);
  hook->set_dropped_importance(0.25);
  const GraphNodeLabels labels = {
      {{6, 40}, "\"<cat>\" 60%"},
      {{5, 7},
       "\"x\u00e9t\u00e9\u00e9t\u00e9\u00e9t\u00e9\u00e9t\u00e9\u00e9t\u00e9\" 90%, \"b\" 5%"}};
  const std::string html = AttributionGraphHtml(g, nullptr, &labels);
  EXPECT_NE(html.find("<text x=\"240\" y=\"36\" fill=\"#555\"><title>1 kept node: 50% of "
                      "what reaches the hook; SAE error 25%, not kept 25%</title>kept 50% &#183; "
                      "error 25% &#183; not kept 25%</text>"),
            std::string::npos)
      << html;
  EXPECT_EQ(html.find("<text x=\"10\" y=\"36\""), std::string::npos) << html;  // no coverage
  // Boxes 52 high, rows 64 apart: the error node of blocks.1 at 52 + 64.
  EXPECT_NE(html.find("<title>#40@2 (fires most on &quot;&lt;cat&gt;&quot; 60%) &#183; importance "
                      "0.500</title><rect x=\"240\" y=\"52\" width=\"170\" height=\"52\""),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<text x=\"246\" y=\"98\" fill=\"#444\">&quot;&lt;cat&gt;&quot; 60%</text>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<rect x=\"240\" y=\"116\""), std::string::npos) << html;
  // An edge with its ablation check: the measured change in its tooltip.
  v1::AttributionGraphResponse checked = g;
  checked.mutable_edges(0)->set_ablated_change(-1.5);
  EXPECT_NE(AttributionGraphHtml(checked, nullptr)
                .find("<title>#40@2 &#8594; output: +2 &#183; taken out, it moves by -1.5</title>"),
            std::string::npos);
  // Linked: each latent's box inside an <a> to its page; the error node and output not.
  const std::string linked =
      AttributionGraphHtml(g, nullptr, &labels, "board-{dataset}/latent-{latent}.html");
  EXPECT_NE(linked.find("<a href=\"board-6/latent-40.html\"><g><title>#40@2"), std::string::npos)
      << linked;
  EXPECT_NE(linked.find("<a href=\"board-5/latent-7.html\"><g>"), std::string::npos) << linked;
  EXPECT_EQ(
      std::count(linked.begin(), linked.end(), '<') - std::count(html.begin(), html.end(), '<'),
      4);  // two <a>, two </a>
  // A long label cut at a character's start with an ellipsis: byte 26 is inside the fifth
  // "été"'s last é (two bytes), so the cut falls before it.
  EXPECT_NE(html.find("<text x=\"16\" y=\"98\" fill=\"#444\">&quot;x\u00e9t\u00e9\u00e9t"
                      "\u00e9\u00e9t\u00e9\u00e9t\u00e9\u00e9t\u2026</text>"),
            std::string::npos)
      << html;
}

}  // namespace
}  // namespace latentd::client
