#include "client/tokenize_files.h"

#include <zlib.h>
#include <zstd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace latentd::client {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// Characters a, b, space; "ab" merged; <bos> (id 4) added by the template, <eos> (id 5) added.
Tokenizer MakeTokenizer(int extra_added_id = -1) {
  Json json = {{"model",
                {{"type", "BPE"},
                 {"vocab", {{"a", 0}, {"b", 1}, {" ", 2}, {"ab", 3}}},
                 {"merges", {"a b"}}}},
               {"added_tokens",
                {{{"id", 4}, {"content", "<bos>"}, {"special", true}},
                 {{"id", 5}, {"content", "<eos>"}, {"special", true}}}},
               {"post_processor",
                {{"type", "TemplateProcessing"},
                 {"single", {{{"SpecialToken", {{"id", "<bos>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
                 {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {4}}}}}}}}};
  if (extra_added_id >= 0) {
    json["added_tokens"].push_back({{"id", extra_added_id}, {"content", "<x>"}, {"special", true}});
  }
  absl::StatusOr<Tokenizer> t = Tokenizer::Parse(json.dump());
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

// The header's dictionary and the data of a .npy file.
std::pair<std::string, std::string> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
  const size_t header = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
  return {bytes.substr(10, header), bytes.substr(10 + header)};
}

std::vector<int32_t> U16(const std::string& data) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < data.size(); i += 2) {
    uint16_t v;
    std::memcpy(&v, &data[i], 2);
    ids.push_back(v);
  }
  return ids;
}

TEST(TokenizeFilesTest, DocumentsFromTextAndJsonlBecomeOneStream) {
  const std::string dir = FreshTestDir("stream");
  const Tokenizer tokenizer = MakeTokenizer();
  WriteFile(dir + "/one.txt", "ab a");
  WriteFile(dir + "/two.jsonl", "{\"text\": \"b\", \"id\": 1}\n\n{\"text\": \"abab\"}\n");
  TokenizeOptions options;
  options.out_path = dir + "/tokens.npy";
  options.separator = 5;
  int reports = 0;
  options.progress = [&reports](const TokenizeProgress&) { ++reports; };
  absl::StatusOr<TokenizeProgress> done =
      TokenizeFiles(tokenizer, {dir + "/one.txt", dir + "/two.jsonl"}, options);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->documents, 3);
  EXPECT_EQ(done->files_done, 2);
  EXPECT_EQ(done->bytes_read, done->bytes_total);
  EXPECT_EQ(done->dtype, "uint16");
  EXPECT_GE(reports, 1);
  const auto [header, data] = ReadNpy(options.out_path);
  EXPECT_THAT(header, HasSubstr("'descr': '<u2'"));
  EXPECT_THAT(header, HasSubstr("'shape': (12,)"));
  // <bos> ab ' ' a <eos> | <bos> b <eos> | <bos> ab ab <eos>
  EXPECT_EQ(U16(data), (std::vector<int32_t>{4, 3, 2, 0, 5, 4, 1, 5, 4, 3, 3, 5}));
  EXPECT_EQ(done->tokens, 12);
  EXPECT_FALSE(std::filesystem::exists(options.out_path + ".partial"));
}

