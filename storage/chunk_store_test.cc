#include "storage/chunk_store.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/keys.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

DatasetMeta SparseMeta(const std::string& name, int32_t width = 256) {
  DatasetMeta m;
  m.name = name;
  m.kind = DatasetKind::kSparse;
  m.value_dtype = ValueDtype::kFloat16;
  m.model_id = "ref";
  m.hook_name = "blocks.2.hook_resid_post";
  m.encoder = "topk";
  m.k = 8;
  m.width = width;
  m.context_length = 16;
  m.top_n = 4;
  return m;
}

// Deterministic rows: row r has up to 8 random latents (unsorted) with positive values.
struct Rows {
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices;
  std::vector<float> values;
  std::vector<int32_t> tokens;
};
Rows MakeRows(int64_t first, int64_t n, int32_t width) {
  Rows rows;
  for (int64_t r = first; r < first + n; ++r) {
    std::mt19937 rng(static_cast<uint32_t>(r * 7919 + 1));
    std::set<int32_t> cols;
    int k = static_cast<int>(rng() % 9);
    while (static_cast<int>(cols.size()) < k) cols.insert(static_cast<int32_t>(rng() % width));
    std::vector<int32_t> shuffled(cols.begin(), cols.end());
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    for (int32_t c : shuffled) {
      rows.indices.push_back(c);
      rows.values.push_back(0.01f + static_cast<float>(rng() % 10000) / 997.0f);
    }
    rows.indptr.push_back(static_cast<int64_t>(rows.indices.size()));
    rows.tokens.push_back(static_cast<int32_t>(r % 1000));
  }
  return rows;
}

// The latent's stored (fp16-rounded) value on every row of t's window, 0 where it does not
// fire: what context_values must hold.
std::vector<float> WindowValues(const Rows& all, int32_t latent, const TopActivationContext& t) {
  std::vector<float> want(t.context_token_ids.size(), 0.0f);
  for (size_t w = 0; w < want.size(); ++w) {
    const int64_t r = t.context_start_row + static_cast<int64_t>(w);
    for (int64_t i = all.indptr[r]; i < all.indptr[r + 1]; ++i) {
      if (all.indices[i] == latent) want[w] = HalfToFloat(FloatToHalf(all.values[i]));
    }
  }
  return want;
}

absl::Status Append(DatasetWriter* w, const Rows& rows) {
  return w->AppendSparse(static_cast<int64_t>(rows.tokens.size()), rows.indptr.data(),
                         rows.indices.data(), rows.values.data(), rows.tokens.data());
}

// Every test runs on datasets of format 3 (latent slices) and format 2 (row-major chunks +
// postings, still written for datasets created before format 3), each with a writer that holds
// every latent's statistics and top-N list (resident, what datasets up to 2^17 latents get) and
// with one that holds neither (what wider datasets get).
struct StoreParam {
  uint32_t format;
  bool resident;
};

class ChunkStoreTest : public ::testing::TestWithParam<StoreParam> {
 protected:
  uint32_t Format() const { return GetParam().format; }
  int32_t ResidentMaxWidth() const { return GetParam().resident ? 1 << 17 : 0; }
  void SetUp() override {
    Open(FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  }
  void Open(const std::string& dir) {
    dir_ = dir;
    store_.reset();
    db_.reset();
    DbOptions o;
    o.min_blob_size = 4096;  // exercise blob files with small chunks
    auto db = Db::Open(dir, o);
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    ChunkStoreOptions so;
    so.chunk_rows = 100;
    so.sparse_chunk_rows = 100;
    so.latent_slices = 16;
    so.record_version = Format();
    so.resident_latent_state_max_width = ResidentMaxWidth();
    store_ = std::make_unique<ChunkStore>(db_.get(), so);
  }
  void Reopen() {
    store_.reset();
    db_.reset();
    Open(dir_);
  }
  // A SPARSE dataset of MakeRows(0, total, width) written in synced commits of commit_rows.
  uint64_t WriteSparse(const std::string& name, int32_t width, int64_t total, int64_t commit_rows) {
    const uint64_t id = *store_->CreateDataset(SparseMeta(name, width));
    auto w = store_->OpenWriter(id);
    EXPECT_TRUE(w.ok()) << w.status();
    for (int64_t at = 0; w.ok() && at < total; at += commit_rows) {
      EXPECT_TRUE(Append(w->get(), MakeRows(at, std::min(commit_rows, total - at), width)).ok());
      EXPECT_TRUE((*w)->Commit().ok());
    }
    return id;
  }
  std::string dir_;
  std::unique_ptr<Db> db_;
  std::unique_ptr<ChunkStore> store_;
};

TEST_P(ChunkStoreTest, CreateFindAndBadMeta) {
  auto id = store_->CreateDataset(SparseMeta("a"));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*store_->FindDataset("a"), *id);
  EXPECT_EQ(store_->CreateDataset(SparseMeta("a")).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->FindDataset("b").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetDataset(999).status().code(), absl::StatusCode::kNotFound);
  {
    ChunkStoreOptions huge;
    huge.sparse_chunk_rows = int64_t{1} << 40;
    ChunkStore bad_store(db_.get(), huge);
    absl::Status s = bad_store.CreateDataset(SparseMeta("huge")).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("sparse_chunk_rows"), std::string::npos) << s;
    EXPECT_EQ(bad_store.OpenWriter(*id).status().code(), absl::StatusCode::kInvalidArgument);
  }
  DatasetMeta bad = SparseMeta("c");
  bad.width = 0;
  absl::Status s = store_->CreateDataset(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("width"), std::string::npos);
  auto info = store_->GetDataset(*id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->hook_name(), "blocks.2.hook_resid_post");
  EXPECT_EQ(info->d_sae(), 256);
  EXPECT_EQ(info->rows_committed(), 0);
  EXPECT_GT(info->created().seconds(), 0);
}

