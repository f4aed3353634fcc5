#include "client/text_input.h"

#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace latentd::client {
namespace {

using ::testing::HasSubstr;

// Lines of JSON-ish text, 4 MB in all: past the reader's 1 MiB chunks, and compressible enough
// that one chunk of compressed input inflates past one chunk of output.
std::vector<std::string> ManyLines() {
  std::vector<std::string> lines;
  for (int i = 0; i < 60000; ++i) {
    lines.push_back("{\"text\": \"line " + std::to_string(i) + " " + std::string(i % 97, 'x') +
                    "\"}");
  }
  lines.push_back("");  // an empty line is a line
  lines.push_back("last, without a newline");
  return lines;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string text;
  for (size_t i = 0; i < lines.size(); ++i) text += lines[i] + (i + 1 < lines.size() ? "\n" : "");
  return text;
}

std::string Gzip(const std::string& text) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, text.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string Zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::string Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

std::vector<std::string> AllLines(TextInput& input) {
  std::vector<std::string> lines;
  std::string line;
  while (true) {
    absl::StatusOr<bool> more = input.ReadLine(&line);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    lines.push_back(line);
  }
  return lines;
}

TEST(TextInputTest, PlainGzipAndZstdGiveTheSameLines) {
  const std::string dir = FreshTestDir("text_input");
  const std::vector<std::string> lines = ManyLines();
  const std::string text = Joined(lines);
  // Two gzip members and two zstd frames, as concatenated downloads are.
  const std::string half_a = text.substr(0, text.size() / 2), half_b = text.substr(text.size() / 2);
  for (const std::string& path :
       {Write(dir + "/a.jsonl", text), Write(dir + "/a.jsonl.gz", Gzip(half_a) + Gzip(half_b)),
        Write(dir + "/a.json.zst", Zstd(half_a) + Zstd(half_b)),
        Write(dir + "/b.jsonl.zstd", Zstd(text))}) {
    SCOPED_TRACE(path);
    absl::StatusOr<std::unique_ptr<TextInput>> input = TextInput::Open(path);
    ASSERT_TRUE(input.ok()) << input.status();
    EXPECT_EQ(AllLines(**input), lines);
    EXPECT_EQ((*input)->stored_bytes_read(),
              static_cast<int64_t>(std::filesystem::file_size(path)));
    absl::StatusOr<std::unique_ptr<TextInput>> again = TextInput::Open(path);
    ASSERT_TRUE(again.ok());
    std::string first;
    ASSERT_TRUE(*(*again)->ReadLine(&first));
    absl::StatusOr<std::string> rest = (*again)->ReadAll();
    ASSERT_TRUE(rest.ok()) << rest.status();
    EXPECT_EQ(first + "\n" + *rest, text);
  }
  EXPECT_EQ(TextInput::StoredName("c4-train.00000-of-01024.json.gz"),
            "c4-train.00000-of-01024.json");
  EXPECT_EQ(TextInput::StoredName("00.jsonl.zst"), "00.jsonl");
  EXPECT_EQ(TextInput::StoredName("notes.txt"), "notes.txt");
}

TEST(TextInputTest, DamagedOrMisnamedFilesAreRefusedByName) {
  const std::string dir = FreshTestDir("text_input_bad");
  const std::string text = Joined(ManyLines());
  const std::string gz = Gzip(text), zst = Zstd(text);
  const auto fails = [](const std::string& path) {
    absl::StatusOr<std::unique_ptr<TextInput>> input = TextInput::Open(path);
    if (!input.ok()) return input.status();
    std::string line;
    while (true) {
      absl::StatusOr<bool> more = (*input)->ReadLine(&line);
      if (!more.ok()) return more.status();
      if (!*more) return absl::OkStatus();
    }
  };
  for (const auto& [name, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"cut.jsonl.gz", gz.substr(0, gz.size() / 2)},
           {"cut.jsonl.zst", zst.substr(0, zst.size() / 2)}}) {
    const absl::Status status = fails(Write(dir + "/" + name, bytes));
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << name;
    EXPECT_THAT(status.message(), HasSubstr(name));
    EXPECT_THAT(status.message(), HasSubstr("truncated download"));
  }
  std::string flipped_gz = gz, flipped_zst = zst;
  flipped_gz[gz.size() / 3] ^= 0x55;
  flipped_zst[zst.size() / 3] ^= 0x55;
  EXPECT_EQ(fails(Write(dir + "/flip.jsonl.gz", flipped_gz)).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(fails(Write(dir + "/flip.jsonl.zst", flipped_zst)).code(), absl::StatusCode::kDataLoss);
  const absl::Status misnamed = fails(Write(dir + "/plain.jsonl.gz", text));
  EXPECT_EQ(misnamed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(misnamed.message(), HasSubstr("named .gz but not gzip"));
  EXPECT_EQ(fails(dir + "/missing.jsonl.zst").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(fails(Write(dir + "/empty.jsonl.gz", "")).ok());
}

}  // namespace
}  // namespace latentd::client