// Compressed JSON lines as the Pile (.jsonl.zst) and C4 (.json.gz) ship them, and a compressed
// plain text file: the same documents as uncompressed.
TEST(TokenizeFilesTest, CompressedInputsAreReadAsDownloaded) {
  const std::string dir = FreshTestDir("compressed");
  const Tokenizer tokenizer = MakeTokenizer();
  const std::string jsonl = "{\"text\": \"ab a\"}\n{\"text\": \"b\"}\n\n{\"text\": \"abab\"}\n";
  WriteFile(dir + "/plain.jsonl", jsonl);
  std::string zst(ZSTD_compressBound(jsonl.size()), '\0');
  zst.resize(ZSTD_compress(zst.data(), zst.size(), jsonl.data(), jsonl.size(), 3));
  WriteFile(dir + "/pile.jsonl.zst", zst);
  gzFile gz = gzopen((dir + "/c4.json.gz").c_str(), "wb");
  gzwrite(gz, jsonl.data(), static_cast<unsigned>(jsonl.size()));
  gzclose(gz);
  gz = gzopen((dir + "/doc.txt.gz").c_str(), "wb");
  gzwrite(gz, "ab a", 4);
  gzclose(gz);
  TokenizeOptions options;
  options.separator = 5;
  std::vector<std::vector<int32_t>> streams;
  for (const std::string& input : {"plain.jsonl", "pile.jsonl.zst", "c4.json.gz"}) {
    options.out_path = dir + "/" + input + ".npy";
    absl::StatusOr<TokenizeProgress> done = TokenizeFiles(tokenizer, {dir + "/" + input}, options);
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->documents, 3) << input;
    EXPECT_EQ(done->bytes_read, done->bytes_total) << input;
    streams.push_back(U16(ReadNpy(options.out_path).second));
  }
  EXPECT_EQ(streams[0], (std::vector<int32_t>{4, 3, 2, 0, 5, 4, 1, 5, 4, 3, 3, 5}));
  EXPECT_EQ(streams[1], streams[0]);
  EXPECT_EQ(streams[2], streams[0]);
  options.out_path = dir + "/doc.npy";
  absl::StatusOr<TokenizeProgress> whole = TokenizeFiles(tokenizer, {dir + "/doc.txt.gz"}, options);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(U16(ReadNpy(options.out_path).second), (std::vector<int32_t>{4, 3, 2, 0, 5}));
  // A download cut short fails naming the file, and leaves no output.
  WriteFile(dir + "/cut.jsonl.zst", zst.substr(0, zst.size() - 3));
  options.out_path = dir + "/cut.npy";
  absl::StatusOr<TokenizeProgress> cut =
      TokenizeFiles(tokenizer, {dir + "/cut.jsonl.zst"}, options);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.status().message(), HasSubstr("cut.jsonl.zst"));
  EXPECT_FALSE(std::filesystem::exists(options.out_path));
}

// A Parquet or Arrow file's text column: one document a row, a null row none (text_ab.parquet
// and text_ab.arrow hold "ab a", null, "b", "abab", written by arrow-rs and Apache Arrow JS): the
// same stream as the files above.
TEST(TokenizeFilesTest, ParquetRowsAreDocuments) {
  const std::string dir = FreshTestDir("parquet");
  const std::string parquet =
      std::string(getenv("TEST_SRCDIR")) + "/latentd/common/testdata/parquet/text_ab.parquet";
  const Tokenizer tokenizer = MakeTokenizer();
  TokenizeOptions options;
  options.out_path = dir + "/tokens.npy";
  options.separator = 5;
  absl::StatusOr<TokenizeProgress> done = TokenizeFiles(tokenizer, {parquet}, options);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->documents, 3);
  EXPECT_EQ(done->bytes_read, done->bytes_total);
  EXPECT_EQ(done->text_bytes, 9);  // "ab a", "b", "abab"
  EXPECT_EQ(U16(ReadNpy(options.out_path).second),
            (std::vector<int32_t>{4, 3, 2, 0, 5, 4, 1, 5, 4, 3, 3, 5}));

  // The same documents kept by Hugging Face datasets (Arrow IPC, two record batches).
  const std::string arrow =
      std::string(getenv("TEST_SRCDIR")) + "/latentd/common/testdata/arrow/text_ab.arrow";
  options.out_path = dir + "/arrow.npy";
  absl::StatusOr<TokenizeProgress> from_arrow = TokenizeFiles(tokenizer, {arrow}, options);
  ASSERT_TRUE(from_arrow.ok()) << from_arrow.status();
  EXPECT_EQ(from_arrow->documents, 3);
  EXPECT_EQ(U16(ReadNpy(options.out_path).second),
            (std::vector<int32_t>{4, 3, 2, 0, 5, 4, 1, 5, 4, 3, 3, 5}));

  options.text_field = "body";
  absl::StatusOr<TokenizeProgress> missing = TokenizeFiles(tokenizer, {parquet}, options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("no column body (its columns: id, text)"));
  options.text_field = "id";
  EXPECT_THAT(TokenizeFiles(tokenizer, {parquet}, options).status().message(),
              HasSubstr("column id holds INT32, not text"));
  EXPECT_FALSE(std::filesystem::exists(options.out_path + ".partial"));
}

