#include "storage/latent_stats.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

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

// A tiny first value sets a very narrow window; a huge later one lies ~2^140 bins out, far past
// any integer (the conversion was undefined before bins were clamped). The window must still end
// as the narrowest power-of-two width holding both, whichever way the values arrive.
TEST(LatentStats, HugeValueAfterTinyFirstValueGetsTheNarrowestWindow) {
  for (float big : {1e10f, 3e38f, -2e20f}) {
    LatentStats one_by_one, batch, merged;
    one_by_one.Add(1e-30f);
    one_by_one.Add(big);
    const float both[] = {1e-30f, big};
    batch.AddBatch(both, 2);
    LatentStats later;
    later.Add(big);
    merged.Add(1e-30f);
    merged.Merge(later);
    for (const LatentStats* s : {&one_by_one, &batch, &merged}) {
      int64_t total = 0;
      for (int64_t c : s->histogram) total += c;
      EXPECT_EQ(total, 2) << big;
      EXPECT_LE(s->histogram_min(), std::min(0.0, static_cast<double>(big)));
      EXPECT_GT(s->histogram_max(), std::max(0.0, static_cast<double>(big)));
      // One halving too many: the window no longer holds 0 and big.
      EXPECT_GT(std::fabs(static_cast<double>(big)), 24 * s->bin_width()) << big;
    }
    EXPECT_EQ(one_by_one.bin_exponent, batch.bin_exponent);
    EXPECT_EQ(one_by_one.histogram, batch.histogram);
  }
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

// OfferRun is how commits feed the lists: it must equal Offer() entry by entry, ties included.
TEST(TopRows, OfferRunEqualsOffer) {
  std::mt19937 rng(5);
  TopRows one, run;
  for (int64_t base = 0; base < 20000; base += 1000) {
    std::vector<uint32_t> offsets;
    std::vector<float> values;
    for (uint32_t off = 0; off < 1000; off += 1 + rng() % 3) {
      offsets.push_back(off);
      values.push_back(static_cast<float>(rng() % 50) / 4);  // many ties
    }
    bool changed = false;
    for (size_t i = 0; i < offsets.size(); ++i)
      changed |= one.Offer(base + offsets[i], values[i], 8);
    EXPECT_EQ(run.OfferRun(base, offsets.data(), values.data(), offsets.size(), 8), changed);
    EXPECT_EQ(run.Encode(), one.Encode());
  }
  // Lists still filling (short runs, a large capacity), and runs replayed over rows seen.
  TopRows few, few_run;
  for (int64_t base = 0; base < 4000; base += 100) {
    const bool replay = base % 700 == 600;
    const int64_t at = replay ? base - 300 : base;
    std::vector<uint32_t> offsets;
    std::vector<float> values;
    for (uint32_t off = 0; off < 100; off += 1 + rng() % 40) {
      offsets.push_back(off);
      values.push_back(static_cast<float>(rng() % 20) / 4);
    }
    bool changed = false;
    for (size_t i = 0; i < offsets.size(); ++i) {
      changed |= few.Offer(at + offsets[i], values[i], 64);
    }
    EXPECT_EQ(few_run.OfferRun(at, offsets.data(), values.data(), offsets.size(), 64), changed)
        << "base " << base;
    EXPECT_EQ(few_run.Encode(), few.Encode()) << "base " << base;
  }
  EXPECT_EQ(few.entries().size(), 64u);
}

// AddBatch is how commits feed statistics; it must equal Add() value by value, whatever the batch
// cut, including the windows that slide (negative values) and widen (a tiny first value).
// Nonzero values for statistics trials that exercise every window change: exponential or
// normal by trial; every 4th trial starts with a tiny value (a narrow initial width), every 3rd
// has a late outlier (the window widens), and with far_negatives every 5th has values far below
// zero (the window slides down).
std::vector<float> TrialValues(std::mt19937* rng, int trial, int count, bool far_negatives) {
  std::exponential_distribution<float> exp_dist(2.0f);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> values;
  if (trial % 4 == 3) values.push_back(1e-6f);
  for (int i = 0; i < count; ++i) {
    float v = trial % 2 ? normal(*rng) : exp_dist(*rng);
    if (i == count / 2 && trial % 3 == 0) v *= 1e4f;
    if (far_negatives && trial % 5 == 4 && i % 7 == 0) v = -v * 50;
    if (v != 0.0f) values.push_back(v);
  }
  return values;
}

TEST(LatentStats, AddBatchEqualsAddOneByOne) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const std::vector<float> values = TrialValues(&rng, trial, 3000, /*far_negatives=*/false);
    LatentStats one, batched;
    for (float v : values) one.Add(v);
    std::uniform_int_distribution<size_t> cut(0, 300);
    for (size_t at = 0; at < values.size();) {
      const size_t n = std::min(values.size() - at, cut(rng));
      batched.AddBatch(values.data() + at, n);
      at += n;
    }
    EXPECT_EQ(batched.Encode(), one.Encode()) << "trial " << trial;
  }
}