TEST_P(ChunkStoreTest, CommittedRowsReadBackAcrossChunksAndReopen) {
  uint64_t id = *store_->CreateDataset(SparseMeta("x"));
  const int64_t total = 730;
  Rows all = MakeRows(0, total, 256);
  {
    auto w = store_->OpenWriter(id);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(store_->OpenWriter(id).status().code(), absl::StatusCode::kFailedPrecondition);
    for (int64_t at = 0; at < total;) {
      int64_t n = std::min<int64_t>(total - at, 130);
      ASSERT_TRUE(Append(w->get(), MakeRows(at, n, 256)).ok());
      at += n;
      EXPECT_EQ((*w)->rows_pending(), n);
      // Uncommitted rows are invisible.
      EXPECT_EQ(store_->GetDataset(id)->rows_committed(), (*w)->rows_committed());
      ASSERT_TRUE((*w)->Commit().ok());
      EXPECT_EQ((*w)->rows_committed(), at);
    }
    ASSERT_TRUE(Append(w->get(), MakeRows(total, 5, 256)).ok());  // dropped: never committed
  }
  Reopen();
  auto info = store_->GetDataset(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->rows_committed(), total);
  EXPECT_EQ(info->nnz(), static_cast<int64_t>(all.indices.size()));
  EXPECT_GT(info->bytes_on_disk(), 0);
  for (auto [start, count] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 0}, {0, 1}, {99, 3}, {250, 300}, {729, 1}, {730, 0}}) {
    auto rows = store_->ReadRows(id, start, count);
    ASSERT_TRUE(rows.ok()) << rows.status();
    int64_t n = count == 0 ? total - start : count;
    ASSERT_EQ(rows->num_rows, n);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t g = start + r;
      std::vector<std::pair<int32_t, float>> want, got;
      for (int64_t i = all.indptr[g]; i < all.indptr[g + 1]; ++i) {
        want.emplace_back(all.indices[i], HalfToFloat(FloatToHalf(all.values[i])));
      }
      std::sort(want.begin(), want.end());
      for (int64_t i = rows->indptr[r]; i < rows->indptr[r + 1]; ++i) {
        got.emplace_back(rows->indices[i], rows->values[i]);
      }
      ASSERT_EQ(got, want) << "row " << g;  // sorted per row, fp16-rounded
      EXPECT_EQ(rows->token_ids[r], all.tokens[g]);
    }
  }
  EXPECT_EQ(store_->ReadRows(id, 700, 31).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store_->ReadRows(id, -1, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store_->RowLatents(id, 730).status().code(), absl::StatusCode::kOutOfRange);
  auto starts = store_->ChunkRowStarts(id);
  ASSERT_TRUE(starts.ok());
  EXPECT_EQ(starts->front(), 0);
  EXPECT_TRUE(std::is_sorted(starts->begin(), starts->end()));
  EXPECT_EQ(static_cast<int64_t>(starts->size()),
            11);  // 5 commits of 130 rows (2 chunks each), one of 80

  // The writer resumes at the watermark.
  auto w = store_->OpenWriter(id);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->rows_committed(), total);
  ASSERT_TRUE(Append(w->get(), MakeRows(total, 10, 256)).ok());
  ASSERT_TRUE((*w)->MarkComplete().ok());
  w->reset();
  EXPECT_TRUE(store_->GetDataset(id)->complete());
  EXPECT_EQ(store_->OpenWriter(id).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Commits written in the background while the next rows are appended and encoded give the same
// dataset as synchronous ones; rows_committed() counts only durable commits.
TEST_P(ChunkStoreTest, AsyncCommitsEqualSyncCommits) {
  uint64_t sync_id = *store_->CreateDataset(SparseMeta("sync", 64));
  uint64_t async_id = *store_->CreateDataset(SparseMeta("async", 64));
  const int64_t total = 1000;
  {
    auto ws = store_->OpenWriter(sync_id);
    auto wa = store_->OpenWriter(async_id);
    ASSERT_TRUE(ws.ok() && wa.ok());
    for (int64_t at = 0; at < total; at += 125) {
      ASSERT_TRUE(Append(ws->get(), MakeRows(at, 125, 64)).ok());
      ASSERT_TRUE((*ws)->Commit().ok());
      ASSERT_TRUE(Append(wa->get(), MakeRows(at, 125, 64)).ok());
      ASSERT_TRUE((*wa)->CommitAsync().ok());
      EXPECT_EQ((*wa)->rows_committed() + (*wa)->rows_in_flight(), at + 125);
      EXPECT_LE((*wa)->rows_committed(), at + 125);
      // Readers never see the batch in flight half-written.
      const int64_t visible = store_->GetDataset(async_id)->rows_committed();
      EXPECT_TRUE(visible == at || visible == at + 125) << visible;
    }
    ASSERT_TRUE((*wa)->MarkComplete().ok());
    EXPECT_EQ((*wa)->rows_committed(), total);
  }
  auto a = store_->ReadRows(async_id, 0, 0);
  auto b = store_->ReadRows(sync_id, 0, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->indptr, b->indptr);
  EXPECT_EQ(a->indices, b->indices);
  EXPECT_EQ(a->values, b->values);
  EXPECT_EQ(a->token_ids, b->token_ids);
  for (int32_t l = 0; l < 64; ++l) {
    EXPECT_EQ(store_->GetLatentStats(async_id, l)->Encode(),
              store_->GetLatentStats(sync_id, l)->Encode());
  }
  EXPECT_TRUE(store_->GetDataset(async_id)->complete());
}

TEST_P(ChunkStoreTest, StatisticsTopNAndPostingsMatchBruteForce) {
  const int64_t total = 500;
  const uint64_t id = WriteSparse("s", 64, total, 125);
  Rows all = MakeRows(0, total, 64);
  std::map<int32_t, std::vector<std::pair<int64_t, float>>> by_latent;
  for (int64_t r = 0; r < total; ++r) {
    for (int64_t i = all.indptr[r]; i < all.indptr[r + 1]; ++i) {
      by_latent[all.indices[i]].emplace_back(r, HalfToFloat(FloatToHalf(all.values[i])));
    }
  }
  {
    std::vector<int64_t> rows;
    std::vector<float> values;
    EXPECT_EQ(store_->LatentPostings(id, 3, &rows, &values, -1, 10).code(),
              absl::StatusCode::kInvalidArgument);
  }
  int dead = 0;
  for (int32_t l = 0; l < 64; ++l) {
    auto& want = by_latent[l];
    if (want.empty()) ++dead;
    auto st = store_->GetLatentStats(id, l);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->firing_count, static_cast<int64_t>(want.size()));
    double sum = 0;
    float mx = 0;
    for (auto& [r, v] : want) sum += v, mx = std::max(mx, v);
    EXPECT_NEAR(st->sum, sum, 1e-6 * std::max(1.0, sum));
    EXPECT_EQ(st->max, mx);
    std::vector<int64_t> rows;
    std::vector<float> values;
    ASSERT_TRUE(store_->LatentPostings(id, l, &rows, &values).ok());
    ASSERT_EQ(rows.size(), want.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(rows[i], want[i].first);
      EXPECT_EQ(values[i], want[i].second);
    }
    // A row range (inside a commit, across commits, past the end) holds exactly its firings.
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 1}, {37, 200}, {125, 250}, {total - 5, INT64_MAX}, {total, total + 10}}) {
      ASSERT_TRUE(store_->LatentPostings(id, l, &rows, &values, begin, end).ok());
      std::vector<std::pair<int64_t, float>> got, in_range;
      for (size_t i = 0; i < rows.size(); ++i) got.emplace_back(rows[i], values[i]);
      for (const auto& f : want) {
        if (f.first >= begin && f.first < end) in_range.push_back(f);
      }
      EXPECT_EQ(got, in_range) << "latent " << l << " rows [" << begin << ", " << end << ")";
    }
    auto sorted = want;
    std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) {
      return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    auto top = store_->TopActivations(id, l, 0, 5, 3);
    ASSERT_TRUE(top.ok()) << top.status();
    ASSERT_EQ(top->size(), std::min<size_t>(4, sorted.size()));
    for (size_t i = 0; i < top->size(); ++i) {
      const auto& t = (*top)[i];
      EXPECT_EQ(t.row, sorted[i].first);
      EXPECT_EQ(t.value, sorted[i].second);
      EXPECT_EQ(t.token_id, all.tokens[t.row]);
      // The window stays inside the row's 16-row sequence.
      const int64_t seq_start = t.row / 16 * 16;
      EXPECT_EQ(t.context_start_row, std::max(seq_start, t.row - 5));
      const int64_t stop = std::min({seq_start + 16, t.row + 4, total});
      ASSERT_EQ(static_cast<int64_t>(t.context_token_ids.size()), stop - t.context_start_row);
      for (int64_t r = t.context_start_row; r < stop; ++r) {
        EXPECT_EQ(t.context_token_ids[r - t.context_start_row], all.tokens[r]);
      }
      // Windows cross chunk (100 rows) and commit (125 rows) boundaries: rows 96-111, 112-127.
      EXPECT_EQ(t.context_values, WindowValues(all, l, t)) << "latent " << l << " row " << t.row;
      EXPECT_EQ(t.context_values[t.row - t.context_start_row], t.value);
    }
  }
  EXPECT_EQ(store_->GetDataset(id)->dead_latents(), dead);
  EXPECT_EQ(store_->GetLatentStats(id, 64).status().code(), absl::StatusCode::kInvalidArgument);
}

