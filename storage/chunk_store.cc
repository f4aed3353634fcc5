#include "storage/chunk_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/big_endian.h"
#include "common/status_macros.h"
#include "rocksdb/options.h"
#include "storage/byte_io.h"
#include "storage/crc32c.h"
#include "storage/id_counter.h"
#include "storage/keys.h"
#include "storage/posting_codec.h"
#include "storage/sliced_chunk.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

// Version 1: row-major chunks + postings as varint row deltas + values (EncodePostingV1).
// Version 2: the same with postings in storage/posting_codec.h (Elias-Fano rows, packed values).
// Version 3: SPARSE chunks as latent slices (storage/sliced_chunk.h), no postings family. A
// dataset keeps the version it was created with, so its chunks never mix layouts.
constexpr uint32_t kRecordVersion = kLatestRecordVersion;

std::string EncodeRecord(const DatasetRecord& r) {
  const DatasetMeta& m = r.meta;
  std::string out;
  PutRaw<uint32_t>(r.format_version, &out);
  PutRaw<uint64_t>(r.id, &out);
  PutRaw<int64_t>(r.created_unix_micros, &out);
  PutString(m.name, &out);
  PutRaw<uint8_t>(static_cast<uint8_t>(m.kind), &out);
  PutRaw<uint8_t>(static_cast<uint8_t>(m.value_dtype), &out);
  PutString(m.model_id, &out);
  PutString(m.model_weight_hash, &out);
  PutString(m.hook_name, &out);
  PutRaw<int32_t>(m.layer, &out);
  PutRaw<int32_t>(m.d_in, &out);
  PutString(m.encoder, &out);
  PutRaw<int32_t>(m.k, &out);
  PutString(m.threshold_policy, &out);
  PutRaw<uint8_t>(m.apply_b_dec_to_input, &out);
  PutRaw<int32_t>(m.width, &out);
  PutRaw<int32_t>(m.context_length, &out);
  PutString(m.token_source, &out);
  PutRaw<int64_t>(m.token_order_start, &out);
  PutRaw<uint64_t>(m.job_id, &out);
  PutRaw<int64_t>(m.rows_planned, &out);
  PutRaw<int32_t>(m.top_n, &out);
  PutRaw<uint8_t>(m.postings, &out);
  // Fields added later follow, so older records (which end here) still decode.
  PutString(m.sae_weight_hash, &out);
  PutString(m.hook_name_out, &out);
  return out;
}

absl::Status ValidateMeta(const DatasetMeta& m);

absl::Status DecodeRecord(absl::string_view in, DatasetRecord* r) {
  ByteReader rd(in);
  DatasetMeta& m = r->meta;
  uint32_t version = rd.Raw<uint32_t>();
  r->id = rd.Raw<uint64_t>();
  r->created_unix_micros = rd.Raw<int64_t>();
  m.name = rd.String();
  m.kind = static_cast<DatasetKind>(rd.Raw<uint8_t>());
  m.value_dtype = static_cast<ValueDtype>(rd.Raw<uint8_t>());
  m.model_id = rd.String();
  m.model_weight_hash = rd.String();
  m.hook_name = rd.String();
  m.layer = rd.Raw<int32_t>();
  m.d_in = rd.Raw<int32_t>();
  m.encoder = rd.String();
  m.k = rd.Raw<int32_t>();
  m.threshold_policy = rd.String();
  m.apply_b_dec_to_input = rd.Raw<uint8_t>() != 0;
  m.width = rd.Raw<int32_t>();
  m.context_length = rd.Raw<int32_t>();
  m.token_source = rd.String();
  m.token_order_start = rd.Raw<int64_t>();
  m.job_id = rd.Raw<uint64_t>();
  m.rows_planned = rd.Raw<int64_t>();
  m.top_n = rd.Raw<int32_t>();
  m.postings = rd.Raw<uint8_t>() != 0;
  if (!rd.rest().empty()) m.sae_weight_hash = rd.String();
  if (!rd.rest().empty()) m.hook_name_out = rd.String();
  if (!rd.ok() || version < 1 || version > kRecordVersion) {
    return absl::DataLossError("malformed dataset record");
  }
  // Readers size buffers by these fields: a record the creator could not have written is
  // corrupt, not a dataset.
  if (absl::Status valid = ValidateMeta(m); !valid.ok()) {
    return absl::DataLossError(absl::StrCat("malformed dataset record: ", valid.message()));
  }
  r->format_version = version;
  return absl::OkStatus();
}

// The watermark record: everything a commit advances.
struct Watermark {
  int64_t rows = 0, nnz = 0, chunks = 0, live_latents = 0, blob_bytes = 0;
  bool complete = false;
};
std::string EncodeWatermark(const DatasetRecord& r, int64_t blob_bytes) {
  std::string out;
  PutRaw<int64_t>(r.rows_committed, &out);
  PutRaw<int64_t>(r.nnz, &out);
  PutRaw<int64_t>(r.num_chunks, &out);
  PutRaw<int64_t>(r.live_latents, &out);
  PutRaw<int64_t>(blob_bytes, &out);
  PutRaw<uint8_t>(r.complete, &out);
  return out;
}
absl::Status DecodeWatermark(absl::string_view in, Watermark* w) {
  ByteReader rd(in);
  w->rows = rd.Raw<int64_t>();
  w->nnz = rd.Raw<int64_t>();
  w->chunks = rd.Raw<int64_t>();
  w->live_latents = rd.Raw<int64_t>();
  w->blob_bytes = rd.Raw<int64_t>();
  w->complete = rd.Raw<uint8_t>() != 0;
  if (!rd.ok() || !rd.rest().empty() || w->rows < 0 || w->nnz < 0 || w->chunks < 0 ||
      w->live_latents < 0 || w->blob_bytes < 0) {
    return absl::DataLossError("malformed watermark record");
  }
  return absl::OkStatus();
}

ChunkDtype ToChunkDtype(ValueDtype d) {
  switch (d) {
    case ValueDtype::kFloat16:
      return ChunkDtype::kFloat16;
    case ValueDtype::kBFloat16:
      return ChunkDtype::kBFloat16;
    case ValueDtype::kFloat32:
      return ChunkDtype::kFloat32;
  }
  return ChunkDtype::kFloat32;
}

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

absl::Status DecodePostingV1(absl::string_view in, int64_t row_start, ChunkDtype dtype,
                             std::vector<int64_t>* rows, std::vector<float>* values) {
  if (in.size() < 4) return absl::DataLossError("posting too short");
  uint32_t crc;
  std::memcpy(&crc, in.data() + in.size() - 4, 4);
  if (crc != Crc32c(in.data(), in.size() - 4)) {
    return absl::DataLossError("posting checksum mismatch");
  }
  ByteReader rd(in.substr(0, in.size() - 4));
  uint64_t n = rd.Varint();
  if (!rd.ok() || n > in.size()) return absl::DataLossError("malformed posting");
  int64_t row = row_start;
  for (uint64_t i = 0; i < n; ++i) {
    row += static_cast<int64_t>(rd.Varint());
    rows->push_back(row);
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (dtype == ChunkDtype::kFloat32) {
      values->push_back(rd.Raw<float>());
    } else {
      uint16_t h = rd.Raw<uint16_t>();
      values->push_back(dtype == ChunkDtype::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h));
    }
  }
  if (!rd.ok() || !rd.rest().empty()) return absl::DataLossError("malformed posting");
  return absl::OkStatus();
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

class SnapshotHolder {
 public:
  explicit SnapshotHolder(rocksdb::DB* db) : db_(db), snap_(db->GetSnapshot()) {}
  ~SnapshotHolder() { db_->ReleaseSnapshot(snap_); }
  const rocksdb::Snapshot* get() const { return snap_; }

 private:
  rocksdb::DB* db_;
  const rocksdb::Snapshot* snap_;
};

absl::Status GetAt(const Db* db, const rocksdb::Snapshot* snap, Family family,
                   const std::string& key, std::string* value) {
  rocksdb::ReadOptions ro;
  ro.snapshot = snap;
  rocksdb::Status s = db->raw()->Get(ro, db->handle(family), key, value);
  if (s.IsNotFound()) return absl::NotFoundError("not found");
  return FromRocks(s, absl::StrCat("reading ", FamilyName(family)));
}

