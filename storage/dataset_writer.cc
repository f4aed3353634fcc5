// DatasetWriter (declared in storage/chunk_store.h): appends, and the commits that make them
// durable. The store's reads are in chunk_store.cc.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/big_endian.h"
#include "common/status_macros.h"
#include "storage/byte_io.h"
#include "storage/chunk_store.h"
#include "storage/chunk_store_internal.h"
#include "storage/crc32c.h"
#include "storage/keys.h"
#include "storage/posting_codec.h"
#include "storage/sliced_chunk.h"
#include "storage/value_codec.h"

namespace latentd::storage {

using chunk_store_internal::DecodeWatermark;
using chunk_store_internal::EncodeWatermark;
using chunk_store_internal::LatentIndexError;
using chunk_store_internal::ToChunkDtype;
using chunk_store_internal::Watermark;

namespace {

// Rounds values[0, n) in place to what the dataset's dtype stores, so that pending rows, the
// statistics and top-N hold exactly the values readers will decode.
void RoundAllTo(ChunkDtype dtype, float* values, int64_t n) {
  switch (dtype) {
    case ChunkDtype::kFloat16:
      return RoundArrayToHalf(values, n);
    case ChunkDtype::kBFloat16:
      return RoundArrayToBFloat16(values, n);
    case ChunkDtype::kFloat32:
      return;
  }
}

// Format-1 postings (datasets of record version 1): varint count, varint row deltas (first
// relative to the commit's first row), values in the dataset dtype, CRC32C.
std::string EncodePostingV1(int64_t row_start, const int64_t* rows, const float* values, size_t n,
                            ChunkDtype dtype) {
  std::string out;
  PutVarint(n, &out);
  int64_t prev = row_start;
  for (size_t i = 0; i < n; ++i) {
    PutVarint(static_cast<uint64_t>(rows[i] - prev), &out);
    prev = rows[i];
  }
  for (size_t i = 0; i < n; ++i) {
    if (dtype == ChunkDtype::kFloat32) {
      PutRaw<float>(values[i], &out);
    } else {
      PutRaw<uint16_t>(
          dtype == ChunkDtype::kFloat16 ? FloatToHalf(values[i]) : FloatToBFloat16(values[i]),
          &out);
    }
  }
  PutRaw<uint32_t>(Crc32c(out.data(), out.size()), &out);
  return out;
}

// Commits add merge operands to the blocks they change (StatsDeltaBuilder: the statistics of
// their own values; EncodeTopDelta: only the top-N entries they placed), and every this many
// changes of a block its whole value instead (a Put): a read folds at most this many operands,
// however long ago the last compaction was, for a write of 1/this of the blocks a commit.
constexpr int kDeltasPerBlockWrite = 16;

// A writer without resident state cuts a latent's top-N candidates at a floor: the last value of
// its stored list once that holds top_n entries (nothing at or below it can enter). False while
// the list has room.
bool FullListFloor(const TopRows& list, int top_n, float* floor) {
  const std::vector<TopEntry>& entries = list.entries();
  if (entries.empty() || static_cast<int>(entries.size()) < top_n) return false;
  *floor = entries.back().value;
  return true;
}

// A commit writes a statistics block whole when it added more than this many values per latent
// of the block on average, else an operand (see AddLatentWork). Measured (docs/STORAGE.md): at
// 4096 latents, 128 values a latent a commit, operands cost 8% more commit CPU and 33% on
// GetLatent before compaction; at 1M latents, 0.5 a latent, they made commits 3.1x faster.
constexpr int64_t kFewStatsValues = 4;

// Commits with at least this many entries spread their per-latent work over commit_threads
// (below it a thread start costs more than it saves).
constexpr int64_t kParallelCommitEntries = 1 << 16;

}  // namespace

DatasetWriter::DatasetWriter(ChunkStore* store, DatasetRecord record)
    : store_(store),
      record_(std::move(record)),
      ahead_(record_),
      dtype_(ToChunkDtype(record_.meta.value_dtype)) {
  pending_.kind =
      record_.meta.kind == DatasetKind::kSparse ? ChunkKind::kSparse : ChunkKind::kDense;
  pending_.dtype = dtype_;
  pending_.width = record_.meta.width;
  pending_.row_start = record_.rows_committed;
  pending_.indptr.assign(1, 0);
}

DatasetWriter::~DatasetWriter() {
  WaitDurable().IgnoreError();  // its failure is the store's: the watermark says what is durable
  if (writer_thread_.joinable()) {
    {
      absl::MutexLock lock(&write_mu_);
      stop_writer_ = true;
    }
    writer_thread_.join();
  }
  store_->ReleaseWriter(record_.id);
}

absl::Status DatasetWriter::LoadLatentState() {
  {
    auto got = store_->db()->Get(Family::kMeta, keys::Watermark(record_.id));
    RETURN_IF_ERROR(got.status());
    Watermark w;
    RETURN_IF_ERROR(DecodeWatermark(*got, &w));
    blob_bytes_ahead_ = w.blob_bytes;
  }
  ASSIGN_OR_RETURN(fit_ahead_, store_->GetReconstructionFit(record_.id));
  if (record_.meta.kind != DatasetKind::kSparse) return absl::OkStatus();
  const int32_t width = record_.meta.width;
  resident_ = width <= store_->options().resident_latent_state_max_width;
  if (resident_) {
    stats_.assign(width, LatentStats());
    top_.assign(width, TopRows());
  } else {
    top_floor_.assign(width, -std::numeric_limits<float>::infinity());
    fired_.assign(width / kLatentsPerBlock + 1, 0);
  }
  // Staggered, so that the blocks written whole are spread evenly over the commits.
  top_deltas_.resize(record_.meta.width / kLatentsPerBlock + 1);
  for (size_t b = 0; b < top_deltas_.size(); ++b) top_deltas_[b] = b % kDeltasPerBlockWrite;
  stats_deltas_ = top_deltas_;
  Db* db = store_->db();
  auto it = db->NewIterator(Family::kLatentIndex);
  const std::string prefix = keys::IdPrefix(record_.id);
  std::vector<LatentStats> block_stats(resident_ ? 0 : kLatentsPerBlock);
  std::vector<TopRows> block_top(resident_ ? 0 : kLatentsPerBlock);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    if (it->key().size() != 13) return absl::DataLossError("malformed latent index key");
    const uint32_t latent = ReadBigEndian32(it->key().data() + 8);
    if (latent >= static_cast<uint32_t>(width) || latent % kLatentsPerBlock != 0) {
      return absl::DataLossError("latent index key out of range");
    }
    absl::string_view v(it->value().data(), it->value().size());
    const int32_t n = std::min<int32_t>(kLatentsPerBlock, width - latent);
    if (it->key()[12] == 'S') {
      LatentStats* out = resident_ ? &stats_[latent] : block_stats.data();
      if (absl::Status s = DecodeStatsBlock(v, out, n); !s.ok()) {
        return LatentIndexError(record_.id, latent, "statistics block", s);
      }
      if (resident_) continue;
      for (int32_t i = 0; i < n; ++i) {
        if (out[i].firing_count > 0) fired_[latent / kLatentsPerBlock] |= uint64_t{1} << i;
      }
    } else {
      TopRows* out = resident_ ? &top_[latent] : block_top.data();
      if (absl::Status s = DecodeTopBlock(v, out, n); !s.ok()) {
        return LatentIndexError(record_.id, latent, "top-N block", s);
      }
      if (resident_) continue;
      for (int32_t i = 0; i < n; ++i) {
        FullListFloor(out[i], record_.meta.top_n, &top_floor_[latent + i]);
      }
    }
  }
  return FromRocks(it->status(),
                   absl::StrCat("dataset ", record_.id, ": loading latent statistics and top-N"));
}

