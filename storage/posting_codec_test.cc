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

// The masked decode serves row windows of latent slices (keys (latent << b) | row): it must equal
// a filtered full decode for every row width b, including windows of one row (where it skips
// entries by their high part) and windows reaching past the chunk.
TEST(PostingCodec, MaskedDecodeEqualsFilteredFullDecode) {
  std::mt19937_64 rng(13);
  for (int b : {0, 1, 5, 12, 20}) {
    for (int latents : {1, 7, 128}) {
      for (size_t per_latent : {1, 30, 2000}) {
        const uint64_t rows_in_chunk = uint64_t{1} << b;
        std::set<int64_t> picked;
        for (int j = 0; j < latents; ++j) {
          for (size_t k = 0; k < std::min<uint64_t>(per_latent, rows_in_chunk); ++k) {
            picked.insert((static_cast<int64_t>(j) << b) |
                          static_cast<int64_t>(rng() % rows_in_chunk));
          }
        }
        std::vector<int64_t> keys(picked.begin(), picked.end());
        std::vector<float> values;
        for (size_t i = 0; i < keys.size(); ++i)
          values.push_back(Round(ChunkDtype::kFloat16, 0.5f + i % 97));
        std::string enc;
        EncodePosting(0, keys.data(), values.data(), keys.size(), ChunkDtype::kFloat16, &enc);
        const uint64_t mask = rows_in_chunk - 1;
        for (int trial = 0; trial < 30; ++trial) {
          uint64_t lo = rng() % rows_in_chunk;
          uint64_t hi = lo + (trial % 3 == 0 ? 1 : rng() % (rows_in_chunk + 2));
          if (trial == 1) lo = 0, hi = rows_in_chunk;
          if (trial == 2) hi = rows_in_chunk + 5;  // past the chunk
          std::vector<int64_t> got_keys;
          std::vector<float> got_values;
          uint64_t total = 0;
          ASSERT_TRUE(DecodePostingMasked(enc, ChunkDtype::kFloat16, mask, lo, hi, &got_keys,
                                          &got_values, &total)
                          .ok());
          EXPECT_EQ(total, keys.size());
          std::vector<int64_t> want_keys;
          std::vector<float> want_values;
          for (size_t i = 0; i < keys.size(); ++i) {
            const uint64_t row = static_cast<uint64_t>(keys[i]) & mask;
            if (row >= lo && row < hi) {
              want_keys.push_back(keys[i]);
              want_values.push_back(values[i]);
            }
          }
          ASSERT_EQ(got_keys, want_keys)
              << "b " << b << " latents " << latents << " [" << lo << ", " << hi << ")";
          ASSERT_EQ(got_values, want_values);
          // A row set inside the window: a random bitmap at a random bit offset.
          const uint64_t offset = rng() % 100;
          std::vector<uint64_t> keep((offset + (hi - lo) + 63) / 64 + 1, 0);
          for (uint64_t r = lo; r < hi; ++r) {
            if (rng() % 3 == 0)
              keep[(offset + r - lo) >> 6] |= uint64_t{1} << ((offset + r - lo) & 63);
          }
          got_keys.clear();
          got_values.clear();
          ASSERT_TRUE(DecodePostingMasked(enc, ChunkDtype::kFloat16, mask, lo, hi, &got_keys,
                                          &got_values, nullptr, keep.data(), offset)
                          .ok());
          want_keys.clear();
          want_values.clear();
          for (size_t i = 0; i < keys.size(); ++i) {
            const uint64_t row = static_cast<uint64_t>(keys[i]) & mask;
            const uint64_t bit = offset + row - lo;
            if (row >= lo && row < hi && ((keep[bit >> 6] >> (bit & 63)) & 1)) {
              want_keys.push_back(keys[i]);
              want_values.push_back(values[i]);
            }
          }
          ASSERT_EQ(got_keys, want_keys) << "row set, b " << b << " offset " << offset;
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
