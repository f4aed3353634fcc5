#include "engine/token_source.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/match.h"
#include "common/column_testing.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

template <typename T>
std::string WriteNpy(const std::string& name, const std::string& descr, const std::string& shape,
                     const std::vector<T>& data) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(header.size() & 0xff));
  out.put(static_cast<char>(header.size() >> 8));
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(T));
  return path;
}

template <typename T>
std::string WriteRaw(const std::string& name, const std::vector<T>& data) {
  std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(T));
  return path;
}

latentd::v1::TokenSource Spec(const std::string& path, int ctx) {
  latentd::v1::TokenSource s;
  s.set_path(path);
  s.set_context_length(ctx);
  return s;
}

std::vector<int64_t> ReadAll(const TokenSource& src) {
  std::vector<int64_t> out(src.num_rows());
  EXPECT_TRUE(src.Read(0, src.num_sequences(), out.data()).ok());
  return out;
}

TEST(TokenSourceTest, EveryFormatYieldsTheSameSequences) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 50; ++i) ids.push_back(i * 1000 + 7);
  std::vector<uint16_t> u16(ids.begin(), ids.end());
  std::vector<uint32_t> u32(ids.begin(), ids.end());
  std::vector<int32_t> i32(ids.begin(), ids.end());
  std::vector<std::string> paths = {WriteNpy("a.npy", "<u2", "(50,)", u16),
                                    WriteNpy("b.npy", "<i4", "(5, 10)", i32),
                                    WriteNpy("c.npy", "<i8", "(50,)", ids), WriteRaw("d.bin", u16)};
  for (const auto& p : paths) {
    auto src = TokenSource::Open(Spec(p, 8));
    ASSERT_TRUE(src.ok()) << p << ": " << src.status();
    EXPECT_EQ((*src)->num_sequences(), 6);  // 50 / 8, trailing 2 dropped
    std::vector<int64_t> want(ids.begin(), ids.begin() + 48);
    EXPECT_EQ(ReadAll(**src), want) << p;
  }
  auto spec = Spec(WriteRaw("e.u32", u32), 8);
  spec.set_format(latentd::v1::RAW_U32);
  auto src = TokenSource::Open(spec);
  ASSERT_TRUE(src.ok());
  EXPECT_EQ(ReadAll(**src), std::vector<int64_t>(ids.begin(), ids.begin() + 48));
}

TEST(TokenSourceTest, BosAndShard) {
  std::vector<uint16_t> u16(40);
  for (int i = 0; i < 40; ++i) u16[i] = i + 1;
  auto spec = Spec(WriteRaw("bos.bin", u16), 5);
  spec.set_prepend_bos(true);
  spec.set_bos_token_id(999);
  spec.set_sequence_start(2);
  spec.set_sequence_count(3);
  auto src = TokenSource::Open(spec);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->num_sequences(), 3);
  EXPECT_EQ((*src)->first_sequence(), 2);
  std::vector<int64_t> want = {999, 9, 10, 11, 12, 999, 13, 14, 15, 16, 999, 17, 18, 19, 20};
  EXPECT_EQ(ReadAll(**src), want);
  std::vector<int64_t> one(5);
  ASSERT_TRUE((*src)->Read(1, 1, one.data()).ok());
  EXPECT_EQ(one, std::vector<int64_t>(want.begin() + 5, want.begin() + 10));
  EXPECT_EQ((*src)->Read(2, 2, one.data()).code(), absl::StatusCode::kOutOfRange);
}

