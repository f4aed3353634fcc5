// The chunk store: datasets of extraction output (SPARSE SAE latents as CSR rows, or DENSE hidden
// states), written by one DatasetWriter at a time in synced, atomic commits and read by anyone.
//
// Guarantees:
//  - A commit is one synced WriteBatch holding the new chunks, their directory entries, the
//    statistics deltas and the committed-row watermark. After a crash a dataset holds exactly its
//    committed prefix; readers see only committed rows (every read runs on one RocksDB snapshot,
//    so a concurrent commit is either wholly visible or not at all).
//  - Chunk keys are (dataset, first row[, part]): a writer reopened after a crash resumes at the
//    watermark and overwrites, never duplicates.
//  - Every stored chunk value carries a CRC32C; a mismatch is DATA_LOSS naming the dataset and
//    chunk.
//  - Per-latent statistics and top-N rows are maintained at commit time; SPARSE rows are readable
//    both by row range and latent-major (every row where a latent fires) without a second copy of
//    the values (format 3, storage/sliced_chunk.h).
// See docs/STORAGE.md for the key layout and codecs.
//
// Thread-safe. The Db must outlive the store, and the store every writer it opened.
#ifndef LATENTD_STORAGE_CHUNK_STORE_H_
#define LATENTD_STORAGE_CHUNK_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/latentd/v1/datasets.pb.h"
#include "storage/chunk_codec.h"
#include "storage/db.h"
#include "storage/latent_stats.h"
#include "storage/reconstruction_fit.h"