absl::Status DatasetWriter::Usable() const {
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "writer of dataset ", record_.id,
        " failed earlier (reopen it to resume at the watermark): ", failed_.message()));
  }
  return absl::OkStatus();
}

absl::Status DatasetWriter::AppendSparse(int64_t num_rows, const int64_t* indptr,
                                         const int32_t* indices, const float* values,
                                         const int32_t* token_ids) {
  RETURN_IF_ERROR(Usable());
  if (record_.meta.kind != DatasetKind::kSparse) {
    return absl::FailedPreconditionError("AppendSparse on a DENSE dataset");
  }
  if (num_rows < 0) return absl::InvalidArgumentError("num_rows: negative");
  if (num_rows == 0) return absl::OkStatus();
  if (!indptr || !token_ids) return absl::InvalidArgumentError("indptr/token_ids: null");
  if (indptr[0] != 0) return absl::InvalidArgumentError("indptr[0]: must be 0");
  const int32_t width = record_.meta.width;
  for (int64_t r = 0; r < num_rows; ++r) {
    if (indptr[r + 1] < indptr[r]) {
      return absl::InvalidArgumentError(absl::StrCat("indptr: decreases at row ", r));
    }
    if (indptr[r + 1] - indptr[r] > width) {
      return absl::InvalidArgumentError(absl::StrCat("indptr: row ", r, " wider than ", width));
    }
  }
  if (indptr[num_rows] > 0 && (!indices || !values)) {
    return absl::InvalidArgumentError("indices/values: null");
  }
  // Entries go straight into the pending buffer; a bad call truncates it back to `mark`, so it
  // changes nothing.
  const size_t mark = pending_.indices.size();
  pending_.indices.resize(mark + indptr[num_rows]);
  pending_.values.resize(mark + indptr[num_rows]);
  int32_t* const out_indices = pending_.indices.data() + mark;
  float* const out_values = pending_.values.data() + mark;
  size_t kept = 0;
  auto fail = [&](std::string message) {
    pending_.indices.resize(mark);
    pending_.values.resize(mark);
    return absl::InvalidArgumentError(std::move(message));
  };
  std::vector<int64_t> row_ends;
  row_ends.reserve(num_rows);
  std::vector<std::pair<int32_t, float>> row;
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t a = indptr[r], b = indptr[r + 1];
    // The common row (the SAE encoder sorts its TopK indices on the device): columns strictly
    // ascending inside [0, width), values finite and nonzero. It is copied as it is.
    bool plain = true;
    int32_t prev = -1;
    for (int64_t i = a; i < b; ++i) {
      plain &= (indices[i] > prev) & (indices[i] < width) & std::isfinite(values[i]) &
               (values[i] != 0.0f);
      prev = indices[i];
    }
    if (plain) {
      for (int64_t i = a; i < b; ++i, ++kept) {
        out_indices[kept] = indices[i];
        out_values[kept] = values[i];
      }
      row_ends.push_back(static_cast<int64_t>(mark + kept));
      continue;
    }
    row.clear();
    for (int64_t i = a; i < b; ++i) {
      if (indices[i] < 0 || indices[i] >= width) {
        return fail(
            absl::StrCat("indices: ", indices[i], " in row ", r, " outside [0, ", width, ")"));
      }
      if (!std::isfinite(values[i])) {
        return fail(absl::StrCat("values: non-finite in row ", r));
      }
      if (values[i] == 0.0f) continue;  // an explicit zero is no firing
      row.emplace_back(indices[i], values[i]);
    }
    std::sort(row.begin(), row.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    for (size_t i = 1; i < row.size(); ++i) {
      if (row[i].first == row[i - 1].first) {
        return fail(absl::StrCat("indices: column ", row[i].first, " repeats in row ", r));
      }
    }
    for (const auto& [c, v] : row) {
      out_indices[kept] = c;
      out_values[kept++] = v;
    }
    row_ends.push_back(static_cast<int64_t>(mark + kept));
  }
  pending_.indices.resize(mark + kept);
  pending_.values.resize(mark + kept);
  RoundAllTo(dtype_, pending_.values.data() + mark, static_cast<int64_t>(kept));
  const int64_t base = pending_.indptr.back() - static_cast<int64_t>(mark);
  for (int64_t r = 0; r < num_rows; ++r) {
    pending_.indptr.push_back(base + row_ends[r]);
    pending_.token_ids.push_back(token_ids[r]);
  }
  pending_.num_rows += num_rows;
  return absl::OkStatus();
}

