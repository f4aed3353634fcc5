#include "common/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>

#include "common/mutate.h"
#include "gtest/gtest.h"

namespace latentd {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

// A file with the given raw header JSON and `data_bytes` zero bytes of data.
std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes,
                     int64_t declared_len = -1) {
  std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary);
  uint64_t n = declared_len < 0 ? header.size() : declared_len;
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << std::string(data_bytes, '\0');
  return path;
}

TEST(SafetensorsTest, RoundTripKeepsNamesShapesBytesAndMetadata) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> b = {7, -8};
  std::string path = TempPath("rt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"W_enc", StDtype::kF32, {2, 3}, a.data()},
                                {"step", StDtype::kI64, {2}, b.data()}},
                               {{"format", "pt"}})
                  .ok());
  auto file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const StTensorInfo* w = file->header().Find("W_enc");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(file->data(*w), a.data(), 24), 0);
  const StTensorInfo* s = file->header().Find("step");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->dtype, StDtype::kI64);
  EXPECT_EQ(std::memcmp(file->data(*s), b.data(), 16), 0);
  EXPECT_EQ(file->header().metadata.at("format"), "pt");
  EXPECT_EQ(file->header().data_start % 8, 0);
}

TEST(SafetensorsTest, ReadsAHandMadeFile) {
  std::string path = WriteRaw(
      "ok.safetensors",
      R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[0],"data_offsets":[4,4]}})",
      4);
  auto header = ReadStHeader(path);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->tensors.size(), 2u);
}

struct BadCase {
  const char* label;
  std::string header;
  size_t data_bytes;
  int64_t declared_len;
};

TEST(SafetensorsTest, RejectsEveryMalformedHeaderField) {
  const std::string t = R"("dtype":"F32","shape":[2])";
  std::vector<BadCase> cases = {
      {"not json", "{nope", 8, -1},
      {"not an object", "[1,2]", 8, -1},
      {"unknown dtype", R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", 2, -1},
      {"negative shape", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, -1},
      {"size mismatch", "{\"a\":{" + t + ",\"data_offsets\":[0,4]}}", 4, -1},
      {"beyond data", "{\"a\":{" + t + ",\"data_offsets\":[0,8]}}", 4, -1},
      {"end < begin", "{\"a\":{" + t + ",\"data_offsets\":[8,0]}}", 8, -1},
      {"overlap",
       "{\"a\":{" + t + ",\"data_offsets\":[0,8]},\"b\":{" + t + ",\"data_offsets\":[4,12]}}", 12,
       -1},
      {"gap", "{\"a\":{" + t + ",\"data_offsets\":[4,12]}}", 12, -1},
      {"trailing bytes", "{\"a\":{" + t + ",\"data_offsets\":[0,8]}}", 16, -1},
      {"missing offsets", "{\"a\":{" + t + "}}", 8, -1},
      {"unknown field", "{\"a\":{" + t + ",\"data_offsets\":[0,8],\"x\":1}}", 8, -1},
      {"metadata not strings", R"({"__metadata__":{"a":1}})", 0, -1},
      {"header length beyond file", "{}", 0, 1 << 20},
      {"header length zero", "", 0, 0},
      {"huge shape overflow",
       R"({"a":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8, -1},
  };
  int i = 0;
  for (const auto& c : cases) {
    std::string path = WriteRaw("bad" + std::to_string(i++) + ".safetensors", c.header,
                                c.data_bytes, c.declared_len);
    auto header = ReadStHeader(path);
    EXPECT_EQ(header.status().code(), absl::StatusCode::kInvalidArgument) << c.label;
    EXPECT_FALSE(SafetensorsFile::Read(path).ok()) << c.label;
  }
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadStHeader(TempPath("absent.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, TruncatedFileIsRejected) {
  std::vector<float> a(16, 1.0f);
  std::string path = TempPath("trunc.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", StDtype::kF32, {16}, a.data()}}).ok());
  ASSERT_EQ(truncate(path.c_str(), 40), 0);
  EXPECT_EQ(ReadStHeader(path).status().code(), absl::StatusCode::kInvalidArgument);
}

// Thousands of damaged headers (bytes flipped, dropped or inserted, JSON punctuation and digits
// put anywhere): each is rejected or parses into a header that keeps every promise of
// ParseStHeader, never a crash or an overflowed size (with --config=asan: no undefined
// behaviour either).
TEST(SafetensorsTest, DamagedHeadersAreRejectedOrKeepTheirPromises) {
  const std::string valid =
      R"({"__metadata__":{"format":"pt"},"W_enc":{"dtype":"F32","shape":[2,3],)"
      R"("data_offsets":[0,24]},"b_enc":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}})";
  constexpr int64_t kDataBytes = 32;
  ASSERT_TRUE(ParseStHeader(valid, valid.size(), 8 + valid.size() + kDataBytes).ok());
  std::mt19937 rng(7);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::string bad =
        MutateBytes(valid, &rng, i % 2 ? std::string(R"({}[]:,"0123456789-+eE. \ut)") : "");
    const int64_t file_size = 8 + static_cast<int64_t>(bad.size()) + kDataBytes;
    auto header = ParseStHeader(bad, bad.size(), file_size);
    if (!header.ok()) {
      ASSERT_EQ(header.status().code(), absl::StatusCode::kInvalidArgument) << bad;
      continue;
    }
    ++accepted;
    int64_t at = 0;
    for (const StTensorInfo& t : header->tensors) {
      for (int64_t d : t.shape) ASSERT_GE(d, 0) << bad;
      ASSERT_EQ(t.begin, at) << bad;
      ASSERT_EQ(t.end - t.begin, t.numel() * StDtypeSize(t.dtype)) << bad;
      at = t.end;
    }
    ASSERT_EQ(header->data_start + at, file_size) << bad;
  }
  std::printf("%d of 20000 damaged headers parsed (each kept the promises)\n", accepted);
}

}  // namespace
}  // namespace latentd