absl::Status ValidateMeta(const DatasetMeta& m) {
  if (m.name.empty()) return absl::InvalidArgumentError("name: must not be empty");
  if (m.width <= 0) return absl::InvalidArgumentError(absl::StrCat("width: ", m.width, " <= 0"));
  if (m.context_length < 0) return absl::InvalidArgumentError("context_length: negative");
  if (m.top_n < 0 || m.top_n > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("top_n: ", m.top_n, " not in [0, 4096]"));
  }
  if (m.k < 0) return absl::InvalidArgumentError("k: negative");
  if (m.kind != DatasetKind::kSparse && m.kind != DatasetKind::kDense) {
    return absl::InvalidArgumentError("kind: unknown");
  }
  if (m.value_dtype != ValueDtype::kFloat16 && m.value_dtype != ValueDtype::kBFloat16 &&
      m.value_dtype != ValueDtype::kFloat32) {
    return absl::InvalidArgumentError("value_dtype: unknown");
  }
  return absl::OkStatus();
}

// Options that shape what a writer stores, checked before anything is written (a sparse chunk's
// row count is a u32 in its header).
absl::Status CheckWriteOptions(const ChunkStoreOptions& o) {
  if (o.record_version < 1 || o.record_version > kRecordVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkStoreOptions.record_version: ", o.record_version, " not in [1, ",
                     kRecordVersion, "]"));
  }
  if (o.sparse_chunk_rows < 1 || o.sparse_chunk_rows > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChunkStoreOptions.sparse_chunk_rows: ", o.sparse_chunk_rows, " not in [1, 2^31)"));
  }
  return absl::OkStatus();
}

// How many elements a reader reserves for `count` items of `per_item` elements that the
// watermark promises: up to 2^26, beyond that the vector grows as chunks arrive (a corrupt
// watermark, up to 2^63 rows, must neither size an allocation nor overflow the product).
size_t ReserveAhead(int64_t count, int64_t per_item = 1) {
  constexpr int64_t kMax = int64_t{1} << 26;
  return static_cast<size_t>(std::min(count, kMax / std::max<int64_t>(per_item, 1)) * per_item);
}

// A malformed statistics record or top-N list, named for the reader.
absl::Status LatentIndexError(uint64_t id, int32_t latent, const char* what,
                              const absl::Status& s) {
  return absl::Status(
      s.code(), absl::StrCat("dataset ", id, " latent ", latent, " ", what, ": ", s.message()));
}

absl::Status ChunkError(uint64_t id, int64_t row_start, const absl::Status& s) {
  return absl::Status(s.code(),
                      absl::StrCat("dataset ", id, " chunk at row ", row_start, ": ", s.message()));
}

}  // namespace

absl::Status CheckRowRange(const DatasetRecord& rec, int64_t row_start, int64_t* row_count) {
  if (*row_count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("row_count ", *row_count, " is negative"));
  }
  if (row_start < 0 || row_start > rec.rows_committed) {
    return absl::OutOfRangeError(absl::StrCat("row_start ", row_start, " is outside the ",
                                              rec.rows_committed, " committed rows of dataset ",
                                              rec.id));
  }
  if (*row_count == 0) *row_count = rec.rows_committed - row_start;
  if (*row_count > rec.rows_committed - row_start) {
    return absl::OutOfRangeError(absl::StrCat("rows [", row_start, ", ", row_start + *row_count,
                                              ") reach past the ", rec.rows_committed,
                                              " committed rows of dataset ", rec.id));
  }
  return absl::OkStatus();
}

// ---- ChunkStore --------------------------------------------------------------------------------

namespace {
ChunkStoreOptions Resolved(ChunkStoreOptions o) {
  if (o.commit_threads <= 0) {
    const int32_t cores = static_cast<int32_t>(std::thread::hardware_concurrency());
    o.commit_threads = std::clamp(cores - 1, 1, 4);
  }
  return o;
}
}  // namespace

ChunkStore::ChunkStore(Db* db, const ChunkStoreOptions& options)
    : db_(db), options_(Resolved(options)) {}
ChunkStore::~ChunkStore() = default;

absl::StatusOr<uint64_t> ChunkStore::CreateDataset(const DatasetMeta& meta) {
  RETURN_IF_ERROR(ValidateMeta(meta));
  RETURN_IF_ERROR(CheckWriteOptions(options_));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(
      const IdAllocation allocation,
      IdAllocation::Read(*db_, {keys::kDatasetIdCounter, keys::kLegacyDatasetIdCounter}));
  const std::string name_key = keys::DatasetName(meta.name);
  auto existing = db_->Get(Family::kMeta, name_key);
  if (existing.ok() && !allocation.HoldsCounter(name_key)) {
    return absl::AlreadyExistsError(absl::StrCat("dataset name \"", meta.name, "\" is taken"));
  }
  if (!existing.ok() && !absl::IsNotFound(existing.status())) return existing.status();
  const uint64_t id = allocation.id();
  DatasetRecord rec;
  rec.id = id;
  rec.meta = meta;
  rec.created_unix_micros = absl::ToUnixMicros(absl::Now());
  rec.format_version = options_.record_version;
  std::string id_bytes;
  AppendBigEndian64(id, &id_bytes);
  rocksdb::WriteBatch batch;
  allocation.AddAdvance(*db_, &batch);
  batch.Put(db_->handle(Family::kMeta), keys::DatasetRecord(id), EncodeRecord(rec));
  batch.Put(db_->handle(Family::kMeta), name_key, id_bytes);
  batch.Put(db_->handle(Family::kMeta), keys::Watermark(id), EncodeWatermark(rec, 0));
  RETURN_IF_ERROR(db_->Write(&batch, /*sync=*/true));
  return id;
}

absl::StatusOr<uint64_t> ChunkStore::FindDataset(const std::string& name) const {
  auto v = db_->Get(Family::kMeta, keys::DatasetName(name));
  if (absl::IsNotFound(v.status())) {
    return absl::NotFoundError(absl::StrCat("no dataset named \"", name, "\""));
  }
  if (!v.ok()) return v.status();
  if (v->size() != 8) return absl::DataLossError("malformed dataset name index");
  return ReadBigEndian64(v->data());
}

absl::StatusOr<DatasetRecord> ChunkStore::GetRecordAt(const rocksdb::Snapshot* snap,
                                                      uint64_t id) const {
  std::string value;
  absl::Status s = GetAt(db_, snap, Family::kMeta, keys::DatasetRecord(id), &value);
  if (absl::IsNotFound(s)) return absl::NotFoundError(absl::StrCat("no dataset with id ", id));
  RETURN_IF_ERROR(s);
  DatasetRecord rec;
  s = DecodeRecord(value, &rec);
  if (s.ok()) s = GetAt(db_, snap, Family::kMeta, keys::Watermark(id), &value);
  Watermark w;
  if (s.ok()) s = DecodeWatermark(value, &w);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("dataset ", id, ": ", s.message()));
  rec.rows_committed = w.rows;
  rec.nnz = w.nnz;
  rec.num_chunks = w.chunks;
  rec.live_latents = w.live_latents;
  rec.complete = w.complete;
  return rec;
}

absl::StatusOr<DatasetRecord> ChunkStore::GetRecord(uint64_t id) const {
  SnapshotHolder snap(db_->raw());
  return GetRecordAt(snap.get(), id);
}