// The whole-SAE scan answers exactly what per-latent reads answer, for a width that is not a
// multiple of the 64-latent block, and names a damaged block.
TEST_P(ChunkStoreTest, ForEachLatentStatsVisitsEveryLatentAsGetLatentStatsReadsIt) {
  const int32_t width = 150;
  const uint64_t id = WriteSparse("scan", width, 40, 13);
  int64_t rows = -1;
  std::vector<int32_t> visited;
  int64_t dead = 0;
  absl::Status s = store_->ForEachLatentStats(id, &rows, [&](int32_t l, const LatentStats& st) {
    visited.push_back(l);
    if (st.firing_count == 0) ++dead;
    auto want = store_->GetLatentStats(id, l);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(st.Encode(), want->Encode()) << "latent " << l;
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(rows, 40);
  ASSERT_EQ(visited.size(), static_cast<size_t>(width));
  for (int32_t l = 0; l < width; ++l) EXPECT_EQ(visited[l], l);
  EXPECT_GT(dead, 0);  // 150 latents, at most 8 a row over 40 rows: some never fire
  EXPECT_EQ(store_->GetDataset(id)->dead_latents(), dead);

  ASSERT_TRUE(
      db_->Put(Family::kLatentIndex, keys::LatentStats(id, 64), "\x05garbage", /*sync=*/true).ok());
  int64_t after_damage = 0;
  s = store_->ForEachLatentStats(id, nullptr, [&](int32_t, const LatentStats&) { ++after_damage; });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(absl::StrCat("dataset ", id, " latent 64 ")), std::string::npos) << s;
  EXPECT_EQ(after_damage, 64);  // the blocks before the damaged one, nothing after it

  EXPECT_EQ(
      store_->ForEachLatentStats(id + 100, nullptr, [](int32_t, const LatentStats&) {}).code(),
      absl::StatusCode::kNotFound);
}

// Commits store top-N lists as merge operands (only the entries each commit added); what a reader
// sees after flushes, compaction, a reopen and a writer that resumes from the merged lists must
// equal a single writer's lists, which the brute force gives.
TEST_P(ChunkStoreTest, TopNAndStatisticsSurviveCompactionReopenAndResume) {
  DatasetMeta meta = SparseMeta("top", 32);
  meta.top_n = 6;
  uint64_t id = *store_->CreateDataset(meta);
  // 24 commits a writer: more than the 16 after which a block is written whole, so the lists
  // and statistics pass through operands, a whole block, and operands on top of it.
  const int64_t total = 960;
  for (int64_t at = 0; at < total;) {
    auto w = store_->OpenWriter(id);  // reopened every 480 rows: state loads from merged values
    ASSERT_TRUE(w.ok()) << w.status();
    for (int64_t stop = at + 480; at < stop; at += 20) {
      ASSERT_TRUE(Append(w->get(), MakeRows(at, 20, 32)).ok());
      ASSERT_TRUE((*w)->CommitAsync().ok());
      if (at == 300) {
        ASSERT_TRUE(db_->CompactAll().ok());
      }
    }
    ASSERT_TRUE((*w)->WaitDurable().ok());
    w->reset();
    if (at == 480) Reopen();
  }
  Rows all = MakeRows(0, total, 32);
  // The statistics, bit for bit: each commit's values of a latent (in row order) as one delta,
  // folded in commit order, as the writer did before and after every reopen.
  std::vector<LatentStats> want_stats(32);
  for (int64_t at = 0; at < total; at += 20) {
    std::vector<std::vector<float>> commit(32);
    for (int64_t i = all.indptr[at]; i < all.indptr[at + 20]; ++i) {
      commit[all.indices[i]].push_back(HalfToFloat(FloatToHalf(all.values[i])));
    }
    for (int32_t l = 0; l < 32; ++l) {
      LatentStats delta;
      delta.AddBatch(commit[l].data(), commit[l].size());
      want_stats[l].Merge(delta);
    }
  }
  for (bool compacted : {false, true}) {
    if (compacted) {
      ASSERT_TRUE(db_->CompactAll().ok());
    }
    for (int32_t l = 0; l < 32; ++l) {
      auto st = store_->GetLatentStats(id, l);
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_EQ(st->Encode(), want_stats[l].Encode()) << "latent " << l;
    }
  }
  for (int32_t l = 0; l < 32; ++l) {
    std::vector<std::pair<float, int64_t>> want;
    for (int64_t r = 0; r < total; ++r) {
      for (int64_t i = all.indptr[r]; i < all.indptr[r + 1]; ++i) {
        if (all.indices[i] == l) want.emplace_back(HalfToFloat(FloatToHalf(all.values[i])), r);
      }
    }
    std::sort(want.begin(), want.end(), [](auto& a, auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    want.resize(std::min<size_t>(want.size(), 6));
    auto top = store_->TopActivations(id, l, 0, 0, 0);
    ASSERT_TRUE(top.ok()) << top.status();
    ASSERT_EQ(top->size(), want.size()) << "latent " << l;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ((*top)[i].row, want[i].second) << "latent " << l << " rank " << i;
      EXPECT_EQ((*top)[i].value, want[i].first);
    }
  }
}

// A writer above resident_latent_state_max_width keeps no per-latent state: commits write
// operands only, top-N candidates are cut at floors read back from folded blocks, and every
// 16th operand of a block is folded into a whole value. Readers must see what the resident
// writer gives: the same counts, extremes, histograms and lists; sums equal where both fold
// per-commit deltas (commits of few values a latent) and within rounding elsewhere.
// A store whose writers keep no per-latent state, whatever the width; the parameter is the format.
class WideWriterTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto db = Db::Open(dir_ + "/wide_store");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    ChunkStoreOptions so;
    so.record_version = GetParam();
    so.resident_latent_state_max_width = 0;
    store_ = std::make_unique<ChunkStore>(db_.get(), so);
  }
  // Appends one row in which latent 0 fires with `value`, and commits it.
  static absl::Status CommitLatent0(DatasetWriter* w, float value) {
    const int64_t indptr[] = {0, 1};
    const int32_t index = 0, token = 7;
    absl::Status s = w->AppendSparse(1, indptr, &index, &value, &token);
    return s.ok() ? w->Commit() : s;
  }
  std::string dir_;
  std::unique_ptr<Db> db_;
  std::unique_ptr<ChunkStore> store_;  // declared after db_: destroyed first
};

TEST_P(WideWriterTest, AnswersAsTheResidentWriterDoes) {
  const std::string& dir = dir_;
  constexpr int32_t kWidth = 96;  // a block and a half
  struct Written {
    std::unique_ptr<Db> db;
    std::unique_ptr<ChunkStore> store;
    uint64_t id = 0;
  };
  auto write = [&](int32_t resident_max, const std::string& dir) {
    Written out;
    ChunkStoreOptions so;
    so.sparse_chunk_rows = 64;
    so.latent_slices = 4;
    so.record_version = GetParam();
    so.resident_latent_state_max_width = resident_max;
    auto open = [&] {
      out.store.reset();
      out.db.reset();
      out.db = *Db::Open(dir);
      out.store = std::make_unique<ChunkStore>(out.db.get(), so);
    };
    open();
    DatasetMeta meta = SparseMeta("wide", kWidth);
    meta.top_n = 3;  // lists fill after a few commits, so floors cut most candidates
    out.id = *out.store->CreateDataset(meta);
    int64_t at = 0;
    for (int session = 0; session < 2; ++session) {  // the second resumes from the store
      auto w = out.store->OpenWriter(out.id);
      EXPECT_TRUE(w.ok()) << w.status();
      if (!w.ok()) return out;
      for (int c = 0; c < 40; ++c) {
        // Mostly a fraction of a value a latent; every 10th commit ~20 a latent.
        const int64_t rows = c % 10 == 9 ? 500 : 12;
        EXPECT_TRUE(Append(w->get(), MakeRows(at, rows, kWidth)).ok());
        EXPECT_TRUE((c % 3 == 0 ? (*w)->Commit() : (*w)->CommitAsync()).ok());
        at += rows;
      }
      EXPECT_TRUE((*w)->WaitDurable().ok());
      w->reset();
      open();
    }
    return out;
  };
  Written resident = write(1 << 17, dir + "/resident");
  Written wide = write(kWidth - 1, dir + "/wide");
  for (bool compacted : {false, true}) {
    if (compacted) {
      ASSERT_TRUE(wide.db->CompactAll().ok());
    }
    EXPECT_EQ(wide.store->GetDataset(wide.id)->dead_latents(),
              resident.store->GetDataset(resident.id)->dead_latents());
    for (int32_t l = 0; l < kWidth; ++l) {
      auto a = resident.store->GetLatentStats(resident.id, l);
      auto b = wide.store->GetLatentStats(wide.id, l);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      ASSERT_GT(a->firing_count, 40) << "latent " << l;
      EXPECT_EQ(b->firing_count, a->firing_count) << "latent " << l;
      EXPECT_EQ(b->max, a->max);
      EXPECT_EQ(b->min, a->min);
      EXPECT_EQ(b->bin_exponent, a->bin_exponent);
      EXPECT_EQ(b->bin_low, a->bin_low);
      EXPECT_EQ(b->histogram, a->histogram) << "latent " << l;
      EXPECT_NEAR(b->sum, a->sum, 1e-12 * a->sum);
      EXPECT_NEAR(b->sum_squares, a->sum_squares, 1e-12 * a->sum_squares);
      auto ta = resident.store->TopActivations(resident.id, l, 0, 0, 0);
      auto tb = wide.store->TopActivations(wide.id, l, 0, 0, 0);
      ASSERT_TRUE(ta.ok() && tb.ok()) << ta.status() << tb.status();
      ASSERT_EQ(ta->size(), 3u);
      ASSERT_EQ(tb->size(), ta->size()) << "latent " << l;
      for (size_t i = 0; i < ta->size(); ++i) {
        EXPECT_EQ((*tb)[i].row, (*ta)[i].row) << "latent " << l << " rank " << i;
        EXPECT_EQ((*tb)[i].value, (*ta)[i].value);
      }
    }
  }
}

