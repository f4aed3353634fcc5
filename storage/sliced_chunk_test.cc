#include "storage/sliced_chunk.h"

#include <numeric>
#include <random>

#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

TEST(SliceLayout, CoversTheWidthWithEqualSlices) {
  for (int32_t width : {1, 7, 64, 4096, 4097, 1 << 20}) {
    for (int32_t slices : {1, 3, 128, 100000}) {
      const SliceLayout l = MakeSliceLayout(width, slices);
      EXPECT_LE(l.num_slices, std::min(width, slices)) << width << " " << slices;
      EXPECT_GE(l.num_slices * l.slice_width, width);
      EXPECT_LT((l.num_slices - 1) * l.slice_width, width);  // no empty last slice
      EXPECT_EQ(l.SliceOf(width - 1), l.num_slices - 1);
    }
  }
  EXPECT_EQ(MakeSliceLayout(4096, 128).slice_width, 32);
  // More slices than a 16-bit key part can name are clamped, never wrapped.
  EXPECT_LE(MakeSliceLayout(1 << 20, 1 << 20).num_slices, kMaxLatentSlices);
}

TEST(RowBits, IsCeilLog2) {
  EXPECT_EQ(RowBits(1), 0);
  EXPECT_EQ(RowBits(2), 1);
  EXPECT_EQ(RowBits(3), 2);
  EXPECT_EQ(RowBits(4096), 12);
  EXPECT_EQ(RowBits(4097), 13);
}

TEST(SlicedHeader, RoundTripsAndRejectsCorruption) {
  SlicedChunkHeader h;
  h.dtype = ChunkDtype::kBFloat16;
  h.row_start = 1 << 20;
  h.num_rows = 4096;
  h.layout = MakeSliceLayout(4096, 128);
  h.slice_nnz.assign(h.layout.num_slices, 0);
  for (int s = 0; s < h.layout.num_slices; s += 3) h.slice_nnz[s] = 1000 + s * 300;
  h.nnz = std::accumulate(h.slice_nnz.begin(), h.slice_nnz.end(), int64_t{0});
  const std::string enc = EncodeSlicedHeader(h);
  SlicedChunkHeader d;
  ASSERT_TRUE(DecodeSlicedHeader(enc, &d).ok());
  EXPECT_EQ(d.dtype, h.dtype);
  EXPECT_EQ(d.row_start, h.row_start);
  EXPECT_EQ(d.num_rows, h.num_rows);
  EXPECT_EQ(d.layout.slice_width, 32);
  EXPECT_EQ(d.layout.num_slices, 128);
  EXPECT_EQ(d.slice_nnz, h.slice_nnz);
  EXPECT_EQ(d.nnz, h.nnz);
  for (size_t i = 0; i < enc.size(); ++i) {
    std::string bad = enc;
    bad[i] ^= 0x10;
    EXPECT_EQ(DecodeSlicedHeader(bad, &d).code(), absl::StatusCode::kDataLoss) << i;
  }
  EXPECT_EQ(DecodeSlicedHeader(enc.substr(0, 3), &d).code(), absl::StatusCode::kDataLoss);
}

TEST(TokenPart, NarrowAndWideIdsRoundTrip) {
  std::vector<int32_t> narrow = {0, 65535, 7, 3}, wide = {0, 70000, 3};
  std::vector<int32_t> out;
  const std::string n = EncodeTokenPart(narrow.data(), narrow.size());
  const std::string w = EncodeTokenPart(wide.data(), wide.size());
  EXPECT_LT(n.size(), w.size() + 4);  // 2 bytes an id against 4
  ASSERT_TRUE(DecodeTokenPart(n, &out).ok());
  EXPECT_EQ(out, narrow);
  ASSERT_TRUE(DecodeTokenPart(w, &out).ok());
  EXPECT_EQ(out, wide);
  std::string bad = w;
  bad[9] ^= 1;
  EXPECT_EQ(DecodeTokenPart(bad, &out).code(), absl::StatusCode::kDataLoss);
}