absl::StatusOr<uint64_t> ChunkStore::BytesOnDisk(uint64_t id) const {
  std::string begin = keys::IdPrefix(id), end = keys::IdPrefix(id + 1);
  // Files: RocksDB's estimate from the SST index blocks. Memtables of the chunk and meta
  // families: the dataset's own entries, counted. RocksDB's memtable estimate multiplies the
  // range's entry count by the memtable's average entry size, which a TRAIN checkpoint or DENSE
  // chunks in the same memtable inflate (a 1.7 MB SPARSE dataset read as 27 MB); a dataset's
  // entries there are few (a key per chunk part), so counting them costs well under a
  // millisecond. The latent-index and postings families hold entries of one kind and size, so
  // their estimate stands (and counting would have to merge their operands).
  const uint64_t min_blob = db_->options().min_blob_size;
  uint64_t total = 0;
  auto add_range = [&](Family f, const std::string& from, const std::string& to,
                       bool count_memtable) -> absl::Status {
    rocksdb::SizeApproximationOptions opts;
    opts.include_memtables = !count_memtable;
    opts.include_files = true;
    rocksdb::Range range(from, to);
    uint64_t size = 0;
    rocksdb::Status s = db_->raw()->GetApproximateSizes(opts, db_->handle(f), &range, 1, &size);
    if (!s.ok()) return FromRocks(s, "approximate sizes");
    total += size;
    if (!count_memtable) return absl::OkStatus();
    rocksdb::ReadOptions memtable_only;
    memtable_only.read_tier = rocksdb::kMemtableTier;
    const rocksdb::Slice upper(to);
    memtable_only.iterate_upper_bound = &upper;
    std::unique_ptr<rocksdb::Iterator> it(db_->raw()->NewIterator(memtable_only, db_->handle(f)));
    for (it->Seek(from); it->Valid(); it->Next()) {
      // Values headed for blob files are in the watermark's blob bytes (added below) already.
      const uint64_t value = it->value().size();
      total += it->key().size() + (min_blob > 0 && value >= min_blob ? 0 : value);
    }
    return FromRocks(it->status(), absl::StrCat("dataset ", id, ": memtable sizes"));
  };
  RETURN_IF_ERROR(add_range(Family::kChunks, begin, end, /*count_memtable=*/true));
  RETURN_IF_ERROR(add_range(Family::kLatentIndex, begin, end, /*count_memtable=*/false));
  RETURN_IF_ERROR(add_range(Family::kPostings, begin, end, /*count_memtable=*/false));
  const std::string dir_begin = keys::ChunkDirPrefix(id);
  RETURN_IF_ERROR(add_range(Family::kMeta, dir_begin, keys::PrefixEnd(dir_begin), true));
  // Chunks in blob files are outside the SST ranges: add their encoded size.
  std::string value;
  SnapshotHolder snap(db_->raw());
  if (GetAt(db_, snap.get(), Family::kMeta, keys::Watermark(id), &value).ok()) {
    Watermark w;
    if (DecodeWatermark(value, &w).ok()) total += static_cast<uint64_t>(w.blob_bytes);
  }
  return total;
}

namespace {
latentd::v1::DatasetInfo ToInfo(const DatasetRecord& r, uint64_t bytes) {
  latentd::v1::DatasetInfo info;
  const DatasetMeta& m = r.meta;
  info.set_id(r.id);
  info.set_name(m.name);
  info.set_kind(m.kind == DatasetKind::kSparse ? latentd::v1::SPARSE_LATENTS
                                               : latentd::v1::DENSE_ACTIVATIONS);
  info.set_value_dtype(m.value_dtype == ValueDtype::kFloat16    ? latentd::v1::FLOAT16
                       : m.value_dtype == ValueDtype::kBFloat16 ? latentd::v1::BFLOAT16
                                                                : latentd::v1::FLOAT32);
  info.set_model_id(m.model_id);
  info.set_model_weight_hash(m.model_weight_hash);
  info.set_sae_weight_hash(m.sae_weight_hash);
  info.set_hook_name(m.hook_name);
  info.set_layer(m.layer);
  info.set_d_in(m.d_in);
  info.set_encoder(m.encoder);
  info.set_k(m.k);
  info.set_threshold_policy(m.threshold_policy);
  info.set_apply_b_dec_to_input(m.apply_b_dec_to_input);
  info.set_hook_name_out(m.hook_name_out);
  info.set_d_sae(m.width);
  info.set_context_length(m.context_length);
  info.set_token_source(m.token_source);
  info.set_token_order_start(m.token_order_start);
  info.set_job_id(m.job_id);
  info.mutable_created()->set_seconds(r.created_unix_micros / 1000000);
  info.mutable_created()->set_nanos(static_cast<int32_t>(r.created_unix_micros % 1000000) * 1000);
  info.set_rows_committed(r.rows_committed);
  info.set_rows_planned(m.rows_planned);
  const bool sparse = m.kind == DatasetKind::kSparse;
  const int64_t nnz = sparse ? r.nnz : r.rows_committed * m.width;
  info.set_nnz(nnz);
  info.set_density(r.rows_committed > 0 ? static_cast<double>(nnz) /
                                              (static_cast<double>(r.rows_committed) * m.width)
                                        : 0.0);
  info.set_dead_latents(sparse ? m.width - r.live_latents : 0);
  info.set_bytes_on_disk(static_cast<int64_t>(bytes));
  info.set_complete(r.complete);
  return info;
}
}  // namespace

absl::StatusOr<latentd::v1::DatasetInfo> ChunkStore::GetDataset(uint64_t id) const {
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecord(id));
  ASSIGN_OR_RETURN(uint64_t bytes, BytesOnDisk(id));
  latentd::v1::DatasetInfo info = ToInfo(rec, bytes);
  ASSIGN_OR_RETURN(const ReconstructionFit fit, GetReconstructionFit(id));
  if (fit.rows > 0) {
    *info.mutable_fit() = ToSaeFit(fit);
    info.mutable_fit()->set_predicted_hook(rec.meta.hook_name_out);
  }
  return info;
}

absl::StatusOr<ReconstructionFit> ChunkStore::GetReconstructionFit(uint64_t id) const {
  auto stored = db_->Get(Family::kMeta, keys::Fit(id));
  if (absl::IsNotFound(stored.status())) return ReconstructionFit();
  RETURN_IF_ERROR(stored.status());
  auto fit = ReconstructionFit::Decode(*stored);
  if (!fit.ok()) {
    return absl::DataLossError(absl::StrCat("dataset ", id, ": ", fit.status().message()));
  }
  return fit;
}

absl::StatusOr<latentd::v1::ListDatasetsResponse> ChunkStore::ListDatasets() const {
  latentd::v1::ListDatasetsResponse out;
  std::vector<uint64_t> ids;
  {
    auto it = db_->NewIterator(Family::kMeta);
    const std::string prefix = keys::kDatasetRecordPrefix;
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      if (it->key().size() != prefix.size() + 8) continue;
      ids.push_back(ReadBigEndian64(it->key().data() + prefix.size()));
    }
    RETURN_IF_ERROR(FromRocks(it->status(), "listing datasets"));
  }
  for (uint64_t id : ids) {
    auto info = GetDataset(id);
    if (absl::IsNotFound(info.status())) continue;  // deleted meanwhile
    if (info.ok()) {
      *out.add_datasets() = *std::move(info);
      continue;
    }
    latentd::v1::UnreadableDataset* unreadable = out.add_unreadable();
    unreadable->set_dataset_id(id);
    unreadable->set_error(info.status().ToString());
    auto names = NamesMappedTo(*db_, keys::DatasetName(""), id);
    if (names.ok() && !names->empty()) unreadable->set_name(names->front());
  }
  return out;
}

absl::Status ChunkStore::ReassignDataset(uint64_t id, uint64_t from_job, uint64_t to_job) {
  absl::MutexLock lock(&mu_);
  if (open_writers_.count(id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", id, " has an open writer (its job is still running)"));
  }
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecord(id));
  if (rec.meta.job_id != from_job) {
    return absl::FailedPreconditionError(absl::StrCat("dataset ", id, " (", rec.meta.name,
                                                      ") belongs to job ", rec.meta.job_id,
                                                      ", not job ", from_job));
  }
  rec.meta.job_id = to_job;
  return db_->Put(Family::kMeta, keys::DatasetRecord(id), EncodeRecord(rec), /*sync=*/true);
}

absl::Status ChunkStore::DeleteDataset(uint64_t id) {
  static constexpr Family kDataFamilies[] = {Family::kChunks, Family::kLatentIndex,
                                             Family::kPostings};
  const std::string begin = keys::IdPrefix(id), end = keys::IdPrefix(id + 1);
  {
    absl::MutexLock lock(&mu_);
    if (open_writers_.count(id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("dataset ", id, " has an open writer (its job is still running)"));
    }
    // The names come from the name index, not the record: a dataset whose record or watermark
    // is damaged (ListDatasets reports it unreadable) must still be removable.
    auto record = db_->Get(Family::kMeta, keys::DatasetRecord(id));
    if (absl::IsNotFound(record.status())) {
      return absl::NotFoundError(absl::StrCat("no dataset with id ", id));
    }
    RETURN_IF_ERROR(record.status());
    ASSIGN_OR_RETURN(const std::vector<std::string> names,
                     NamesMappedTo(*db_, keys::DatasetName(""), id));
    rocksdb::WriteBatch batch;
    for (Family f : kDataFamilies) batch.DeleteRange(db_->handle(f), begin, end);
    const std::string dir = keys::ChunkDirPrefix(id);
    batch.DeleteRange(db_->handle(Family::kMeta), dir, keys::PrefixEnd(dir));
    batch.Delete(db_->handle(Family::kMeta), keys::Watermark(id));
    batch.Delete(db_->handle(Family::kMeta), keys::Fit(id));
    for (const std::string& name : names) {
      batch.Delete(db_->handle(Family::kMeta), keys::DatasetName(name));
    }
    batch.Delete(db_->handle(Family::kMeta), keys::DatasetRecord(id));
    RETURN_IF_ERROR(db_->Write(&batch, /*sync=*/true));
  }
  // The dataset is gone for every reader now; its bytes leave the disk only when a compaction
  // drops the covered keys, which RocksDB schedules by write volume, not by tombstones. A
  // failure here loses nothing and later compactions still free the space, so it is not the
  // caller's error.
  for (Family f : kDataFamilies) db_->CompactRange(f, begin, end).IgnoreError();
  return absl::OkStatus();
}

