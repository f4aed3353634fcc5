// Corrupt bytes never crash the store and never come back as silent garbage.
//
// Every decoder of a stored value is fed thousands of mutations of valid encodings (bit flips,
// overwritten and zeroed runs, truncations, appended bytes), half of them with their CRC32C
// recomputed so that the mutation reaches the parser behind the checksum (a writer bug, or a
// corruption that happens before the checksum is taken). A decoder may accept a mutation only
// with an output that keeps its contract (the invariants every reader indexes arrays by);
// anything else must be an error status. Then the same at the level of the store: each stored
// value of real datasets is replaced in turn by a mutation and every query runs against it.
// Built with --config=asan (AddressSanitizer + UBSan), this is the proof that no such input
// reads out of bounds or hits undefined behaviour.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/mutate.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/chunk_codec.h"
#include "storage/chunk_store.h"
#include "storage/crc32c.h"
#include "storage/keys.h"
#include "storage/latent_stats.h"
#include "storage/latents_on_rows.h"
#include "storage/posting_codec.h"
#include "storage/sliced_chunk.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

constexpr int kMutationsPerInput = 1500;

float RoundTo(ChunkDtype dtype, float v) {
  switch (dtype) {
    case ChunkDtype::kFloat16:
      return RoundToHalf(v);
    case ChunkDtype::kBFloat16:
      return RoundToBFloat16(v);
    case ChunkDtype::kFloat32:
      break;
  }
  return v;
}

// Recomputes the trailing CRC32C (the last four bytes: the checksum of every byte before them),
// the layout of every checksummed value of the store.
std::string Reseal(std::string s) {
  if (s.size() < 4) return s;
  const uint32_t crc = Crc32c(s.data(), s.size() - 4);
  std::memcpy(&s[s.size() - 4], &crc, 4);
  return s;
}

// Runs `check` on kMutationsPerInput mutations of `valid`, half of them resealed. `check`
// returns the decoder's status; a mutation that is not resealed must be DATA_LOSS when
// `checksummed` (the CRC catches every change of up to three bits, and the rest with
// probability 1 - 2^-32).
template <typename Check>
void FuzzValue(const std::string& what, const std::string& valid, bool checksummed, Check check,
               uint32_t seed) {
  std::mt19937 rng(seed);
  const bool failed_before = ::testing::Test::HasFailure();
  int accepted = 0;
  for (int i = 0; i < kMutationsPerInput; ++i) {
    const bool reseal = checksummed && (i % 2 == 1);
    std::string bad = MutateBytes(valid, &rng);
    if (reseal) bad = Reseal(bad);
    if (bad == valid) continue;
    const absl::Status s = check(bad);
    if (s.ok()) {
      ++accepted;
      EXPECT_TRUE(reseal || !checksummed) << what << ": a changed value passed its checksum";
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << what << ": " << s;
    }
    if (!failed_before && ::testing::Test::HasFailure()) {
      ADD_FAILURE() << what << ": mutation " << i << " of seed " << seed;
      return;
    }
  }
  // Not an assertion about the rate: a record for whoever reads the log.
  std::printf("%-40s %4d of %d mutations decoded (each kept the contract)\n", what.c_str(),
              accepted, kMutationsPerInput);
}

// --- the contracts of decoded values ---

void ExpectSparseChunkValid(const Chunk& c) {
  ASSERT_GE(c.num_rows, 0);
  ASSERT_GT(c.width, 0);
  ASSERT_EQ(c.token_ids.size(), static_cast<size_t>(c.num_rows));
  if (c.kind == ChunkKind::kDense) {
    ASSERT_EQ(c.values.size(), static_cast<size_t>(c.num_rows) * c.width);
    return;
  }
  ASSERT_EQ(c.indptr.size(), static_cast<size_t>(c.num_rows) + 1);
  ASSERT_EQ(c.indptr[0], 0);
  ASSERT_EQ(static_cast<size_t>(c.indptr.back()), c.indices.size());
  ASSERT_EQ(c.values.size(), c.indices.size());
  for (int64_t r = 0; r < c.num_rows; ++r) {
    ASSERT_LE(c.indptr[r], c.indptr[r + 1]);
    for (int64_t i = c.indptr[r]; i < c.indptr[r + 1]; ++i) {
      ASSERT_GE(c.indices[i], 0);
      ASSERT_LT(c.indices[i], c.width);
      if (i > c.indptr[r]) {
        ASSERT_LT(c.indices[i - 1], c.indices[i]);
      }
    }
  }
}

void ExpectHeaderValid(const SlicedChunkHeader& h) {
  ASSERT_GE(h.num_rows, 0);
  ASSERT_GT(h.layout.slice_width, 0);
  ASSERT_EQ(h.layout.num_slices,
            (h.layout.width + h.layout.slice_width - 1) / h.layout.slice_width);
  ASSERT_EQ(h.slice_nnz.size(), static_cast<size_t>(h.layout.num_slices));
  int64_t sum = 0;
  for (uint32_t n : h.slice_nnz) sum += n;
  ASSERT_EQ(sum, h.nnz);
}

