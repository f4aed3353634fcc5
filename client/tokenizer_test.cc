#include "client/tokenizer.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace latentd::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

// A BPE tokenizer.json whose ids are the tokens' positions in `tokens`.
Json BpeJson(const std::vector<std::string>& tokens, const std::vector<std::string>& merges) {
  Json vocab = Json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  return Json{{"version", "1.0"},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
              {"added_tokens", Json::array()}};
}

Tokenizer Make(const Json& json) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Parse(json.dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return std::move(tokenizer).value();
}

Ids Encode(const Tokenizer& tokenizer, const std::string& text, bool special = true) {
  absl::StatusOr<Ids> ids = tokenizer.Encode(text, special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : Ids{};
}

TEST(TokenizerTest, MergesTheLowestRankFirstAndTheLeftmostAmongEquals) {
  // ranks: "b c" (0) before "a b" (1): "abc" -> a + bc, never ab + c.
  const Tokenizer t = Make(BpeJson({"a", "b", "c", "ab", "bc", "aa"}, {"b c", "a b", "a a"}));
  EXPECT_THAT(Encode(t, "abc"), ElementsAre(0, 4));
  EXPECT_THAT(Encode(t, "ab"), ElementsAre(3));
  EXPECT_THAT(Encode(t, "aaa"), ElementsAre(5, 0));  // the left pair merges first
  EXPECT_THAT(Encode(t, ""), ElementsAre());
}

TEST(TokenizerTest, ByteLevelSplitsLikeGpt2AndSpellsBytes) {
  // Byte-level spellings: "Ġ" is the space, "Ċ" the newline.
  Json json = BpeJson({"h", "i", "Ġ", "Ċ", "!", "hi", "Ġh", "Ġhi", "'", "s", "'s", "Ã", "©"},
                      {"Ġ h", "Ġh i", "h i", "' s"});
  json["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
  const Tokenizer t = Make(json);
  // " hi" keeps its space (one pre-token), "!" splits off, "'s" after a word is a contraction.
  EXPECT_THAT(Encode(t, "hi hi!hi's"), ElementsAre(5, 7, 4, 5, 10));
  // After punctuation it is not: "!'" is one run of symbols.
  EXPECT_THAT(Encode(t, "!'s"), ElementsAre(4, 8, 9));
  // é is two bytes, spelled Ã ©; a newline is Ċ.
  EXPECT_THAT(Encode(t, "\xC3\xA9\n"), ElementsAre(11, 12, 3));
  // Two spaces before a word: the first stands alone (\s+(?!\S)), the second joins the word.
  EXPECT_THAT(Encode(t, "hi  hi"), ElementsAre(5, 2, 7));

  json["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_THAT(Encode(Make(json), "hi"), ElementsAre(7));
}

TEST(TokenizerTest, SplitBehaviorsPlaceTheDelimiterAsHuggingFaceDoes) {
  const Json base =
      BpeJson({"a", "b", "-", "a-", "-b", "a-b", "--"}, {"a -", "a- b", "- b", "- -"});
  const auto with_split = [&](const char* behavior, bool invert = false) {
    Json json = base;
    json["pre_tokenizer"] = {{"type", "Split"},
                             {"pattern", {{"String", "-"}}},
                             {"behavior", behavior},
                             {"invert", invert}};
    return Make(json);
  };
  EXPECT_THAT(Encode(Make(base), "a-b"), ElementsAre(5));  // no pre-tokenizer: one word
  EXPECT_THAT(Encode(with_split("Isolated"), "a-b"), ElementsAre(0, 2, 1));
  EXPECT_THAT(Encode(with_split("Removed"), "a-b"), ElementsAre(0, 1));
  EXPECT_THAT(Encode(with_split("MergedWithPrevious"), "a-b"), ElementsAre(3, 1));
  EXPECT_THAT(Encode(with_split("MergedWithNext"), "a-b"), ElementsAre(0, 4));
  EXPECT_THAT(Encode(with_split("Contiguous"), "a--b"), ElementsAre(0, 6, 1));
  EXPECT_THAT(Encode(with_split("Isolated"), "a--b"), ElementsAre(0, 2, 2, 1));
  // invert: the matches are what is kept, the rest the delimiters.
  EXPECT_THAT(Encode(with_split("Removed", /*invert=*/true), "a-b"), ElementsAre(2));
}

TEST(TokenizerTest, RegexSplitUsesUnicodeWhitespace) {
  // \s covers U+0085 (NEL), as Oniguruma's does (the Unicode White_Space property).
  Json json = BpeJson({"x", "\xC2\x85", " "}, {});
  json["pre_tokenizer"] = {{"type", "Split"},
                           {"pattern", {{"Regex", "\\s+"}}},
                           {"behavior", "Removed"},
                           {"invert", false}};
  EXPECT_THAT(Encode(Make(json), "x\xC2\x85x x"), ElementsAre(0, 0, 0));
}

TEST(TokenizerTest, SentencePieceStyleWithByteFallbackAndBos) {
  Json json = BpeJson(
      {"<unk>", "<s>", "</s>", "<0xC3>", "<0xA9>", "\u2581", "h", "i", "\u2581h", "\u2581hi"},
      {"\u2581 h", "\u2581h i"});
  json["model"]["unk_token"] = "<unk>";
  json["model"]["byte_fallback"] = true;
  json["model"]["fuse_unk"] = true;
  json["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", "\u2581"}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}};
  json["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  json["added_tokens"] = {{{"id", 1}, {"content", "<s>"}, {"special", true}},
                          {{"id", 2}, {"content", "</s>"}, {"special", true}}};
  const Tokenizer t = Make(json);
  EXPECT_THAT(Encode(t, "hi hi"), ElementsAre(1, 9, 9));
  EXPECT_THAT(Encode(t, "hi hi", /*special=*/false), ElementsAre(9, 9));
  // é has no token but its bytes do; the two unknown "xy" fuse into one <unk>.
  EXPECT_THAT(Encode(t, "h\xC3\xA9xy", false), ElementsAre(8, 3, 4, 0));
  // An added token in the text is that token; the text after it is normalized on its own.
  EXPECT_THAT(Encode(t, "hi</s>hi", false), ElementsAre(9, 2, 9));
  EXPECT_EQ(t.TokenId("</s>"), 2);
  EXPECT_EQ(t.TokenId("\u2581hi"), 9);
  EXPECT_EQ(t.TokenId("nope"), std::nullopt);
  EXPECT_EQ(t.vocab_size(), 10);
}

TEST(TokenizerTest, PostProcessorsWrapTheSequence) {
  Json json = BpeJson({"<s>", "a", "</s>", "<eos>"}, {});
  json["post_processor"] = {{"type", "RobertaProcessing"},
                            {"cls", {"<s>", 0}},
                            {"sep", {"</s>", 2}},
                            {"trim_offsets", true}};
  EXPECT_THAT(Encode(Make(json), "aa"), ElementsAre(0, 1, 1, 2));
  // A Sequence: ByteLevel changes nothing; the template appends <eos> after the text.
  json["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"Sequence", {{"id", "A"}}}}, {{"SpecialToken", {{"id", "<eos>"}}}}}},
         {"special_tokens", {{"<eos>", {{"id", "<eos>"}, {"ids", {3}}}}}}}}}};
  EXPECT_THAT(Encode(Make(json), "a"), ElementsAre(1, 3));
  EXPECT_THAT(Encode(Make(json), "a", /*special=*/false), ElementsAre(1));
}