namespace {

// An iterator over the chunk family on a snapshot, bounded to one dataset's keys.
class ChunkIterator {
 public:
  ChunkIterator(const Db* db, const rocksdb::Snapshot* snap, uint64_t id)
      : upper_(keys::IdPrefix(id + 1)), upper_slice_(upper_) {
    rocksdb::ReadOptions ro;
    ro.snapshot = snap;
    ro.iterate_upper_bound = &upper_slice_;
    it_.reset(db->raw()->NewIterator(ro, db->handle(Family::kChunks)));
  }
  rocksdb::Iterator* operator->() const { return it_.get(); }
  rocksdb::Iterator* get() const { return it_.get(); }

 private:
  const std::string upper_;
  const rocksdb::Slice upper_slice_;  // must outlive the iterator
  std::unique_ptr<rocksdb::Iterator> it_;
};

}  // namespace

struct ChunkStore::WindowCache {
  WindowCache(const Db* db, const rocksdb::Snapshot* snap, uint64_t id)
      : db(db), snap(snap), id(id) {}
  const Db* const db;
  const rocksdb::Snapshot* const snap;
  const uint64_t id;
  // A chunk read so far: its token ids and (format 3, when the query needs them) the latent's
  // rows and values in it, both from one read of its header.
  struct Chunk {
    std::vector<int32_t> tokens;
    std::vector<int64_t> rows;
    std::vector<float> values;
  };
  std::map<int64_t, Chunk> chunks;  // by first row
  // Format 3 reads go through three iterators (headers, token parts, slices: each a range of its
  // own in the key order) made on the first read and kept for the query.
  std::optional<ChunkIterator> headers;
  std::optional<ChunkIterator> token_parts;
  std::optional<ChunkIterator> slices;
};

namespace {

// The first row of the format-3 chunk holding `row`: the one whose header key is the last at or
// before (row, header). Leaves `it` there. DATA_LOSS when there is none.
absl::StatusOr<int64_t> ChunkHolding(rocksdb::Iterator* it, uint64_t id, int64_t row) {
  it->SeekForPrev(keys::ChunkPart(id, row, kPartHeader));
  const std::string prefix = keys::ChunkPart(id, 0, kPartHeader).substr(0, 10);
  if (!it->Valid() || !it->key().starts_with(prefix) || it->key().size() != 18) {
    RETURN_IF_ERROR(FromRocks(it->status(), absl::StrCat("reading chunks of dataset ", id)));
    return absl::DataLossError(absl::StrCat("dataset ", id, " has no chunk holding row ", row));
  }
  return static_cast<int64_t>(ReadBigEndian64(it->key().data() + 10));
}

}  // namespace

template <typename Visit>
absl::Status ChunkStore::ForEachChunk(const rocksdb::Snapshot* snap, const DatasetRecord& rec,
                                      int64_t row_start, int64_t row_count, bool tokens_only,
                                      Visit visit, const uint64_t* keep) const {
  if (row_count <= 0) return absl::OkStatus();
  if (rec.format_version >= 3 && rec.meta.kind == DatasetKind::kSparse) {
    return ForEachSlicedChunk(snap, rec, row_start, row_count, tokens_only, visit, keep);
  }
  const uint64_t id = rec.id;
  ChunkIterator it(db_, snap, id);
  const std::string prefix = keys::IdPrefix(id);
  it->SeekForPrev(keys::Chunk(id, row_start));
  const int64_t row_end = row_start + row_count;
  int64_t next = -1;
  Chunk chunk;
  while (true) {
    if (!it->Valid() || !it->key().starts_with(prefix) || it->key().size() != 16) {
      RETURN_IF_ERROR(FromRocks(it->status(), absl::StrCat("reading chunks of dataset ", id)));
      return absl::DataLossError(
          absl::StrCat("dataset ", id, " has no chunk holding row ", next < 0 ? row_start : next));
    }
    const int64_t key_row = static_cast<int64_t>(ReadBigEndian64(it->key().data() + 8));
    absl::string_view value(it->value().data(), it->value().size());
    absl::Status s = tokens_only ? DecodeChunkTokens(value, &chunk) : DecodeChunk(value, &chunk);
    if (!s.ok()) return ChunkError(id, key_row, s);
    const bool continues =
        next < 0 ? (key_row <= row_start && key_row + chunk.num_rows > row_start) : key_row == next;
    if (chunk.row_start != key_row || !continues) {
      return ChunkError(id, key_row, absl::DataLossError("chunk does not continue the rows"));
    }
    visit(chunk);
    next = chunk.row_start + chunk.num_rows;
    if (next >= row_end) return absl::OkStatus();
    it->Next();
  }
}

namespace {

// True when `it` stands on `key` (a chunk part that must exist).
bool AtPart(rocksdb::Iterator* it, const std::string& key) {
  return it->Valid() && it->key() == rocksdb::Slice(key);
}

// Lands `it` on `key`: usually the next key already is (headers, and one slice across chunks,
// are contiguous ranges), else a seek.
bool LandOn(rocksdb::Iterator* it, const std::string& key) {
  if (!AtPart(it, key)) it->Seek(key);
  return AtPart(it, key);
}

// Reads the format-3 chunk starting at chunk_start: its header through `headers`; when
// `tokens` is given, its token ids through `token_parts`; when latent >= 0, appends the latent's
// run (rows ascending) through `slices` from the one slice holding it. Each iterator is left past
// what it read. *header is the chunk's (its num_rows says where the next chunk starts).
absl::Status ReadChunkParts(rocksdb::Iterator* headers, rocksdb::Iterator* token_parts,
                            rocksdb::Iterator* slices, const DatasetRecord& rec, int32_t latent,
                            int64_t chunk_start, SlicedChunkHeader* header,
                            std::vector<int32_t>* tokens, std::vector<int64_t>* rows,
                            std::vector<float>* values) {
  const uint64_t id = rec.id;
  std::string key = keys::ChunkPart(id, chunk_start, kPartHeader);
  if (!LandOn(headers, key)) {
    RETURN_IF_ERROR(FromRocks(headers->status(), absl::StrCat("reading chunks of dataset ", id)));
    return absl::DataLossError(
        absl::StrCat("dataset ", id, " has no chunk holding row ", chunk_start));
  }
  absl::Status s = DecodeSlicedHeader(
      absl::string_view(headers->value().data(), headers->value().size()), header);
  if (s.ok() && (header->row_start != chunk_start || header->layout.width != rec.meta.width ||
                 header->dtype != ToChunkDtype(rec.meta.value_dtype))) {
    s = absl::DataLossError("chunk does not continue the rows");
  }
  if (!s.ok()) return ChunkError(id, chunk_start, s);
  headers->Next();
  if (tokens != nullptr) {
    key = keys::ChunkPart(id, chunk_start, kPartTokens);
    if (!LandOn(token_parts, key)) {
      RETURN_IF_ERROR(FromRocks(token_parts->status(), "reading token ids"));
      return ChunkError(id, chunk_start, absl::DataLossError("token ids missing"));
    }
    s = DecodeTokenPart(absl::string_view(token_parts->value().data(), token_parts->value().size()),
                        tokens);
    if (s.ok() && static_cast<int64_t>(tokens->size()) != header->num_rows) {
      s = absl::DataLossError("token ids do not match the rows");
    }
    if (!s.ok()) return ChunkError(id, chunk_start, s);
    token_parts->Next();
  }
  if (latent < 0) return absl::OkStatus();
  const int32_t sl = header->layout.SliceOf(latent);
  if (header->slice_nnz[sl] == 0) return absl::OkStatus();
  key = keys::ChunkPart(id, chunk_start, static_cast<uint16_t>(kPartFirstSlice + sl));
  if (!LandOn(slices, key)) {
    RETURN_IF_ERROR(FromRocks(slices->status(), "reading latent slices"));
    return ChunkError(id, chunk_start, absl::DataLossError(absl::StrCat("slice ", sl, " missing")));
  }
  s = DecodeSliceLatent(absl::string_view(slices->value().data(), slices->value().size()), *header,
                        sl, latent, rows, values);
  if (!s.ok()) return ChunkError(id, chunk_start, s);
  slices->Next();
  return absl::OkStatus();
}

// CSR rows [row_lo, row_hi) (chunk-local) of one format-3 chunk from its slices decoded for that
// window (slice order = latent order, and within a slice (latent, row) order, so every row's
// columns come out ascending).
void AssembleRows(const SlicedChunkHeader& h, int64_t row_lo, int64_t row_hi,
                  const std::vector<int32_t>& slice_ids, const std::vector<SliceEntries>& slices,
                  Chunk* chunk) {
  const int row_bits = RowBits(h.num_rows);
  const int64_t mask = (int64_t{1} << row_bits) - 1;
  const int64_t rows = row_hi - row_lo;
  chunk->indptr.assign(rows + 1, 0);
  int64_t nnz = 0;
  for (size_t i = 0; i < slice_ids.size(); ++i) {
    for (int64_t x : slices[i].keys) ++chunk->indptr[(x & mask) - row_lo + 1];
    nnz += static_cast<int64_t>(slices[i].keys.size());
  }
  for (int64_t r = 0; r < rows; ++r) chunk->indptr[r + 1] += chunk->indptr[r];
  chunk->indices.resize(nnz);
  chunk->values.resize(nnz);
  std::vector<int64_t> cursor(chunk->indptr.begin(), chunk->indptr.end() - 1);
  for (size_t i = 0; i < slice_ids.size(); ++i) {
    const int32_t first = h.layout.FirstLatent(slice_ids[i]);
    const std::vector<int64_t>& keys = slices[i].keys;
    const std::vector<float>& values = slices[i].values;
    for (size_t e = 0; e < keys.size(); ++e) {
      const int64_t at = cursor[(keys[e] & mask) - row_lo]++;
      chunk->indices[at] = first + static_cast<int32_t>(keys[e] >> row_bits);
      chunk->values[at] = values[e];
    }
  }
}

}  // namespace