absl::Status DatasetWriter::AppendDense(int64_t num_rows, const float* values,
                                        const int32_t* token_ids) {
  RETURN_IF_ERROR(Usable());
  if (record_.meta.kind != DatasetKind::kDense) {
    return absl::FailedPreconditionError("AppendDense on a SPARSE dataset");
  }
  if (num_rows < 0) return absl::InvalidArgumentError("num_rows: negative");
  if (num_rows == 0) return absl::OkStatus();
  if (!values || !token_ids) return absl::InvalidArgumentError("values/token_ids: null");
  const int64_t n = num_rows * record_.meta.width;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("values: non-finite in row ", i / record_.meta.width));
    }
  }
  const size_t at = pending_.values.size();
  pending_.values.resize(at + n);
  std::copy(values, values + n, pending_.values.begin() + at);
  RoundAllTo(dtype_, pending_.values.data() + at, n);
  pending_.token_ids.insert(pending_.token_ids.end(), token_ids, token_ids + num_rows);
  pending_.num_rows += num_rows;
  return absl::OkStatus();
}

// Everything one commit writes, assembled before the one synced Write.
struct DatasetWriter::CommitBatch {
  rocksdb::WriteBatch batch;
  DatasetRecord next;      // the record once the commit is durable
  int64_t blob_bytes = 0;  // encoded bytes of chunk values that go to blob files
  ReconstructionFit fit;   // the dataset's totals once durable (when the commit has sums)
  void PutChunkValue(Db* db, const std::string& key, const std::string& value) {
    const uint64_t min_blob = db->options().min_blob_size;
    if (min_blob > 0 && value.size() >= min_blob) blob_bytes += value.size();
    batch.Put(db->handle(Family::kChunks), key, value);
  }
  void PutDirectory(Db* db, uint64_t id, int64_t row_start, int64_t rows, int64_t nnz) {
    std::string dir;
    PutRaw<uint32_t>(static_cast<uint32_t>(rows), &dir);
    PutRaw<uint64_t>(static_cast<uint64_t>(nnz), &dir);
    batch.Put(db->handle(Family::kMeta), keys::ChunkDir(id, row_start), dir);
    ++next.num_chunks;
    next.nnz += nnz;
  }

  // Wide datasets (non-resident writer state): latent-index blocks that reached their 16th
  // operand. Before the batch, the writer folds each from the store (a Get merges its
  // operands) and writes it back whole: the same value, so this needs no atomicity with the
  // batch, and a crash between the two changes nothing a reader sees.
  struct Fold {
    std::string key;
    int32_t first = 0;  // first latent of the block
    int32_t size = 0;   // latents in the block
    bool top = false;   // a top-N block (else statistics)
  };
  std::vector<Fold> folds;
  uint64_t dataset_id = 0;
  int top_n = 0;
  // Filled by Write(): (latent, last value) of every full list among the folded top-N blocks.
  std::vector<std::pair<int32_t, float>> floors;