void ExpectSliceValid(const SliceEntries& e, const SlicedChunkHeader& h, int64_t lo, int64_t hi) {
  ASSERT_EQ(e.keys.size(), e.values.size());
  const int bits = RowBits(h.num_rows);
  for (size_t i = 0; i < e.keys.size(); ++i) {
    const int64_t row = e.keys[i] & ((int64_t{1} << bits) - 1);
    ASSERT_LT(e.keys[i] >> bits, h.layout.slice_width);
    ASSERT_GE(row, lo);
    ASSERT_LT(row, std::min(hi, h.num_rows));
    if (i > 0) {
      ASSERT_LT(e.keys[i - 1], e.keys[i]);
    }
  }
}

void ExpectRowsAscendingFrom(const std::vector<int64_t>& rows, size_t values, int64_t lo,
                             int64_t hi) {
  ASSERT_EQ(rows.size(), values);
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_GE(rows[i], lo);
    ASSERT_LT(rows[i], hi);
    if (i > 0) {
      ASSERT_LT(rows[i - 1], rows[i]);
    }
  }
}

// Exercises a decoded statistics record the way readers and the merge operator do.
void UseStats(const LatentStats& st) {
  LatentStats probe;
  probe.AddBatch(std::vector<float>{0.5f, 3.0f, 1e-20f, 7e6f}.data(), 4);
  LatentStats a = st, b = probe;
  a.Merge(probe);
  b.Merge(st);
  a.Add(2.0f);
  volatile double sink = st.mean() + st.stddev() + st.histogram_min() + st.histogram_max() +
                         a.bin_width() + b.bin_width();
  (void)sink;
}

// --- valid encodings ---

Chunk SparseChunk(ChunkDtype dtype, int32_t width, bool fixed_k, uint32_t seed) {
  std::mt19937 rng(seed);
  Chunk c;
  c.kind = ChunkKind::kSparse;
  c.dtype = dtype;
  c.width = width;
  c.row_start = 4096;
  c.num_rows = 37;
  c.indptr = {0};
  for (int64_t r = 0; r < c.num_rows; ++r) {
    const int k = fixed_k ? 6 : static_cast<int>(rng() % 9);
    std::vector<int32_t> cols;
    while (static_cast<int>(cols.size()) < k) {
      const int32_t col = static_cast<int32_t>(rng() % width);
      if (std::find(cols.begin(), cols.end(), col) == cols.end()) cols.push_back(col);
    }
    std::sort(cols.begin(), cols.end());
    for (int32_t col : cols) {
      c.indices.push_back(col);
      c.values.push_back(RoundTo(dtype, 0.01f + static_cast<float>(rng() % 5000) / 313.0f));
    }
    c.indptr.push_back(static_cast<int64_t>(c.indices.size()));
    c.token_ids.push_back(static_cast<int32_t>(rng() % (width > 65536 ? 100000 : 50257)));
  }
  return c;
}

TEST(CorruptionFuzz, ChunksDecodeOrFailWithDataLoss) {
  struct Case {
    ChunkDtype dtype;
    int32_t width;
    IndexEncoding encoding;
    bool fixed_k;
  };
  const Case cases[] = {
      {ChunkDtype::kFloat16, 300, IndexEncoding::kIndexBitPacked, true},
      {ChunkDtype::kBFloat16, 4096, IndexEncoding::kIndexBitPacked, false},
      {ChunkDtype::kFloat32, 70000, IndexEncoding::kIndexU32, false},
      {ChunkDtype::kFloat16, 300, IndexEncoding::kIndexU16, false},
  };
  uint32_t seed = 1;
  for (const Case& k : cases) {
    EncodeOptions options;
    options.index_encoding = k.encoding;
    const std::string valid = EncodeChunk(SparseChunk(k.dtype, k.width, k.fixed_k, seed), options);
    FuzzValue(
        "sparse chunk width " + std::to_string(k.width), valid, true,
        [](const std::string& bad) {
          Chunk c;
          absl::Status s = DecodeChunk(bad, &c);
          if (s.ok()) ExpectSparseChunkValid(c);
          Chunk t;
          absl::Status st = DecodeChunkTokens(bad, &t);
          if (st.ok()) {
            EXPECT_EQ(t.token_ids.size(), static_cast<size_t>(t.num_rows));
          }
          return s;
        },
        seed++);
  }
  Chunk dense;
  dense.kind = ChunkKind::kDense;
  dense.dtype = ChunkDtype::kBFloat16;
  dense.width = 24;
  dense.num_rows = 9;
  for (int i = 0; i < 9 * 24; ++i) dense.values.push_back(RoundTo(dense.dtype, i * 0.25f - 3));
  dense.token_ids.assign(9, 7);
  FuzzValue(
      "dense chunk", EncodeChunk(dense), true,
      [](const std::string& bad) {
        Chunk c;
        absl::Status s = DecodeChunk(bad, &c);
        if (s.ok()) ExpectSparseChunkValid(c);
        return s;
      },
      seed);
}

