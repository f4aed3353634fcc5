#include "storage/latent_stats.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

TEST(LatentStats, MomentsAndHistogramCoverEveryValue) {
  std::mt19937 rng(1);
  std::exponential_distribution<float> dist(0.5f);
  LatentStats s;
  std::vector<float> seen;
  for (int i = 0; i < 5000; ++i) {
    float v = dist(rng);
    s.Add(v);
    seen.push_back(v);
  }
  EXPECT_EQ(s.firing_count, 5000);
  EXPECT_FLOAT_EQ(s.max, *std::max_element(seen.begin(), seen.end()));
  int64_t total = 0;
  for (int64_t c : s.histogram) total += c;
  EXPECT_EQ(total, 5000);
  EXPECT_LE(s.histogram_min(), 0.0);
  EXPECT_GT(s.histogram_max(), s.max);
  EXPECT_LE(s.histogram_max(), 4 * s.max);  // the range grows by doubling, never far past max
  // Each bin counts exactly the values inside it.
  for (int b = 0; b < kHistogramBins; ++b) {
    const double lo = s.histogram_min() + b * s.bin_width(), hi = lo + s.bin_width();
    int64_t expect =
        std::count_if(seen.begin(), seen.end(), [&](float v) { return v >= lo && v < hi; });
    EXPECT_EQ(s.histogram[b], expect) << b;
  }
}

TEST(LatentStats, NegativeValuesAndRoundTrip) {
  LatentStats s;
  for (float v : {3.0f, -7.5f, 0.25f, 120.0f}) s.Add(v);
  int64_t total = 0;
  for (int64_t c : s.histogram) total += c;
  EXPECT_EQ(total, 4);
  EXPECT_LE(s.histogram_min(), -7.5);
  LatentStats d;
  ASSERT_TRUE(LatentStats::Decode(s.Encode(), &d).ok());
  EXPECT_EQ(d.histogram, s.histogram);
  EXPECT_EQ(d.sum, s.sum);
  EXPECT_EQ(d.min, -7.5f);
  EXPECT_FALSE(LatentStats::Decode("xyz", &d).ok());
}

TEST(TopRows, KeepsLargestDeterministicallyAndIgnoresReplays) {
  TopRows t;
  for (int r = 0; r < 100; ++r) t.Offer(r, static_cast<float>(r % 10), 5);
  ASSERT_EQ(t.entries().size(), 5u);
  // Five rows with value 9, the earliest first.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(t.entries()[i].value, 9.0f);
    EXPECT_EQ(t.entries()[i].row, 9 + 10 * i);
  }
  EXPECT_FALSE(t.Offer(9, 9.0f, 5));
  EXPECT_TRUE(t.Offer(500, 10.0f, 5));
  TopRows d;
  ASSERT_TRUE(TopRows::Decode(t.Encode(), &d).ok());
  EXPECT_EQ(d.entries().front().row, 500);
}

}  // namespace
}  // namespace latentd::storage
