#include "engine/checkpoint.h"

#include "absl/strings/str_cat.h"
#include "common/big_endian.h"
#include "common/status_macros.h"
#include "rocksdb/write_batch.h"

namespace latentd::engine {
namespace {

constexpr char kPrefix[] = "ckpt/";

uint64_t Fnv1a(const std::string& data) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : data) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace

absl::StatusOr<std::optional<Checkpoint>> InMemoryCheckpointStore::LoadLatest() {
  absl::MutexLock lock(&mu_);
  return latest_;
}

absl::Status InMemoryCheckpointStore::Commit(const Checkpoint& checkpoint) {
  absl::MutexLock lock(&mu_);
  latest_ = checkpoint;
  ++commits_;
  return absl::OkStatus();
}

absl::Status InMemoryCheckpointStore::Clear() {
  absl::MutexLock lock(&mu_);
  latest_.reset();
  return absl::OkStatus();
}

int InMemoryCheckpointStore::commits() const {
  absl::MutexLock lock(&mu_);
  return commits_;
}

std::string DbCheckpointStore::PointerKey() const {
  std::string key = kPrefix;
  AppendBigEndian64(job_id_, &key);
  return key;
}

std::string DbCheckpointStore::BlobKey(int64_t step) const {
  std::string key = PointerKey();
  AppendBigEndian64(static_cast<uint64_t>(step), &key);
  return key;
}

absl::StatusOr<std::optional<DbCheckpointStore::Pointer>> DbCheckpointStore::ReadPointer() const {
  auto value = db_->Get(storage::Family::kMeta, PointerKey());
  if (absl::IsNotFound(value.status())) return std::optional<Pointer>();
  if (!value.ok()) return value.status();
  if (value->size() != 24) {
    return absl::DataLossError(absl::StrCat("checkpoint pointer of job ", job_id_, " has ",
                                            value->size(), " bytes, expected 24"));
  }
  Pointer pointer;
  pointer.step = static_cast<int64_t>(ReadBigEndian64(value->data()));
  pointer.checksum = ReadBigEndian64(value->data() + 8);
  pointer.size = ReadBigEndian64(value->data() + 16);
  return std::optional<Pointer>(pointer);
}

void DbCheckpointStore::PutCheckpoint(const Checkpoint& checkpoint,
                                      rocksdb::WriteBatch* batch) const {
  std::string pointer;
  AppendBigEndian64(static_cast<uint64_t>(checkpoint.step), &pointer);
  AppendBigEndian64(Fnv1a(checkpoint.blob), &pointer);
  AppendBigEndian64(checkpoint.blob.size(), &pointer);
  batch->Put(db_->handle(storage::Family::kChunks), BlobKey(checkpoint.step), checkpoint.blob);
  batch->Put(db_->handle(storage::Family::kMeta), PointerKey(), pointer);
}

void DbCheckpointStore::DeleteCurrent(const std::optional<Pointer>& pointer,
                                      rocksdb::WriteBatch* batch) const {
  if (pointer.has_value()) {
    batch->Delete(db_->handle(storage::Family::kChunks), BlobKey(pointer->step));
  }
  batch->Delete(db_->handle(storage::Family::kMeta), PointerKey());
}

absl::StatusOr<std::optional<Checkpoint>> DbCheckpointStore::LoadLatest() {
  ASSIGN_OR_RETURN(std::optional<Pointer> pointer, ReadPointer());
  if (!pointer.has_value()) return std::optional<Checkpoint>();
  auto blob = db_->Get(storage::Family::kChunks, BlobKey(pointer->step));
  if (absl::IsNotFound(blob.status())) {
    return absl::DataLossError(
        absl::StrCat("checkpoint of job ", job_id_, " at step ", pointer->step, " is missing"));
  }
  if (!blob.ok()) return blob.status();
  if (blob->size() != pointer->size || Fnv1a(*blob) != pointer->checksum) {
    return absl::DataLossError(absl::StrCat("checkpoint of job ", job_id_, " at step ",
                                            pointer->step, " is corrupt (", blob->size(),
                                            " bytes, expected ", pointer->size, ")"));
  }
  return std::optional<Checkpoint>(Checkpoint{pointer->step, std::move(*blob)});
}

// A malformed pointer (DATA_LOSS on read) is replaced or removed like a good one; only the blob
// it names cannot be found to delete.
absl::Status DbCheckpointStore::Commit(const Checkpoint& checkpoint) {
  auto previous = ReadPointer();
  if (!previous.ok() && !absl::IsDataLoss(previous.status())) return previous.status();
  rocksdb::WriteBatch batch;
  if (previous.ok() && previous->has_value() && (*previous)->step != checkpoint.step) {
    batch.Delete(db_->handle(storage::Family::kChunks), BlobKey((*previous)->step));
  }
  PutCheckpoint(checkpoint, &batch);
  return db_->Write(&batch, /*sync=*/true);
}

absl::Status DbCheckpointStore::Clear() {
  auto previous = ReadPointer();
  if (previous.ok() && !previous->has_value()) return absl::OkStatus();
  if (!previous.ok() && !absl::IsDataLoss(previous.status())) return previous.status();
  rocksdb::WriteBatch batch;
  DeleteCurrent(previous.ok() ? *previous : std::nullopt, &batch);
  return db_->Write(&batch, /*sync=*/true);
}

absl::StatusOr<std::optional<int64_t>> DbCheckpointStore::LatestStep() const {
  ASSIGN_OR_RETURN(std::optional<Pointer> pointer, ReadPointer());
  if (!pointer.has_value()) return std::optional<int64_t>();
  return std::optional<int64_t>(pointer->step);
}

absl::StatusOr<std::optional<int64_t>> DbCheckpointStore::AdoptFrom(uint64_t from_job) {
  ASSIGN_OR_RETURN(std::optional<int64_t> own, LatestStep());
  if (own.has_value()) return std::optional<int64_t>();
  DbCheckpointStore from(db_, from_job);
  ASSIGN_OR_RETURN(std::optional<Checkpoint> latest, from.LoadLatest());
  if (!latest.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", from_job, " holds no checkpoint (it finished, or another job took it over)"));
  }
  rocksdb::WriteBatch batch;
  PutCheckpoint(*latest, &batch);
  from.DeleteCurrent(Pointer{latest->step, 0, 0}, &batch);
  RETURN_IF_ERROR(db_->Write(&batch, /*sync=*/true));
  return std::optional<int64_t>(latest->step);
}

}  // namespace latentd::engine