  // The folds, then the batch, synced.
  absl::Status Write(Db* db) {
    if (!folds.empty()) {
      rocksdb::WriteBatch whole;
      std::vector<TopRows> lists(kLatentsPerBlock);
      for (const Fold& f : folds) {
        const char* what = f.top ? "top-N block" : "statistics block";
        absl::StatusOr<std::string> value = db->Get(Family::kLatentIndex, f.key);
        if (absl::IsNotFound(value.status())) continue;  // nothing stored, nothing to fold
        if (!value.ok()) return LatentIndexError(dataset_id, f.first, what, value.status());
        if (f.top) {
          if (absl::Status s = DecodeTopBlock(*value, lists.data(), f.size); !s.ok()) {
            return LatentIndexError(dataset_id, f.first, what, s);
          }
          for (int32_t i = 0; i < f.size; ++i) {
            float floor;
            if (FullListFloor(lists[i], top_n, &floor)) floors.emplace_back(f.first + i, floor);
          }
        }
        whole.Put(db->handle(Family::kLatentIndex), f.key, *value);
      }
      RETURN_IF_ERROR(db->Write(&whole, /*sync=*/false));
    }
    return db->Write(&batch, /*sync=*/true);
  }
};

namespace {

// Splits latents [0, width) into at most `parts` ranges whose bounds are multiples of `align`
// (or width), with about equal entry counts. Returns the bounds (first 0, last width).
// entries_before(l): the commit's entries of latents below l.
template <typename EntriesBefore>
std::vector<int32_t> SplitLatents(EntriesBefore entries_before, int32_t width, int32_t align,
                                  int parts) {
  std::vector<int32_t> bounds{0};
  const int64_t total = entries_before(width);
  for (int p = 1; p < parts; ++p) {
    const int64_t want = total * p / parts;
    int32_t l = bounds.back();
    while (l < width && entries_before(l) < want) l += align;
    l = std::min(l, width);
    if (l > bounds.back() && l < width) bounds.push_back(l);
  }
  bounds.push_back(width);
  return bounds;
}

// Runs task(p) for p in [0, parts): p = 0 on the calling thread, the others on threads of their
// own. The tasks must touch disjoint state.
template <typename Task>
void RunParts(int parts, Task task) {
  std::vector<std::thread> threads;
  for (int p = 1; p < parts; ++p) threads.emplace_back(task, p);
  task(0);
  for (std::thread& t : threads) t.join();
}

using KeyValues = std::vector<std::pair<std::string, std::string>>;

}  // namespace

void DatasetWriter::AddRowMajorChunks(CommitBatch* commit) {
  Db* db = store_->db();
  const int64_t n = pending_.num_rows;
  const int64_t chunk_rows = std::max<int64_t>(1, store_->options().chunk_rows);
  const bool sparse = pending_.kind == ChunkKind::kSparse;
  const int32_t width = record_.meta.width;
  EncodeOptions enc;
  enc.index_encoding = store_->options().index_encoding;
  Chunk c;
  c.kind = pending_.kind;
  c.dtype = dtype_;
  c.width = width;
  for (int64_t off = 0; off < n; off += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, n - off);
    c.row_start = pending_.row_start + off;
    c.num_rows = rows;
    c.token_ids.assign(pending_.token_ids.begin() + off, pending_.token_ids.begin() + off + rows);
    int64_t nnz = 0;
    if (sparse) {
      const int64_t a = pending_.indptr[off], b = pending_.indptr[off + rows];
      c.indptr.resize(rows + 1);
      for (int64_t r = 0; r <= rows; ++r) c.indptr[r] = pending_.indptr[off + r] - a;
      c.indices.assign(pending_.indices.begin() + a, pending_.indices.begin() + b);
      c.values.assign(pending_.values.begin() + a, pending_.values.begin() + b);
      nnz = b - a;
    } else {
      c.values.assign(pending_.values.begin() + off * width,
                      pending_.values.begin() + (off + rows) * width);
    }
    commit->PutChunkValue(db, keys::Chunk(record_.id, c.row_start), EncodeChunk(c, enc));
    commit->PutDirectory(db, record_.id, c.row_start, rows, nnz);
  }
}

