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
#include "storage/chunk_store_internal.h"
#include "storage/crc32c.h"
#include "storage/id_counter.h"
#include "storage/keys.h"
#include "storage/posting_codec.h"
#include "storage/sliced_chunk.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace chunk_store_internal {

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

absl::Status LatentIndexError(uint64_t id, int32_t latent, const char* what,
                              const absl::Status& s) {
  return absl::Status(
      s.code(), absl::StrCat("dataset ", id, " latent ", latent, " ", what, ": ", s.message()));
}

}  // namespace chunk_store_internal

using chunk_store_internal::DecodeWatermark;
using chunk_store_internal::EncodeWatermark;
using chunk_store_internal::LatentIndexError;
using chunk_store_internal::ToChunkDtype;
using chunk_store_internal::Watermark;

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

absl::StatusOr<DatasetRecord> ChunkStore::GetSparseRecord(uint64_t id) const {
  ASSIGN_OR_RETURN(DatasetRecord rec, GetRecord(id));
  if (rec.meta.kind != DatasetKind::kSparse) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", id, " is DENSE: it has no latents"));
  }
  return rec;
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
    const std::string explained = keys::ExplanationPrefix(id);
    batch.DeleteRange(db_->handle(Family::kMeta), explained, keys::PrefixEnd(explained));
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

}  // namespace latentd::storage