namespace latentd::storage {

enum class DatasetKind { kSparse, kDense };
enum class ValueDtype { kFloat16, kBFloat16, kFloat32 };

struct DatasetMeta {  // what the creator fills in; the store adds id, created time, counters
  std::string name;   // unique among datasets (ALREADY_EXISTS otherwise); not empty
  DatasetKind kind = DatasetKind::kSparse;
  ValueDtype value_dtype = ValueDtype::kFloat16;
  std::string model_id, model_weight_hash, hook_name;
  // SPARSE: identifies the SAE's weights, so a resumed writer cannot mix two SAEs in one
  // dataset. Stored after every older field, so records without it read as "".
  std::string sae_weight_hash;
  // SPARSE by a transcoder: the hook its decoder predicts (hook_name is the one it encodes);
  // "" for an SAE. Stored after sae_weight_hash, so older records read as "".
  std::string hook_name_out;
  int32_t layer = 0;
  int32_t d_in = 0;
  std::string encoder;  // "topk", "relu", "jumprelu"; "" for dense
  int32_t k = 0;
  std::string threshold_policy;
  bool apply_b_dec_to_input = true;
  int32_t width = 0;           // d_sae for SPARSE, d_in for DENSE; > 0
  int32_t context_length = 0;  // rows per sequence; 0 = one sequence (no boundaries)
  std::string token_source;
  int64_t token_order_start = 0;
  uint64_t job_id = 0;
  int64_t rows_planned = 0;
  int32_t top_n = 64;  // rows kept per latent by value, 0..4096
  // Format 2 only: maintain latent-major postings (a second copy of every value). Format-3
  // datasets answer LatentPostings from their latent slices whatever this says.
  bool postings = true;
};

// A dataset as the store knows it.
struct DatasetRecord {
  uint64_t id = 0;
  DatasetMeta meta;
  int64_t created_unix_micros = 0;
  int64_t rows_committed = 0;
  int64_t nnz = 0;
  int64_t num_chunks = 0;
  int64_t live_latents = 0;  // latents that fired at least once
  bool complete = false;
  // On-disk format of the dataset (ChunkStoreOptions::record_version at creation), kept for the
  // dataset's life so its chunks never mix layouts: 1 and 2 store SPARSE rows as row-major chunks
  // plus optional postings (format 1 varint, format 2 Elias-Fano), 3 as latent-sliced chunks.
  uint32_t format_version = 0;
};

// Checks a row range against the dataset's committed rows, as every reader does, and resolves
// *row_count 0 to "to the committed end": INVALID_ARGUMENT for a negative count, OUT_OF_RANGE
// for a start or end past the watermark.
absl::Status CheckRowRange(const DatasetRecord& rec, int64_t row_start, int64_t* row_count);

// The values a row holds at the dataset's mean, for sizing blocks, buffers and estimates before
// a range is read: SPARSE its firings per committed row so far (0 before the first commit),
// DENSE its width.
inline double MeanValuesPerRow(const DatasetRecord& rec) {
  if (rec.meta.kind == DatasetKind::kDense) return rec.meta.width;
  return rec.rows_committed > 0 ? static_cast<double>(rec.nnz) / rec.rows_committed : 0;
}

// Rows [row_start, row_start + num_rows) as CSR (indptr starts at 0), with one token id per row.
struct CsrRows {
  int64_t row_start = 0;
  int64_t num_rows = 0;
  int32_t num_cols = 0;
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices;
  std::vector<float> values;
  std::vector<int32_t> token_ids;
};

struct TopActivationContext {
  int64_t row = 0;
  float value = 0;
  int32_t token_id = 0;
  int64_t context_start_row = 0;  // first row of the window (clipped at the sequence start)
  std::vector<int32_t> context_token_ids;
  // The latent's value on each row of the window (0 where it does not fire), parallel to
  // context_token_ids.
  std::vector<float> context_values;
};

// Rows of one value interval of a latent, sampled across it (SAEDashboard's "interval samples":
// what the latent does at moderate activations, which the top-N never shows).
struct ActivationInterval {
  float low = 0;  // [low, high); the last interval includes high (the latent's max)
  float high = 0;
  int64_t count = 0;  // entries of the latent whose value lies in it
  std::vector<TopActivationContext> samples;
};

inline constexpr uint32_t kLatestRecordVersion = 3;

struct ChunkStoreOptions {
  // Rows per chunk of DENSE datasets and of SPARSE datasets of format 1-2: a commit splits its
  // rows into chunks of at most this many. Default 1024 (1 MiB of fp32 rows at d_in 256).
  int64_t chunk_rows = 1024;
  // Rows per chunk of SPARSE format-3 datasets. Default 4096: a row-range read decodes whole
  // chunks (about 390 KiB at X1's shape), a latent read one slice per chunk (docs/STORAGE.md has
  // the measured trade-off). In [1, 2^31): CreateDataset / OpenWriter are INVALID_ARGUMENT
  // otherwise.
  int64_t sparse_chunk_rows = 4096;
  // Latent slices per SPARSE format-3 chunk (at most; never more than the width). Default 32: a
  // latent read reads 1/32 of the data, a row-range read seeks to 34 parts per chunk (more slices
  // trade row reads for latent reads; docs/STORAGE.md has the measured sweep). Clamped to
  // [1, 65533] (the part field of a chunk key is 16 bits).
  int32_t latent_slices = 32;
  // Threads a large commit spreads its per-latent work over (statistics, top-N, slices),
  // the calling thread included. 0 (default): hardware threads - 1, within [1, 4]: one core is
  // left to the writer thread and RocksDB (on 2 cores a second commit thread bought no wall time
  // and cost 13% more CPU, docs/STORAGE.md).
  int32_t commit_threads = 0;
  // Format of datasets created from now on: 3 (default) or 2 (row-major chunks + postings, kept
  // for comparisons and for datasets written before format 3).
  uint32_t record_version = kLatestRecordVersion;
  // Index encoding of new row-major chunks (formats 1-2). Default bit-packed gaps.
  IndexEncoding index_encoding = IndexEncoding::kIndexBitPacked;
  // A writer of a SPARSE dataset at most this wide (default 131072) holds every latent's
  // statistics and top-N list in memory (~0.5 KiB + 16 B per list entry a latent, ~1.5 GiB at
  // 1M latents with full lists). A wider one holds 4 bytes and a bit a latent: its commits
  // write only merge operands, a latent's top-N candidates are cut at a floor learned from the
  // stored lists, and every 16th operand of a block the writer thread folds the block from the
  // store and writes it back whole; a commit's latent-major sort covers only the latents it
  // touches, not the width (docs/STORAGE.md "Wide SAEs"). Readers see the same counts,
  // extremes, histograms and lists either way; statistics sums may differ in their last bits,
  // so keep the value for the life of a dataset (the daemon never changes it).
  int32_t resident_latent_state_max_width = 1 << 17;
};

class DatasetWriter;

// The most sequences ChunkStore::TopSequences returns.
inline constexpr int32_t kMaxTopSequences = 1000;

class ChunkStore {
 public:
  explicit ChunkStore(Db* db, const ChunkStoreOptions& options = ChunkStoreOptions());
  ~ChunkStore();