TEST(TokenizerTest, MetaspaceFirstPrependsOnlyAtTheStartOfTheText) {
  Json json = BpeJson({"<s>", "\u2581", "a", "\u2581a"}, {"\u2581 a"});
  json["pre_tokenizer"] = {{"type", "Metaspace"},
                           {"replacement", "\u2581"},
                           {"prepend_scheme", "first"},
                           {"split", true}};
  json["added_tokens"] = {{{"id", 0}, {"content", "<s>"}, {"special", true}}};
  const Tokenizer t = Make(json);
  EXPECT_THAT(Encode(t, "a a"), ElementsAre(3, 3));
  EXPECT_THAT(Encode(t, "a<s>a"), ElementsAre(3, 0, 2));  // no ▁ after the added token
  json["pre_tokenizer"]["prepend_scheme"] = "always";
  EXPECT_THAT(Encode(Make(json), "a<s>a"), ElementsAre(3, 0, 3));
}

TEST(TokenizerTest, AddedTokenOptions) {
  Json json = BpeJson({"a", " ", "<m>", "<mask>"}, {});
  json["added_tokens"] = {
      {{"id", 3}, {"content", "<mask>"}, {"lstrip", true}, {"rstrip", true}, {"special", true}},
      {{"id", 2}, {"content", "<m>"}, {"single_word", true}, {"special", true}}};
  const Tokenizer t = Make(json);
  // lstrip / rstrip swallow the spaces around <mask>.
  EXPECT_THAT(Encode(t, "a  <mask> a"), ElementsAre(0, 3, 0));
  // single_word: <m> counts only when no letter touches it.
  EXPECT_THAT(Encode(t, "a <m> a"), ElementsAre(0, 1, 2, 1, 0));
  // Touching a letter it is plain text, whose "<", "m", ">" have no token (and no unk): dropped.
  EXPECT_THAT(Encode(t, "a<m>"), ElementsAre(0));
}