// Many documents over several batches and threads: the stream is the documents' ids in order,
// whatever the thread count.
TEST(TokenizeFilesTest, ThreadsKeepTheDocumentsInOrder) {
  const std::string dir = FreshTestDir("threads");
  const Tokenizer tokenizer = MakeTokenizer();
  std::string jsonl;
  std::vector<int32_t> want;
  for (int d = 0; d < 9000; ++d) {  // over two batches of 4096 documents
    std::string text;
    for (int k = 0; k <= d % 7; ++k)
      text += (d + k) % 3 == 0 ? "ab" : (d + k) % 3 == 1 ? "a" : "b ";
    jsonl += "{\"text\": \"" + text + "\"}\n";
    want.push_back(4);
    const absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, false);
    want.insert(want.end(), ids->begin(), ids->end());
  }
  WriteFile(dir + "/docs.jsonl", jsonl);
  for (const int threads : {1, 2, 3}) {
    TokenizeOptions options;
    options.out_path = dir + "/tokens.npy";
    options.threads = threads;
    absl::StatusOr<TokenizeProgress> done =
        TokenizeFiles(tokenizer, {dir + "/docs.jsonl"}, options);
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->documents, 9000);
    EXPECT_EQ(U16(ReadNpy(options.out_path).second), want) << threads << " threads";
  }
}

TEST(TokenizeFilesTest, WithoutSpecialTokensAndWideIds) {
  const std::string dir = FreshTestDir("wide");
  const Tokenizer tokenizer = MakeTokenizer(/*extra_added_id=*/70000);
  WriteFile(dir + "/doc.txt", "ab<x>");
  TokenizeOptions options;
  options.out_path = dir + "/tokens.npy";
  options.add_special_tokens = false;
  absl::StatusOr<TokenizeProgress> done = TokenizeFiles(tokenizer, {dir + "/doc.txt"}, options);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->dtype, "int32");
  const auto [header, data] = ReadNpy(options.out_path);
  EXPECT_THAT(header, HasSubstr("'descr': '<i4'"));
  ASSERT_EQ(data.size(), 8u);
  int32_t ids[2];
  std::memcpy(ids, data.data(), 8);
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 70000);
}

TEST(TokenizeFilesTest, BadInputsFailWithoutLeavingAnOutput) {
  const std::string dir = FreshTestDir("bad");
  const Tokenizer tokenizer = MakeTokenizer();
  TokenizeOptions options;
  options.out_path = dir + "/tokens.npy";
  const auto fails = [&](const std::vector<std::string>& inputs) {
    absl::StatusOr<TokenizeProgress> done = TokenizeFiles(tokenizer, inputs, options);
    EXPECT_FALSE(done.ok());
    EXPECT_FALSE(std::filesystem::exists(options.out_path));
    EXPECT_FALSE(std::filesystem::exists(options.out_path + ".partial"));
    return done.status();
  };
  EXPECT_EQ(fails({dir + "/missing.txt"}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fails({}).code(), absl::StatusCode::kInvalidArgument);

  WriteFile(dir + "/bad.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
  absl::Status status = fails({dir + "/bad.jsonl"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("bad.jsonl:2"));
  EXPECT_THAT(status.message(), HasSubstr("\"text\""));

  WriteFile(dir + "/latin1.txt", "caf\xE9");
  status = fails({dir + "/latin1.txt"});
  EXPECT_THAT(status.message(), HasSubstr("latin1.txt"));
  EXPECT_THAT(status.message(), HasSubstr("not UTF-8 at byte 3"));

  WriteFile(dir + "/ok.txt", "a");
  options.separator = 99;
  EXPECT_THAT(fails({dir + "/ok.txt"}).message(), HasSubstr("separator id 99"));
}

}  // namespace
}  // namespace latentd::client