  // INVALID_ARGUMENT naming the field; ALREADY_EXISTS for a taken name.
  absl::StatusOr<uint64_t> CreateDataset(const DatasetMeta& meta);
  absl::StatusOr<uint64_t> FindDataset(const std::string& name) const;  // NOT_FOUND
  absl::StatusOr<DatasetRecord> GetRecord(uint64_t id) const;           // NOT_FOUND
  // GetRecord of a dataset that has latents: FAILED_PRECONDITION for a DENSE one.
  absl::StatusOr<DatasetRecord> GetSparseRecord(uint64_t id) const;
  // The summary as the API shows it (rows, nnz, density, dead latents, bytes on disk).
  absl::StatusOr<latentd::v1::DatasetInfo> GetDataset(uint64_t id) const;
  // Every dataset's summary; a dataset whose metadata cannot be read is listed as unreadable
  // (with its error) instead of failing the listing. Fails only when the store cannot be read.
  absl::StatusOr<latentd::v1::ListDatasetsResponse> ListDatasets() const;
  // The reconstruction totals of the committed rows (DatasetWriter::AddReconstructionSums); no
  // rows when none were given. DATA_LOSS naming the dataset for damaged totals.
  absl::StatusOr<ReconstructionFit> GetReconstructionFit(uint64_t id) const;
  // Hands an unfinished dataset from job `from_job` (which failed or was cancelled) to `to_job`,
  // which then resumes it at its watermark: one synced write of the record. FAILED_PRECONDITION
  // while a writer is open or when the dataset is not `from_job`'s.
  absl::Status ReassignDataset(uint64_t id, uint64_t from_job, uint64_t to_job);
  // Removes every key of the dataset in one synced batch, then compacts its key ranges so that
  // its files are freed before this returns (files a concurrent reader's snapshot still needs
  // stay until a later compaction). FAILED_PRECONDITION while a writer is open. A dataset whose
  // record or watermark is damaged is deleted too (its names come from the name index).
  absl::Status DeleteDataset(uint64_t id);

  // Rows [row_start, row_start + row_count) of a SPARSE dataset; row_count 0 means to the
  // committed end. OUT_OF_RANGE past the watermark; DATA_LOSS for a corrupt chunk.
  absl::StatusOr<CsrRows> ReadRows(uint64_t id, int64_t row_start, int64_t row_count) const;
  // ReadRows of a set of rows: of [row_start, row_start + row_count) (row_count > 0), the rows
  // whose bit row - row_start is set in `keep` come back with their latents, the others may come
  // back empty (format 3 decodes no value of theirs and assembles nothing for them; a format-2
  // chunk returns them whole). Token ids come for every row. INVALID_ARGUMENT when `keep` is
  // shorter than (row_count + 63) / 64 words; otherwise errors as ReadRows.
  absl::StatusOr<CsrRows> ReadRowSet(uint64_t id, int64_t row_start, int64_t row_count,
                                     const std::vector<uint64_t>& keep) const;
  // The latents firing on `row` (one CSR row).
  absl::StatusOr<CsrRows> RowLatents(uint64_t id, int64_t row) const;
  // Rows [row_start, row_start + row_count) of a DENSE dataset as row-major floats.
  absl::Status ReadDense(uint64_t id, int64_t row_start, int64_t row_count,
                         std::vector<float>* values, std::vector<int32_t>* token_ids) const;
  // Token ids of committed rows [row_start, row_start + row_count).
  absl::Status ReadTokens(uint64_t id, int64_t row_start, int64_t row_count,
                          std::vector<int32_t>* token_ids) const;
  // First row of every committed chunk, ascending (the last chunk ends at rows_committed):
  // trainers shuffle chunk order and rows within a chunk.
  absl::StatusOr<std::vector<int64_t>> ChunkRowStarts(uint64_t id) const;

