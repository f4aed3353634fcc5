#include "client/latent_view.h"

#include <regex>

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

}  // namespace
}  // namespace latentd::client