// The floor at work: once a folded block shows a latent's list full, the writer stops sending
// candidates at or below its last value (they could never enter). Latent 0 fires once a commit
// with falling values, so after the list of 2 fills nothing new belongs in it: from the fold
// on, the block gets no more operands (without floors it would get one every commit).
TEST_P(WideWriterTest, FloorsStopCandidatesThatCannotEnterTheList) {
  DatasetMeta meta = SparseMeta("floors", 64);
  meta.top_n = 2;
  const uint64_t id = *store_->CreateDataset(meta);
  auto w = store_->OpenWriter(id);
  ASSERT_TRUE(w.ok()) << w.status();
  for (int r = 0; r < 40; ++r) ASSERT_TRUE(CommitLatent0(w->get(), 1000.0f - r).ok());
  rocksdb::GetMergeOperandsOptions options;
  options.expected_max_number_of_operands = 64;
  std::vector<rocksdb::PinnableSlice> operands(64);
  int count = 0;
  ASSERT_TRUE(db_->raw()
                  ->GetMergeOperands(rocksdb::ReadOptions(), db_->handle(Family::kLatentIndex),
                                     keys::LatentTop(id, 0), operands.data(), &options, &count)
                  .ok());
  // The whole block the 16th commit's fold wrote, and that commit's own operand.
  EXPECT_LE(count, 3);
  auto top = store_->TopActivations(id, 0, 0, 0, 0);
  ASSERT_TRUE(top.ok()) << top.status();
  ASSERT_EQ(top->size(), 2u);
  EXPECT_EQ((*top)[0].row, 0);
  EXPECT_EQ((*top)[1].row, 1);
}

// The writer thread folds a block from the store; a block damaged under an open writer fails
// the commit that folds it, like a failed write: DATA_LOSS naming the dataset and the block,
// and the store keeps every earlier commit.
TEST_P(WideWriterTest, FoldOfADamagedBlockFailsItsCommitNamingIt) {
  const uint64_t id = *store_->CreateDataset(SparseMeta("damaged", 64));
  auto w = store_->OpenWriter(id);
  ASSERT_TRUE(w.ok()) << w.status();
  for (int r = 0; r < 5; ++r) ASSERT_TRUE(CommitLatent0(w->get(), 1.0f + r).ok());
  ASSERT_TRUE(db_->Put(Family::kLatentIndex, keys::LatentTop(id, 0), "\x05garbage", true).ok());
  absl::Status failed;
  int r = 5;
  for (; r < 40 && failed.ok(); ++r) failed = CommitLatent0(w->get(), 1.0f + r);  // fold by 16th
  ASSERT_EQ(failed.code(), absl::StatusCode::kDataLoss) << failed;
  EXPECT_NE(failed.message().find(absl::StrCat("dataset ", id, " latent 0 top-N block")),
            std::string::npos)
      << failed;
  EXPECT_EQ(store_->GetRecord(id)->rows_committed, r - 1);
}

INSTANTIATE_TEST_SUITE_P(Formats, WideWriterTest, ::testing::Values(3u, 2u),
                         [](const ::testing::TestParamInfo<uint32_t>& info) {
                           return "format" + std::to_string(info.param);
                         });

// A damaged statistics or top-N block stops a writer from opening (it would build on garbage)
// with DATA_LOSS naming the dataset and the block's first latent; repaired, the writer opens.
TEST_P(ChunkStoreTest, CorruptLatentIndexBlockKeepsTheWriterClosedNamingIt) {
  const uint64_t id = WriteSparse("corrupt", 64, 200, 50);
  for (const std::string& key : {keys::LatentStats(id, 0), keys::LatentTop(id, 0)}) {
    auto good = db_->Get(Family::kLatentIndex, key);
    ASSERT_TRUE(good.ok()) << good.status();
    ASSERT_TRUE(db_->Put(Family::kLatentIndex, key, "\x05garbage", /*sync=*/true).ok());
    auto w = store_->OpenWriter(id);
    ASSERT_EQ(w.status().code(), absl::StatusCode::kDataLoss) << w.status();
    EXPECT_NE(w.status().message().find(absl::StrCat("dataset ", id, " latent 0 ")),
              std::string::npos)
        << w.status();
    ASSERT_TRUE(db_->Put(Family::kLatentIndex, key, *good, /*sync=*/true).ok());
    EXPECT_TRUE(store_->OpenWriter(id).ok());
  }
}

