// The reader against files written by arrow-rs's Parquet writer (common/testdata/parquet,
// make_fixtures.cjs): each NAME.parquet's stream must equal NAME.u32, the ids the writer was given.
#include "common/parquet_column.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/column_testing.h"
#include "common/mutate.h"
#include "common/read_file.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace latentd {
namespace {

std::string Fixture(const std::string& name) { return column_testing::Fixture("parquet", name); }

std::vector<int64_t> Expected(const std::string& name) {
  return column_testing::ReadU32(Fixture(name + ".u32"));
}

struct Case {
  const char* name;
  const char* column;  // what the default choice must find
  int64_t rows;
};

TEST(ParquetColumnTest, ReadsWhatArrowWroteInEveryLayout) {
  // SNAPPY + dictionary v1 pages falling back to PLAIN, three row groups, an empty and a null
  // list; ZSTD v2 DELTA_BINARY_PACKED int64; GZIP flat int32; LZ4_RAW uint16 above 32767;
  // hyparquet-writer's PLAIN pages whose statistics spare counting levels on open.
  for (const Case& c :
       {Case{"snappy_dictionary", "input_ids", 48}, Case{"zstd_v2_delta", "tokens", 24},
        Case{"gzip_flat", "input_ids", 3000}, Case{"lz4_uint16", "input_ids", 16},
        Case{"hyparquet_statistics", "input_ids", 12}}) {
    SCOPED_TRACE(c.name);
    const std::vector<int64_t> expected = Expected(c.name);
    ASSERT_FALSE(expected.empty());
    auto column = ParquetColumn::Open(Fixture(std::string(c.name) + ".parquet"), "");
    ASSERT_TRUE(column.ok()) << column.status();
    EXPECT_EQ((*column)->column(), c.column);
    EXPECT_EQ((*column)->num_rows(), c.rows);
    column_testing::ExpectReadsMatch(**column, expected);
  }
}

std::vector<std::string> ExpectedTexts(const std::string& name) {
  absl::StatusOr<std::string> raw = ReadFileToString(Fixture(name + ".json"));
  EXPECT_TRUE(raw.ok()) << raw.status();
  return nlohmann::json::parse(*raw).get<std::vector<std::string>>();
}

TEST(ParquetColumnTest, ReadsTextColumnsOneDocumentARow) {
  // Dictionary pages with their PLAIN fallback over three row groups (an empty document and a
  // null row among them); v2 DELTA_LENGTH_BYTE_ARRAY; DELTA_BYTE_ARRAY's shared prefixes.
  for (const char* name :
       {"text_snappy_dictionary", "text_zstd_v2_delta_length", "text_gzip_delta_byte_array"}) {
    SCOPED_TRACE(name);
    const std::vector<std::string> expected = ExpectedTexts(name);
    auto column = ParquetColumn::Open(Fixture(std::string(name) + ".parquet"), "",
                                      ParquetColumn::Kind::kText);
    ASSERT_TRUE(column.ok()) << column.status();
    EXPECT_EQ((*column)->column(), "text");
    ASSERT_EQ((*column)->num_values(), static_cast<int64_t>(expected.size()));
    std::vector<std::string> all;
    ASSERT_TRUE((*column)->ReadText(0, expected.size(), &all).ok());
    EXPECT_EQ(all, expected);
    std::mt19937 rng(2);
    for (int i = 0; i < 100; ++i) {
      const int64_t first = rng() % expected.size();
      const int64_t count = rng() % (expected.size() - first + 1);
      std::vector<std::string> part;
      ASSERT_TRUE((*column)->ReadText(first, count, &part).ok());
      ASSERT_EQ(part, std::vector<std::string>(expected.begin() + first,
                                               expected.begin() + first + count));
    }
    int64_t unused;
    EXPECT_TRUE(absl::IsFailedPrecondition((*column)->Read(0, 1, &unused)));
  }
  auto ids = ParquetColumn::Open(Fixture("text_snappy_dictionary.parquet"), "id",
                                 ParquetColumn::Kind::kText);
  EXPECT_TRUE(absl::IsInvalidArgument(ids.status()));
  EXPECT_NE(ids.status().message().find("column id holds INT32, not text"), std::string::npos)
      << ids.status();
  auto tokens =
      ParquetColumn::Open(Fixture("snappy_dictionary.parquet"), "", ParquetColumn::Kind::kIntegers);
  ASSERT_TRUE(tokens.ok());
  std::vector<std::string> unused_texts;
  EXPECT_TRUE(absl::IsFailedPrecondition((*tokens)->ReadText(0, 1, &unused_texts)));
}

TEST(ParquetColumnTest, ANamedColumnIsReadAndAWrongOneExplained) {
  auto named = ParquetColumn::Open(Fixture("snappy_dictionary.parquet"), "input_ids");
  ASSERT_TRUE(named.ok()) << named.status();

  auto text = ParquetColumn::Open(Fixture("snappy_dictionary.parquet"), "text");
  EXPECT_TRUE(absl::IsInvalidArgument(text.status()));
  EXPECT_NE(text.status().message().find("column text holds BYTE_ARRAY"), std::string::npos)
      << text.status();
  EXPECT_NE(text.status().message().find("latentctl tokenize"), std::string::npos);

  auto missing = ParquetColumn::Open(Fixture("snappy_dictionary.parquet"), "ids");
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_NE(missing.status().message().find("no column ids (its columns: text, input_ids)"),
            std::string::npos)
      << missing.status();
}

TEST(ParquetColumnTest, ANullIdIsRefusedNotMadeUp) {
  auto column = ParquetColumn::Open(Fixture("null_id.parquet"), "");
  EXPECT_TRUE(absl::IsInvalidArgument(column.status()));
  EXPECT_NE(column.status().message().find("null id"), std::string::npos) << column.status();
  EXPECT_NE(column.status().message().find("row group 0, page 0"), std::string::npos);
}

TEST(ParquetColumnTest, OtherFilesAreRefusedByName) {
  EXPECT_TRUE(absl::IsNotFound(ParquetColumn::Open("/nonexistent.parquet", "").status()));
  auto not_parquet = ParquetColumn::Open(Fixture("gzip_flat.u32"), "");
  EXPECT_TRUE(absl::IsInvalidArgument(not_parquet.status()));
  EXPECT_NE(not_parquet.status().message().find("not a Parquet file"), std::string::npos);
}

TEST(ParquetColumnTest, ThreadsReadingAtOnceSeeTheirOwnRanges) {
  const std::vector<int64_t> expected = Expected("snappy_dictionary");
  auto column = ParquetColumn::Open(Fixture("snappy_dictionary.parquet"), "");
  ASSERT_TRUE(column.ok()) << column.status();
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 300; ++i) {
        const int64_t first = rng() % (expected.size() - 300);
        std::vector<int64_t> part(300);
        if (!(*column)->Read(first, 300, part.data()).ok() ||
            !std::equal(part.begin(), part.end(), expected.begin() + first)) {
          ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// The footer and page headers are untrusted input parsed by hand: damaged files must come back
// as an error status (or, where the damage missed what is read, the right ids), never a crash.
// Runs under --config=asan in scripts/test.sh.
TEST(ParquetColumnTest, CorruptFilesAreRefusedNeverACrash) {
  const std::string dir = FreshTestDir("parquet_fuzz");
  std::mt19937 rng(11);
  int refused = 0, trials = 0;
  for (const char* name :
       {"snappy_dictionary", "zstd_v2_delta", "gzip_flat", "lz4_uint16", "hyparquet_statistics",
        "text_snappy_dictionary", "text_zstd_v2_delta_length", "text_gzip_delta_byte_array"}) {
    const auto kind = std::string(name).rfind("text_", 0) == 0 ? ParquetColumn::Kind::kText
                                                               : ParquetColumn::Kind::kIntegers;
    absl::StatusOr<std::string> valid = ReadFileToString(Fixture(std::string(name) + ".parquet"));
    ASSERT_TRUE(valid.ok());
    refused += column_testing::DamagedFilesRefused<ParquetColumn>(
        *valid, dir + "/" + name + ".parquet", 400, column_testing::Metadata::kAtTheEnd, 600, kind,
        &rng);
    trials += 400;
  }
  EXPECT_GT(refused, trials / 4);
}

}  // namespace
}  // namespace latentd