TEST(CorruptionFuzz, SlicedChunkPartsDecodeOrFailWithDataLoss) {
  // A chunk of 100 rows, 300 latents in 8 slices of 38; slice 2 holds latents [76, 114).
  SlicedChunkHeader header;
  header.dtype = ChunkDtype::kFloat16;
  header.row_start = 200;
  header.num_rows = 100;
  header.layout = MakeSliceLayout(300, 8);
  header.slice_nnz.assign(header.layout.num_slices, 0);
  const int bits = RowBits(header.num_rows);
  std::vector<int64_t> keys;
  std::vector<float> values;
  std::mt19937 rng(5);
  for (int32_t off = 0; off < header.layout.slice_width; ++off) {
    for (int64_t row = 0; row < header.num_rows; ++row) {
      if (rng() % 7 != 0) continue;
      keys.push_back((int64_t{off} << bits) | row);
      values.push_back(RoundTo(header.dtype, 0.1f + static_cast<float>(rng() % 900) / 37.0f));
    }
  }
  header.slice_nnz[2] = static_cast<uint32_t>(keys.size());
  header.slice_nnz[5] = 1;
  header.nnz = static_cast<int64_t>(keys.size()) + 1;
  std::string slice;
  EncodeSlice(keys.data(), values.data(), keys.size(), header.dtype, &slice);
  const std::string header_bytes = EncodeSlicedHeader(header);

  FuzzValue(
      "sliced chunk header", header_bytes, true,
      [&](const std::string& bad) {
        SlicedChunkHeader h;
        absl::Status s = DecodeSlicedHeader(bad, &h);
        if (s.ok()) {
          ExpectHeaderValid(h);
          // A header that decodes must not let a slice decode out of bounds.
          for (int32_t sl : {0, 2, 5, h.layout.num_slices - 1}) {
            if (sl < 0) continue;
            SliceEntries e;
            if (DecodeSlice(slice, h, sl, 0, h.num_rows, &e).ok()) {
              ExpectSliceValid(e, h, 0, h.num_rows);
            }
          }
        }
        return s;
      },
      11);
  FuzzValue(
      "latent slice", slice, true,
      [&](const std::string& bad) {
        SliceEntries e;
        absl::Status s = DecodeSlice(bad, header, 2, 0, header.num_rows, &e);
        if (s.ok()) ExpectSliceValid(e, header, 0, header.num_rows);
        SliceEntries window;
        if (DecodeSlice(bad, header, 2, 30, 47, &window).ok()) {
          ExpectSliceValid(window, header, 30, 47);
        }
        std::vector<int64_t> rows;
        std::vector<float> vals;
        if (DecodeSliceLatent(bad, header, 2, 90, &rows, &vals).ok()) {
          ExpectRowsAscendingFrom(rows, vals.size(), header.row_start,
                                  header.row_start + header.num_rows);
        }
        return s;
      },
      12);
  for (bool wide : {false, true}) {
    std::vector<int32_t> ids(57);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * (wide ? 9001 : 13));
    FuzzValue(
        wide ? "token part (i32)" : "token part (u16)", EncodeTokenPart(ids.data(), 57), true,
        [](const std::string& bad) {
          std::vector<int32_t> out;
          return DecodeTokenPart(bad, &out);
        },
        wide ? 14 : 13);
  }
}

TEST(CorruptionFuzz, PostingsDecodeOrFailWithDataLoss) {
  uint32_t seed = 20;
  for (ChunkDtype dtype : {ChunkDtype::kFloat16, ChunkDtype::kBFloat16, ChunkDtype::kFloat32}) {
    std::vector<int64_t> rows;
    std::vector<float> values;
    std::mt19937 rng(seed);
    for (int64_t r = 1000; r < 3000; ++r) {
      if (rng() % 11 != 0) continue;
      rows.push_back(r);
      values.push_back(RoundTo(dtype, 0.2f + static_cast<float>(rng() % 1000) / 71.0f));
    }
    std::string valid;
    EncodePosting(1000, rows.data(), values.data(), rows.size(), dtype, &valid);
    FuzzValue(
        "posting dtype " + std::to_string(static_cast<int>(dtype)), valid, true,
        [&](const std::string& bad) {
          std::vector<int64_t> got_rows;
          std::vector<float> got_values;
          absl::Status s = DecodePosting(bad, 1000, dtype, &got_rows, &got_values);
          if (s.ok()) {
            ExpectRowsAscendingFrom(got_rows, got_values.size(), 1000, int64_t{1} << 62);
          }
          std::vector<int64_t> range_rows;
          std::vector<float> range_values;
          if (DecodePostingRange(bad, 1000, dtype, 1500, 1700, &range_rows, &range_values).ok()) {
            ExpectRowsAscendingFrom(range_rows, range_values.size(), 1500, 1700);
          }
          std::vector<int64_t> masked;
          std::vector<float> masked_values;
          if (DecodePostingMasked(bad, dtype, 0xff, 10, 40, &masked, &masked_values).ok()) {
            EXPECT_EQ(masked.size(), masked_values.size());
            for (int64_t x : masked) {
              EXPECT_GE(x & 0xff, 10);
              EXPECT_LT(x & 0xff, 40);
            }
          }
          return s;
        },
        seed++);
  }
}