template <typename Visit>
absl::Status ChunkStore::ForEachSlicedChunk(const rocksdb::Snapshot* snap, const DatasetRecord& rec,
                                            int64_t row_start, int64_t row_count, bool tokens_only,
                                            Visit visit, const uint64_t* keep) const {
  const uint64_t id = rec.id;
  ChunkIterator it(db_, snap, id);
  ASSIGN_OR_RETURN(int64_t chunk_start, ChunkHolding(it.get(), id, row_start));
  const int64_t row_end = row_start + row_count;
  Chunk chunk;
  chunk.kind = ChunkKind::kSparse;
  chunk.dtype = ToChunkDtype(rec.meta.value_dtype);
  chunk.width = rec.meta.width;
  SlicedChunkHeader header;
  std::vector<int32_t> slice_ids;
  std::vector<SliceEntries> slices;
  while (true) {
    std::string key = keys::ChunkPart(id, chunk_start, kPartHeader);
    it->Seek(key);
    if (!AtPart(it.get(), key)) {
      RETURN_IF_ERROR(FromRocks(it->status(), absl::StrCat("reading chunks of dataset ", id)));
      return absl::DataLossError(absl::StrCat("dataset ", id, " has no chunk holding row ",
                                              std::max(chunk_start, row_start)));
    }
    absl::Status s =
        DecodeSlicedHeader(absl::string_view(it->value().data(), it->value().size()), &header);
    if (!s.ok()) return ChunkError(id, chunk_start, s);
    if (header.row_start != chunk_start || chunk_start + header.num_rows <= row_start ||
        header.layout.width != rec.meta.width || header.dtype != chunk.dtype) {
      return ChunkError(id, chunk_start, absl::DataLossError("chunk does not continue the rows"));
    }
    key = keys::ChunkPart(id, chunk_start, kPartTokens);
    it->Seek(key);
    if (!AtPart(it.get(), key)) {
      RETURN_IF_ERROR(FromRocks(it->status(), "reading token ids"));
      return ChunkError(id, chunk_start, absl::DataLossError("token ids missing"));
    }
    s = DecodeTokenPart(absl::string_view(it->value().data(), it->value().size()),
                        &chunk.token_ids);
    if (s.ok() && static_cast<int64_t>(chunk.token_ids.size()) != header.num_rows) {
      s = absl::DataLossError("token ids do not match the rows");
    }
    if (!s.ok()) return ChunkError(id, chunk_start, s);
    // Only the rows the caller asked for are assembled (and their values decoded); token-only
    // reads keep the whole chunk (callers cache it for context windows).
    const int64_t row_lo = tokens_only ? 0 : std::max(row_start, chunk_start) - chunk_start;
    const int64_t row_hi = tokens_only
                               ? header.num_rows
                               : std::min(row_end, chunk_start + header.num_rows) - chunk_start;
    chunk.row_start = chunk_start + row_lo;
    chunk.num_rows = row_hi - row_lo;
    if (row_lo > 0 || row_hi < header.num_rows) {
      chunk.token_ids.erase(chunk.token_ids.begin() + row_hi, chunk.token_ids.end());
      chunk.token_ids.erase(chunk.token_ids.begin(), chunk.token_ids.begin() + row_lo);
    }
    if (!tokens_only) {
      slice_ids.clear();
      for (int32_t sl = 0; sl < header.layout.num_slices; ++sl) {
        if (header.slice_nnz[sl] == 0) continue;
        key = keys::ChunkPart(id, chunk_start, static_cast<uint16_t>(kPartFirstSlice + sl));
        it->Seek(key);
        if (!AtPart(it.get(), key)) {
          RETURN_IF_ERROR(FromRocks(it->status(), "reading latent slices"));
          return ChunkError(id, chunk_start,
                            absl::DataLossError(absl::StrCat("slice ", sl, " missing")));
        }
        if (slices.size() <= slice_ids.size()) slices.emplace_back();
        // keep's bit for the chunk-local row r is r + chunk_start - row_start.
        s = DecodeSlice(absl::string_view(it->value().data(), it->value().size()), header, sl,
                        row_lo, row_hi, &slices[slice_ids.size()], keep,
                        static_cast<uint64_t>(chunk_start + row_lo - row_start));
        if (!s.ok()) return ChunkError(id, chunk_start, s);
        slice_ids.push_back(sl);
      }
      AssembleRows(header, row_lo, row_hi, slice_ids, slices, &chunk);
    }
    visit(chunk);
    chunk_start += header.num_rows;
    if (chunk_start >= row_end) return absl::OkStatus();
  }
}

absl::StatusOr<CsrRows> ChunkStore::ReadRows(uint64_t id, int64_t row_start,
                                             int64_t row_count) const {
  return ReadRowsKeeping(id, row_start, row_count, nullptr);
}

absl::StatusOr<CsrRows> ChunkStore::ReadRowSet(uint64_t id, int64_t row_start, int64_t row_count,
                                               const std::vector<uint64_t>& keep) const {
  if (row_count <= 0 || static_cast<uint64_t>(row_count) > keep.size() * 64) {
    return absl::InvalidArgumentError(absl::StrCat("keep: ", keep.size(), " words for ", row_count,
                                                   " rows (row_count must be > 0)"));
  }
  return ReadRowsKeeping(id, row_start, row_count, keep.data());
}

absl::StatusOr<CsrRows> ChunkStore::ReadRowsKeeping(uint64_t id, int64_t row_start,
                                                    int64_t row_count, const uint64_t* keep) const {
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecordAt(snap.get(), id));
  if (rec.meta.kind != DatasetKind::kSparse) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", id, " is DENSE: read it with ReadDense"));
  }
  RETURN_IF_ERROR(CheckRowRange(rec, row_start, &row_count));
  CsrRows out;
  out.row_start = row_start;
  out.num_rows = row_count;
  out.num_cols = rec.meta.width;
  out.indptr.reserve(ReserveAhead(row_count) + 1);
  out.token_ids.reserve(ReserveAhead(row_count));
  const int64_t row_end = row_start + row_count;
  RETURN_IF_ERROR(ForEachChunk(
      snap.get(), rec, row_start, row_count, false,
      [&](const Chunk& c) {
        const int64_t a = std::max(row_start, c.row_start) - c.row_start;
        const int64_t b = std::min(row_end, c.row_start + c.num_rows) - c.row_start;
        const int64_t base = out.indptr.back() - c.indptr[a];
        for (int64_t r = a; r < b; ++r) {
          out.indptr.push_back(c.indptr[r + 1] + base);
          out.token_ids.push_back(c.token_ids[r]);
        }
        out.indices.insert(out.indices.end(), c.indices.begin() + c.indptr[a],
                           c.indices.begin() + c.indptr[b]);
        out.values.insert(out.values.end(), c.values.begin() + c.indptr[a],
                          c.values.begin() + c.indptr[b]);
      },
      keep));
  return out;
}