// The per-latent part of a SPARSE commit: statistics and top-N (every format), postings (formats
// 1-2) or the latent-sliced chunks (format 3).
//
// First the entries are sorted latent-major by a counting sort, unit by unit: a unit is one chunk
// in format 3 (its 4096 rows' entries stay in L2 while they are scattered, and each latent slice
// of the chunk comes out as one contiguous run), the whole commit in formats 1-2 (their postings
// are per commit). Then the latents are cut into ranges of about equal entry counts at
// statistics-block (and slice) boundaries, one per commit thread, so every thread owns whole
// records and the batch comes out the same whatever the thread count.
void DatasetWriter::AddLatentWork(CommitBatch* commit) {
  Db* db = store_->db();
  const uint64_t id = record_.id;
  const int64_t n = pending_.num_rows;
  const int64_t nnz = pending_.indptr[n];
  const int64_t first_row = pending_.row_start;
  const int32_t width = record_.meta.width;
  const int top_n = record_.meta.top_n;
  const bool sliced = record_.format_version >= 3;
  const bool postings = !sliced && record_.meta.postings;
  const int parts =
      nnz >= kParallelCommitEntries ? std::max(1, store_->options().commit_threads) : 1;

  // The commit's latent space. Dense: every latent of the width, position c is latent c.
  // Compact (writers without resident state, i.e. wide SAEs): only the latents with an entry,
  // ascending, so a range of latents is a range of positions and the buffers below grow with the
  // commit, not the width (dense, at 16M latents they were 0.5 GB a commit, walked per chunk).
  LatentMajor& lm = latent_major_;
  const bool compact = !resident_;
  int32_t space = width;
  const int32_t* columns = pending_.indices.data();  // each entry's position
  if (compact) {
    const size_t words = static_cast<size_t>(width) / 64 + 1;
    lm.touched_bits.assign(words, 0);
    for (int64_t i = 0; i < nnz; ++i) {
      lm.touched_bits[columns[i] >> 6] |= uint64_t{1} << (columns[i] & 63);
    }
    lm.word_rank.resize(words);
    lm.touched.clear();
    int32_t rank = 0;
    for (size_t w = 0; w < words; ++w) {
      lm.word_rank[w] = rank;
      for (uint64_t bits = lm.touched_bits[w]; bits != 0; bits &= bits - 1) {
        lm.touched.push_back(static_cast<int32_t>(w * 64 + __builtin_ctzll(bits)));
      }
      rank += __builtin_popcountll(lm.touched_bits[w]);
    }
    space = rank;
  }
  // The latent at position c, and the first position whose latent is >= l (l <= width).
  auto latent_at = [&](int32_t c) { return compact ? lm.touched[c] : c; };
  auto position_of = [&](int32_t l) -> int32_t {
    if (!compact) return l;
    if (l >= width) return space;
    const uint64_t below = lm.touched_bits[l >> 6] & ((uint64_t{1} << (l & 63)) - 1);
    return lm.word_rank[l >> 6] + __builtin_popcountll(below);
  };
  if (compact) {
    lm.columns.resize(nnz);
    for (int64_t i = 0; i < nnz; ++i) lm.columns[i] = position_of(columns[i]);
    columns = lm.columns.data();
  }

  // Unit u holds rows [u * unit_rows, ...) of the commit; within it the entries of the latent at
  // position c are [starts[u * (space + 1) + c], starts[u * (space + 1) + c + 1]) of offsets
  // (row - unit's first row, ascending) and values. The buffers live as long as the writer.
  const int64_t unit_rows = sliced ? store_->options().sparse_chunk_rows : n;  // checked >= 1
  const int64_t units = (n + unit_rows - 1) / unit_rows;
  lm.starts.resize(units * (space + 1));
  lm.offsets.resize(nnz);
  lm.values.resize(nnz);
  auto unit_starts = [&](int64_t u) { return &lm.starts[u * (space + 1)]; };
  const int sort_parts = static_cast<int>(std::min<int64_t>(parts, units));
  RunParts(sort_parts, [&](int p) {
    std::vector<int64_t> cursor;
    const int64_t* indptr = pending_.indptr.data();
    for (int64_t u = p; u < units; u += sort_parts) {
      const int64_t r0 = u * unit_rows, r1 = std::min(n, r0 + unit_rows);
      int64_t* starts = unit_starts(u);
      std::fill(starts, starts + space + 1, 0);
      for (int64_t i = indptr[r0]; i < indptr[r1]; ++i) ++starts[columns[i] + 1];
      starts[0] = indptr[r0];
      for (int32_t c = 0; c < space; ++c) starts[c + 1] += starts[c];
      cursor.assign(starts, starts + space);
      int64_t* pos = cursor.data();
      for (int64_t r = r0; r < r1; ++r) {
        const uint32_t offset = static_cast<uint32_t>(r - r0);
        for (int64_t i = indptr[r]; i < indptr[r + 1]; ++i) {
          const int64_t slot = pos[columns[i]]++;
          lm.offsets[slot] = offset;
          lm.values[slot] = pending_.values[i];
        }
      }
    }
  });
  // Entries per position over the whole commit, cumulative: what the ranges are balanced on.
  std::vector<int64_t>& counts = lm.counts;
  counts.assign(space + 1, 0);
  for (int64_t u = 0; u < units; ++u) {
    const int64_t* starts = unit_starts(u);
    for (int32_t c = 0; c < space; ++c) counts[c + 1] += starts[c + 1] - starts[c];
  }
  for (int32_t c = 0; c < space; ++c) counts[c + 1] += counts[c];
  auto entries_before = [&](int32_t l) { return counts[position_of(l)]; };

  // Statistics, top-N and (formats 1-2) postings of latents [lo, hi), lo a block start.
  struct StatsOut {
    int64_t new_live = 0;
    KeyValues postings;
    KeyValues index;   // Puts: statistics and top-N blocks written whole
    KeyValues merges;  // Merges: statistics and top-N operands
    std::vector<CommitBatch::Fold> folds;
  };
  auto stats_pass = [&](int32_t lo, int32_t hi, StatsOut* out) {
    std::string key = keys::Posting(id, 0, first_row);
    std::vector<int64_t> posting_rows;
    LatentStats delta;       // a latent's statistics of this commit (blocks given few values)
    std::vector<float> raw;  // a latent's values when few: the operand carries them as they are
    // Wide datasets: the block's top-N candidates of this commit (each a list of its own).
    std::vector<TopRows> candidates(resident_ ? 0 : kLatentsPerBlock);
    for (int32_t c = position_of(lo), c_end = position_of(hi); c < c_end;) {
      const int32_t first = latent_at(c) / kLatentsPerBlock * kLatentsPerBlock;
      const int32_t size = std::min(kLatentsPerBlock, hi - first);
      const int32_t block_begin = c, block_end = position_of(first + size);  // positions
      c = block_end;
      if (counts[block_begin] == counts[block_end]) continue;  // no value in this block
      const size_t b = first / kLatentsPerBlock;
      // An operand only pays where the commit gave the block's latents few values (wide SAEs):
      // with many, its records are as large as the block's, and reads would fold them. Which
      // arithmetic a block's statistics take (values added one run at a time, or the commit's
      // delta merged, as a fold of operands does) depends on this alone, i.e. on the commit's
      // rows, so a resumed writer computes the same bits as an uninterrupted one. A writer
      // without resident state always writes the delta (and the fold of operands is the sum).
      const bool as_delta =
          !resident_ || counts[block_end] - counts[block_begin] <= kFewStatsValues * size;
      const bool stats_whole =
          resident_ && (!as_delta || ++stats_deltas_[b] >= kDeltasPerBlockWrite);
      if (stats_whole) stats_deltas_[b] = 0;
      StatsDeltaBuilder stats_delta(size);
      bool top_changed = false;
      for (TopRows& c : candidates) c.Clear();
      for (int32_t c = block_begin; c < block_end; ++c) {
        if (counts[c] == counts[c + 1]) continue;
        const int32_t l = latent_at(c);
        LatentStats* st = resident_ ? &stats_[l] : nullptr;
        if (resident_ ? st->firing_count == 0 : (fired_[b] >> (l - first) & 1) == 0) {
          ++out->new_live;
          if (!resident_) fired_[b] |= uint64_t{1} << (l - first);
        }
        if (as_delta) delta = LatentStats();
        raw.clear();
        const bool few = counts[c + 1] - counts[c] <= kRawStatsValues;
        TopRows& top = resident_ ? top_[l] : candidates[l - first];
        const float floor = resident_ ? -std::numeric_limits<float>::infinity() : top_floor_[l];
        for (int64_t u = 0; u < units; ++u) {
          const int64_t* starts = unit_starts(u);
          const int64_t begin = starts[c], end = starts[c + 1];
          if (begin == end) continue;
          if (as_delta) {
            delta.AddBatch(&lm.values[begin], end - begin);
            if (few) raw.insert(raw.end(), &lm.values[begin], &lm.values[end]);
          } else {
            st->AddBatch(&lm.values[begin], end - begin);
          }
          const int64_t unit_first = first_row + u * unit_rows;
          top_changed |= top.OfferRun(unit_first, &lm.offsets[begin], &lm.values[begin],
                                      end - begin, top_n, floor);
        }
        if (as_delta) {
          if (resident_) st->Merge(delta);  // the arithmetic every reader's fold repeats
          if (!stats_whole) stats_delta.Add(l - first, delta, raw.data());
        }
        if (postings) {  // one unit: the whole commit
          const int64_t begin = counts[c], end = counts[c + 1];
          posting_rows.resize(end - begin);
          for (int64_t i = begin; i < end; ++i) {
            posting_rows[i - begin] = first_row + lm.offsets[i];
          }
          for (int k = 0; k < 4; ++k) {  // the latent field of keys::Posting, big-endian
            key[8 + k] = static_cast<char>(static_cast<uint32_t>(l) >> (24 - 8 * k));
          }
          out->postings.emplace_back(key, std::string());
          if (record_.format_version >= 2) {
            EncodePosting(first_row, posting_rows.data(), &lm.values[begin], end - begin, dtype_,
                          &out->postings.back().second);
          } else {
            out->postings.back().second = EncodePostingV1(first_row, posting_rows.data(),
                                                          &lm.values[begin], end - begin, dtype_);
          }
        }
      }
      const std::string stats_key = keys::LatentStats(id, static_cast<uint32_t>(first));
      if (stats_whole) {
        out->index.emplace_back(stats_key, EncodeStatsBlock(&stats_[first], size));
      } else {
        out->merges.emplace_back(stats_key, stats_delta.Finish());
        if (!resident_ && ++stats_deltas_[b] >= kDeltasPerBlockWrite) {
          stats_deltas_[b] = 0;
          out->folds.push_back({stats_key, first, size, /*top=*/false});
        }
      }
      if (top_changed) {
        const std::string top_key = keys::LatentTop(id, static_cast<uint32_t>(first));
        const bool top_due = ++top_deltas_[b] >= kDeltasPerBlockWrite;
        if (top_due) top_deltas_[b] = 0;
        if (resident_ && top_due) {
          out->index.emplace_back(top_key, EncodeTopBlock(&top_[first], size));
        } else {
          const TopRows* lists = resident_ ? &top_[first] : candidates.data();
          out->merges.emplace_back(top_key, EncodeTopDelta(lists, size, top_n, first_row));
          if (top_due) out->folds.push_back({top_key, first, size, /*top=*/true});
        }
      }
    }
  };

  // Format 3: slices [s_lo, s_hi) of every chunk (unit), slice by slice.
  const SliceLayout layout = MakeSliceLayout(width, store_->options().latent_slices);
  std::vector<uint32_t> slice_nnz(sliced ? units * layout.num_slices : 0, 0);
  auto slice_pass = [&](int32_t s_lo, int32_t s_hi, KeyValues* out) {
    std::vector<int64_t> slice_keys;
    for (int32_t sl = s_lo; sl < s_hi; ++sl) {
      const int32_t l0 = layout.FirstLatent(sl);
      const int32_t l1 = std::min(l0 + layout.slice_width, width);
      const int32_t c0 = position_of(l0), c1 = position_of(l1);
      for (int64_t u = 0; u < units; ++u) {
        const int64_t* starts = unit_starts(u);
        const int64_t begin = starts[c0], end = starts[c1];
        if (begin == end) continue;
        const int row_bits = RowBits(std::min(unit_rows, n - u * unit_rows));
        slice_keys.resize(end - begin);
        for (int32_t c = c0; c < c1; ++c) {
          const int64_t high = static_cast<int64_t>(latent_at(c) - l0) << row_bits;
          for (int64_t i = starts[c]; i < starts[c + 1]; ++i) {
            slice_keys[i - begin] = high | lm.offsets[i];
          }
        }
        slice_nnz[u * layout.num_slices + sl] = static_cast<uint32_t>(end - begin);
        out->emplace_back(keys::ChunkPart(id, first_row + u * unit_rows,
                                          static_cast<uint16_t>(kPartFirstSlice + sl)),
                          std::string());
        EncodeSlice(slice_keys.data(), &lm.values[begin], end - begin, dtype_, &out->back().second);
      }
    }
  };

  const std::vector<int32_t> stat_bounds =
      SplitLatents(entries_before, width, kLatentsPerBlock, parts);
  std::vector<int32_t> slice_bounds;
  if (sliced) {
    for (int32_t l : SplitLatents(entries_before, width, layout.slice_width, parts)) {
      slice_bounds.push_back((l + layout.slice_width - 1) / layout.slice_width);
    }
  }
  std::vector<StatsOut> stats_out(stat_bounds.size() - 1);
  std::vector<KeyValues> slices_out(sliced ? slice_bounds.size() - 1 : 0);
  const int tasks = static_cast<int>(std::max(stats_out.size(), slices_out.size()));
  RunParts(tasks, [&](int p) {
    // Formats 1-2 encode their row-major chunks here, beside the other threads' latent work.
    if (p == 0 && !sliced) AddRowMajorChunks(commit);
    if (p < static_cast<int>(stats_out.size())) {
      stats_pass(stat_bounds[p], stat_bounds[p + 1], &stats_out[p]);
    }
    if (p < static_cast<int>(slices_out.size())) {
      slice_pass(slice_bounds[p], slice_bounds[p + 1], &slices_out[p]);
    }
  });

  commit->top_n = top_n;
  commit->dataset_id = id;
  for (const StatsOut& out : stats_out) {
    commit->next.live_latents += out.new_live;
    commit->folds.insert(commit->folds.end(), out.folds.begin(), out.folds.end());
    for (const auto& [k, v] : out.postings) commit->batch.Put(db->handle(Family::kPostings), k, v);
    for (const auto& [k, v] : out.index) commit->batch.Put(db->handle(Family::kLatentIndex), k, v);
    for (const auto& [k, v] : out.merges)
      commit->batch.Merge(db->handle(Family::kLatentIndex), k, v);
  }
  if (!sliced) return;
  for (int64_t c = 0; c < units; ++c) {
    SlicedChunkHeader header;
    header.dtype = dtype_;
    header.row_start = first_row + c * unit_rows;
    header.num_rows = std::min(unit_rows, n - c * unit_rows);
    header.layout = layout;
    header.slice_nnz.assign(slice_nnz.begin() + c * layout.num_slices,
                            slice_nnz.begin() + (c + 1) * layout.num_slices);
    for (uint32_t k : header.slice_nnz) header.nnz += k;
    commit->PutChunkValue(db, keys::ChunkPart(id, header.row_start, kPartHeader),
                          EncodeSlicedHeader(header));
    commit->PutChunkValue(
        db, keys::ChunkPart(id, header.row_start, kPartTokens),
        EncodeTokenPart(pending_.token_ids.data() + c * unit_rows, header.num_rows));
    commit->PutDirectory(db, id, header.row_start, header.num_rows, header.nnz);
  }
  for (const KeyValues& out : slices_out) {
    for (const auto& [k, v] : out) commit->PutChunkValue(db, k, v);
  }
}

