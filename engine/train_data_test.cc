#include "engine/train_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace latentd::engine {
namespace {

// Row r holds the single value r, so the stream's content tells which rows it visited.
InMemoryDenseRowSource Rows(int64_t n, int64_t chunk) {
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i);
  return InMemoryDenseRowSource(values, 1, chunk);
}

TEST(ShuffledRowStreamTest, EachEpochVisitsEveryRowOnceInAShuffledOrder) {
  InMemoryDenseRowSource source = Rows(103, 10);
  ShuffledRowStream stream(&source, {.seed = 7, .window_chunks = 3});
  std::vector<float> out(206);
  ASSERT_TRUE(stream.Read(0, 206, out.data()).ok());
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<float> rows(out.begin() + epoch * 103, out.begin() + (epoch + 1) * 103);
    std::vector<float> sorted = rows;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < 103; ++i) ASSERT_EQ(sorted[i], i);
    EXPECT_FALSE(std::is_sorted(rows.begin(), rows.end()));
  }
  EXPECT_FALSE(std::equal(out.begin(), out.begin() + 103, out.begin() + 103));
}

TEST(ShuffledRowStreamTest, RandomAccessEqualsSequentialReadAndDependsOnSeed) {
  InMemoryDenseRowSource source = Rows(64, 8);
  ShuffledRowStream sequential(&source, {.seed = 1, .window_chunks = 2});
  std::vector<float> all(200);
  ASSERT_TRUE(sequential.Read(0, 200, all.data()).ok());
  ShuffledRowStream fresh(&source, {.seed = 1, .window_chunks = 2});
  std::vector<float> part(37);
  ASSERT_TRUE(fresh.Read(150, 37, part.data()).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + 150));
  ShuffledRowStream other(&source, {.seed = 2, .window_chunks = 2});
  std::vector<float> other_rows(64);
  ASSERT_TRUE(other.Read(0, 64, other_rows.data()).ok());
  EXPECT_FALSE(std::equal(other_rows.begin(), other_rows.end(), all.begin()));
}

}  // namespace
}  // namespace latentd::engine