// A slice of a 1000-row chunk (not a power of two: row keys leave gaps) round-trips exactly,
// and entries outside the slice or a count the header does not expect are DATA_LOSS.
TEST(Slice, RoundTripsAndChecksItsBounds) {
  SlicedChunkHeader h;
  h.dtype = ChunkDtype::kFloat16;
  h.num_rows = 1000;
  h.layout = MakeSliceLayout(100, 8);  // slice width 13, last slice 9 latents
  h.slice_nnz.assign(h.layout.num_slices, 0);
  const int bits = RowBits(h.num_rows);
  std::mt19937 rng(5);
  std::vector<int64_t> keys;
  std::vector<float> values;
  const int32_t last = h.layout.num_slices - 1;
  const int32_t last_width = h.layout.width - h.layout.FirstLatent(last);
  for (int64_t off = 0; off < last_width; ++off) {
    for (int64_t row = off; row < h.num_rows; row += 17 + off) {
      keys.push_back(off << bits | row);
      values.push_back(static_cast<float>(rng() % 1000) / 64.0f + 0.25f);
    }
  }
  h.slice_nnz[last] = static_cast<uint32_t>(keys.size());
  std::string enc;
  EncodeSlice(keys.data(), values.data(), keys.size(), h.dtype, &enc);
  SliceEntries got;
  ASSERT_TRUE(DecodeSlice(enc, h, last, 0, h.num_rows, &got).ok());
  EXPECT_EQ(got.keys, keys);
  EXPECT_EQ(got.values, values);  // multiples of 1/64 below 16: exact in fp16
  // A row window returns exactly the entries of those rows.
  for (auto [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {17, 18}, {100, 640}}) {
    SliceEntries window;
    ASSERT_TRUE(DecodeSlice(enc, h, last, lo, hi, &window).ok());
    SliceEntries want;
    for (size_t i = 0; i < keys.size(); ++i) {
      const int64_t row = keys[i] & ((1 << bits) - 1);
      if (row >= lo && row < hi) {
        want.keys.push_back(keys[i]);
        want.values.push_back(values[i]);
      }
    }
    EXPECT_EQ(window.keys, want.keys) << lo;
    EXPECT_EQ(window.values, want.values) << lo;
  }
  // One latent's run, decoded alone, is that latent's entries with absolute rows.
  h.row_start = 5000;
  for (int32_t off = 0; off < last_width; ++off) {
    std::vector<int64_t> want_rows, rows{-1};
    std::vector<float> want_values, vals{-1};
    for (size_t i = 0; i < keys.size(); ++i) {
      if ((keys[i] >> bits) == off) {
        want_rows.push_back(h.row_start + (keys[i] & ((1 << bits) - 1)));
        want_values.push_back(values[i]);
      }
    }
    ASSERT_TRUE(
        DecodeSliceLatent(enc, h, last, h.layout.FirstLatent(last) + off, &rows, &vals).ok());
    want_rows.insert(want_rows.begin(), -1);
    want_values.insert(want_values.begin(), -1);
    EXPECT_EQ(rows, want_rows) << off;
    EXPECT_EQ(vals, want_values) << off;
  }

  h.slice_nnz[last] += 1;
  EXPECT_EQ(DecodeSlice(enc, h, last, 0, h.num_rows, &got).code(), absl::StatusCode::kDataLoss);
  h.slice_nnz[last] -= 1;
  // The same keys read as slice 0 of a 600-row chunk: rows past the chunk.
  SlicedChunkHeader short_chunk = h;
  short_chunk.num_rows = 600;
  short_chunk.slice_nnz[0] = h.slice_nnz[last];
  EXPECT_EQ(DecodeSlice(enc, short_chunk, 0, 0, 600, &got).code(), absl::StatusCode::kDataLoss);
  // Latent offsets past a narrower slice.
  SlicedChunkHeader narrow = h;
  narrow.layout.width = h.layout.FirstLatent(last) + 4;  // the last slice holds 4 latents
  EXPECT_EQ(DecodeSlice(enc, narrow, last, 0, h.num_rows, &got).code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace latentd::storage
