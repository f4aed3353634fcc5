// The reader against files written by Apache Arrow's JavaScript implementation
// (common/testdata/arrow, make_fixtures.cjs): each NAME.arrow's stream must equal NAME.u32.
#include "common/arrow_column.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/column_testing.h"
#include "common/mutate.h"
#include "common/read_file.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace latentd {
namespace {

std::string Fixture(const std::string& name) { return column_testing::Fixture("arrow", name); }

std::vector<int64_t> Expected(const std::string& name) {
  return column_testing::ReadU32(Fixture(name + ".u32"));
}

TEST(ArrowColumnTest, ReadsWhatArrowWroteInEveryLayout) {
  // datasets' stream format with three record batches, a null and an empty list; Feather v2's
  // file format with fixed-size lists of int64; a plain uint16 column.
  struct Case {
    const char* name;
    const char* column;
    int64_t rows;
  };
  for (const Case& c :
       {Case{"datasets_stream", "input_ids", 30}, Case{"feather_fixed_size_list", "tokens", 20},
        Case{"plain_uint16", "token", 500}}) {
    SCOPED_TRACE(c.name);
    const std::vector<int64_t> expected = Expected(c.name);
    auto column = ArrowColumn::Open(Fixture(std::string(c.name) + ".arrow"), "");
    ASSERT_TRUE(column.ok()) << column.status();
    EXPECT_EQ((*column)->column(), c.column);
    EXPECT_EQ((*column)->num_rows(), c.rows);
    column_testing::ExpectReadsMatch(**column, expected);
  }
}

TEST(ArrowColumnTest, ReadsTextColumnsOneDocumentARow) {
  absl::StatusOr<std::string> json = ReadFileToString(Fixture("text_stream.json"));
  ASSERT_TRUE(json.ok());
  const auto expected = nlohmann::json::parse(*json).get<std::vector<std::string>>();
  auto texts = ArrowColumn::Open(Fixture("text_stream.arrow"), "", ArrowColumn::Kind::kText);
  ASSERT_TRUE(texts.ok()) << texts.status();
  EXPECT_EQ((*texts)->column(), "text");
  EXPECT_EQ((*texts)->num_rows(), 7);  // two of them null: no document
  ASSERT_EQ((*texts)->num_values(), static_cast<int64_t>(expected.size()));
  std::vector<std::string> all;
  ASSERT_TRUE((*texts)->ReadText(0, expected.size(), &all).ok());
  EXPECT_EQ(all, expected);
  std::vector<std::string> middle;
  ASSERT_TRUE((*texts)->ReadText(2, 2, &middle).ok());  // across the two record batches
  EXPECT_EQ(middle, std::vector<std::string>(expected.begin() + 2, expected.begin() + 4));
  int64_t unused;
  EXPECT_TRUE(absl::IsFailedPrecondition((*texts)->Read(0, 1, &unused)));
  auto ids = ArrowColumn::Open(Fixture("text_stream.arrow"), "id", ArrowColumn::Kind::kText);
  EXPECT_NE(ids.status().message().find("column id holds Arrow type 2, not text"),
            std::string::npos)
      << ids.status();
}

TEST(ArrowColumnTest, ColumnsAreChosenOrExplained) {
  // attention_mask is a list of int8: a readable column when named.
  auto mask = ArrowColumn::Open(Fixture("datasets_stream.arrow"), "attention_mask");
  ASSERT_TRUE(mask.ok()) << mask.status();
  EXPECT_EQ((*mask)->num_values(), static_cast<int64_t>(Expected("datasets_stream").size()));
  std::vector<int64_t> ones((*mask)->num_values());
  ASSERT_TRUE((*mask)->Read(0, ones.size(), ones.data()).ok());
  EXPECT_EQ(ones, std::vector<int64_t>(ones.size(), 1));

  auto text = ArrowColumn::Open(Fixture("datasets_stream.arrow"), "text");
  EXPECT_TRUE(absl::IsInvalidArgument(text.status()));
  EXPECT_NE(text.status().message().find("column text holds text (`latentctl tokenize`"),
            std::string::npos)
      << text.status();
  auto missing = ArrowColumn::Open(Fixture("datasets_stream.arrow"), "ids");
  EXPECT_NE(missing.status().message().find(
                "no column ids (its columns: text, input_ids, attention_mask)"),
            std::string::npos)
      << missing.status();
  auto null_id = ArrowColumn::Open(Fixture("null_id.arrow"), "");
  EXPECT_TRUE(absl::IsInvalidArgument(null_id.status()));
  EXPECT_NE(null_id.status().message().find("record batch 0: 1 null ids"), std::string::npos)
      << null_id.status();
  EXPECT_TRUE(absl::IsNotFound(ArrowColumn::Open("/nonexistent.arrow", "").status()));
  auto not_arrow = ArrowColumn::Open(Fixture("plain_uint16.u32"), "");
  EXPECT_TRUE(absl::IsInvalidArgument(not_arrow.status()));
  EXPECT_NE(not_arrow.status().message().find("not an Arrow IPC file"), std::string::npos)
      << not_arrow.status();
}

// The flatbuffer metadata and the buffers' offsets are untrusted input parsed by hand: damaged
// files come back as an error status (or, where the damage missed what is read, ids), never a
// crash. Runs under --config=asan in scripts/test.sh.
TEST(ArrowColumnTest, CorruptFilesAreRefusedNeverACrash) {
  const std::string dir = FreshTestDir("arrow_fuzz");
  std::mt19937 rng(5);
  int refused = 0, trials = 0;
  for (const char* name :
       {"datasets_stream", "feather_fixed_size_list", "plain_uint16", "text_stream"}) {
    const auto kind = std::string(name) == "text_stream" ? ArrowColumn::Kind::kText
                                                         : ArrowColumn::Kind::kIntegers;
    absl::StatusOr<std::string> valid = ReadFileToString(Fixture(std::string(name) + ".arrow"));
    ASSERT_TRUE(valid.ok());
    refused += column_testing::DamagedFilesRefused<ArrowColumn>(
        *valid, dir + "/" + name + ".arrow", 600, column_testing::Metadata::kAtTheFront, 1024, kind,
        &rng);
    trials += 600;
  }
  EXPECT_GT(refused, trials / 4);
}

}  // namespace
}  // namespace latentd