// A commit's statistics are folded into the dataset's with Merge: counts, extremes and the
// histogram (window and bins) must be those of adding every value one by one, whatever the
// commit boundaries; the sums may differ only in the last bits.
TEST(LatentStats, MergeOfCommitsEqualsAddOneByOne) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const std::vector<float> values = TrialValues(&rng, trial, 2000, /*far_negatives=*/true);
    LatentStats one, merged;
    for (float v : values) one.Add(v);
    std::uniform_int_distribution<size_t> cut(1, trial % 2 ? 5 : 400);
    for (size_t at = 0; at < values.size();) {
      const size_t n = std::min(values.size() - at, cut(rng));
      LatentStats commit;
      commit.AddBatch(values.data() + at, n);
      merged.Merge(commit);
      at += n;
    }
    EXPECT_EQ(merged.firing_count, one.firing_count);
    EXPECT_EQ(merged.max, one.max);
    EXPECT_EQ(merged.min, one.min);
    EXPECT_EQ(merged.bin_exponent, one.bin_exponent) << "trial " << trial;
    EXPECT_EQ(merged.bin_low, one.bin_low) << "trial " << trial;
    EXPECT_EQ(merged.histogram, one.histogram) << "trial " << trial;
    EXPECT_NEAR(merged.sum, one.sum, 1e-9 * std::fabs(one.sum) + 1e-9);
    EXPECT_NEAR(merged.sum_squares, one.sum_squares, 1e-9 * one.sum_squares);
  }
}

// The writer folds each commit's delta into its statistics and writes the same delta as an
// operand (few values as they are, more as a record); RocksDB folds the operands onto the
// stored block in order. Both must hold the same bits, with or without a stored block.
TEST(StatsBlocks, OperandsFoldToTheWritersStatistics) {
  std::mt19937 rng(5);
  std::exponential_distribution<float> dist(1.0f);
  constexpr int kLatents = 6;
  std::vector<LatentStats> writer(kLatents);
  std::vector<std::string> operands;
  for (int commit = 0; commit < 10; ++commit) {
    StatsDeltaBuilder builder(kLatents);
    for (int l = 0; l < kLatents; ++l) {
      if (l == 5 || (l == 4 && commit % 3)) continue;           // 5 never fires, 4 now and then
      std::vector<float> values(1 + rng() % (l < 2 ? 4 : 40));  // raw and record forms
      for (float& v : values) v = dist(rng) * (commit == 7 ? 300.0f : 1.0f);
      LatentStats delta;
      delta.AddBatch(values.data(), values.size());
      writer[l].Merge(delta);
      builder.Add(l, delta, values.data());
    }
    operands.push_back(builder.Finish());
  }
  const std::string want = EncodeStatsBlock(writer.data(), kLatents);
  std::vector<absl::string_view> all(operands.begin(), operands.end());
  std::string folded;
  ASSERT_TRUE(MergeStatsBlocks(nullptr, all, &folded).ok());
  EXPECT_EQ(folded, want);
  // Onto a stored block written whole after the fourth commit, as the writer does now and then.
  std::string stored;
  ASSERT_TRUE(MergeStatsBlocks(nullptr, {all.begin(), all.begin() + 4}, &stored).ok());
  absl::string_view base(stored);
  std::string rest;
  ASSERT_TRUE(MergeStatsBlocks(&base, {all.begin() + 4, all.end()}, &rest).ok());
  EXPECT_EQ(rest, want);
  std::vector<LatentStats> decoded(kLatents);
  ASSERT_TRUE(DecodeStatsBlock(folded, decoded.data(), kLatents).ok());
  EXPECT_EQ(decoded[5].firing_count, 0);
  EXPECT_EQ(decoded[0].Encode(), writer[0].Encode());
}

