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

absl::StatusOr<std::optional<Checkpoint>> DbCheckpointStore::LoadLatest() {
  auto pointer = db_->Get(storage::Family::kMeta, PointerKey());
  if (absl::IsNotFound(pointer.status())) return std::optional<Checkpoint>();
  if (!pointer.ok()) return pointer.status();
  if (pointer->size() != 24) {
    return absl::DataLossError(absl::StrCat("checkpoint pointer of job ", job_id_, " has ",
                                            pointer->size(), " bytes, expected 24"));
  }
  Checkpoint checkpoint;
  checkpoint.step = static_cast<int64_t>(ReadBigEndian64(pointer->data()));
  const uint64_t checksum = ReadBigEndian64(pointer->data() + 8);
  const uint64_t size = ReadBigEndian64(pointer->data() + 16);
  auto blob = db_->Get(storage::Family::kChunks, BlobKey(checkpoint.step));
  if (absl::IsNotFound(blob.status())) {
    return absl::DataLossError(
        absl::StrCat("checkpoint of job ", job_id_, " at step ", checkpoint.step, " is missing"));
  }
  if (!blob.ok()) return blob.status();
  if (blob->size() != size || Fnv1a(*blob) != checksum) {
    return absl::DataLossError(absl::StrCat("checkpoint of job ", job_id_, " at step ",
                                            checkpoint.step, " is corrupt (", blob->size(),
                                            " bytes, expected ", size, ")"));
  }
  checkpoint.blob = std::move(*blob);
  return std::optional<Checkpoint>(std::move(checkpoint));
}

absl::Status DbCheckpointStore::Commit(const Checkpoint& checkpoint) {
  rocksdb::WriteBatch batch;
  auto previous = db_->Get(storage::Family::kMeta, PointerKey());
  if (previous.ok() && previous->size() == 24) {
    const int64_t previous_step = static_cast<int64_t>(ReadBigEndian64(previous->data()));
    if (previous_step != checkpoint.step) {
      batch.Delete(db_->handle(storage::Family::kChunks), BlobKey(previous_step));
    }
  } else if (!previous.ok() && !absl::IsNotFound(previous.status())) {
    return previous.status();
  }
  std::string pointer;
  AppendBigEndian64(static_cast<uint64_t>(checkpoint.step), &pointer);
  AppendBigEndian64(Fnv1a(checkpoint.blob), &pointer);
  AppendBigEndian64(checkpoint.blob.size(), &pointer);
  batch.Put(db_->handle(storage::Family::kChunks), BlobKey(checkpoint.step), checkpoint.blob);
  batch.Put(db_->handle(storage::Family::kMeta), PointerKey(), pointer);
  return db_->Write(&batch, /*sync=*/true);
}

absl::StatusOr<std::optional<int64_t>> DbCheckpointStore::LatestStep() const {
  auto pointer = db_->Get(storage::Family::kMeta, PointerKey());
  if (absl::IsNotFound(pointer.status())) return std::optional<int64_t>();
  if (!pointer.ok()) return pointer.status();
  if (pointer->size() != 24) {
    return absl::DataLossError(absl::StrCat("checkpoint pointer of job ", job_id_, " has ",
                                            pointer->size(), " bytes, expected 24"));
  }
  return std::optional<int64_t>(static_cast<int64_t>(ReadBigEndian64(pointer->data())));
}

absl::StatusOr<std::optional<int64_t>> DbCheckpointStore::AdoptFrom(uint64_t from_job) {
  ASSIGN_OR_RETURN(std::optional<int64_t> own, LatestStep());
  if (own.has_value()) return std::optional<int64_t>();
  DbCheckpointStore from(db_, from_job);
  ASSIGN_OR_RETURN(std::optional<Checkpoint> latest, from.LoadLatest());
  if (!latest.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", from_job,
                     " holds no checkpoint (it finished, or another job took "
                     "its checkpoint over)"));
  }
  std::string pointer;
  AppendBigEndian64(static_cast<uint64_t>(latest->step), &pointer);
  AppendBigEndian64(Fnv1a(latest->blob), &pointer);
  AppendBigEndian64(latest->blob.size(), &pointer);
  rocksdb::WriteBatch batch;
  batch.Put(db_->handle(storage::Family::kChunks), BlobKey(latest->step), latest->blob);
  batch.Put(db_->handle(storage::Family::kMeta), PointerKey(), pointer);
  batch.Delete(db_->handle(storage::Family::kChunks), from.BlobKey(latest->step));
  batch.Delete(db_->handle(storage::Family::kMeta), from.PointerKey());
  RETURN_IF_ERROR(db_->Write(&batch, /*sync=*/true));
  return std::optional<int64_t>(latest->step);
}

absl::Status DbCheckpointStore::Clear() {
  auto previous = db_->Get(storage::Family::kMeta, PointerKey());
  if (absl::IsNotFound(previous.status())) return absl::OkStatus();
  if (!previous.ok()) return previous.status();
  rocksdb::WriteBatch batch;
  if (previous->size() == 24) {
    batch.Delete(db_->handle(storage::Family::kChunks),
                 BlobKey(static_cast<int64_t>(ReadBigEndian64(previous->data()))));
  }
  batch.Delete(db_->handle(storage::Family::kMeta), PointerKey());
  return db_->Write(&batch, /*sync=*/true);
}

}  // namespace latentd::engine