TEST(CorruptionFuzz, StatisticsAndTopNBlocksDecodeOrFailWithDataLoss) {
  // A block of 64 latents: some never fired, some with a few values, some with many, over
  // several binades (histograms that were widened and slid).
  std::mt19937 rng(30);
  std::vector<LatentStats> stats(kLatentsPerBlock);
  std::vector<TopRows> top(kLatentsPerBlock);
  for (int32_t l = 0; l < kLatentsPerBlock; ++l) {
    const int n = l % 5 == 0 ? 0 : static_cast<int>(rng() % (l % 3 == 0 ? 200 : 4)) + 1;
    for (int i = 0; i < n; ++i) {
      const float v = std::ldexp(1.0f + static_cast<float>(rng() % 100) / 100.0f,
                                 static_cast<int>(rng() % 12) - 6);
      stats[l].Add(v);
      top[l].Offer(1000 + l * 300 + i, v, 8);
    }
  }
  const std::string stats_block = EncodeStatsBlock(stats.data(), kLatentsPerBlock);
  const std::string top_block = EncodeTopBlock(top.data(), kLatentsPerBlock);
  // Operands as a commit writes them: a few latents' new values, and the entries of rows >=
  // 20000 that entered the lists.
  StatsDeltaBuilder builder(kLatentsPerBlock);
  for (int32_t l : {1, 7, 33}) {
    std::vector<float> v{0.75f, 12.0f, 0.001f};
    LatentStats delta;
    delta.AddBatch(v.data(), v.size());
    builder.Add(l, delta, v.data());
  }
  {
    std::vector<float> v(40, 2.5f);
    LatentStats delta;
    delta.AddBatch(v.data(), v.size());
    builder.Add(9, delta, v.data());
  }
  const std::string stats_operand = builder.Finish();
  for (int32_t l : {2, 3, 9}) top[l].Offer(20000 + l, 100.0f, 8);
  const std::string top_operand = EncodeTopDelta(top.data(), kLatentsPerBlock, 8, 20000);

  auto use_block = [](const std::vector<LatentStats>& block) {
    for (const LatentStats& st : block) UseStats(st);
  };
  // A merge result decodes, and its records survive what readers do with them.
  auto expect_stats_block = [&](const std::string& block) {
    std::vector<LatentStats> out(kLatentsPerBlock);
    EXPECT_TRUE(DecodeStatsBlock(block, out.data(), kLatentsPerBlock).ok());
    use_block(out);
  };
  FuzzValue(
      "statistics block", stats_block, false,
      [&](const std::string& bad) {
        std::vector<LatentStats> out(kLatentsPerBlock);
        absl::Status s = DecodeStatsBlock(bad, out.data(), kLatentsPerBlock);
        if (s.ok()) use_block(out);
        LatentStats one;  // what a query of one latent decodes
        if (DecodeStatsBlockRecord(bad, kLatentsPerBlock, 7, &one).ok()) UseStats(one);
        // The merge operator folds the same bytes as a base.
        const absl::string_view base(bad);
        std::string merged;
        if (MergeStatsBlocks(&base, {stats_operand}, &merged).ok()) expect_stats_block(merged);
        return s;
      },
      31);
  FuzzValue(
      "statistics operand", stats_operand, false,
      [&](const std::string& bad) {
        const absl::string_view base(stats_block);
        std::string merged;
        absl::Status s = MergeStatsBlocks(&base, {bad}, &merged);
        if (s.ok()) expect_stats_block(merged);
        std::string alone;
        if (MergeStatsBlocks(nullptr, {bad, stats_operand}, &alone).ok()) {
          expect_stats_block(alone);
        }
        return s;
      },
      32);
  // A merge result decodes, each list in order; with intact operands (capacity 8) no list is
  // longer than that. (A corrupt operand's capacity field cannot be told from a real one;
  // readers cut lists to the top_n they are asked for.)
  auto expect_lists = [](const std::string& block, int capacity) {
    std::vector<TopRows> out(kLatentsPerBlock);
    ASSERT_TRUE(DecodeTopBlock(block, out.data(), kLatentsPerBlock).ok());
    for (const TopRows& list : out) {
      if (capacity > 0) {
        EXPECT_LE(list.entries().size(), static_cast<size_t>(capacity));
      }
      for (size_t i = 1; i < list.entries().size(); ++i) {
        const TopEntry &a = list.entries()[i - 1], &b = list.entries()[i];
        EXPECT_TRUE(a.value > b.value || (a.value == b.value && a.row < b.row));
      }
    }
  };
  FuzzValue(
      "top-N block", top_block, false,
      [&](const std::string& bad) {
        std::vector<TopRows> out(kLatentsPerBlock);
        absl::Status s = DecodeTopBlock(bad, out.data(), kLatentsPerBlock);
        TopRows one;
        if (DecodeTopBlockList(bad, kLatentsPerBlock, 9, &one).ok()) {
          for (const TopEntry& e : one.entries()) EXPECT_GE(e.row, 0);
        }
        const absl::string_view base(bad);
        std::string merged;
        if (MergeTopBlocks(&base, {top_operand}, /*as_operand=*/false, &merged).ok()) {
          expect_lists(merged, 8);
        }
        return s;
      },
      33);
  FuzzValue(
      "top-N operand", top_operand, false,
      [&](const std::string& bad) {
        const absl::string_view base(top_block);
        std::string merged;
        absl::Status s = MergeTopBlocks(&base, {bad}, /*as_operand=*/false, &merged);
        if (s.ok()) expect_lists(merged, /*capacity=*/0);
        std::string partial;
        if (MergeTopBlocks(nullptr, {top_operand, bad}, /*as_operand=*/true, &partial).ok()) {
          std::string folded;
          if (MergeTopBlocks(&base, {partial}, false, &folded).ok()) expect_lists(folded, 0);
        }
        return s;
      },
      34);
}

