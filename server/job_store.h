// Durable job records and job events, in the kJobs column family of the daemon's one RocksDB.
//
// Key layout (fixed-width big-endian ids, so RocksDB's order is numeric order):
//   'J' id(8)           -> latentd.v1.Job (the latest record)
//   'E' id(8) seq(8)    -> latentd.v1.JobEvent
//   'R' request_id      -> id(8)             (idempotent SubmitJob)
//   'N'                 -> next id(8)             (never reused, also after a job is deleted)
// A record and the events that explain its change are written in one WriteBatch, so a reader never
// sees a state without its event. Writes that a client has been told about (submission, state
// changes) are synced; progress and telemetry are not (they survive a process crash through the
// WAL, and losing the newest few on a power cut is harmless).
#ifndef LATENTD_SERVER_JOB_STORE_H_
#define LATENTD_SERVER_JOB_STORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/latentd/v1/jobs.pb.h"
#include "storage/db.h"

namespace latentd::server {

class JobStore {
 public:
  explicit JobStore(storage::Db* db) : db_(db) {}

  // The id the next created job will get (1 for a new database). Not thread-safe with Create: the
  // job manager serializes both.
  absl::StatusOr<uint64_t> LoadNextId() const;

  // Writes a new job, its request id mapping and its first events, and advances the id counter, in
  // one synced batch.
  absl::Status Create(const latentd::v1::Job& job,
                      const std::vector<latentd::v1::JobEvent>& events);

  // Replaces the record of `job` and appends `events` in one batch.
  absl::Status Update(const latentd::v1::Job& job, const std::vector<latentd::v1::JobEvent>& events,
                      bool sync);

  // Removes the record of `job`, its events and its request id mapping, in one synced batch.
  absl::Status Delete(const latentd::v1::Job& job);
  // Every job record, oldest first. A record that does not parse, or names another id than its
  // key, is left out and described in `unreadable` ("job record 7: ..."): one damaged record
  // must not keep the daemon from starting and serving every other job and dataset.
  struct Loaded {
    std::vector<latentd::v1::Job> jobs;
    std::vector<std::string> unreadable;
  };
  absl::StatusOr<Loaded> LoadAll() const;

  // Events of `job_id` with sequence > after_sequence, in order, at most `limit`.
  absl::StatusOr<std::vector<latentd::v1::JobEvent>> ReadEvents(uint64_t job_id,
                                                                int64_t after_sequence,
                                                                int limit) const;

 private:
  storage::Db* db_;
};

}  // namespace latentd::server

#endif  // LATENTD_SERVER_JOB_STORE_H_