TEST(StatsBlocks, MalformedInputIsDataLoss) {
  StatsDeltaBuilder builder(3);
  LatentStats delta;
  const float v = 2.5f;
  delta.Add(v);
  builder.Add(1, delta, &v);
  const std::string op = builder.Finish();
  std::string out;
  const std::string truncated = op.substr(0, op.size() - 1);
  EXPECT_EQ(MergeStatsBlocks(nullptr, {truncated}, &out).code(), absl::StatusCode::kDataLoss);
  StatsDeltaBuilder wider(4);
  wider.Add(3, delta, &v);
  EXPECT_EQ(MergeStatsBlocks(nullptr, {op, wider.Finish()}, &out).code(),
            absl::StatusCode::kDataLoss);
  StatsDeltaBuilder outside(3);
  outside.Add(3, delta, &v);  // offset 3 of a 3-latent block
  EXPECT_EQ(MergeStatsBlocks(nullptr, {outside.Finish()}, &out).code(),
            absl::StatusCode::kDataLoss);
  StatsDeltaBuilder huge(kLatentsPerBlock + 1);  // a corrupt size must not allocate blindly
  huge.Add(0, delta, &v);
  EXPECT_EQ(MergeStatsBlocks(nullptr, {huge.Finish()}, &out).code(), absl::StatusCode::kDataLoss);
  std::vector<LatentStats> two(2);
  ASSERT_TRUE(MergeStatsBlocks(nullptr, {op}, &out).ok());
  EXPECT_EQ(DecodeStatsBlock(out, two.data(), 2).code(), absl::StatusCode::kDataLoss);
}

// Commits write top-N deltas that RocksDB folds; the fold must give the list the writer holds,
// however the operands are grouped (compaction merges operands among themselves) and if one is
// applied twice.
TEST(TopBlocks, DeltasFoldToTheWritersLists) {
  std::mt19937 rng(3);
  std::exponential_distribution<float> dist(1.0f);
  constexpr int kLatents = 5, kCapacity = 6;
  std::vector<TopRows> lists(kLatents);
  std::vector<std::string> operands;
  int64_t row = 0;
  for (int commit = 0; commit < 12; ++commit) {
    const int64_t first = row;
    for (int r = 0; r < 40; ++r, ++row) {
      const int latent = static_cast<int>(rng() % kLatents);
      if (latent == 4 && commit > 0) continue;  // latent 4 fires in the first commit only
      lists[latent].Offer(row, std::round(dist(rng) * 8) / 8, kCapacity);  // ties happen
    }
    operands.push_back(EncodeTopDelta(lists.data(), kLatents, kCapacity, first));
  }
  const std::string want = EncodeTopBlock(lists.data(), kLatents);
  std::vector<absl::string_view> all(operands.begin(), operands.end());

  std::string folded;
  ASSERT_TRUE(MergeTopBlocks(nullptr, all, false, &folded).ok());
  EXPECT_EQ(folded, want);

  // One operand at a time onto the stored block, as reads between commits see it.
  std::string block;
  ASSERT_TRUE(MergeTopBlocks(nullptr, {all[0]}, false, &block).ok());
  for (size_t i = 1; i < all.size(); ++i) {
    absl::string_view base(block);
    std::string next;
    ASSERT_TRUE(MergeTopBlocks(&base, {all[i]}, false, &next).ok());
    block = next;
  }
  EXPECT_EQ(block, want);

  // Operands folded among themselves in two groups first, one operand replayed.
  std::string left, right;
  ASSERT_TRUE(MergeTopBlocks(nullptr, {all.begin(), all.begin() + 5}, true, &left).ok());
  ASSERT_TRUE(MergeTopBlocks(nullptr, {all.begin() + 4, all.end()}, true, &right).ok());
  std::string regrouped;
  ASSERT_TRUE(MergeTopBlocks(nullptr, {left, right}, false, &regrouped).ok());
  EXPECT_EQ(regrouped, want);

  std::vector<TopRows> decoded(kLatents);
  ASSERT_TRUE(DecodeTopBlock(folded, decoded.data(), kLatents).ok());
  for (int l = 0; l < kLatents; ++l) {
    ASSERT_EQ(decoded[l].entries().size(), lists[l].entries().size());
    for (size_t i = 0; i < lists[l].entries().size(); ++i) {
      EXPECT_EQ(decoded[l].entries()[i].row, lists[l].entries()[i].row);
    }
  }
}

