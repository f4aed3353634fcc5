#include "client/row_ranges.h"

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace latentd::client {
namespace {

std::vector<std::pair<int64_t, int64_t>> Pairs(const std::vector<RowRange>& ranges) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const RowRange& r : ranges) out.emplace_back(r.start, r.count);
  return out;
}

TEST(ParseRowRanges, SortsAndMergesRowsAndRanges) {
  auto ranges = ParseRowRanges("160:32, 64:20 80:16\n7\n9 8,3:1");
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  // 64:20 and 80:16 overlap at 80..83; 7, 8 and 9 touch.
  EXPECT_EQ(Pairs(*ranges),
            (std::vector<std::pair<int64_t, int64_t>>{{3, 1}, {7, 3}, {64, 32}, {160, 32}}));
  ranges = ParseRowRanges("10:100 20:5 10");  // one holding the others
  ASSERT_TRUE(ranges.ok());
  EXPECT_EQ(Pairs(*ranges), (std::vector<std::pair<int64_t, int64_t>>{{10, 100}}));
  ranges = ParseRowRanges(" \n");
  ASSERT_TRUE(ranges.ok());
  EXPECT_TRUE(ranges->empty());
}

TEST(ParseRowRanges, QuotesTheBadItem) {
  const auto message = [](const std::string& text) {
    return std::string(ParseRowRanges(text).status().message());
  };
  EXPECT_EQ(message("4 x"), "'x' is not a row or START:COUNT");
  EXPECT_EQ(message("4:"), "'4:' is not a row or START:COUNT");
  EXPECT_EQ(message("4:2:1"), "'4:2:1' is not a row or START:COUNT");
  EXPECT_EQ(message("-3"), "'-3': a row is never negative");
  EXPECT_EQ(message("5:0"), "'5:0': the count must be at least 1");
  EXPECT_EQ(message("5:9223372036854775807"),
            "'5:9223372036854775807': the range passes the largest row");
  EXPECT_EQ(ParseRowRanges("x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RowsOfSequences, EachSequenceIsItsContextLengthRows) {
  auto sequences = ParseRowRanges("2 5:2 0");
  ASSERT_TRUE(sequences.ok());
  auto rows = RowsOfSequences(*sequences, 128);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(Pairs(*rows),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 128}, {256, 128}, {640, 256}}));
  EXPECT_EQ(RowsOfSequences(*sequences, 0).status().code(), absl::StatusCode::kInvalidArgument);
  // The last sequence whose rows fit, and the first that does not.
  const int64_t last = std::numeric_limits<int64_t>::max() / 1024 - 1;
  rows = RowsOfSequences({{last, 1}}, 1024);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(Pairs(*rows), (std::vector<std::pair<int64_t, int64_t>>{{last * 1024, 1024}}));
  absl::Status past = RowsOfSequences({{last, 2}}, 1024).status();
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(past.message().find("pass the largest row"), std::string::npos) << past;
}

}  // namespace
}  // namespace latentd::client