TEST(TokenSourceTest, BadInput) {
  std::vector<uint16_t> u16(40, 1);
  const std::string bin = WriteRaw("ok.bin", u16);
  EXPECT_EQ(TokenSource::Open(Spec(TempPath("missing.bin"), 8)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenSource::Open(Spec(bin, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenSource::Open(Spec(bin, 41)).status().code(), absl::StatusCode::kInvalidArgument);
  auto shard = Spec(bin, 8);
  shard.set_sequence_start(3);
  shard.set_sequence_count(3);
  EXPECT_EQ(TokenSource::Open(shard).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      TokenSource::Open(Spec(WriteRaw("odd.bin", std::vector<uint8_t>(41)), 8)).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenSource::Open(Spec(WriteNpy("f.npy", "<f4", "(10,)", std::vector<float>(10)), 2))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenSource::Open(Spec(WriteNpy("short.npy", "<u2", "(100,)", u16), 2)).status().code(),
            absl::StatusCode::kInvalidArgument);  // shape says 200 bytes, file holds 80
  EXPECT_EQ(TokenSource::Open(Spec(WriteRaw("junk.npy", u16), 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto neg = TokenSource::Open(
      Spec(WriteNpy("neg.npy", "<i4", "(4,)", std::vector<int32_t>{1, -2, 3, 4}), 2));
  ASSERT_TRUE(neg.ok());
  std::vector<int64_t> out(4);
  EXPECT_EQ((*neg)->Read(0, 2, out.data()).code(), absl::StatusCode::kInvalidArgument);
}

// A file of common/testdata/parquet, or of common/testdata/arrow for the Arrow fixtures' names.
std::string Fixture(const std::string& name) {
  const bool arrow = name.rfind("datasets_stream", 0) == 0 || name.rfind("feather_", 0) == 0;
  return column_testing::Fixture(arrow ? "arrow" : "parquet", name);
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<int64_t> Ids(const std::string& fixture) {
  return column_testing::ReadU32(Fixture(fixture + ".u32"));
}

std::string CopyTo(const std::string& fixture, const std::string& dir, const std::string& name) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << ReadBytes(Fixture(fixture));
  return path;
}

TEST(TokenSourceTest, AParquetFileIsItsTokenColumnCutIntoSequences) {
  const std::vector<int64_t> ids = Ids("snappy_dictionary");  // 46 lists of 128 ids
  auto src = TokenSource::Open(Spec(Fixture("snappy_dictionary.parquet"), 100));
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->num_sequences(), static_cast<int64_t>(ids.size()) / 100);
  std::vector<int64_t> want(ids.begin(), ids.begin() + (*src)->num_rows());
  EXPECT_EQ(ReadAll(**src), want);
  EXPECT_NE((*src)->Describe().find("parquet:"), std::string::npos);
  EXPECT_NE((*src)->Describe().find("[input_ids]"), std::string::npos) << (*src)->Describe();

  // With BOS and a shard, as with any other format.
  auto spec = Spec(Fixture("zstd_v2_delta.parquet"), 11);
  spec.set_column("tokens");
  spec.set_prepend_bos(true);
  spec.set_bos_token_id(7);
  spec.set_sequence_start(3);
  spec.set_sequence_count(2);
  auto shard = TokenSource::Open(spec);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::vector<int64_t> zstd = Ids("zstd_v2_delta");
  std::vector<int64_t> expected = {7};
  expected.insert(expected.end(), zstd.begin() + 30, zstd.begin() + 40);
  expected.push_back(7);
  expected.insert(expected.end(), zstd.begin() + 40, zstd.begin() + 50);
  EXPECT_EQ(ReadAll(**shard), expected);
}

TEST(TokenSourceTest, HuggingFaceShardsAreOneStreamInNameOrder) {
  const std::string dir = TempPath("hub/data");
  std::filesystem::remove_all(TempPath("hub"));
  CopyTo("snappy_dictionary.parquet", dir, "train-00000-of-00002.parquet");
  CopyTo("lz4_uint16.parquet", dir, "train-00001-of-00002.parquet");
  std::vector<int64_t> ids = Ids("snappy_dictionary");
  const std::vector<int64_t> second = Ids("lz4_uint16");
  ids.insert(ids.end(), second.begin(), second.end());
  for (const std::string& path : {dir, dir + "/train-*.parquet", dir + "/train-0000?-of-*"}) {
    SCOPED_TRACE(path);
    auto src = TokenSource::Open(Spec(path, 64));
    ASSERT_TRUE(src.ok()) << src.status();
    ASSERT_EQ((*src)->num_sequences(), static_cast<int64_t>(ids.size()) / 64);
    EXPECT_EQ(ReadAll(**src), std::vector<int64_t>(ids.begin(), ids.begin() + (*src)->num_rows()));
    EXPECT_NE((*src)->Describe().find("2 files"), std::string::npos) << (*src)->Describe();
  }

  // Another split beside it: the directory is ambiguous, the pattern is not.
  CopyTo("gzip_flat.parquet", dir, "test-00000-of-00001.parquet");
  auto both = TokenSource::Open(Spec(dir, 64));
  EXPECT_TRUE(absl::IsInvalidArgument(both.status()));
  EXPECT_NE(both.status().message().find("holds the shards of test, train; name one: " + dir +
                                         "/test-*.parquet"),
            std::string::npos)
      << both.status();
  auto test_split = TokenSource::Open(Spec(dir + "/test-*.parquet", 64));
  ASSERT_TRUE(test_split.ok()) << test_split.status();
  EXPECT_EQ((*test_split)->num_sequences(), 3000 / 64);

  // A shard missing from the set: an interrupted download, said so.
  std::filesystem::remove(dir + "/train-00001-of-00002.parquet");
  auto partial = TokenSource::Open(Spec(dir + "/train-*.parquet", 64));
  EXPECT_TRUE(absl::IsInvalidArgument(partial.status()));
  EXPECT_NE(partial.status().message().find("train-00001-of-00002.parquet is missing (1 of 2"),
            std::string::npos)
      << partial.status();
  EXPECT_TRUE(absl::IsNotFound(TokenSource::Open(Spec(dir + "/val-*.parquet", 64)).status()));
  // A shard numbered past its set (a name mangled by hand, or two sets' files mixed).
  CopyTo("gzip_flat.parquet", dir, "train-00002-of-00002.parquet");
  auto past = TokenSource::Open(Spec(dir + "/train-*.parquet", 64));
  EXPECT_TRUE(absl::IsInvalidArgument(past.status()));
  EXPECT_NE(past.status().message().find("train-00002-of-00002.parquet is shard 2 of 2"),
            std::string::npos)
      << past.status();
}

TEST(TokenSourceTest, ADatasetSavedToDiskIsReadFromItsArrowShards) {
  // save_to_disk's layout: data-0000i-of-0000n.arrow beside its JSON files.
  const std::string dir = TempPath("saved");
  std::filesystem::remove_all(dir);
  CopyTo("datasets_stream.arrow", dir, "data-00000-of-00002.arrow");
  CopyTo("feather_fixed_size_list.arrow", dir, "data-00001-of-00002.arrow");
  std::ofstream(dir + "/state.json") << "{}";
  std::ofstream(dir + "/dataset_info.json") << "{}";
  // The two shards keep their ids in different columns (input_ids, tokens): named, refused.
  auto mixed = TokenSource::Open(Spec(dir, 32));
  EXPECT_TRUE(absl::IsInvalidArgument(mixed.status()));
  EXPECT_NE(mixed.status().message().find("has its ids in tokens"), std::string::npos)
      << mixed.status();
  std::filesystem::remove(dir + "/data-00001-of-00002.arrow");
  CopyTo("datasets_stream.arrow", dir, "data-00001-of-00002.arrow");
  std::vector<int64_t> ids = Ids("datasets_stream");
  const std::vector<int64_t> once = ids;
  ids.insert(ids.end(), once.begin(), once.end());
  auto src = TokenSource::Open(Spec(dir, 32));
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->num_sequences(), static_cast<int64_t>(ids.size()) / 32);
  EXPECT_EQ(ReadAll(**src), std::vector<int64_t>(ids.begin(), ids.begin() + (*src)->num_rows()));
  EXPECT_NE((*src)->Describe().find("arrow:"), std::string::npos) << (*src)->Describe();
  // One shard gone: said so, with the .arrow name.
  std::filesystem::remove(dir + "/data-00000-of-00002.arrow");
  auto partial = TokenSource::Open(Spec(dir, 32));
  EXPECT_NE(partial.status().message().find("data-00000-of-00002.arrow is missing"),
            std::string::npos)
      << partial.status();
  // A single Feather file, its fixed-size lists of int64 named by the column.
  auto feather = Spec(Fixture("feather_fixed_size_list.arrow"), 40);
  feather.set_column("tokens");
  auto one = TokenSource::Open(feather);
  ASSERT_TRUE(one.ok()) << one.status();
  const std::vector<int64_t> feather_ids = Ids("feather_fixed_size_list");
  EXPECT_EQ(ReadAll(**one),
            std::vector<int64_t>(feather_ids.begin(), feather_ids.begin() + (*one)->num_rows()));
}

TEST(TokenSourceTest, ParquetColumnsAreNamedInErrors) {
  auto text = Spec(Fixture("snappy_dictionary.parquet"), 8);
  text.set_column("text");
  auto refused = TokenSource::Open(text);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_NE(refused.status().message().find("extract.tokens.column:"), std::string::npos)
      << refused.status();
  // Two shards keeping their ids in different columns.
  const std::string dir = TempPath("mixed");
  std::filesystem::remove_all(dir);
  CopyTo("snappy_dictionary.parquet", dir, "a.parquet");
  CopyTo("zstd_v2_delta.parquet", dir, "b.parquet");
  auto mixed = TokenSource::Open(Spec(dir, 8));
  EXPECT_TRUE(absl::IsInvalidArgument(mixed.status()));
  EXPECT_NE(mixed.status().message().find("has its ids in tokens"), std::string::npos)
      << mixed.status();
  // A column for a format without columns.
  auto npy = Spec(WriteNpy("col.npy", "<u2", "(8,)", std::vector<uint16_t>(8, 1)), 4);
  npy.set_column("input_ids");
  EXPECT_TRUE(absl::IsInvalidArgument(TokenSource::Open(npy).status()));
}

TEST(TokenSourceTest, EveryShardOfADirectoryMustResolveUnderTheRoots) {
  const std::string dir = TempPath("rooted");
  std::filesystem::remove_all(dir);
  CopyTo("gzip_flat.parquet", dir, "a.parquet");
  CopyTo("gzip_flat.parquet", dir, "b.parquet");
  std::vector<std::string> asked;
  auto refuse_b = [&](const std::string& p) -> absl::StatusOr<std::string> {
    asked.push_back(p);
    if (absl::EndsWith(p, "b.parquet")) return absl::PermissionDeniedError("outside");
    return p;
  };
  EXPECT_TRUE(absl::IsPermissionDenied(
      ResolveTokenPath(dir + "/*.parquet", "extract.tokens.path", refuse_b).status()));
  EXPECT_EQ(asked, (std::vector<std::string>{dir, dir + "/a.parquet", dir + "/b.parquet"}));
  auto allow = [](const std::string& p) -> absl::StatusOr<std::string> { return p; };
  auto resolved = ResolveTokenPath(dir + "/*.parquet", "extract.tokens.path", allow);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, dir + "/*.parquet");
  EXPECT_EQ(*ResolveTokenPath(dir + "/a.parquet", "f", allow), dir + "/a.parquet");
}

}  // namespace
}  // namespace latentd::engine