TEST(TokenizerTest, NormalizersAndDigits) {
  Json json = BpeJson({"\xC3\xA9", "e", "1", "2", "12", "a"}, {"1 2"});
  json["normalizer"] = {{"type", "Sequence"},
                        {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  json["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
  const Tokenizer t = Make(json);
  EXPECT_THAT(Encode(t, "e\xCC\x81"), ElementsAre(0));  // e + combining acute -> é
  EXPECT_THAT(Encode(t, "A12"), ElementsAre(5, 2, 3));  // lowercased; digits one by one
  json["pre_tokenizer"]["individual_digits"] = false;
  EXPECT_THAT(Encode(Make(json), "a12"), ElementsAre(5, 4));
}

TEST(TokenizerTest, BadFilesAndTextAreClearErrors) {
  const auto error = [](const Json& json) {
    absl::StatusOr<Tokenizer> t = Tokenizer::Parse(json.dump());
    EXPECT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(t.status().message());
  };
  Json unigram = BpeJson({"a"}, {});
  unigram["model"]["type"] = "Unigram";
  EXPECT_THAT(error(unigram), HasSubstr("model.type"));
  EXPECT_THAT(error(BpeJson({"a", "b"}, {"a c"})), HasSubstr("model.merges[0]"));
  EXPECT_THAT(error(BpeJson({"a"}, {"a"})), HasSubstr("model.merges[0]"));
  Json regex = BpeJson({"a"}, {});
  regex["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}}}};
  EXPECT_THAT(error(regex), HasSubstr("pre_tokenizer.pretokenizers[0].pattern"));
  Json bert = BpeJson({"a"}, {});
  bert["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  EXPECT_THAT(error(bert), HasSubstr("BertPreTokenizer"));
  Json unk = BpeJson({"a"}, {});
  unk["model"]["unk_token"] = "<unk>";
  EXPECT_THAT(error(unk), HasSubstr("model.unk_token"));
  EXPECT_EQ(Tokenizer::Parse("not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::Load("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);

  const Tokenizer t = Make(BpeJson({"a"}, {}));
  absl::StatusOr<Ids> ids = t.Encode("aa\xFF");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("byte 2"));
}

}  // namespace
}  // namespace latentd::client