absl::Status DatasetWriter::AddReconstructionSums(const ReconstructionFit& sums) {
  RETURN_IF_ERROR(Usable());
  if (sums.rows > 0 && fit_ahead_.rows > 0 && fit_ahead_.sum_x.size() != sums.sum_x.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reconstruction sums of ", sums.sum_x.size(), " dimensions for dataset ",
                     record_.id, ", whose totals have ", fit_ahead_.sum_x.size()));
  }
  return pending_fit_.Add(sums);
}

absl::Status DatasetWriter::StartCommit(bool background) {
  RETURN_IF_ERROR(Usable());
  const int64_t n = pending_.num_rows;
  Db* db = store_->db();
  const uint64_t id = record_.id;
  std::unique_ptr<CommitBatch> commit;
  if (n > 0) {
    // Built while the previous batch (if any) is still being written.
    commit = std::make_unique<CommitBatch>();
    commit->next = ahead_;
    commit->blob_bytes = blob_bytes_ahead_;
    if (pending_.kind == ChunkKind::kSparse) {
      AddLatentWork(commit.get());
    } else {
      AddRowMajorChunks(commit.get());
    }
    commit->next.rows_committed += n;
    commit->batch.Put(db->handle(Family::kMeta), keys::Watermark(id),
                      EncodeWatermark(commit->next, commit->blob_bytes));
    if (pending_fit_.rows > 0) {
      commit->fit = fit_ahead_;
      RETURN_IF_ERROR(commit->fit.Add(pending_fit_));
      commit->batch.Put(db->handle(Family::kMeta), keys::Fit(id), commit->fit.Encode());
    }
  }
  RETURN_IF_ERROR(WaitDurable());
  if (commit == nullptr) return absl::OkStatus();
  ahead_ = commit->next;
  blob_bytes_ahead_ = commit->blob_bytes;
  if (pending_fit_.rows > 0) fit_ahead_ = commit->fit;
  pending_fit_ = ReconstructionFit();
  pending_.row_start = ahead_.rows_committed;
  pending_.num_rows = 0;
  pending_.indptr.assign(1, 0);
  pending_.indices.clear();
  pending_.values.clear();
  pending_.token_ids.clear();
  in_flight_ = std::move(commit);
  if (!background) {
    in_flight_status_ = in_flight_->Write(db);
    return WaitDurable();
  }
  // One long-lived thread writes every batch of this writer: RocksDB writes from a fresh thread
  // each time cost about twice the CPU (measured with many small keys a batch).
  if (!writer_thread_.joinable()) {
    writer_thread_ = std::thread([this, db] {
      absl::MutexLock lock(&write_mu_);
      while (true) {
        write_mu_.Await(absl::Condition(
            +[](DatasetWriter* w) { return w->write_requested_ || w->stop_writer_; }, this));
        if (!write_requested_) return;  // stopping with nothing to write
        write_mu_.Unlock();
        absl::Status s = in_flight_->Write(db);
        write_mu_.Lock();
        in_flight_status_ = s;
        write_requested_ = false;
      }
    });
  }
  absl::MutexLock lock(&write_mu_);
  write_requested_ = true;
  return absl::OkStatus();
}