  // Statistics of latent `latent` (INVALID_ARGUMENT outside [0, width)).
  absl::StatusOr<LatentStats> GetLatentStats(uint64_t id, int32_t latent) const;
  // The statistics of every latent of a SPARSE dataset, from its statistics blocks at one
  // snapshot (one read per 64 latents, never the rows): visit(latent, stats) for latents 0, 1, ...
  // width - 1 in order, those that never fired included (firing_count 0). *rows_committed, when
  // not null, is the committed row count at the same snapshot, set before the first visit.
  // FAILED_PRECONDITION for a DENSE
  // dataset; DATA_LOSS naming the block for a malformed one (nothing more is visited).
  absl::Status ForEachLatentStats(
      uint64_t id, int64_t* rows_committed,
      const std::function<void(int32_t latent, const LatentStats& stats)>& visit) const;
  // The top `top_n` rows of the latent by value (at most the dataset's top_n), each with the token
  // ids of [row - before, row + after] clipped to the row's sequence and the committed rows.
  absl::StatusOr<std::vector<TopActivationContext>> TopActivations(uint64_t id, int32_t latent,
                                                                   int32_t top_n, int32_t before,
                                                                   int32_t after) const;
  // The top `top_n` sequences of the latent (delphi's and SAEDashboard's "top examples"): per
  // sequence of context_length rows (every row its own when the dataset has none) the row of its
  // largest value (the earliest on ties), ranked by value descending then row ascending, with
  // context windows as TopActivations gives them. Unlike TopActivations, neighbouring rows of one
  // sequence never crowd the list, and top_n is not bounded by the stored top-N: it reads every
  // row of the latent (LatentPostings). INVALID_ARGUMENT for top_n outside [1, kMaxTopSequences] or
  // a negative window.
  absl::StatusOr<std::vector<TopActivationContext>> TopSequences(uint64_t id, int32_t latent,
                                                                 int32_t top_n, int32_t before,
                                                                 int32_t after) const;
  // The latent's value range [min, max] cut into `intervals` intervals of equal width (one when
  // min == max), each with its entry count and up to `per_interval` of its rows, spread evenly
  // over them in row order (deterministic), with context windows as TopActivations gives them.
  // Reads every row of the latent (LatentPostings). INVALID_ARGUMENT naming the field for
  // intervals or per_interval outside [1, 1000] or a negative window; an empty vector for a
  // latent that never fired.
  absl::StatusOr<std::vector<ActivationInterval>> IntervalSamples(uint64_t id, int32_t latent,
                                                                  int32_t intervals,
                                                                  int32_t per_interval,
                                                                  int32_t before,
                                                                  int32_t after) const;
  // Up to `count` rows where the latent does not fire, each with a window (as TopActivations
  // gives them) in which it never fires: the contrast an explanation of the latent is scored
  // against (delphi's non-activating examples), and what a reader compares its top examples
  // with. Rows are drawn uniformly from the committed rows by a generator seeded with `seed` and
  // the latent, so an answer is reproducible; fewer come back when the latent fires almost
  // everywhere (64 draws per row asked). Row order. INVALID_ARGUMENT for count outside
  // [1, 1000] or a negative window.
  absl::StatusOr<std::vector<TopActivationContext>> SilentSamples(uint64_t id, int32_t latent,
                                                                  int32_t count, int32_t before,
                                                                  int32_t after,
                                                                  uint64_t seed) const;
  // Every committed row in [row_begin, row_end) where the latent fires, ascending, with its
  // value: one small read per chunk (format 3) or one range read of the postings (format 2).
  // The range is clipped to the committed rows; INVALID_ARGUMENT for a negative row_begin.
  // FAILED_PRECONDITION for a format-2 dataset created without postings.
  absl::Status LatentPostings(uint64_t id, int32_t latent, std::vector<int64_t>* rows,
                              std::vector<float>* values, int64_t row_begin = 0,
                              int64_t row_end = INT64_MAX) const;

  // The writer of a dataset, resuming at its watermark. FAILED_PRECONDITION if another writer
  // of the dataset is open or the dataset is complete.
  absl::StatusOr<std::unique_ptr<DatasetWriter>> OpenWriter(uint64_t id);

  Db* db() const { return db_; }
  const ChunkStoreOptions& options() const { return options_; }