// A query of one latent decodes only its record of the block: the same record as the whole
// block's decode, and a block of the wrong count is still refused.
TEST(Blocks, OneRecordDecodesAsInTheWholeBlock) {
  std::vector<LatentStats> stats(kLatentsPerBlock);
  std::vector<TopRows> top(kLatentsPerBlock);
  for (int32_t l = 0; l < kLatentsPerBlock; l += 3) {
    for (int i = 0; i <= l; ++i) {
      stats[l].Add(0.25f * (i + 1));
      top[l].Offer(100 * l + i, 0.25f * ((i * 7) % 11 + 1), 8);
    }
  }
  const std::string stats_block = EncodeStatsBlock(stats.data(), kLatentsPerBlock);
  const std::string top_block = EncodeTopBlock(top.data(), kLatentsPerBlock);
  for (int32_t l : {0, 1, 3, 30, kLatentsPerBlock - 1}) {
    LatentStats one;
    ASSERT_TRUE(DecodeStatsBlockRecord(stats_block, kLatentsPerBlock, l, &one).ok());
    EXPECT_EQ(one.Encode(), stats[l].Encode()) << l;
    TopRows list;
    ASSERT_TRUE(DecodeTopBlockList(top_block, kLatentsPerBlock, l, &list).ok());
    EXPECT_EQ(list.Encode(), top[l].Encode()) << l;
  }
  LatentStats one;
  TopRows list;
  EXPECT_EQ(DecodeStatsBlockRecord(stats_block, kLatentsPerBlock - 1, 0, &one).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeTopBlockList(top_block, kLatentsPerBlock + 1, 0, &list).code(),
            absl::StatusCode::kDataLoss);
}

TEST(TopBlocks, MalformedInputIsDataLoss) {
  std::vector<TopRows> lists(2);
  lists[0].Offer(3, 1.5f, 4);
  const std::string op = EncodeTopDelta(lists.data(), 2, 4, 0);
  std::string out;
  const std::string truncated = op.substr(0, op.size() - 2);
  EXPECT_EQ(MergeTopBlocks(nullptr, {truncated}, false, &out).code(), absl::StatusCode::kDataLoss);
  std::vector<TopRows> three(3);
  const std::string other = EncodeTopDelta(three.data(), 3, 4, 0);
  EXPECT_EQ(MergeTopBlocks(nullptr, {op, other}, false, &out).code(), absl::StatusCode::kDataLoss);
  const std::string other_capacity = EncodeTopDelta(lists.data(), 2, 5, 0);
  EXPECT_EQ(MergeTopBlocks(nullptr, {op, other_capacity}, false, &out).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeTopBlock(EncodeTopBlock(lists.data(), 2), three.data(), 3).code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace latentd::storage
