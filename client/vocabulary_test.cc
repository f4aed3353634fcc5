#include "client/vocabulary.h"

#include <fstream>

#include "gtest/gtest.h"

namespace latentd::client {
namespace {

TEST(VocabularyTest, ByteLevelTokenizerJsonMapsBackToBytes) {
  // GPT-2's alphabet: space is U+0120, newline U+010A, 0x7F U+0121, 0xAD U+0143; "â€" is the
  // first two bytes of an em dash (E2 80), which byte-level BPE may split off.
  auto vocab = Vocabulary::Parse(R"({
    "version": "1.0",
    "added_tokens": [{"id": 6, "content": "<|endoftext|>", "special": true}],
    "decoder": {"type": "ByteLevel", "add_prefix_space": false},
    "model": {"type": "BPE", "vocab": {"Hello": 0, "\u0120world": 1, "\u010A": 2,
                                        "\u00E2\u0122": 3, "\u0121": 4, "\u0143": 5}}})");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->size(), 7);
  EXPECT_EQ(vocab->Bytes(0), "Hello");
  EXPECT_EQ(vocab->Bytes(1), " world");
  EXPECT_EQ(vocab->Bytes(2), "\n");
  EXPECT_EQ(vocab->Bytes(3), std::string("\xE2\x80"));
  EXPECT_EQ(vocab->Bytes(4), std::string("\x7F"));
  EXPECT_EQ(vocab->Bytes(5), std::string("\xAD"));
  EXPECT_EQ(vocab->Bytes(6), "<|endoftext|>");  // added tokens are literal
  EXPECT_EQ(vocab->Display(2), "\u21B5");
  EXPECT_EQ(vocab->Display(3), "\\xE2\\x80");  // half a character: shown as bytes
  EXPECT_EQ(vocab->Display(7), "<id 7>");
  EXPECT_EQ(vocab->Display(-1), "<id -1>");
  EXPECT_EQ(vocab->Bytes(7), std::nullopt);
  EXPECT_EQ(vocab->Find(" world"), std::vector<int32_t>{1});
  EXPECT_EQ(vocab->Find("\u0120world"), std::vector<int32_t>{});  // bytes, not the spelling
}

TEST(VocabularyTest, SentencePieceTokensBecomeSpacesAndBytes) {
  auto unigram = Vocabulary::Parse(R"({
    "decoder": {"type": "Metaspace", "replacement": "\u2581"},
    "model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["\u2581the", -1.5], ["<0x0A>", -9],
                                            ["caf\u00E9", -3]]}})");
  ASSERT_TRUE(unigram.ok()) << unigram.status();
  EXPECT_EQ(unigram->Bytes(0), "<unk>");
  EXPECT_EQ(unigram->Bytes(1), " the");
  EXPECT_EQ(unigram->Bytes(2), "\n");
  EXPECT_EQ(unigram->Display(3), "caf\u00E9");
  // Llama-style: a BPE map whose decoder is a sequence with a Replace of "▁".
  auto bpe = Vocabulary::Parse(R"({"decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}]},
    "model": {"type": "BPE", "vocab": {"\u2581Paris": 0, "<0xFF>": 1}}})");
  ASSERT_TRUE(bpe.ok()) << bpe.status();
  EXPECT_EQ(bpe->Bytes(0), " Paris");
  EXPECT_EQ(bpe->Bytes(1), std::string("\xFF"));
}

TEST(VocabularyTest, VocabJsonListsAndLines) {
  auto gpt2 = Vocabulary::Parse(R"({"the": 0, "\u0120cat": 2})");
  ASSERT_TRUE(gpt2.ok());
  EXPECT_EQ(gpt2->Bytes(2), " cat");
  EXPECT_EQ(gpt2->Bytes(1), std::nullopt);  // a gap
  auto literal = Vocabulary::Parse(R"({"\u00C4": 0, "b": 1})");
  ASSERT_TRUE(literal.ok());
  EXPECT_EQ(literal->Bytes(0), "\u00C4");  // no "Ġ" anywhere: taken as written
  auto list = Vocabulary::Parse(R"(["a", "\u0120b"])");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->Bytes(1), "\u0120b");  // a list is literal
  auto lines = Vocabulary::Parse("foo\nbar baz\r\n\n{x}\n");
  ASSERT_TRUE(lines.ok()) << lines.status();
  EXPECT_EQ(lines->size(), 4);
  EXPECT_EQ(lines->Bytes(1), "bar baz");
  EXPECT_EQ(lines->Bytes(2), "");
  EXPECT_EQ(lines->Bytes(3), "{x}");
}

TEST(VocabularyTest, MalformedFilesNameTheProblem) {
  auto code = [](absl::string_view text) { return Vocabulary::Parse(text).status(); };
  EXPECT_EQ(code("{\"a\": ").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(code(R"({"a": "zero"})").message().find("\"a\""), std::string::npos);
  EXPECT_NE(code(R"({"a": -1})").message().find("-1"), std::string::npos);
  EXPECT_NE(code(R"({"a": 99999999})").message().find("2^24"), std::string::npos);
  EXPECT_NE(code(R"({"model": {"type": "BPE"}})").message().find("model.vocab"), std::string::npos);
  EXPECT_NE(code(R"({"model": {"vocab": [1, 2]}})").message().find("model.vocab[0]"),
            std::string::npos);
  EXPECT_NE(code(R"({"model": {"vocab": {}}, "added_tokens": [{"id": "x"}]})")
                .message()
                .find("added_tokens"),
            std::string::npos);
  EXPECT_NE(code(R"(["a", 3])").message().find("entry 1"), std::string::npos);
  EXPECT_EQ(code("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("{}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Vocabulary::Load("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(VocabularyTest, LoadReadsAFile) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/vocab.txt";
  std::ofstream(path) << "zero\none\n";
  auto vocab = Vocabulary::Load(path);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->Display(1), "one");
}

TEST(VocabularyTest, PrintableKeepsOneLineOfValidUtf8) {
  EXPECT_EQ(Printable("a\tb\r\n"), "a\u21E5b\u240D\u21B5");
  EXPECT_EQ(Printable(std::string("x\x01y\x7F", 4)), "x\\x01y\\x7F");
  EXPECT_EQ(Printable("\xFF\xC3\xA9\xC3"), "\\xFF\u00E9\\xC3");  // é kept, strays escaped
  EXPECT_EQ(Printable("\xED\xA0\x80"), "\\xED\\xA0\\x80");       // a UTF-16 surrogate
  EXPECT_EQ(Printable("\xF0\x9F\x98\x80 ok"), "\xF0\x9F\x98\x80 ok");
}

}  // namespace
}  // namespace latentd::client
