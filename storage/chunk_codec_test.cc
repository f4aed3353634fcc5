#include "storage/chunk_codec.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

Chunk RandomSparse(int64_t rows, int32_t width, int k, bool variable, int32_t max_token,
                   uint32_t seed) {
  std::mt19937 rng(seed);
  Chunk c;
  c.kind = ChunkKind::kSparse;
  c.dtype = ChunkDtype::kFloat32;
  c.row_start = 1000;
  c.num_rows = rows;
  c.width = width;
  c.indptr.push_back(0);
  for (int64_t r = 0; r < rows; ++r) {
    int n = variable ? static_cast<int>(rng() % (k + 1)) : k;
    std::set<int32_t> cols;
    while (static_cast<int>(cols.size()) < n) cols.insert(static_cast<int32_t>(rng() % width));
    for (int32_t col : cols) {
      c.indices.push_back(col);
      c.values.push_back(static_cast<float>(rng() % 1000) / 7.0f);
    }
    c.indptr.push_back(static_cast<int64_t>(c.indices.size()));
    c.token_ids.push_back(static_cast<int32_t>(rng() % max_token));
  }
  return c;
}

void ExpectSame(const Chunk& a, const Chunk& b) {
  EXPECT_EQ(a.row_start, b.row_start);
  EXPECT_EQ(a.num_rows, b.num_rows);
  EXPECT_EQ(a.width, b.width);
  EXPECT_EQ(a.indptr, b.indptr);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.token_ids, b.token_ids);
}

TEST(ChunkCodec, SparseRoundTripsInEveryIndexEncoding) {
  for (IndexEncoding enc :
       {IndexEncoding::kIndexBitPacked, IndexEncoding::kIndexU16, IndexEncoding::kIndexU32}) {
    for (bool variable : {false, true}) {
      Chunk c = RandomSparse(300, 4096, 32, variable, 50000, 1);
      EncodeOptions opt;
      opt.index_encoding = enc;
      Chunk d;
      ASSERT_TRUE(DecodeChunk(EncodeChunk(c, opt), &d).ok());
      ExpectSame(c, d);
    }
  }
}

TEST(ChunkCodec, WideAndExtremeColumnsAndLargeTokens) {
  Chunk c = RandomSparse(50, 1 << 20, 64, true, 1 << 30, 2);
  // Make a row that touches column 0 and the last column (largest gap).
  c.indices[0] = 0;
  Chunk d;
  ASSERT_TRUE(DecodeChunk(EncodeChunk(c), &d).ok());
  ExpectSame(c, d);
}

TEST(ChunkCodec, BitPackedBeatsU16AtX1Shape) {
  Chunk c = RandomSparse(1024, 4096, 32, false, 4096, 3);
  c.dtype = ChunkDtype::kFloat16;
  EncodeOptions u16;
  u16.index_encoding = IndexEncoding::kIndexU16;
  size_t packed = EncodeChunk(c).size(), plain = EncodeChunk(c, u16).size();
  EXPECT_LT(packed, plain);
  EXPECT_LT(packed / 1024.0, 110.0);  // 64 B of values + ~37 B of indices + 2 B token
}

TEST(ChunkCodec, DenseRoundTripsInEachDtype) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  for (ChunkDtype dt : {ChunkDtype::kFloat16, ChunkDtype::kBFloat16, ChunkDtype::kFloat32}) {
    Chunk c;
    c.kind = ChunkKind::kDense;
    c.dtype = dt;
    c.num_rows = 17;
    c.width = 33;
    for (int i = 0; i < 17 * 33; ++i) c.values.push_back(normal(rng));
    c.token_ids.assign(17, 5);
    Chunk d;
    ASSERT_TRUE(DecodeChunk(EncodeChunk(c), &d).ok());
    ASSERT_EQ(d.values.size(), c.values.size());
    for (size_t i = 0; i < c.values.size(); ++i) {
      float tol = dt == ChunkDtype::kFloat32 ? 0 : (dt == ChunkDtype::kFloat16 ? 1e-3f : 8e-3f);
      EXPECT_NEAR(d.values[i], c.values[i], tol * std::max(1.0f, std::fabs(c.values[i])));
    }
  }
}