absl::StatusOr<CsrRows> ChunkStore::RowLatents(uint64_t id, int64_t row) const {
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecord(id));
  if (row < 0 || row >= rec.rows_committed) {
    return absl::OutOfRangeError(absl::StrCat("row ", row, " is outside the ", rec.rows_committed,
                                              " committed rows of dataset ", id));
  }
  return ReadRows(id, row, 1);
}

absl::Status ChunkStore::ReadDense(uint64_t id, int64_t row_start, int64_t row_count,
                                   std::vector<float>* values,
                                   std::vector<int32_t>* token_ids) const {
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecordAt(snap.get(), id));
  if (rec.meta.kind != DatasetKind::kDense) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", id, " is SPARSE: read it with ReadRows"));
  }
  RETURN_IF_ERROR(CheckRowRange(rec, row_start, &row_count));
  const int64_t width = rec.meta.width, row_end = row_start + row_count;
  values->clear();
  values->reserve(ReserveAhead(row_count, width));
  if (token_ids) token_ids->clear();
  return ForEachChunk(snap.get(), rec, row_start, row_count, false, [&](const Chunk& c) {
    const int64_t a = std::max(row_start, c.row_start) - c.row_start;
    const int64_t b = std::min(row_end, c.row_start + c.num_rows) - c.row_start;
    values->insert(values->end(), c.values.begin() + a * width, c.values.begin() + b * width);
    if (token_ids) {
      token_ids->insert(token_ids->end(), c.token_ids.begin() + a, c.token_ids.begin() + b);
    }
  });
}

absl::Status ChunkStore::ReadTokens(uint64_t id, int64_t row_start, int64_t row_count,
                                    std::vector<int32_t>* token_ids) const {
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecordAt(snap.get(), id));
  RETURN_IF_ERROR(CheckRowRange(rec, row_start, &row_count));
  const int64_t row_end = row_start + row_count;
  token_ids->clear();
  return ForEachChunk(snap.get(), rec, row_start, row_count, true, [&](const Chunk& c) {
    const int64_t a = std::max(row_start, c.row_start) - c.row_start;
    const int64_t b = std::min(row_end, c.row_start + c.num_rows) - c.row_start;
    token_ids->insert(token_ids->end(), c.token_ids.begin() + a, c.token_ids.begin() + b);
  });
}

absl::StatusOr<std::vector<int64_t>> ChunkStore::ChunkRowStarts(uint64_t id) const {
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecordAt(snap.get(), id));
  rocksdb::ReadOptions ro;
  ro.snapshot = snap.get();
  std::unique_ptr<rocksdb::Iterator> it(db_->raw()->NewIterator(ro, db_->handle(Family::kMeta)));
  const std::string prefix = keys::ChunkDirPrefix(id);
  std::vector<int64_t> starts;
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const int64_t row = static_cast<int64_t>(ReadBigEndian64(it->key().data() + prefix.size()));
    if (row < rec.rows_committed) starts.push_back(row);
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "reading the chunk directory"));
  return starts;
}