// Interval samples: every entry of the latent counted in exactly one interval of its value range,
// samples drawn from inside their interval, spread over its rows, with the same context windows
// as the top-N.
// One row per sequence (its maximum), ranked across sequences, against a brute force over the
// rows; the overall top row always leads both lists.
TEST_P(ChunkStoreTest, TopSequencesTakeEachSequencesMaximumOnce) {
  const int64_t total = 500;  // sequences of 16 rows (SparseMeta), the last one partial
  const uint64_t id = WriteSparse("seq", 64, total, 125);
  Rows all = MakeRows(0, total, 64);
  for (int32_t l = 0; l < 64; ++l) {
    std::map<int64_t, std::pair<float, int64_t>> best;  // sequence -> (value, row)
    for (int64_t r = 0; r < total; ++r) {
      for (int64_t i = all.indptr[r]; i < all.indptr[r + 1]; ++i) {
        if (all.indices[i] != l) continue;
        const float v = HalfToFloat(FloatToHalf(all.values[i]));
        auto [it, fresh] = best.emplace(r / 16, std::make_pair(v, r));
        if (!fresh && v > it->second.first) it->second = {v, r};
      }
    }
    std::vector<std::pair<float, int64_t>> want;
    for (const auto& [sequence, entry] : best) want.push_back(entry);
    std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    auto got = store_->TopSequences(id, l, 1000, 5, 3);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size()) << "latent " << l;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ((*got)[i].row, want[i].second) << "latent " << l << " rank " << i;
      EXPECT_EQ((*got)[i].value, want[i].first);
      EXPECT_EQ((*got)[i].token_id, all.tokens[(*got)[i].row]);
      EXPECT_EQ((*got)[i].context_start_row, std::max((*got)[i].row / 16 * 16, (*got)[i].row - 5));
      EXPECT_EQ((*got)[i].context_values, WindowValues(all, l, (*got)[i]));
    }
    auto three = store_->TopSequences(id, l, 3, 5, 3);
    ASSERT_TRUE(three.ok());
    EXPECT_EQ(three->size(), std::min<size_t>(3, want.size()));
    auto top = store_->TopActivations(id, l, 1, 5, 3);
    if (!want.empty()) {
      EXPECT_EQ(top->front().row, three->front().row);
    }
  }
  EXPECT_EQ(store_->TopSequences(id, 0, 0, 5, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->TopSequences(id, 0, 1001, 5, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->TopSequences(id, 0, 5, -1, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->TopSequences(id, 64, 5, 5, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A row set read back: kept rows as ReadRows gives them, the others empty (format 3) or whole
// (format 2), for sets spanning chunks at offsets that are not multiples of 64.
TEST_P(ChunkStoreTest, RowSetsReadTheKeptRows) {
  const int64_t total = 500;
  const uint64_t id = WriteSparse("set", 64, total, 125);
  std::mt19937 rng(5);
  for (auto [start, count] : {std::pair<int64_t, int64_t>{0, 100}, {37, 250}, {99, 2}, {450, 50}}) {
    std::vector<uint64_t> keep((count + 63) / 64, 0);
    for (int64_t r = 0; r < count; ++r) {
      if (rng() % 4 == 0 || r == count - 1) keep[r >> 6] |= uint64_t{1} << (r & 63);
    }
    auto set = store_->ReadRowSet(id, start, count, keep);
    ASSERT_TRUE(set.ok()) << set.status();
    auto all = store_->ReadRows(id, start, count);
    ASSERT_TRUE(all.ok());
    ASSERT_EQ(set->num_rows, count);
    EXPECT_EQ(set->token_ids, all->token_ids);
    for (int64_t r = 0; r < count; ++r) {
      const bool kept = (keep[r >> 6] >> (r & 63)) & 1;
      auto row = [&](const CsrRows& c) {
        return std::make_pair(
            std::vector<int32_t>(c.indices.begin() + c.indptr[r],
                                 c.indices.begin() + c.indptr[r + 1]),
            std::vector<float>(c.values.begin() + c.indptr[r], c.values.begin() + c.indptr[r + 1]));
      };
      if (kept || Format() == 2) {
        EXPECT_EQ(row(*set), row(*all)) << "row " << start + r;
      } else {
        EXPECT_EQ(set->indptr[r + 1], set->indptr[r]) << "row " << start + r << " not kept";
      }
    }
  }
  EXPECT_EQ(store_->ReadRowSet(id, 0, 65, std::vector<uint64_t>(1, ~uint64_t{0})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->ReadRowSet(id, 490, 64, std::vector<uint64_t>(1, 1)).status().code(),
            absl::StatusCode::kOutOfRange);
}

// A format-2 dataset written without postings has no latent-major layout: its windows' values
// come from the rows themselves.
TEST_P(ChunkStoreTest, WindowsWithoutPostingsReadValuesFromTheRows) {
  if (Format() != 2) GTEST_SKIP() << "postings are a format-2 option";
  DatasetMeta meta = SparseMeta("nopost", 64);
  meta.postings = false;
  const uint64_t id = *store_->CreateDataset(meta);
  auto w = store_->OpenWriter(id);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(Append(w->get(), MakeRows(0, 200, 64)).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  const Rows all = MakeRows(0, 200, 64);
  for (int32_t l = 0; l < 64; ++l) {
    auto top = store_->TopActivations(id, l, 0, 5, 3);
    ASSERT_TRUE(top.ok()) << top.status();
    for (const TopActivationContext& t : *top) {
      EXPECT_FALSE(t.context_token_ids.empty());
      EXPECT_EQ(t.context_values, WindowValues(all, l, t)) << "latent " << l << " row " << t.row;
    }
  }
}

TEST_P(ChunkStoreTest, IntervalSamplesCoverTheValueRange) {
  const int64_t total = 400;
  const uint64_t id = WriteSparse("iv", 16, total, 400);
  Rows all = MakeRows(0, total, 16);
  for (int32_t l = 0; l < 16; ++l) {
    std::vector<std::pair<int64_t, float>> want;  // (row, stored value), rows ascending
    for (int64_t r = 0; r < total; ++r) {
      for (int64_t i = all.indptr[r]; i < all.indptr[r + 1]; ++i) {
        if (all.indices[i] == l) want.emplace_back(r, HalfToFloat(FloatToHalf(all.values[i])));
      }
    }
    auto got = store_->IntervalSamples(id, l, 5, 3, 2, 1);
    ASSERT_TRUE(got.ok()) << got.status();
    if (want.empty()) {
      EXPECT_TRUE(got->empty());
      continue;
    }
    ASSERT_EQ(got->size(), 5u) << "latent " << l;
    float lo = want[0].second, hi = want[0].second;
    for (auto& [r, v] : want) lo = std::min(lo, v), hi = std::max(hi, v);
    EXPECT_EQ(got->front().low, lo);
    EXPECT_EQ(got->back().high, hi);
    int64_t counted = 0;
    for (size_t b = 0; b < got->size(); ++b) {
      const ActivationInterval& iv = (*got)[b];
      const bool last = b + 1 == got->size();
      int64_t inside = 0;
      for (auto& [r, v] : want) inside += v >= iv.low && (v < iv.high || (last && v <= iv.high));
      EXPECT_EQ(iv.count, inside) << "latent " << l << " interval " << b;
      counted += iv.count;
      EXPECT_EQ(iv.samples.size(), std::min<size_t>(3, iv.count));
      for (size_t j = 0; j < iv.samples.size(); ++j) {
        const TopActivationContext& t = iv.samples[j];
        if (j > 0) {
          EXPECT_GT(t.row, iv.samples[j - 1].row);  // spread in row order, distinct
        }
        EXPECT_GE(t.value, iv.low);
        EXPECT_LE(t.value, iv.high);
        auto it = std::find_if(want.begin(), want.end(), [&](auto& e) { return e.first == t.row; });
        ASSERT_NE(it, want.end());
        EXPECT_EQ(it->second, t.value);
        EXPECT_EQ(t.token_id, all.tokens[t.row]);
        EXPECT_EQ(t.context_start_row, std::max(t.row / 16 * 16, t.row - 2));
        EXPECT_EQ(t.context_values, WindowValues(all, l, t));
      }
    }
    EXPECT_EQ(counted, static_cast<int64_t>(want.size()));
    // One sample an interval: the middle of its rows (spread, not the first ones).
    auto one = store_->IntervalSamples(id, l, 5, 1, 0, 0);
    ASSERT_TRUE(one.ok());
    for (size_t b = 0; b < one->size(); ++b) {
      const ActivationInterval& iv = (*one)[b];
      std::vector<int64_t> inside;
      for (auto& [r, v] : want) {
        if (v >= iv.low && (v < iv.high || (b + 1 == one->size() && v <= iv.high))) {
          inside.push_back(r);
        }
      }
      if (inside.empty()) continue;
      ASSERT_EQ(iv.samples.size(), 1u);
      EXPECT_EQ(iv.samples[0].row, inside[inside.size() / 2]) << "latent " << l;
    }
  }
  auto again = store_->IntervalSamples(id, 3, 5, 3, 2, 1);
  auto first = store_->IntervalSamples(id, 3, 5, 3, 2, 1);
  ASSERT_TRUE(again.ok() && first.ok());
  ASSERT_EQ(again->size(), first->size());
  for (size_t b = 0; b < again->size(); ++b) {
    for (size_t j = 0; j < (*again)[b].samples.size(); ++j) {
      EXPECT_EQ((*again)[b].samples[j].row, (*first)[b].samples[j].row);
    }
  }
  EXPECT_EQ(store_->IntervalSamples(id, 3, 0, 3, 2, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(store_->IntervalSamples(id, 3, 5, 0, 2, 1).status().message().find("interval_samples"),
            absl::string_view::npos);
  EXPECT_EQ(store_->IntervalSamples(id, 16, 5, 3, 2, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->IntervalSamples(id + 100, 3, 5, 3, 2, 1).status().code(),
            absl::StatusCode::kNotFound);
}

// Windows where the latent is silent: drawn at random, reproducibly, none holding a firing.
TEST_P(ChunkStoreTest, SilentSamplesAreWindowsWithoutAFiring) {
  const int64_t total = 400;
  const uint64_t id = WriteSparse("quiet", 64, total, 400);
  const Rows all = MakeRows(0, total, 64);
  auto fires_in = [&](int32_t latent, int64_t from, int64_t to) {
    for (int64_t r = from; r < to; ++r) {
      for (int64_t i = all.indptr[r]; i < all.indptr[r + 1]; ++i) {
        if (all.indices[i] == latent) return true;
      }
    }
    return false;
  };
  for (int32_t l : {0, 5, 63}) {
    auto got = store_->SilentSamples(id, l, 12, 3, 2, /*seed=*/7);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 12u) << "latent " << l;  // a latent of 64 leaves many quiet windows
    for (size_t j = 0; j < got->size(); ++j) {
      const TopActivationContext& t = (*got)[j];
      if (j > 0) {
        EXPECT_GT(t.row, (*got)[j - 1].row);  // row order, distinct
      }
      EXPECT_EQ(t.value, 0);
      EXPECT_EQ(t.token_id, all.tokens[t.row]);
      EXPECT_EQ(t.context_start_row, std::max(t.row / 16 * 16, t.row - 3));
      const int64_t stop = std::min(t.row / 16 * 16 + 16, t.row + 3);
      ASSERT_EQ(static_cast<int64_t>(t.context_token_ids.size()), stop - t.context_start_row);
      for (size_t w = 0; w < t.context_token_ids.size(); ++w) {
        EXPECT_EQ(t.context_token_ids[w], all.tokens[t.context_start_row + w]);
      }
      EXPECT_FALSE(fires_in(l, t.context_start_row, stop)) << "latent " << l << " row " << t.row;
      EXPECT_EQ(t.context_values, std::vector<float>(t.context_token_ids.size(), 0.0f));
    }
    // The same seed draws the same rows; another seed, others; another latent, others.
    auto again = store_->SilentSamples(id, l, 12, 3, 2, 7);
    auto other = store_->SilentSamples(id, l, 12, 3, 2, 8);
    ASSERT_TRUE(again.ok() && other.ok());
    std::vector<int64_t> a, b, c;
    for (const auto& t : *got) a.push_back(t.row);
    for (const auto& t : *again) b.push_back(t.row);
    for (const auto& t : *other) c.push_back(t.row);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
  }
  // A window as wide as a sequence leaves fewer rows where a frequent latent is silent: fewer
  // come back rather than a window with a firing.
  auto wide = store_->SilentSamples(id, 0, 1000, 16, 16, 1);
  ASSERT_TRUE(wide.ok());
  for (const auto& t : *wide) {
    EXPECT_FALSE(fires_in(0, t.context_start_row,
                          t.context_start_row + static_cast<int64_t>(t.context_token_ids.size())));
  }
  EXPECT_EQ(store_->SilentSamples(id, 0, 0, 3, 2, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->SilentSamples(id, 0, 1001, 3, 2, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->SilentSamples(id, 64, 5, 3, 2, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->SilentSamples(id + 100, 0, 5, 3, 2, 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(ChunkStoreTest, DenseRowsRoundTripInChunks) {
  DatasetMeta m = SparseMeta("d", 12);
  m.kind = DatasetKind::kDense;
  m.value_dtype = ValueDtype::kFloat32;
  uint64_t id = *store_->CreateDataset(m);
  std::vector<float> values(250 * 12);
  std::vector<int32_t> tokens(250);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 3;
  for (int i = 0; i < 250; ++i) tokens[i] = 70000 + i;  // needs 4-byte token ids
  {
    auto w = store_->OpenWriter(id);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ((*w)->AppendSparse(0, nullptr, nullptr, nullptr, nullptr).code(),
              absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE((*w)->AppendDense(250, values.data(), tokens.data()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  std::vector<float> out;
  std::vector<int32_t> toks;
  ASSERT_TRUE(store_->ReadDense(id, 95, 110, &out, &toks).ok());
  ASSERT_EQ(out.size(), 110u * 12);
  EXPECT_EQ(out[0], values[95 * 12]);
  EXPECT_EQ(out.back(), values[205 * 12 - 1]);
  EXPECT_EQ(toks[0], 70095);
  EXPECT_EQ(*store_->ChunkRowStarts(id), (std::vector<int64_t>{0, 100, 200}));
  EXPECT_EQ(store_->ReadRows(id, 0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->ForEachLatentStats(id, nullptr, [](int32_t, const LatentStats&) {}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->ReadDense(id, 200, 51, &out, &toks).code(), absl::StatusCode::kOutOfRange);
}

// A dataset's size is its own bytes, whatever else shares the memtable: a TRAIN checkpoint (one
// huge value in the chunks family) once made a small SPARSE dataset read as tens of MB, and a
// DENSE dataset's blob-bound values were counted twice before their flush.
TEST_P(ChunkStoreTest, BytesOnDiskCountOnlyTheDatasetsOwnBytes) {
  const uint64_t sparse = WriteSparse("small", 256, 300, 100);
  DatasetMeta m = SparseMeta("dense", 64);
  m.kind = DatasetKind::kDense;
  m.value_dtype = ValueDtype::kFloat32;
  const uint64_t dense = *store_->CreateDataset(m);
  {
    std::vector<float> values(400 * 64, 0.25f);
    std::vector<int32_t> tokens(400, 7);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 977);
    auto w = store_->OpenWriter(dense);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendDense(400, values.data(), tokens.data()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  const int64_t sparse_before = store_->GetDataset(sparse)->bytes_on_disk();
  const int64_t dense_before = store_->GetDataset(dense)->bytes_on_disk();
  // 400 rows x 64 float32: about 100 KB of values; stored once.
  EXPECT_GT(dense_before, 400 * 64 * 4 / 2);
  EXPECT_LT(dense_before, 400 * 64 * 4 * 3 / 2);
  // 16 MB under another key of the chunks family, in the same memtable.
  ASSERT_TRUE(db_->Put(Family::kChunks, "zz-checkpoint", std::string(16 << 20, 'c'), false).ok());
  EXPECT_EQ(store_->GetDataset(sparse)->bytes_on_disk(), sparse_before);
  EXPECT_EQ(store_->GetDataset(dense)->bytes_on_disk(), dense_before);
  // Flushed and compacted, the figures stay of the same size.
  ASSERT_TRUE(db_->raw()->Flush(rocksdb::FlushOptions()).ok());
  for (Family f : {Family::kChunks, Family::kLatentIndex, Family::kMeta}) {
    ASSERT_TRUE(db_->raw()->Flush(rocksdb::FlushOptions(), db_->handle(f)).ok());
  }
  EXPECT_LT(store_->GetDataset(dense)->bytes_on_disk(), dense_before * 3 / 2);
  EXPECT_GT(store_->GetDataset(dense)->bytes_on_disk(), dense_before / 2);
  EXPECT_LT(store_->GetDataset(sparse)->bytes_on_disk(), sparse_before * 3 / 2 + 4096);
}

TEST_P(ChunkStoreTest, BadAppendsChangeNothing) {
  uint64_t id = *store_->CreateDataset(SparseMeta("b", 16));
  auto w = store_->OpenWriter(id);
  ASSERT_TRUE(w.ok());
  int64_t indptr[] = {0, 2};
  int32_t dup[] = {3, 3}, out_of_range[] = {1, 16}, tok[] = {1};
  float vals[] = {1, 2}, nan_vals[] = {1, NAN};
  int32_t ok_idx[] = {1, 2};
  EXPECT_EQ((*w)->AppendSparse(1, indptr, dup, vals, tok).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->AppendSparse(1, indptr, out_of_range, vals, tok).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->AppendSparse(1, indptr, ok_idx, nan_vals, tok).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->rows_pending(), 0);
  ASSERT_TRUE((*w)->AppendSparse(1, indptr, ok_idx, vals, tok).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  EXPECT_EQ(store_->GetDataset(id)->nnz(), 2);
}

TEST_P(ChunkStoreTest, ExplicitZerosAreNotFirings) {
  uint64_t id = *store_->CreateDataset(SparseMeta("z", 16));
  auto w = store_->OpenWriter(id);
  ASSERT_TRUE(w.ok());
  int64_t indptr[] = {0, 3, 4};
  int32_t idx[] = {5, 1, 9, 5};
  float vals[] = {0.0f, 2.0f, 0.0f, 3.0f};
  int32_t tok[] = {1, 2};
  ASSERT_TRUE((*w)->AppendSparse(2, indptr, idx, vals, tok).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  auto rows = store_->ReadRows(id, 0, 0);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->indptr, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(rows->indices, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(store_->GetLatentStats(id, 5)->firing_count, 1);
  EXPECT_EQ(store_->GetLatentStats(id, 9)->firing_count, 0);
  EXPECT_EQ(store_->GetDataset(id)->dead_latents(), 14);
}

TEST_P(ChunkStoreTest, CorruptChunkIsDataLossNamingTheChunk) {
  uint64_t id = *store_->CreateDataset(SparseMeta("c"));
  {
    auto w = store_->OpenWriter(id);
    ASSERT_TRUE(Append(w->get(), MakeRows(0, 250, 256)).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  // Format 2: the chunk at row 100. Format 3: each part of that chunk in turn (header, token
  // ids, the slice holding latent 5).
  std::vector<std::string> targets{keys::Chunk(id, 100)};
  if (Format() >= 3) {
    targets = {keys::ChunkPart(id, 100, 0), keys::ChunkPart(id, 100, 1),
               keys::ChunkPart(id, 100, 2 + 5 / 16)};
  }
  for (const std::string& key : targets) {
    auto value = db_->Get(Family::kChunks, key);
    ASSERT_TRUE(value.ok());
    std::string bad = *value;
    bad[bad.size() / 2] ^= 0x40;
    ASSERT_TRUE(db_->Put(Family::kChunks, key, bad, true).ok());
    auto rows = store_->ReadRows(id, 0, 0);
    EXPECT_EQ(rows.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(rows.status().message().find("chunk at row 100"), std::string::npos) << rows.status();
    EXPECT_TRUE(store_->ReadRows(id, 0, 100).ok());  // the other chunks still read
    EXPECT_TRUE(store_->ReadRows(id, 200, 50).ok());
    std::vector<int64_t> post_rows;
    std::vector<float> post_values;
    if (Format() >= 3 && key != keys::ChunkPart(id, 100, 1)) {
      absl::Status s = store_->LatentPostings(id, 5, &post_rows, &post_values);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
      EXPECT_NE(s.message().find("chunk at row 100"), std::string::npos) << s;
    }
    ASSERT_TRUE(db_->Put(Family::kChunks, key, *value, true).ok());
  }
  if (Format() >= 3) {
    // A slice the header lists but the store lacks is DATA_LOSS too, not an empty slice.
    ASSERT_TRUE(db_->raw()
                    ->Delete(rocksdb::WriteOptions(), db_->handle(Family::kChunks),
                             keys::ChunkPart(id, 100, 2 + 5 / 16))
                    .ok());
    auto rows = store_->ReadRows(id, 100, 1);
    EXPECT_EQ(rows.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(rows.status().message().find("slice 0 missing"), std::string::npos) << rows.status();
  }
}

// The SAE's weight hash came after the first datasets: their records end before it and must
// still open, reading an empty hash.
// Fields appended to the record later (the SAE's hash, then a transcoder's output hook) read as
// "" from records written before them.
TEST_P(ChunkStoreTest, RecordsWithoutTheLaterFieldsStillOpen) {
  DatasetMeta meta = SparseMeta("hashed");
  meta.sae_weight_hash = "crc32c:0123abcd:4096";
  meta.hook_name_out = "blocks.1.hook_mlp_out";
  const uint64_t id = *store_->CreateDataset(meta);
  EXPECT_EQ(store_->GetRecord(id)->meta.sae_weight_hash, meta.sae_weight_hash);
  EXPECT_EQ(store_->GetDataset(id)->sae_weight_hash(), meta.sae_weight_hash);
  EXPECT_EQ(store_->GetDataset(id)->hook_name_out(), meta.hook_name_out);
  std::string stored = *db_->Get(Family::kMeta, keys::DatasetRecord(id));
  for (const std::string* field : {&meta.hook_name_out, &meta.sae_weight_hash}) {
    stored.resize(stored.size() - 4 - field->size());  // a length and the bytes
    ASSERT_TRUE(db_->Put(Family::kMeta, keys::DatasetRecord(id), stored, true).ok());
    Reopen();
    auto old = store_->GetRecord(id);
    ASSERT_TRUE(old.ok()) << old.status();
    EXPECT_EQ(old->meta.hook_name_out, "");
    EXPECT_EQ(old->meta.sae_weight_hash, field == &meta.hook_name_out ? meta.sae_weight_hash : "");
    EXPECT_EQ(old->meta.name, "hashed");
    EXPECT_EQ(old->meta.top_n, meta.top_n);
  }
}

TEST_P(ChunkStoreTest, ReassignHandsAnIdleDatasetToTheNextJob) {
  DatasetMeta meta = SparseMeta("handed");
  meta.job_id = 5;
  const uint64_t id = *store_->CreateDataset(meta);
  {
    auto w = store_->OpenWriter(id);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(Append(w->get(), MakeRows(0, 150, 256)).ok());
    ASSERT_TRUE((*w)->Commit().ok());
    EXPECT_EQ(store_->ReassignDataset(id, 5, 6).code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(store_->ReassignDataset(id, 4, 6).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_->ReassignDataset(id, 5, 6).ok());
  Reopen();
  auto rec = store_->GetRecord(id);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->meta.job_id, 6u);
  EXPECT_EQ(rec->rows_committed, 150);  // the watermark is untouched
  EXPECT_EQ(store_->ReassignDataset(id, 5, 7).code(), absl::StatusCode::kFailedPrecondition);
}

// Reconstruction sums given with rows reach the dataset's totals with the commit that makes the
// rows durable, and die with them otherwise: the totals always describe committed rows.
TEST_P(ChunkStoreTest, ReconstructionTotalsFollowTheCommittedRows) {
  const uint64_t id = *store_->CreateDataset(SparseMeta("fit"));
  auto sums = [](int64_t rows, double error) {
    ReconstructionFit f;
    f.rows = rows;
    f.squared_error = error * rows;
    f.sum_squares = 10.0 * rows;
    f.cosine_sum = 0.9 * rows;
    f.sum_x = {1.0 * rows, -1.0 * rows};
    return f;
  };
  auto fit_of = [&]() {
    auto info = store_->GetDataset(id);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->fit() : latentd::v1::SaeFit();
  };
  EXPECT_FALSE(store_->GetDataset(id)->has_fit());  // nothing measured yet
  {
    auto w = store_->OpenWriter(id);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(Append(w->get(), MakeRows(0, 60, 256)).ok());
    ASSERT_TRUE((*w)->AddReconstructionSums(sums(40, 1.0)).ok());  // two calls add up
    ASSERT_TRUE((*w)->AddReconstructionSums(sums(20, 1.0)).ok());
    ASSERT_TRUE((*w)->CommitAsync().ok());
    ASSERT_TRUE(Append(w->get(), MakeRows(60, 40, 256)).ok());
    ASSERT_TRUE((*w)->AddReconstructionSums(sums(40, 4.0)).ok());
    ASSERT_TRUE((*w)->Commit().ok());
    // Rows and sums that never commit (the writer dies, as in a crash).
    ASSERT_TRUE(Append(w->get(), MakeRows(100, 30, 256)).ok());
    ASSERT_TRUE((*w)->AddReconstructionSums(sums(30, 100.0)).ok());
    ReconstructionFit other_width = sums(5, 1.0);
    other_width.sum_x.push_back(0);
    EXPECT_EQ((*w)->AddReconstructionSums(other_width).code(), absl::StatusCode::kInvalidArgument);
  }
  latentd::v1::SaeFit fit = fit_of();
  EXPECT_EQ(fit.rows(), 100);
  // SSE 60 + 160; SST = 1000 - (100^2 + 100^2) / 100 = 800.
  EXPECT_NEAR(fit.explained_variance(), 1 - 220.0 / 800, 1e-12);
  EXPECT_NEAR(fit.mse(), 220.0 / 200, 1e-12);
  EXPECT_NEAR(fit.cosine_similarity(), 0.9, 1e-12);
  // A writer opened later resumes from the stored totals.
  Reopen();
  {
    auto w = store_->OpenWriter(id);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(Append(w->get(), MakeRows(100, 100, 256)).ok());
    ASSERT_TRUE((*w)->AddReconstructionSums(sums(100, 2.0)).ok());
    ASSERT_TRUE((*w)->MarkComplete().ok());
  }
  fit = fit_of();
  EXPECT_EQ(fit.rows(), 200);
  EXPECT_NEAR(fit.explained_variance(), 1 - 420.0 / (2000 - (200.0 * 200 * 2) / 200), 1e-12);

  // Damaged totals: DATA_LOSS naming the dataset.
  ASSERT_TRUE(db_->Put(Family::kMeta, keys::Fit(id), "junk", /*sync=*/true).ok());
  absl::Status s = store_->GetDataset(id).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(absl::StrCat("dataset ", id)), std::string::npos) << s;
  // Deleting the dataset deletes its totals.
  ASSERT_TRUE(store_->DeleteDataset(id).ok());
  EXPECT_TRUE(absl::IsNotFound(db_->Get(Family::kMeta, keys::Fit(id)).status()));
}

TEST_P(ChunkStoreTest, DeleteRemovesEverything) {
  uint64_t id = *store_->CreateDataset(SparseMeta("del"));
  uint64_t keep = *store_->CreateDataset(SparseMeta("keep"));
  {
    auto w = store_->OpenWriter(id);
    ASSERT_TRUE(Append(w->get(), MakeRows(0, 150, 256)).ok());
    ASSERT_TRUE((*w)->Commit().ok());
    EXPECT_EQ(store_->DeleteDataset(id).code(), absl::StatusCode::kFailedPrecondition);
  }
  ASSERT_TRUE(store_->DeleteDataset(id).ok());
  EXPECT_EQ(store_->GetDataset(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->FindDataset("del").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->DeleteDataset(id).code(), absl::StatusCode::kNotFound);
  auto list = store_->ListDatasets();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->datasets_size(), 1);
  EXPECT_EQ(list->datasets(0).id(), keep);
  EXPECT_EQ(list->unreadable_size(), 0);
  for (Family f : {Family::kChunks, Family::kPostings, Family::kLatentIndex}) {
    auto it = db_->NewIterator(f);
    it->Seek(keys::IdPrefix(id));
    EXPECT_TRUE(!it->Valid() || !it->key().starts_with(keys::IdPrefix(id)));
  }
  // The name can be reused.
  EXPECT_TRUE(store_->CreateDataset(SparseMeta("del")).ok());
}

// One damaged dataset must not hide the others (users list datasets to find what to read, and
// to find what to delete), and a damaged one can still be deleted.
TEST_P(ChunkStoreTest, DamagedDatasetsAreListedAsUnreadableAndCanBeDeleted) {
  const uint64_t good = WriteSparse("good", 256, 200, 100);
  const uint64_t bad_record = WriteSparse("bad_record", 256, 200, 100);
  const uint64_t bad_watermark = WriteSparse("bad_watermark", 256, 200, 100);
  ASSERT_TRUE(db_->Put(Family::kMeta, keys::DatasetRecord(bad_record), "junk", true).ok());
  ASSERT_TRUE(db_->Put(Family::kMeta, keys::Watermark(bad_watermark), "junk", true).ok());

  auto list = store_->ListDatasets();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->datasets_size(), 1);
  EXPECT_EQ(list->datasets(0).id(), good);
  EXPECT_EQ(list->datasets(0).rows_committed(), 200);
  ASSERT_EQ(list->unreadable_size(), 2);
  EXPECT_EQ(list->unreadable(0).dataset_id(), bad_record);
  EXPECT_EQ(list->unreadable(0).name(), "bad_record");
  EXPECT_EQ(list->unreadable(0).error(), store_->GetDataset(bad_record).status().ToString());
  EXPECT_TRUE(absl::StartsWith(list->unreadable(0).error(), "DATA_LOSS: dataset "))
      << list->unreadable(0).error();
  EXPECT_EQ(list->unreadable(1).dataset_id(), bad_watermark);
  EXPECT_EQ(list->unreadable(1).name(), "bad_watermark");

  for (uint64_t id : {bad_record, bad_watermark}) {
    ASSERT_TRUE(store_->DeleteDataset(id).ok()) << id;
    EXPECT_EQ(store_->GetDataset(id).status().code(), absl::StatusCode::kNotFound);
    for (Family f : {Family::kChunks, Family::kLatentIndex}) {
      auto it = db_->NewIterator(f);
      it->Seek(keys::IdPrefix(id));
      EXPECT_TRUE(!it->Valid() || !it->key().starts_with(keys::IdPrefix(id))) << id;
    }
  }
  list = store_->ListDatasets();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->datasets_size(), 1);
  EXPECT_EQ(list->unreadable_size(), 0);
  // Their names are free again, and the good dataset reads as before.
  EXPECT_TRUE(store_->CreateDataset(SparseMeta("bad_record")).ok());
  EXPECT_TRUE(store_->CreateDataset(SparseMeta("bad_watermark")).ok());
  EXPECT_EQ(store_->ReadRows(good, 0, 0)->token_ids.size(), 200u);
}

// Names are free text: "ext" once made the name key ("ds/n" + name) the id counter's key
// ("ds/next"): on a new store the name resolved to the next dataset, on any other it was "taken",
// and deleting it reset the counter, so a later dataset reused a live dataset's id.
TEST_P(ChunkStoreTest, ANameLikeACounterKeyIsAnOrdinaryName) {
  auto ext = store_->CreateDataset(SparseMeta("ext"));
  ASSERT_TRUE(ext.ok()) << ext.status();
  const uint64_t b = *store_->CreateDataset(SparseMeta("b"));
  EXPECT_EQ(*store_->FindDataset("ext"), *ext);
  ASSERT_TRUE(store_->DeleteDataset(*ext).ok());
  const uint64_t c = *store_->CreateDataset(SparseMeta("c"));
  EXPECT_GT(c, b);
  EXPECT_EQ(store_->GetRecord(b)->meta.name, "b");
  EXPECT_EQ(*store_->FindDataset("c"), c);
  auto again = store_->CreateDataset(SparseMeta("ext"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(*again, c);
}

// A store written before the counter moved keeps its counter under "ds/next", the name key of
// "ext": its ids go on from there, and the name is free.
TEST_P(ChunkStoreTest, AStoreWithTheLegacyCounterGoesOnFromIt) {
  std::string seven;
  AppendBigEndian64(7, &seven);
  ASSERT_TRUE(db_->Put(Family::kMeta, keys::kLegacyDatasetIdCounter, seven, true).ok());
  auto ext = store_->CreateDataset(SparseMeta("ext"));
  ASSERT_TRUE(ext.ok()) << ext.status();
  EXPECT_EQ(*ext, 7u);
  EXPECT_EQ(*store_->FindDataset("ext"), 7u);
  EXPECT_EQ(*store_->CreateDataset(SparseMeta("next")), 8u);
  EXPECT_EQ(store_->CreateDataset(SparseMeta("ext")).status().code(),
            absl::StatusCode::kAlreadyExists);
}

// A deleted dataset's files go with it: users delete datasets to get their disk back, and a
// range tombstone alone frees nothing until some later compaction happens to cover the range.
TEST_P(ChunkStoreTest, DeleteGivesTheDiskSpaceBack) {
  const uint64_t keep = WriteSparse("keep", 256, 300, 100);
  ASSERT_TRUE(db_->CompactAll().ok());
  const uint64_t kept_bytes = *db_->BytesOnDisk();
  const uint64_t sparse = WriteSparse("big", 256, 20000, 2000);
  // Dense chunks of 100 x 64 floats are blobs here (min_blob_size 4096).
  DatasetMeta m = SparseMeta("big_dense", 64);
  m.kind = DatasetKind::kDense;
  m.value_dtype = ValueDtype::kFloat32;
  const uint64_t dense = *store_->CreateDataset(m);
  {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    std::vector<float> values(4000 * 64);
    for (float& v : values) v = normal(rng);
    std::vector<int32_t> tokens(4000, 7);
    auto w = store_->OpenWriter(dense);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendDense(4000, values.data(), tokens.data()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  ASSERT_TRUE(db_->CompactAll().ok());
  const uint64_t with_big = *db_->BytesOnDisk();
  uint64_t blob_bytes = 0;
  db_->raw()->GetIntProperty(db_->handle(Family::kChunks),
                             rocksdb::DB::Properties::kLiveBlobFileSize, &blob_bytes);
  ASSERT_GT(blob_bytes, 500000u);
  ASSERT_TRUE(store_->DeleteDataset(sparse).ok());
  ASSERT_TRUE(store_->DeleteDataset(dense).ok());
  EXPECT_LT(*db_->BytesOnDisk(), kept_bytes + (with_big - kept_bytes) / 20)
      << "before " << with_big << " B (" << blob_bytes << " B of blobs), the kept dataset alone "
      << kept_bytes << " B";
  auto rows = store_->ReadRows(keep, 0, 0);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->num_rows, 300);
}

// Commits of at least kParallelCommitEntries entries split their per-latent work (statistics,
// top-N, slices or postings) over commit_threads; whatever the split, the stored bytes are those
// one thread writes. (The default is 1 thread on 2 cores, so this is what runs the split here.)
TEST_P(ChunkStoreTest, ParallelCommitsStoreTheBytesOfOneThread) {
  std::vector<std::map<std::string, std::string>> stored;
  for (int32_t threads : {1, 3}) {
    const std::string dir = dir_ + "/threads" + std::to_string(threads);
    auto db = Db::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    ChunkStoreOptions options;
    options.sparse_chunk_rows = 4096;
    options.record_version = Format();
    options.resident_latent_state_max_width = ResidentMaxWidth();
    options.commit_threads = threads;
    {
      ChunkStore store(db->get(), options);
      const uint64_t id = *store.CreateDataset(SparseMeta("wide", 1024));
      auto w = store.OpenWriter(id);
      ASSERT_TRUE(w.ok()) << w.status();
      for (int64_t at = 0; at < 60000; at += 30000) {  // ~120k entries a commit
        ASSERT_TRUE(Append(w->get(), MakeRows(at, 30000, 1024)).ok());
        ASSERT_TRUE((*w)->Commit().ok());
      }
    }
    stored.emplace_back();
    for (Family f : {Family::kChunks, Family::kPostings, Family::kLatentIndex}) {
      auto it = (*db)->NewIterator(f);
      for (it->SeekToFirst(); it->Valid(); it->Next()) {
        stored.back()[std::to_string(static_cast<int>(f)) + it->key().ToString()] =
            it->value().ToString();
      }
    }
  }
  EXPECT_GT(stored[0].size(), 100u);
  EXPECT_TRUE(stored[0] == stored[1]);
}

INSTANTIATE_TEST_SUITE_P(Formats, ChunkStoreTest,
                         ::testing::Values(StoreParam{3, true}, StoreParam{2, true},
                                           StoreParam{3, false}, StoreParam{2, false}),
                         [](const ::testing::TestParamInfo<StoreParam>& info) {
                           return "format" + std::to_string(info.param.format) +
                                  (info.param.resident ? "" : "_wide");
                         });

}  // namespace
}  // namespace latentd::storage