TEST(ChunkCodec, EveryFlippedByteIsDataLoss) {
  Chunk c = RandomSparse(20, 4096, 8, true, 100, 5);
  std::string enc = EncodeChunk(c);
  for (size_t i = 0; i < enc.size(); i += 3) {
    std::string bad = enc;
    bad[i] ^= 0x20;
    Chunk d;
    absl::Status s = DecodeChunk(bad, &d);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << i;
  }
  Chunk d;
  EXPECT_EQ(DecodeChunk(enc.substr(0, 10), &d).code(), absl::StatusCode::kDataLoss);
}

// SPARSE fp16 / bf16 chunks ("LTC2") bit-pack the values: exact (the stored 16 bits come back)
// and smaller than 2 bytes a value when values span few binades; corruption is DATA_LOSS.
TEST(ChunkCodec, PackedSixteenBitValuesRoundTripExactly) {
  for (ChunkDtype dt : {ChunkDtype::kFloat16, ChunkDtype::kBFloat16}) {
    for (bool mixed_signs : {false, true}) {
      Chunk c = RandomSparse(256, 4096, 32, true, 100, 9);
      c.dtype = dt;
      std::mt19937 rng(4);
      std::exponential_distribution<float> value(1.0f);
      for (float& v : c.values) {
        const float x = (mixed_signs && rng() % 8 == 0 ? -1.0f : 1.0f) * (0.05f + value(rng));
        v = dt == ChunkDtype::kFloat16 ? HalfToFloat(FloatToHalf(x))
                                       : BFloat16ToFloat(FloatToBFloat16(x));
      }
      const std::string enc = EncodeChunk(c);
      Chunk d;
      ASSERT_TRUE(DecodeChunk(enc, &d).ok());
      ExpectSame(c, d);
      Chunk plain = c;
      plain.dtype = ChunkDtype::kFloat32;  // same indices, 4-byte values
      // Positive values: the head (sign + exponent) spans a few binades, so fewer bits.
      if (!mixed_signs) {
        EXPECT_LT(enc.size(), EncodeChunk(plain).size() - c.values.size() * 2);
      }
      for (size_t i = 0; i < enc.size(); i += 7) {
        std::string bad = enc;
        bad[i] ^= 0x04;
        EXPECT_EQ(DecodeChunk(bad, &d).code(), absl::StatusCode::kDataLoss) << i;
      }
    }
  }
  Chunk empty = RandomSparse(4, 64, 0, false, 10, 1);  // no values at all
  empty.dtype = ChunkDtype::kFloat16;
  Chunk d;
  ASSERT_TRUE(DecodeChunk(EncodeChunk(empty), &d).ok());
  ExpectSame(empty, d);
}

TEST(ValueCodec, HalfAndBFloat16Rounding) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(5.9604644775390625e-8f), 0x0001);  // smallest subnormal
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half round-trips
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h);
  }
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(3.140625f)), 3.140625f);
}

// The branch-free rounding the writer applies to whole arrays must give the stored value's
// exact bits: checked at every half, at every tie between neighbouring halves and one float
// either side of it, in both signs, and over a sweep of all float bit patterns (NaN, infinity,
// overflow, subnormals included).
TEST(ValueCodec, ArrayRoundingEqualsTheStoredRoundTrip) {
  auto expect_same = [](float v) {
    ASSERT_EQ(FloatBits(RoundToHalf(v)), FloatBits(HalfToFloat(FloatToHalf(v)))) << v;
    ASSERT_EQ(FloatBits(RoundToBFloat16(v)), FloatBits(BFloat16ToFloat(FloatToBFloat16(v)))) << v;
  };
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float a = HalfToFloat(static_cast<uint16_t>(h));
    const float tie = (a + HalfToFloat(static_cast<uint16_t>(h + 1))) / 2;  // exact in float
    for (float v : {a, tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 1e9f)}) {
      expect_same(v);
      expect_same(-v);
    }
  }
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4093) {
    expect_same(BitsFloat(static_cast<uint32_t>(bits)));
  }
  for (float v : {NAN, -NAN, INFINITY, -INFINITY, 65519.99f, 65520.0f, 1e-30f, 0.0f, -0.0f}) {
    expect_same(v);
  }
}

}  // namespace
}  // namespace latentd::storage
