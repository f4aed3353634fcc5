// Durable checkpoints of a TRAIN job: opaque blobs (the trainer serialises model, optimizer and
// data position into one) committed so that a crash at any instant leaves either the previous or
// the new checkpoint, never a torn one. Torch-free.
//
// DbCheckpointStore layout (prefix "ckpt/" is TRAIN's own in both families):
//   kChunks  "ckpt/" + be64(job) + be64(step)  -> blob
//   kMeta    "ckpt/" + be64(job)               -> be64(step) + be64(FNV-1a checksum) + be64(size)
// Commit writes the new blob, flips the pointer and deletes the previous blob in ONE synced
// WriteBatch, so the pointer never names a missing or partial blob.
#ifndef LATENTD_ENGINE_CHECKPOINT_H_
#define LATENTD_ENGINE_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/db.h"

namespace latentd::engine {

struct Checkpoint {
  int64_t step = 0;
  std::string blob;
};

class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;
  // The newest committed checkpoint, or nullopt when none exists. DATA_LOSS when the stored blob
  // does not match its pointer's size and checksum.
  virtual absl::StatusOr<std::optional<Checkpoint>> LoadLatest() = 0;
  // Makes `checkpoint` the newest, durably, replacing the previous one.
  virtual absl::Status Commit(const Checkpoint& checkpoint) = 0;
  // Removes every checkpoint (after the job's output is registered).
  virtual absl::Status Clear() = 0;
};

class InMemoryCheckpointStore : public CheckpointStore {
 public:
  absl::StatusOr<std::optional<Checkpoint>> LoadLatest() override;
  absl::Status Commit(const Checkpoint& checkpoint) override;
  absl::Status Clear() override;
  int commits() const;

 private:
  mutable absl::Mutex mu_;
  std::optional<Checkpoint> latest_ ABSL_GUARDED_BY(mu_);
  int commits_ ABSL_GUARDED_BY(mu_) = 0;
};

class DbCheckpointStore : public CheckpointStore {
 public:
  DbCheckpointStore(storage::Db* db, uint64_t job_id) : db_(db), job_id_(job_id) {}

  absl::StatusOr<std::optional<Checkpoint>> LoadLatest() override;
  absl::Status Commit(const Checkpoint& checkpoint) override;
  absl::Status Clear() override;

  // The newest checkpoint's step, reading only its pointer (cheap: no blob); nullopt when none.
  absl::StatusOr<std::optional<int64_t>> LatestStep() const;
  // Makes job `from_job`'s newest checkpoint this job's, in ONE synced WriteBatch that also
  // removes it from `from_job`, so exactly one job holds it after a crash at any instant. Returns
  // the adopted step, or nullopt when this job already holds a checkpoint (it adopted one, or got
  // further, before it was interrupted: that one is newer). FAILED_PRECONDITION when `from_job`
  // holds none; DATA_LOSS when its blob does not match its pointer.
  absl::StatusOr<std::optional<int64_t>> AdoptFrom(uint64_t from_job);

 private:
  struct Pointer {  // the kMeta value: which blob is the newest, and how to check it
    int64_t step = 0;
    uint64_t checksum = 0;
    uint64_t size = 0;
  };
  std::string PointerKey() const;
  std::string BlobKey(int64_t step) const;
  // nullopt when the job holds no checkpoint; DATA_LOSS for a malformed pointer.
  absl::StatusOr<std::optional<Pointer>> ReadPointer() const;
  // Puts `checkpoint`'s blob and the pointer naming it into `batch`.
  void PutCheckpoint(const Checkpoint& checkpoint, rocksdb::WriteBatch* batch) const;
  // Deletes the pointer and, when known, the blob it names.
  void DeleteCurrent(const std::optional<Pointer>& pointer, rocksdb::WriteBatch* batch) const;

  storage::Db* db_;
  uint64_t job_id_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_CHECKPOINT_H_