// --- the store ---

DatasetMeta Meta(const std::string& name, DatasetKind kind, int32_t width) {
  DatasetMeta m;
  m.name = name;
  m.kind = kind;
  m.value_dtype = ValueDtype::kFloat16;
  m.model_id = "ref";
  m.hook_name = "blocks.1.hook_resid_post";
  m.encoder = kind == DatasetKind::kSparse ? "topk" : "";
  m.k = kind == DatasetKind::kSparse ? 6 : 0;
  m.width = width;
  m.context_length = 50;
  m.top_n = 5;
  return m;
}

class StoreCorruptionFuzz : public ::testing::TestWithParam<uint32_t> {};

// Every stored value of a SPARSE and a DENSE dataset is replaced, one at a time, by mutations
// of itself; every query then either fails with a status or answers within its contract, and
// the value put back restores the exact answers.
TEST_P(StoreCorruptionFuzz, EveryQueryOnEveryCorruptValueFailsCleanlyOrKeepsItsContract) {
  const std::string dir = FreshTestDir("store_corruption_" + std::to_string(GetParam()));
  auto db_or = Db::Open(dir);
  ASSERT_TRUE(db_or.ok()) << db_or.status();
  std::unique_ptr<Db> db = *std::move(db_or);
  ChunkStoreOptions options;
  options.chunk_rows = 100;
  options.sparse_chunk_rows = 100;
  options.latent_slices = 8;
  options.record_version = GetParam();
  ChunkStore store(db.get(), options);

  constexpr int32_t kWidth = 300;
  constexpr int64_t kRows = 350;
  const uint64_t sparse = *store.CreateDataset(Meta("s", DatasetKind::kSparse, kWidth));
  const uint64_t dense = *store.CreateDataset(Meta("d", DatasetKind::kDense, 12));
  {
    auto w = store.OpenWriter(sparse);
    ASSERT_TRUE(w.ok());
    std::mt19937 rng(40);
    for (int64_t at = 0; at < kRows; at += 70) {  // several commits: operands pile up
      std::vector<int64_t> indptr{0};
      std::vector<int32_t> indices, tokens;
      std::vector<float> values;
      for (int64_t r = 0; r < 70; ++r) {
        std::vector<int32_t> cols;
        while (cols.size() < 6) {
          const int32_t c = static_cast<int32_t>(rng() % kWidth);
          if (std::find(cols.begin(), cols.end(), c) == cols.end()) cols.push_back(c);
        }
        std::sort(cols.begin(), cols.end());
        for (int32_t c : cols) {
          indices.push_back(c);
          values.push_back(0.05f + static_cast<float>(rng() % 4000) / 250.0f);
        }
        indptr.push_back(static_cast<int64_t>(indices.size()));
        tokens.push_back(static_cast<int32_t>(rng() % 50257));
      }
      ASSERT_TRUE(
          (*w)->AppendSparse(70, indptr.data(), indices.data(), values.data(), tokens.data()).ok());
      ReconstructionFit fit;  // the SAE's fit on these rows, as EXTRACT gives it
      fit.rows = 70;
      fit.squared_error = 3.5;
      fit.sum_squares = 70;
      fit.cosine_sum = 60;
      fit.sum_x = {1.0, -2.0, 0.5};
      ASSERT_TRUE((*w)->AddReconstructionSums(fit).ok());
      ASSERT_TRUE((*w)->Commit().ok());
    }
    auto d = store.OpenWriter(dense);
    ASSERT_TRUE(d.ok());
    std::vector<float> dense_values(130 * 12);
    for (size_t i = 0; i < dense_values.size(); ++i) dense_values[i] = std::sin(0.1 * i);
    std::vector<int32_t> dense_tokens(130, 3);
    ASSERT_TRUE((*d)->AppendDense(130, dense_values.data(), dense_tokens.data()).ok());
    ASSERT_TRUE((*d)->MarkComplete().ok());
  }

  // Every query a client can send, with the contract of its answer checked; the answers of
  // the intact store are the reference the restored store must give again.
  const std::string named = "dataset " + std::to_string(sparse);  // in every DATA_LOSS message
  std::mt19937 qrng(41);
  int64_t data_loss = 0;  // queries answered DATA_LOSS
  auto run_queries = [&](std::string* transcript, int32_t focus_latent) {
    auto note = [&](const absl::Status& s) {
      if (s.code() == absl::StatusCode::kDataLoss) {
        ++data_loss;
        // Named for the reader: which dataset (and chunk, latent or record) is damaged.
        EXPECT_NE(s.message().find("dataset "), std::string::npos) << s;
      }
      if (!s.ok()) {
        // What a corrupt value may yield: DATA_LOSS where a stored value is malformed; a
        // corrupt record or watermark may also shrink what exists (NOT_FOUND, OUT_OF_RANGE,
        // FAILED_PRECONDITION). Never INTERNAL, UNKNOWN or a crash.
        EXPECT_NE(s.code(), absl::StatusCode::kInternal) << s;
        EXPECT_NE(s.code(), absl::StatusCode::kUnknown) << s;
      }
      if (transcript) absl::StrAppend(transcript, s.ToString(), ";");
    };
    auto record = store.GetRecord(sparse);
    note(record.status());
    const int64_t rows = record.ok() ? record->rows_committed : kRows;
    const auto summary = store.GetDataset(sparse);
    note(summary.status());
    // The listing always answers, with a damaged dataset among the unreadable (and its error)
    // rather than failing for every dataset.
    const auto listing = store.ListDatasets();
    note(listing.status());
    EXPECT_TRUE(listing.ok()) << listing.status();
    if (listing.ok()) {
      int listed = 0;
      for (const auto& d : listing->datasets()) listed += d.id() == sparse;
      for (const auto& u : listing->unreadable()) {
        if (u.dataset_id() != sparse) continue;
        ++listed;
        EXPECT_EQ(u.error(), summary.status().ToString());
      }
      EXPECT_EQ(listed, absl::IsNotFound(summary.status()) ? 0 : 1);
    }
    for (auto [start, count] : {std::pair<int64_t, int64_t>{0, 0}, {qrng() % kRows, 37}}) {
      auto csr = store.ReadRows(sparse, start, count);
      note(csr.status());
      if (!csr.ok()) continue;
      const size_t n = csr->token_ids.size();
      ASSERT_EQ(csr->indptr.size(), n + 1);
      ASSERT_EQ(static_cast<size_t>(csr->indptr.back()), csr->indices.size());
      ASSERT_EQ(csr->values.size(), csr->indices.size());
      for (size_t r = 0; r < n; ++r) {
        ASSERT_LE(csr->indptr[r], csr->indptr[r + 1]);
        for (int64_t i = csr->indptr[r]; i < csr->indptr[r + 1]; ++i) {
          ASSERT_GE(csr->indices[i], 0);
          ASSERT_LT(csr->indices[i], kWidth);
        }
      }
      if (transcript) {
        for (int32_t c : csr->indices) absl::StrAppend(transcript, c, ",");
        for (float v : csr->values) absl::StrAppend(transcript, v, ",");
        for (int32_t t : csr->token_ids) absl::StrAppend(transcript, t, ",");
      }
    }
    note(store.RowLatents(sparse, static_cast<int64_t>(qrng() % kRows)).status());
    {
      // A writer resuming the dataset loads every statistics and top-N block (the store was
      // left without MarkComplete): damage there keeps it closed, named, never hung or crashed.
      auto w = store.OpenWriter(sparse);
      note(w.status());
    }
    for (int32_t latent : {focus_latent, static_cast<int32_t>(qrng() % kWidth), kWidth - 1}) {
      auto st = store.GetLatentStats(sparse, latent);
      note(st.status());
      if (!st.ok() && st.status().code() == absl::StatusCode::kDataLoss) {
        // Named for the reader: which dataset and latent (or chunk) is damaged.
        EXPECT_NE(st.status().message().find(named), std::string::npos) << st.status();
      }
      if (st.ok()) {
        UseStats(*st);
        if (transcript) absl::StrAppend(transcript, st->firing_count, ",", st->sum, ",");
      }
      auto top = store.TopActivations(sparse, latent, 5, 32, 8);
      note(top.status());
      if (top.status().code() == absl::StatusCode::kDataLoss) {
        EXPECT_NE(top.status().message().find(named), std::string::npos) << top.status();
      }
      if (top.ok()) {
        EXPECT_LE(top->size(), 5u);
        for (const TopActivationContext& t : *top) {
          EXPECT_GE(t.row, 0);
          EXPECT_LT(t.row, rows);
          EXPECT_LE(t.context_token_ids.size(), 41u);
          EXPECT_TRUE(t.context_values.empty() ||
                      t.context_values.size() == t.context_token_ids.size());
          if (transcript) {
            absl::StrAppend(transcript, t.row, ":", t.value, ",");
            for (float v : t.context_values) absl::StrAppend(transcript, v, ",");
          }
        }
      }
      auto sequences = store.TopSequences(sparse, latent, 5, 4, 2);
      note(sequences.status());
      if (sequences.status().code() == absl::StatusCode::kDataLoss) {
        EXPECT_NE(sequences.status().message().find(named), std::string::npos)
            << sequences.status();
      }
      if (sequences.ok()) {
        EXPECT_LE(sequences->size(), 5u);
        for (const TopActivationContext& t : *sequences) {
          EXPECT_GE(t.row, 0);
          EXPECT_LT(t.row, rows);
          EXPECT_LE(t.context_token_ids.size(), 7u);
        }
      }
      auto intervals = store.IntervalSamples(sparse, latent, 4, 3, 4, 2);
      note(intervals.status());
      if (intervals.ok()) {
        EXPECT_LE(intervals->size(), 4u);
        for (const ActivationInterval& in : *intervals) {
          EXPECT_LE(in.samples.size(), 3u);
          EXPECT_GE(in.count, static_cast<int64_t>(in.samples.size()));
        }
      }
      std::vector<int64_t> post_rows;
      std::vector<float> post_values;
      absl::Status s = store.LatentPostings(sparse, latent, &post_rows, &post_values);
      note(s);
      if (s.ok()) ExpectRowsAscendingFrom(post_rows, post_values.size(), 0, rows);
    }
    {
      // What fires with a latent, and on a token: whole chunks, the latent's runs, the token
      // parts and every statistics block.
      LatentsOnRowsOptions on;
      on.limit = 5;
      for (const auto& found : {LatentsFiringWith(store, sparse, focus_latent, on),
                                LatentsFiringOnToken(store, sparse, 3, on)}) {
        note(found.status());
        if (found.status().code() == absl::StatusCode::kDataLoss) {
          EXPECT_NE(found.status().message().find(named), std::string::npos) << found.status();
        }
        if (!found.ok()) continue;
        EXPECT_LE(found->rows_read, found->rows_selected);
        EXPECT_LE(found->latents.size(), 5u);
        for (const LatentOnRows& l : found->latents) {
          EXPECT_GE(l.latent, 0);
          EXPECT_LT(l.latent, kWidth);
          EXPECT_LE(l.count, found->rows_read);
          if (transcript) absl::StrAppend(transcript, l.latent, ":", l.count, ",");
        }
      }
    }
    {
      // The whole-SAE scan (ListLatents) decodes every statistics block.
      int64_t scan_rows = -1, visited = 0;
      absl::Status scan =
          store.ForEachLatentStats(sparse, &scan_rows, [&](int32_t, const LatentStats& st) {
            ++visited;
            UseStats(st);
          });
      note(scan);
      if (scan.code() == absl::StatusCode::kDataLoss) {
        EXPECT_NE(scan.message().find(named), std::string::npos) << scan;
      }
      if (scan.ok()) {
        EXPECT_EQ(visited, kWidth);
        EXPECT_EQ(scan_rows, rows);
      }
    }
    std::vector<float> dense_values;
    std::vector<int32_t> dense_tokens;
    absl::Status s = store.ReadDense(dense, 0, 0, &dense_values, &dense_tokens);
    note(s);
    if (s.ok()) {
      EXPECT_EQ(dense_values.size(), dense_tokens.size() * 12);
    }
  };

  // Compacted, so that every key holds one value (merge operands folded): a Put then replaces
  // exactly what a reader would see.
  ASSERT_TRUE(db->CompactAll().ok());
  struct Stored {
    Family family;
    std::string key, value;
  };
  std::vector<Stored> stored;
  for (Family f : {Family::kMeta, Family::kChunks, Family::kPostings, Family::kLatentIndex}) {
    auto it = db->NewIterator(f);
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      stored.push_back({f, it->key().ToString(), it->value().ToString()});
    }
  }
  ASSERT_GT(stored.size(), 20u);
  std::string reference;
  const std::mt19937 query_seed = qrng;
  run_queries(&reference, 0);
  ASSERT_EQ(reference.find("DATA_LOSS"), std::string::npos) << reference;

  std::mt19937 rng(42);
  int runs = 0;
  // Format 2 stores a posting per latent and commit (over a thousand keys): fewer mutations each.
  const int per_key = std::clamp<int>(static_cast<int>(4000 / stored.size()), 2, 12);
  // The latent whose data a key holds (postings, statistics and top-N keys carry it after the
  // dataset id; a format-3 chunk part, its slice), so that the queries read the corrupt value.
  const int32_t slice_width = MakeSliceLayout(kWidth, options.latent_slices).slice_width;
  auto focus_of = [&](const Stored& s) -> int32_t {
    const auto byte = [&](size_t i) {
      return static_cast<uint32_t>(static_cast<uint8_t>(s.key[i]));
    };
    if ((s.family == Family::kPostings || s.family == Family::kLatentIndex) && s.key.size() >= 12) {
      return static_cast<int32_t>((byte(8) << 24 | byte(9) << 16 | byte(10) << 8 | byte(11)) %
                                  kWidth);
    }
    if (s.family == Family::kChunks && s.key.size() == 18) {
      const int32_t part = static_cast<int32_t>(byte(8) << 8 | byte(9));
      if (part >= kPartFirstSlice) return ((part - kPartFirstSlice) * slice_width + 5) % kWidth;
    }
    return static_cast<int32_t>(rng() % kWidth);
  };
  for (const Stored& s : stored) {
    const int32_t focus = focus_of(s);
    for (int i = 0; i < per_key; ++i, ++runs) {
      std::string bad = MutateBytes(s.value, &rng);
      if (i % 2 == 1) bad = Reseal(bad);
      ASSERT_TRUE(db->Put(s.family, s.key, bad, /*sync=*/false).ok());
      run_queries(nullptr, focus);
      if (::testing::Test::HasFailure()) {
        FAIL() << "family " << static_cast<int>(s.family) << " key " << absl::CEscape(s.key)
               << " mutation " << i;
      }
    }
    ASSERT_TRUE(db->Put(s.family, s.key, s.value, false).ok());
  }
  // Damaged merge operands on the statistics and top-N blocks (what a commit adds to them): the
  // read that folds one fails as a whole (RocksDB's Corruption, DATA_LOSS naming the dataset and
  // latent) or answers within contract; the block Put back afterwards replaces them.
  int operands = 0;
  const int64_t data_loss_before_operands = data_loss;
  for (const Stored& s : stored) {
    if (s.family != Family::kLatentIndex || s.key.size() != 13) continue;
    const int32_t first = static_cast<int32_t>(focus_of(s) / kLatentsPerBlock * kLatentsPerBlock);
    const int32_t n = std::min(kLatentsPerBlock, kWidth - first);
    std::string operand;
    if (s.key.back() == 'S') {
      StatsDeltaBuilder builder(n);
      const float v[] = {1.5f, 0.25f};
      LatentStats delta;
      delta.AddBatch(v, 2);
      builder.Add(1, delta, v);
      operand = builder.Finish();
    } else {
      std::vector<TopRows> lists(n);
      lists[1].Offer(kRows + 5, 99.0f, 5);  // a row past the committed ones: never shown
      operand = EncodeTopDelta(lists.data(), n, 5, kRows);
    }
    for (int i = 0; i < 6; ++i, ++operands) {
      const std::string bad = i == 0 ? operand : MutateBytes(operand, &rng);
      ASSERT_TRUE(db->raw()->Merge(rocksdb::WriteOptions(), db->handle(s.family), s.key, bad).ok());
      run_queries(nullptr, first + 1);
      if (::testing::Test::HasFailure())
        FAIL() << "operand " << i << " on " << absl::CEscape(s.key);
    }
    ASSERT_TRUE(db->Put(s.family, s.key, s.value, false).ok());
  }
  ASSERT_GT(operands, 0);
  EXPECT_GT(data_loss, data_loss_before_operands);  // damaged operands did reach the readers
  std::printf(
      "%zu stored values, %d corrupt versions and %d merge operands, every query run on each: "
      "%lld DATA_LOSS\n",
      stored.size(), runs, operands, static_cast<long long>(data_loss));
  EXPECT_GT(data_loss, runs / 2);  // the corruption did reach the readers
  std::string restored;
  qrng = query_seed;
  run_queries(&restored, 0);
  EXPECT_EQ(restored, reference);
}

INSTANTIATE_TEST_SUITE_P(Formats, StoreCorruptionFuzz, ::testing::Values(2u, 3u),
                         [](const auto& info) { return "format" + std::to_string(info.param); });

}  // namespace
}  // namespace latentd::storage
