#include "storage/posting_codec.h"

#include <random>
#include <set>

#include "gtest/gtest.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

float Round(ChunkDtype dtype, float v) {
  switch (dtype) {
    case ChunkDtype::kFloat16:
      return HalfToFloat(FloatToHalf(v));
    case ChunkDtype::kBFloat16:
      return BFloat16ToFloat(FloatToBFloat16(v));
    case ChunkDtype::kFloat32:
      return v;
  }
  return v;
}

// Random ascending rows over universes from dense to very sparse, every dtype: exact round trip,
// appended after what the vectors already hold.
TEST(PostingCodec, RoundTripsRowsAndValuesExactly) {
  std::mt19937_64 rng(3);
  for (ChunkDtype dtype : {ChunkDtype::kFloat16, ChunkDtype::kBFloat16, ChunkDtype::kFloat32}) {
    for (int64_t universe :
         {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, int64_t{1000}, int64_t{16384},
          int64_t{1} << 30, int64_t{1} << 45, int64_t{1} << 60}) {
      for (size_t want : {1, 2, 3, 50, 700}) {
        std::set<int64_t> picked;
        const size_t n = std::min<size_t>(want, universe);
        while (picked.size() < n) picked.insert(static_cast<int64_t>(rng() % universe));
        const int64_t row_start = 123456789;
        std::vector<int64_t> rows;
        std::vector<float> values;
        std::normal_distribution<float> value(0, 3);
        for (int64_t x : picked) {
          rows.push_back(row_start + x);
          values.push_back(Round(dtype, value(rng)));
        }
        std::string enc;
        EncodePosting(row_start, rows.data(), values.data(), rows.size(), dtype, &enc);
        std::vector<int64_t> got_rows{-1};
        std::vector<float> got_values{-1};
        ASSERT_TRUE(DecodePosting(enc, row_start, dtype, &got_rows, &got_values).ok());
        ASSERT_EQ(got_rows.size(), rows.size() + 1);
        EXPECT_EQ(got_rows[0], -1);
        for (size_t i = 0; i < rows.size(); ++i) {
          ASSERT_EQ(got_rows[i + 1], rows[i]) << "universe " << universe << " n " << n;
          ASSERT_EQ(FloatBits(got_values[i + 1]), FloatBits(values[i]));
        }
      }
    }
  }
}

// A range decode returns exactly the entries of the full decode that lie in the range, for
// ranges inside, across and outside the rows, on dense and sparse universes.
TEST(PostingCodec, RangeDecodeEqualsFilteredFullDecode) {
  std::mt19937_64 rng(11);
  for (ChunkDtype dtype : {ChunkDtype::kFloat16, ChunkDtype::kBFloat16, ChunkDtype::kFloat32}) {
    for (int64_t universe : {int64_t{3}, int64_t{200}, int64_t{1} << 17, int64_t{1} << 60}) {
      for (size_t want : {1, 5, 900}) {
        std::set<int64_t> picked;
        const size_t n = std::min<size_t>(want, universe);
        while (picked.size() < n) picked.insert(static_cast<int64_t>(rng() % universe));
        const int64_t row_start = 1000;
        std::vector<int64_t> rows;
        std::vector<float> values;
        for (int64_t x : picked) {
          rows.push_back(row_start + x);
          values.push_back(Round(dtype, static_cast<float>(rng() % 1000) / 7.0f - 30.0f));
        }
        std::string enc;
        EncodePosting(row_start, rows.data(), values.data(), rows.size(), dtype, &enc);
        for (int trial = 0; trial < 40; ++trial) {
          int64_t lo = row_start - 5 + static_cast<int64_t>(rng() % (universe + 10));
          int64_t hi = lo + static_cast<int64_t>(rng() % (universe / 3 + 2));
          if (trial == 0) lo = row_start, hi = row_start + universe;  // everything
          if (trial == 1) lo = 0, hi = row_start;                     // before the rows
          std::vector<int64_t> got_rows;
          std::vector<float> got_values;
          ASSERT_TRUE(
              DecodePostingRange(enc, row_start, dtype, lo, hi, &got_rows, &got_values).ok());
          std::vector<int64_t> want_rows;
          std::vector<float> want_values;
          for (size_t i = 0; i < rows.size(); ++i) {
            if (rows[i] >= lo && rows[i] < hi) {
              want_rows.push_back(rows[i]);
              want_values.push_back(values[i]);
            }
          }
          ASSERT_EQ(got_rows, want_rows) << "universe " << universe << " [" << lo << ", " << hi;
          ASSERT_EQ(got_values, want_values);
        }
      }
    }
  }
}

TEST(PostingCodec, RowsCostAboutTwoPlusLogGapBits) {
  std::vector<int64_t> rows;
  std::vector<float> values;
  for (int64_t r = 0; r < 16384; r += 128) rows.push_back(r), values.push_back(1.0f);
  std::string enc;
  EncodePosting(0, rows.data(), values.data(), rows.size(), ChunkDtype::kFloat16, &enc);
  // 128 entries: 7 low bits + ~2 high bits each, at most 2 value bytes, header and CRC.
  EXPECT_LE(enc.size(), 128 * 9 / 8 + 128 * 2 + 16);
}

TEST(PostingCodec, CorruptionIsDataLoss) {
  std::vector<int64_t> rows{5, 9, 300};
  std::vector<float> values{1, 2, 3};
  std::string enc;
  EncodePosting(0, rows.data(), values.data(), 3, ChunkDtype::kFloat16, &enc);
  std::vector<int64_t> r;
  std::vector<float> v;
  for (size_t i = 0; i < enc.size(); ++i) {
    std::string bad = enc;
    bad[i] ^= 0x10;
    EXPECT_EQ(DecodePosting(bad, 0, ChunkDtype::kFloat16, &r, &v).code(),
              absl::StatusCode::kDataLoss);
  }
  EXPECT_EQ(DecodePosting(enc.substr(0, 5), 0, ChunkDtype::kFloat16, &r, &v).code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace latentd::storage
