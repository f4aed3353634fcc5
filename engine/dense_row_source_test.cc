#include "engine/dense_row_source.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace latentd::engine {
namespace {

// `rows` rows of `width` values, value = base + row * width + column.
std::unique_ptr<DenseRowSource> Source(int64_t rows, int64_t width, float base,
                                       int64_t chunk_rows) {
  std::vector<float> values(rows * width);
  for (int64_t i = 0; i < rows * width; ++i) values[i] = base + static_cast<float>(i);
  return std::make_unique<InMemoryDenseRowSource>(std::move(values), width, chunk_rows);
}

TEST(SideBySideDenseRowSourceTest, ARowIsEverySourcesRowInOrder) {
  std::vector<std::unique_ptr<DenseRowSource>> sources;
  sources.push_back(Source(10, 2, 0, 4));
  sources.push_back(Source(10, 3, 1000, 5));
  sources.push_back(Source(10, 1, 2000, 3));
  auto joined = SideBySideDenseRowSource::Create(std::move(sources));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ((*joined)->num_rows(), 10);
  EXPECT_EQ((*joined)->width(), 6);
  EXPECT_EQ((*joined)->chunk_starts(), (std::vector<int64_t>{0, 4, 8}));  // the first source's
  std::vector<float> rows(2 * 6);
  ASSERT_TRUE((*joined)->Read(7, 2, rows.data()).ok());
  EXPECT_EQ(rows, (std::vector<float>{14, 15, 1021, 1022, 1023, 2007,  //
                                      16, 17, 1024, 1025, 1026, 2008}));
  EXPECT_EQ((*joined)->Read(9, 2, rows.data()).code(), absl::StatusCode::kOutOfRange);
}

TEST(SideBySideDenseRowSourceTest, SourcesOfOtherRowCountsAreRefused) {
  std::vector<std::unique_ptr<DenseRowSource>> sources;
  sources.push_back(Source(10, 2, 0, 4));
  sources.push_back(Source(9, 2, 0, 4));
  auto joined = SideBySideDenseRowSource::Create(std::move(sources));
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SideBySideDenseRowSource::Create({}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace latentd::engine