 private:
  friend class DatasetWriter;
  void ReleaseWriter(uint64_t id);
  absl::StatusOr<DatasetRecord> GetRecordAt(const rocksdb::Snapshot* snap, uint64_t id) const;
  absl::StatusOr<uint64_t> BytesOnDisk(uint64_t id) const;
  // Visits the decoded chunks overlapping [row_start, row_start + row_count) in order, whatever
  // the dataset's format (format-3 chunks are assembled into CSR from their slices). With `keep`
  // (a bitmap, bit row - row_start), format-3 rows outside it come back empty.
  template <typename Visit>
  absl::Status ForEachChunk(const rocksdb::Snapshot* snap, const DatasetRecord& rec,
                            int64_t row_start, int64_t row_count, bool tokens_only, Visit visit,
                            const uint64_t* keep = nullptr) const;
  template <typename Visit>
  absl::Status ForEachSlicedChunk(const rocksdb::Snapshot* snap, const DatasetRecord& rec,
                                  int64_t row_start, int64_t row_count, bool tokens_only,
                                  Visit visit, const uint64_t* keep) const;
  // ReadRows and ReadRowSet (keep null: every row).
  absl::StatusOr<CsrRows> ReadRowsKeeping(uint64_t id, int64_t row_start, int64_t row_count,
                                          const uint64_t* keep) const;
  // What a query showing a latent's firings with context windows starts from: the window
  // checked (INVALID_ARGUMENT when negative), then the record and every committed firing of the
  // latent at `snap`.
  struct LatentFirings {
    DatasetRecord record;
    std::vector<int64_t> rows;  // ascending
    std::vector<float> values;
  };
  absl::StatusOr<LatentFirings> FiringsForWindows(const rocksdb::Snapshot* snap, uint64_t id,
                                                  int32_t latent, int32_t before,
                                                  int32_t after) const;
  // LatentPostings at a snapshot, of the committed rows in [row_begin, row_end) (rows and values
  // cleared first).
  absl::Status LatentPostingsAt(const rocksdb::Snapshot* snap, const DatasetRecord& rec,
                                int32_t latent, int64_t row_begin, int64_t row_end,
                                std::vector<int64_t>* rows, std::vector<float>* values) const;
  // What one query's context windows have read so far (chunks' token ids, the latent's run in
  // chunks), so that windows sharing a chunk read it once. Defined in the .cc.
  struct WindowCache;
  // Fills t's token id, the window [row - before, row + after] clipped to the row's sequence
  // and the committed rows, and the latent's value on each of its rows (t->row set by the
  // caller). `firings`, when not null, holds every firing of the latent at `snap`; else the
  // window's are read.
  absl::Status FillContext(const rocksdb::Snapshot* snap, const DatasetRecord& rec, int32_t latent,
                           int32_t before, int32_t after, const LatentFirings* firings,
                           WindowCache* cache, TopActivationContext* t) const;
  // The two layouts' halves of LatentPostingsAt: they may append rows outside the range of the
  // chunks or commits holding its ends (the caller trims them).
  absl::Status SlicedLatentPostings(const rocksdb::Snapshot* snap, const DatasetRecord& rec,
                                    int32_t latent, int64_t row_begin, int64_t row_end,
                                    std::vector<int64_t>* rows, std::vector<float>* values) const;
  absl::Status RowMajorLatentPostings(const rocksdb::Snapshot* snap, const DatasetRecord& rec,
                                      int32_t latent, int64_t row_begin, int64_t row_end,
                                      std::vector<int64_t>* rows, std::vector<float>* values) const;

  Db* const db_;
  const ChunkStoreOptions options_;
  mutable absl::Mutex mu_;
  std::set<uint64_t> open_writers_ ABSL_GUARDED_BY(mu_);
};

// Appends rows to one dataset and commits them. Not thread-safe (one thread drives a writer).
// After a failed commit the writer refuses further calls: reopen it to resume at the watermark.
class DatasetWriter {
 public:
  ~DatasetWriter();  // waits for a commit in flight

  // The durable watermark: rows of commits whose batch is synced.
  int64_t rows_committed() const { return record_.rows_committed; }
  // Appended rows not handed to a commit yet. The next row appended is
  // rows_committed() + rows_in_flight() + rows_pending().
  int64_t rows_pending() const { return static_cast<int64_t>(pending_.token_ids.size()); }
  int64_t rows_in_flight() const { return ahead_.rows_committed - record_.rows_committed; }
  uint64_t dataset_id() const { return record_.id; }