namespace {

// A per-latent query needs a SPARSE dataset and a latent inside its width.
absl::Status CheckLatentQuery(const DatasetRecord& rec, uint64_t id, int32_t latent) {
  if (rec.meta.kind != DatasetKind::kSparse) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", id, " is DENSE: it has no latents"));
  }
  if (latent < 0 || latent >= rec.meta.width) {
    return absl::InvalidArgumentError(
        absl::StrCat("latent: ", latent, " is outside [0, ", rec.meta.width, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LatentStats> ChunkStore::GetLatentStats(uint64_t id, int32_t latent) const {
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecordAt(snap.get(), id));
  RETURN_IF_ERROR(CheckLatentQuery(rec, id, latent));
  std::string value;
  const int32_t first = latent - latent % kLatentsPerBlock;
  absl::Status s = GetAt(db_, snap.get(), Family::kLatentIndex,
                         keys::LatentStats(id, static_cast<uint32_t>(first)), &value);
  if (absl::IsNotFound(s)) return LatentStats();
  LatentStats stats;
  if (s.ok()) {  // (a malformed merge operand fails the read itself: RocksDB's Corruption)
    s = DecodeStatsBlockRecord(value, std::min(kLatentsPerBlock, rec.meta.width - first),
                               latent - first, &stats);
  }
  if (!s.ok()) return LatentIndexError(id, latent, "statistics", s);
  return stats;
}

absl::Status ChunkStore::ForEachLatentStats(
    uint64_t id, int64_t* rows_committed,
    const std::function<void(int32_t latent, const LatentStats& stats)>& visit) const {
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecordAt(snap.get(), id));
  RETURN_IF_ERROR(CheckLatentQuery(rec, id, 0));
  if (rows_committed != nullptr) *rows_committed = rec.rows_committed;
  std::vector<LatentStats> block(kLatentsPerBlock);
  std::string value;
  // Point reads, not an iterator over the family: the top-N blocks interleave with the
  // statistics blocks, and an iterator would merge their operands only to skip them.
  for (int32_t first = 0; first < rec.meta.width; first += kLatentsPerBlock) {
    const int32_t n = std::min(kLatentsPerBlock, rec.meta.width - first);
    absl::Status s = GetAt(db_, snap.get(), Family::kLatentIndex,
                           keys::LatentStats(id, static_cast<uint32_t>(first)), &value);
    if (absl::IsNotFound(s)) {
      std::fill(block.begin(), block.begin() + n, LatentStats());
      s = absl::OkStatus();
    } else if (s.ok()) {
      s = DecodeStatsBlock(value, block.data(), n);
    }
    if (!s.ok()) return LatentIndexError(id, first, "statistics block", s);
    for (int32_t i = 0; i < n; ++i) visit(first + i, block[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TopActivationContext>> ChunkStore::TopActivations(
    uint64_t id, int32_t latent, int32_t top_n, int32_t before, int32_t after) const {
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecordAt(snap.get(), id));
  RETURN_IF_ERROR(CheckLatentQuery(rec, id, latent));
  if (before < 0 || after < 0) {
    return absl::InvalidArgumentError("context_before/context_after: negative");
  }
  std::string value;
  TopRows top;
  const int32_t first = latent - latent % kLatentsPerBlock;
  absl::Status s = GetAt(db_, snap.get(), Family::kLatentIndex,
                         keys::LatentTop(id, static_cast<uint32_t>(first)), &value);
  if (!absl::IsNotFound(s)) {
    if (s.ok()) {
      s = DecodeTopBlockList(value, std::min(kLatentsPerBlock, rec.meta.width - first),
                             latent - first, &top);
    }
    if (!s.ok()) return LatentIndexError(id, latent, "top-N list", s);
  }
  WindowCache cache(db_, snap.get(), id);
  std::vector<TopActivationContext> out;
  for (const TopEntry& e : top.entries()) {
    if (top_n > 0 && static_cast<int32_t>(out.size()) >= top_n) break;
    if (e.row >= rec.rows_committed) continue;
    TopActivationContext t;
    t.row = e.row;
    t.value = e.value;
    RETURN_IF_ERROR(FillContext(snap.get(), rec, latent, before, after, nullptr, &cache, &t));
    out.push_back(std::move(t));
  }
  return out;
}

namespace {

// The most windows IntervalSamples (per interval, and intervals) and SilentSamples return.
constexpr int64_t kMaxSamples = 1000;

// INVALID_ARGUMENT "field: n outside [1, max]" unless n lies there.
absl::Status CheckCount(absl::string_view field, int64_t n, int64_t max) {
  if (n >= 1 && n <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", n, " outside [1, ", max, "]"));
}

// The context window of `row`: [*start, *stop), `before` rows before it and `after` after, clipped
// to its sequence and the committed rows.
void ContextWindow(const DatasetRecord& rec, int64_t row, int32_t before, int32_t after,
                   int64_t* start, int64_t* stop) {
  const int64_t seq = rec.meta.context_length > 0 ? rec.meta.context_length : 0;
  const int64_t seq_start = seq > 0 ? row - row % seq : 0;
  const int64_t seq_end =
      seq > 0 ? std::min(seq_start + seq, rec.rows_committed) : rec.rows_committed;
  *start = std::max(seq_start, row - before);
  *stop = std::min(seq_end, row + after + 1);
}

}  // namespace

absl::StatusOr<ChunkStore::LatentFirings> ChunkStore::FiringsForWindows(
    const rocksdb::Snapshot* snap, uint64_t id, int32_t latent, int32_t before,
    int32_t after) const {
  if (before < 0 || after < 0) {
    return absl::InvalidArgumentError("context_before/context_after: negative");
  }
  LatentFirings out;
  ASSIGN_OR_RETURN(out.record, GetRecordAt(snap, id));
  RETURN_IF_ERROR(CheckLatentQuery(out.record, id, latent));
  RETURN_IF_ERROR(LatentPostingsAt(snap, out.record, latent, 0, out.record.rows_committed,
                                   &out.rows, &out.values));
  return out;
}

absl::StatusOr<std::vector<TopActivationContext>> ChunkStore::TopSequences(
    uint64_t id, int32_t latent, int32_t top_n, int32_t before, int32_t after) const {
  RETURN_IF_ERROR(CheckCount("top_n", top_n, kMaxTopSequences));
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(LatentFirings firings, FiringsForWindows(snap.get(), id, latent, before, after));
  const DatasetRecord& rec = firings.record;
  const std::vector<int64_t>& rows = firings.rows;
  const std::vector<float>& values = firings.values;
  // Rows come ascending, so a sequence's entries are one run: keep the first of its maxima.
  const int64_t seq = rec.meta.context_length > 0 ? rec.meta.context_length : 1;
  std::vector<size_t> best;  // an entry per sequence that fired
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!best.empty() && rows[best.back()] / seq == rows[i] / seq) {
      if (values[i] > values[best.back()]) best.back() = i;
    } else {
      best.push_back(i);
    }
  }
  auto before_in_rank = [&](size_t a, size_t b) {
    return values[a] != values[b] ? values[a] > values[b] : rows[a] < rows[b];
  };
  const size_t n = std::min(best.size(), static_cast<size_t>(top_n));
  std::partial_sort(best.begin(), best.begin() + n, best.end(), before_in_rank);
  WindowCache cache(db_, snap.get(), id);
  std::vector<TopActivationContext> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i].row = rows[best[i]];
    out[i].value = values[best[i]];
    RETURN_IF_ERROR(FillContext(snap.get(), rec, latent, before, after, &firings, &cache, &out[i]));
  }
  return out;
}

absl::Status ChunkStore::FillContext(const rocksdb::Snapshot* snap, const DatasetRecord& rec,
                                     int32_t latent, int32_t before, int32_t after,
                                     const LatentFirings* firings, WindowCache* cache,
                                     TopActivationContext* t) const {
  const bool sliced = rec.format_version >= 3;
  // The cached chunk holding `row`, read first if need be.
  auto chunk_of =
      [&](int64_t row) -> absl::StatusOr<std::map<int64_t, WindowCache::Chunk>::iterator> {
    auto it = cache->chunks.upper_bound(row);
    if (it != cache->chunks.begin()) {
      --it;
      if (row < it->first + static_cast<int64_t>(it->second.tokens.size())) return it;
    }
    int64_t start = 0;
    WindowCache::Chunk chunk;
    if (sliced) {
      // The chunk's header once, its token ids and (unless the caller holds every firing) the
      // latent's run in it.
      if (!cache->headers) {
        cache->headers.emplace(cache->db, cache->snap, cache->id);
        cache->token_parts.emplace(cache->db, cache->snap, cache->id);
        cache->slices.emplace(cache->db, cache->snap, cache->id);
      }
      ASSIGN_OR_RETURN(start, ChunkHolding(cache->headers->get(), rec.id, row));
      SlicedChunkHeader header;
      RETURN_IF_ERROR(ReadChunkParts(cache->headers->get(), cache->token_parts->get(),
                                     cache->slices->get(), rec, firings != nullptr ? -1 : latent,
                                     start, &header, &chunk.tokens, &chunk.rows, &chunk.values));
      if (row >= start + header.num_rows) {
        return absl::DataLossError(
            absl::StrCat("dataset ", rec.id, " has no chunk holding row ", row));
      }
    } else {
      RETURN_IF_ERROR(ForEachChunk(snap, rec, row, 1, true, [&](const Chunk& c) {
        start = c.row_start;
        chunk.tokens = c.token_ids;
      }));
    }
    return cache->chunks.emplace(start, std::move(chunk)).first;
  };
  const int64_t row = t->row;
  int64_t stop = 0;
  ContextWindow(rec, row, before, after, &t->context_start_row, &stop);
  t->context_token_ids.clear();
  for (int64_t r = t->context_start_row; r < stop; ++r) {
    ASSIGN_OR_RETURN(const auto chunk, chunk_of(r));
    const int32_t token = chunk->second.tokens[r - chunk->first];
    t->context_token_ids.push_back(token);
    if (r == row) t->token_id = token;
  }
  // The latent's value on every row of the window (what a dashboard shades each token by): from
  // the firings the caller holds, else from the latent's run in the one or two chunks the
  // window spans (format 3: their starts are the token cache's), else from its postings.
  t->context_values.assign(t->context_token_ids.size(), 0.0f);
  auto place = [&](const std::vector<int64_t>& rows, const std::vector<float>& values) {
    for (auto it = std::lower_bound(rows.begin(), rows.end(), t->context_start_row);
         it != rows.end() && *it < stop; ++it) {
      t->context_values[*it - t->context_start_row] = values[it - rows.begin()];
    }
  };
  if (firings != nullptr) {
    place(firings->rows, firings->values);
  } else if (sliced) {
    // Every chunk the window spans was read with its run when its token ids were.
    for (int64_t r = t->context_start_row; r < stop;) {
      ASSIGN_OR_RETURN(const auto chunk, chunk_of(r));
      place(chunk->second.rows, chunk->second.values);
      r = chunk->first + static_cast<int64_t>(chunk->second.tokens.size());
    }
  } else {
    std::vector<int64_t> rows;
    std::vector<float> values;
    absl::Status s =
        LatentPostingsAt(snap, rec, latent, t->context_start_row, stop, &rows, &values);
    if (absl::IsFailedPrecondition(s)) {
      // A format-2 dataset written without postings has no latent-major layout: the window's
      // rows themselves (one or two row-major chunks).
      rows.clear();
      values.clear();
      const int64_t first = t->context_start_row;
      RETURN_IF_ERROR(ForEachChunk(snap, rec, first, stop - first, false, [&](const Chunk& c) {
        for (int64_t r = std::max(c.row_start, first); r < std::min(c.row_start + c.num_rows, stop);
             ++r) {
          for (int64_t e = c.indptr[r - c.row_start]; e < c.indptr[r - c.row_start + 1]; ++e) {
            if (c.indices[e] == latent) rows.push_back(r), values.push_back(c.values[e]);
          }
        }
      }));
    } else {
      RETURN_IF_ERROR(s);
    }
    place(rows, values);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ActivationInterval>> ChunkStore::IntervalSamples(
    uint64_t id, int32_t latent, int32_t intervals, int32_t per_interval, int32_t before,
    int32_t after) const {
  RETURN_IF_ERROR(CheckCount("intervals", intervals, kMaxSamples));
  RETURN_IF_ERROR(CheckCount("interval_samples", per_interval, kMaxSamples));
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(LatentFirings firings, FiringsForWindows(snap.get(), id, latent, before, after));
  const DatasetRecord& rec = firings.record;
  const std::vector<int64_t>& rows = firings.rows;
  const std::vector<float>& values = firings.values;
  std::vector<ActivationInterval> out;
  if (rows.empty()) return out;
  const auto [lo_it, hi_it] = std::minmax_element(values.begin(), values.end());
  const double lo = *lo_it, hi = *hi_it;
  if (lo == hi) intervals = 1;
  // The edges as reported (floats), and each entry placed by them, so that the counts agree
  // with the bounds a client sees.
  std::vector<float> edges(intervals + 1);
  for (int b = 0; b < intervals; ++b) edges[b] = static_cast<float>(lo + (hi - lo) * b / intervals);
  edges[intervals] = static_cast<float>(hi);
  std::vector<std::vector<size_t>> members(intervals);  // entries of each interval, row order
  for (size_t i = 0; i < values.size(); ++i) {
    const auto inner = std::upper_bound(edges.begin() + 1, edges.end() - 1, values[i]);
    members[inner - (edges.begin() + 1)].push_back(i);
  }
  WindowCache cache(db_, snap.get(), id);
  for (int b = 0; b < intervals; ++b) {
    ActivationInterval interval;
    interval.low = edges[b];
    interval.high = edges[b + 1];
    const std::vector<size_t>& m = members[b];
    interval.count = static_cast<int64_t>(m.size());
    const size_t take = std::min<size_t>(m.size(), per_interval);
    for (size_t j = 0; j < take; ++j) {
      // The j-th of `take` evenly spaced picks: the middle of its share of the interval's rows.
      const size_t pick = m[(2 * j + 1) * m.size() / (2 * take)];
      TopActivationContext t;
      t.row = rows[pick];
      t.value = values[pick];
      RETURN_IF_ERROR(FillContext(snap.get(), rec, latent, before, after, &firings, &cache, &t));
      interval.samples.push_back(std::move(t));
    }
    out.push_back(std::move(interval));
  }
  return out;
}

absl::StatusOr<std::vector<TopActivationContext>> ChunkStore::SilentSamples(
    uint64_t id, int32_t latent, int32_t count, int32_t before, int32_t after,
    uint64_t seed) const {
  RETURN_IF_ERROR(CheckCount("silent_samples", count, kMaxSamples));
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(LatentFirings firings, FiringsForWindows(snap.get(), id, latent, before, after));
  const DatasetRecord& rec = firings.record;
  const std::vector<int64_t>& rows = firings.rows;
  std::vector<TopActivationContext> out;
  if (rec.rows_committed == 0) return out;
  // Seeded by the latent too: each latent gets its own rows, the same ones every time.
  std::mt19937_64 rng(seed ^ (static_cast<uint64_t>(latent) * 0x9e3779b97f4a7c15ull));
  std::uniform_int_distribution<int64_t> pick(0, rec.rows_committed - 1);
  std::set<int64_t> chosen;
  for (int64_t draw = 0; draw < int64_t{64} * count && static_cast<int32_t>(chosen.size()) < count;
       ++draw) {
    const int64_t row = pick(rng);
    int64_t start = 0, stop = 0;
    ContextWindow(rec, row, before, after, &start, &stop);
    const auto next_firing = std::lower_bound(rows.begin(), rows.end(), start);
    if (next_firing != rows.end() && *next_firing < stop) continue;  // it fires in the window
    chosen.insert(row);
  }
  WindowCache cache(db_, snap.get(), id);
  for (int64_t row : chosen) {  // ascending
    TopActivationContext t;
    t.row = row;
    RETURN_IF_ERROR(FillContext(snap.get(), rec, latent, before, after, &firings, &cache, &t));
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status ChunkStore::LatentPostings(uint64_t id, int32_t latent, std::vector<int64_t>* rows,
                                        std::vector<float>* values, int64_t row_begin,
                                        int64_t row_end) const {
  if (row_begin < 0) {
    return absl::InvalidArgumentError(absl::StrCat("row_begin: ", row_begin, " is negative"));
  }
  SnapshotHolder snap(db_->raw());
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecordAt(snap.get(), id));
  RETURN_IF_ERROR(CheckLatentQuery(rec, id, latent));
  return LatentPostingsAt(snap.get(), rec, latent, row_begin, row_end, rows, values);
}

absl::Status ChunkStore::LatentPostingsAt(const rocksdb::Snapshot* snap, const DatasetRecord& rec,
                                          int32_t latent, int64_t row_begin, int64_t row_end,
                                          std::vector<int64_t>* rows,
                                          std::vector<float>* values) const {
  rows->clear();
  values->clear();
  row_end = std::min(row_end, rec.rows_committed);
  if (row_begin >= row_end) return absl::OkStatus();
  absl::Status s;
  if (rec.format_version >= 3) {
    s = SlicedLatentPostings(snap, rec, latent, row_begin, row_end, rows, values);
  } else {
    s = RowMajorLatentPostings(snap, rec, latent, row_begin, row_end, rows, values);
  }
  RETURN_IF_ERROR(s);
  // Postings and slices hold whole commits or chunks: keep the rows asked for.
  const auto first = std::lower_bound(rows->begin(), rows->end(), row_begin);
  const auto last = std::lower_bound(first, rows->end(), row_end);
  values->erase(values->begin() + (last - rows->begin()), values->end());
  values->erase(values->begin(), values->begin() + (first - rows->begin()));
  rows->erase(last, rows->end());
  rows->erase(rows->begin(), first);
  return absl::OkStatus();
}

absl::Status ChunkStore::RowMajorLatentPostings(const rocksdb::Snapshot* snap,
                                                const DatasetRecord& rec, int32_t latent,
                                                int64_t row_begin, int64_t row_end,
                                                std::vector<int64_t>* rows,
                                                std::vector<float>* values) const {
  const uint64_t id = rec.id;
  if (!rec.meta.postings) {
    return absl::FailedPreconditionError(absl::StrCat("dataset ", id, " keeps no postings"));
  }
  rocksdb::ReadOptions ro;
  ro.snapshot = snap;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->raw()->NewIterator(ro, db_->handle(Family::kPostings)));
  const std::string prefix = keys::PostingPrefix(id, static_cast<uint32_t>(latent));
  // A posting holds one commit's rows from its key's row on: the one holding row_begin is the
  // last at or before it.
  it->SeekForPrev(keys::Posting(id, static_cast<uint32_t>(latent), row_begin));
  if (!it->Valid() || !it->key().starts_with(prefix)) it->Seek(prefix);
  for (; it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const int64_t start = static_cast<int64_t>(ReadBigEndian64(it->key().data() + prefix.size()));
    if (start >= row_end) break;
    const absl::string_view value(it->value().data(), it->value().size());
    const ChunkDtype dtype = ToChunkDtype(rec.meta.value_dtype);
    const size_t before = rows->size();
    absl::Status s = rec.format_version >= 2 ? DecodePosting(value, start, dtype, rows, values)
                                             : DecodePostingV1(value, start, dtype, rows, values);
    // Each posting ascends on its own; together they must too, inside the committed rows.
    if (s.ok() && rows->size() > before &&
        ((before > 0 && (*rows)[before] <= (*rows)[before - 1]) ||
         rows->back() >= rec.rows_committed)) {
      s = absl::DataLossError("rows outside the posting's commit");
    }
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat("dataset ", id, " latent ", latent,
                                              " posting at row ", start, ": ", s.message()));
    }
  }
  return FromRocks(it->status(), "reading postings");
}

absl::Status ChunkStore::SlicedLatentPostings(const rocksdb::Snapshot* snap,
                                              const DatasetRecord& rec, int32_t latent,
                                              int64_t row_begin, int64_t row_end,
                                              std::vector<int64_t>* rows,
                                              std::vector<float>* values) const {
  const uint64_t id = rec.id;
  ChunkIterator it(db_, snap, id);
  ChunkIterator slices(db_, snap, id);
  ASSIGN_OR_RETURN(const int64_t first_chunk, ChunkHolding(it.get(), id, row_begin));
  SlicedChunkHeader header;
  for (int64_t chunk_start = first_chunk; chunk_start < row_end; chunk_start += header.num_rows) {
    RETURN_IF_ERROR(ReadChunkParts(it.get(), nullptr, slices.get(), rec, latent, chunk_start,
                                   &header, nullptr, rows, values));
  }
  RETURN_IF_ERROR(FromRocks(slices->status(), "reading latent slices"));
  return FromRocks(it->status(), "reading latent slices");
}

absl::StatusOr<std::unique_ptr<DatasetWriter>> ChunkStore::OpenWriter(uint64_t id) {
  RETURN_IF_ERROR(CheckWriteOptions(options_));
  std::unique_ptr<DatasetWriter> writer;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(DatasetRecord rec, GetRecord(id));
    if (rec.complete) {
      return absl::FailedPreconditionError(absl::StrCat("dataset ", id, " is complete"));
    }
    if (open_writers_.count(id)) {
      return absl::FailedPreconditionError(absl::StrCat("dataset ", id, " already has a writer"));
    }
    writer.reset(new DatasetWriter(this, std::move(rec)));
    open_writers_.insert(id);
  }
  // Outside the lock: the scan can be long (every block of a wide SAE), and on error the
  // writer's destructor releases the id, which takes the lock.
  RETURN_IF_ERROR(writer->LoadLatentState());
  return writer;
}

void ChunkStore::ReleaseWriter(uint64_t id) {
  absl::MutexLock lock(&mu_);
  open_writers_.erase(id);
}

// ---- DatasetWriter -----------------------------------------------------------------------------

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