absl::Status DatasetWriter::CommitAsync() { return StartCommit(/*background=*/true); }

absl::Status DatasetWriter::Commit() { return StartCommit(/*background=*/false); }

absl::Status DatasetWriter::WaitDurable() {
  if (in_flight_ == nullptr) return failed_;
  {
    absl::MutexLock lock(&write_mu_);
    write_mu_.Await(absl::Condition(
        +[](DatasetWriter* w) { return !w->write_requested_; }, this));
  }
  const DatasetRecord next = in_flight_->next;
  // Floors only rise: each was a full list's last value, and a list's last value never falls.
  for (const auto& [latent, floor] : in_flight_->floors) {
    top_floor_[latent] = std::max(top_floor_[latent], floor);
  }
  in_flight_.reset();
  if (!in_flight_status_.ok()) {
    // The in-memory statistics now run ahead of the store: refuse further use.
    const absl::Status& s = in_flight_status_;
    failed_ =
        absl::Status(s.code(), absl::StrCat("commit of rows [", record_.rows_committed, ", ",
                                            next.rows_committed, ") of dataset ", record_.id,
                                            " failed; the store keeps ", record_.rows_committed,
                                            " committed rows: ", s.message()));
    return failed_;
  }
  record_ = next;
  return absl::OkStatus();
}

absl::Status DatasetWriter::MarkComplete() {
  RETURN_IF_ERROR(Commit());
  Db* db = store_->db();
  DatasetRecord done = record_;
  done.complete = true;
  rocksdb::WriteBatch batch;
  batch.Put(db->handle(Family::kMeta), keys::Watermark(record_.id),
            EncodeWatermark(done, blob_bytes_ahead_));
  RETURN_IF_ERROR(db->Write(&batch, /*sync=*/true));
  record_.complete = true;
  return absl::OkStatus();
}

}  // namespace latentd::storage