  // CSR rows: indptr has num_rows + 1 entries starting at 0; indices need not be sorted (the
  // writer sorts per row) but must be unique within a row and in [0, width); values finite.
  // Entries whose value is exactly 0 are dropped (a zero is not a firing), so nnz, statistics
  // and postings count only firings. (A tiny value that rounds to 0 in fp16 is kept.)
  absl::Status AppendSparse(int64_t num_rows, const int64_t* indptr, const int32_t* indices,
                            const float* values, const int32_t* token_ids);
  // Dense rows: num_rows x width floats, stored in the dataset's dtype.
  absl::Status AppendDense(int64_t num_rows, const float* values, const int32_t* token_ids);
  // How well the SAE that encoded the rows appended since the last commit reconstructs their
  // activations (the caller computes the sums; several calls add up). The commit that makes
  // those rows durable adds them to the dataset's totals in the same batch, and they are lost
  // with the rows otherwise, so the totals (DatasetInfo.fit) always describe committed rows,
  // however often a job was interrupted. INVALID_ARGUMENT for sums of another dimension than
  // before.
  absl::Status AddReconstructionSums(const ReconstructionFit& sums);
  // Everything pending in one synced WriteBatch (chunks + watermark + stats deltas + postings);
  // returns once it is durable (and a batch in flight before it).
  absl::Status Commit();
  // Encodes everything pending into one batch on the calling thread, then has a background
  // thread write it (synced) and returns: the caller appends and encodes the next rows while the
  // batch is written. At most one batch is in flight: CommitAsync first waits for the previous
  // one and returns its error if it failed. Batches reach the store in order, each atomic, so a
  // crash still leaves exactly a committed prefix.
  absl::Status CommitAsync();
  // Waits for the batch in flight, if any; its status (OK when there is none).
  absl::Status WaitDurable();
  // Commits, then flags the dataset complete (no writer can open it afterwards).
  absl::Status MarkComplete();

 private:
  friend class ChunkStore;
  DatasetWriter(ChunkStore* store, DatasetRecord record);
  absl::Status LoadLatentState();
  absl::Status Usable() const;
  // Encodes the pending rows, waits for the batch in flight, then writes the new batch on a
  // background thread (CommitAsync) or on this one (Commit).
  absl::Status StartCommit(bool background);

  // Commit() pieces: the chunks (and directory entries) of the pending rows into *batch.
  struct CommitBatch;
  void AddRowMajorChunks(CommitBatch* commit);
  void AddLatentWork(CommitBatch* commit);

  ChunkStore* const store_;
  DatasetRecord record_;  // as durable in the store
  DatasetRecord ahead_;   // record_ plus the batch in flight: what the next commit builds on
  int64_t blob_bytes_ahead_ = 0;
  ChunkDtype dtype_;
  Chunk pending_;  // row_start = ahead_.rows_committed; values already rounded to the dtype
  ReconstructionFit pending_fit_;  // of the pending rows
  ReconstructionFit fit_ahead_;    // the dataset's totals, the batch in flight included
  // Per-latent state of SPARSE datasets. Resident (width <= resident_latent_state_max_width):
  // stats_ and top_ hold every latent's statistics and list, as the store has them after the
  // batch in flight. Otherwise only top_floor_ (a value at or below which nothing can enter the
  // latent's stored list: its last value when full, as last read from the store; -inf) and
  // fired_ (a bit per latent that ever fired; a 64-bit word per block of kLatentsPerBlock).
  bool resident_ = true;
  std::vector<LatentStats> stats_;
  std::vector<TopRows> top_;
  std::vector<float> top_floor_;
  std::vector<uint64_t> fired_;
  std::vector<int> top_deltas_;    // per top-N block: operands written since it was last whole
  std::vector<int> stats_deltas_;  // per statistics block: the same
  struct LatentMajor {  // a SPARSE commit's entries sorted by latent (AddLatentWork); reused
    std::vector<int64_t> starts, counts;
    std::vector<uint32_t> offsets;
    std::vector<float> values;
    // The compact latent space of writers without resident state: a bit per latent that has an
    // entry in the commit, the touched latents before each 64-bit word, the touched latents in
    // order, and each entry's position among them.
    std::vector<uint64_t> touched_bits;
    std::vector<int32_t> word_rank, touched, columns;
  } latent_major_;
  std::unique_ptr<CommitBatch> in_flight_;  // the batch handed over, durable or not yet
  std::thread writer_thread_;               // started by the first CommitAsync
  absl::Mutex write_mu_;
  bool write_requested_ ABSL_GUARDED_BY(write_mu_) = false;  // in_flight_ awaits the thread
  bool stop_writer_ ABSL_GUARDED_BY(write_mu_) = false;
  absl::Status in_flight_status_;  // written by whoever wrote in_flight_
  absl::Status failed_;
};

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_CHUNK_STORE_H_
