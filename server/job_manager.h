// The job manager: the daemon's scheduler and the owner of every job's state machine.
//
//   SubmitJob -> PENDING --(devices free, its turn)--> RUNNING --> SUCCEEDED | FAILED
//                   |                                    |  \--(CancelJob)--> CANCELLING -->
//                   CANCELLED
//                   \--(CancelJob)--> CANCELLED          \--(shutdown or crash)--> PENDING
//                   (INTERRUPTED)
//
// Scheduling: strict priority order (higher first), FIFO by submission within one priority, and no
// backfill: when the job at the head cannot get its devices, nothing behind it that needs devices
// starts (a large job is never starved by a stream of small ones). A device is given to one job at
// a time (DevicePool). Jobs of a type that holds no device (EXPORT: JobRunner::holds_devices
// false) are outside that queue: they start in priority order as soon as fewer than
// max_deviceless_jobs of them run, whatever waits for devices.
// Pipelines: a job with after_job_ids is not a candidate until every job it waits for has
// SUCCEEDED (it holds nobody up meanwhile), FAILS with DEPENDENCY_FAILED as soon as one has
// FAILED or been CANCELLED, and takes its bindings (server/spec_bindings.h) once they all have:
// its record's spec then holds the values (submitted_spec the original) and its runner's
// validate runs on them as it starts.
//
// Durability: every state change is written (synced) with the event that announces it before any
// caller is told about it; on Start() a job that was RUNNING when the daemon died is re-queued
// (reason INTERRUPTED) and its runner is called again, which may resume from its own checkpoint.
//
// Thread-safe. Runners execute on their own threads and talk back through engine::JobContext.
#ifndef LATENTD_SERVER_JOB_MANAGER_H_
#define LATENTD_SERVER_JOB_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/device_pool.h"
#include "engine/job_context.h"
#include "proto/latentd/v1/jobs.pb.h"
#include "server/job_store.h"

namespace latentd::server {

// How one job type is checked and run. Both may be called from any thread.
struct JobRunner {
  // Cheap submit-time checks of the type-specific spec; an error is returned to the client as is.
  // May be empty (accept everything).
  std::function<absl::Status(const latentd::v1::JobSpec&)> validate;
  // Runs the job to completion on the devices in the context. See engine/job_context.h for the
  // contract (cancellation, error codes).
  std::function<absl::StatusOr<latentd::v1::JobResult>(const latentd::v1::JobSpec&,
                                                       engine::JobContext*)>
      run;
  // Removes what a finished job of this type keeps besides its record and events (TRAIN: its
  // checkpoint), when the job is deleted. May be empty (nothing).
  std::function<absl::Status(uint64_t job_id)> forget;
  // What a job of `spec` would do, for a dry run. It makes `validate`'s checks itself (a dry run
  // calls it instead of validate, so that the checks are not run twice). May be empty (a dry
  // run then runs validate and says only that the spec passed).
  std::function<absl::StatusOr<std::vector<std::string>>(const latentd::v1::JobSpec&)> plan;
  // The job whose leftovers a job of `spec` takes over (resume_from_job_id), or 0; that job
  // cannot be deleted while this one has not finished. May be empty (never).
  std::function<uint64_t(const latentd::v1::JobSpec& spec)> continues;
  // False for a type whose jobs run on the host without a device (EXPORT): num_devices must be
  // 0, and they neither wait for devices nor hold up the jobs that do. Default true.
  bool holds_devices = true;
};

struct JobManagerOptions {
  // Progress events closer together than this are coalesced (the last one is always written).
  // Default 200 ms.
  absl::Duration progress_interval = absl::Milliseconds(200);
  // How often a waiting watcher re-checks whether its client went away. Default 250 ms.
  absl::Duration watch_poll = absl::Milliseconds(250);
  // Jobs that hold no device (JobRunner::holds_devices false) running at once; more wait in
  // PENDING. Default 2: exports are bound by the disk, and two keep it busy.
  int max_deviceless_jobs = 2;
};

// Which jobs List returns; each field unset (UNSPECIFIED, empty) matches every job.
struct JobFilter {
  latentd::v1::JobState state = latentd::v1::JOB_STATE_UNSPECIFIED;
  latentd::v1::JobType type = latentd::v1::JOB_TYPE_UNSPECIFIED;
  std::string label;  // JobSpec.label, exactly
};

struct ListJobsResult {
  std::vector<latentd::v1::Job> jobs;
  std::string next_page_token;
};

// What the manager holds now, for the daemon's /metrics (server/metrics.h).
struct JobFigures {
  // Jobs by (type, state): every job the manager holds, finished ones until they are deleted.
  std::map<std::pair<latentd::v1::JobType, latentd::v1::JobState>, int64_t> counts;
  // RUNNING and CANCELLING jobs, ascending id (their latest telemetry in Job.latest_telemetry).
  std::vector<latentd::v1::Job> active;
};

class JobManager {
 public:
  JobManager(JobStore* store, engine::DevicePool* pool,
             std::map<latentd::v1::JobType, JobRunner> runners,
             JobManagerOptions options = JobManagerOptions());
  ~JobManager();  // calls Shutdown()

  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Loads the stored jobs, re-queues interrupted ones and starts scheduling. A job record that
  // cannot be read is left out, with a line in startup_warnings().
  absl::Status Start();
  // What Start() left out and why, for the daemon's log; set by Start(), read after it.
  const std::vector<std::string>& startup_warnings() const { return startup_warnings_; }
  // Stops scheduling, asks running jobs to stop at their next safe point (they go back to PENDING
  // with reason INTERRUPTED, resumable on the next start), ends watchers and joins every thread.
  // Idempotent.
  void Shutdown();

  // The same request_id returns the job it first created (ALREADY_EXISTS if the spec differs).
  // A spec with bindings whose jobs have not all succeeded passes the shared and pipeline checks
  // now and its type's checks when it starts (a failure then FAILS it, INVALID_INPUT).
  absl::StatusOr<latentd::v1::Job> Submit(const std::string& request_id,
                                          const latentd::v1::JobSpec& spec);
  // A dry run of Submit: the same checks and errors, then the runner's plan; creates nothing.
  absl::StatusOr<latentd::v1::JobPlan> Plan(const latentd::v1::JobSpec& spec) const;
  absl::StatusOr<latentd::v1::Job> Get(uint64_t job_id) const;
  // Every job not yet SUCCEEDED, FAILED or CANCELLED, ascending id. A job whose bindings are not
  // applied yet has the values of those whose jobs have SUCCEEDED in its spec already (as
  // ApplyBindings will set them), so that a check before deleting a dataset or an artifact sees
  // the one a waiting pipeline job will take; its submitted_spec stays unset.
  std::vector<latentd::v1::Job> UnfinishedJobs() const;
  // Counts and running jobs from memory, under the manager's lock (no database read).
  JobFigures Figures() const;
  // Newest first. page_token is the opaque next_page_token of the previous page.
  absl::StatusOr<ListJobsResult> List(const JobFilter& filter, int page_size,
                                      const std::string& page_token) const;
  // PENDING -> CANCELLED; RUNNING -> CANCELLING (the runner stops at its next safe point);
  // finished -> FAILED_PRECONDITION.
  absl::StatusOr<latentd::v1::Job> Cancel(uint64_t job_id);
  // Forgets a finished job: its record, its events and what its runner keeps for it (a TRAIN
  // job's checkpoint); the datasets and artifacts it made stay. FAILED_PRECONDITION while it
  // has not finished, or while an unfinished job continues it (resume_from_job_id) or waits for
  // it (after_job_ids); NOT_FOUND
  // for an unknown id. Its id is never given out again; its request id may be.
  absl::Status Delete(uint64_t job_id);

  // Sends the job's events with sequence > after_sequence, in order, then waits for new ones, until
  // the job's final event was sent (OK), `send` returns false (OK), `client_gone` returns true
  // (CANCELLED) or the manager shuts down (UNAVAILABLE).
  absl::Status Watch(uint64_t job_id, int64_t after_sequence,
                     const std::function<bool(const latentd::v1::JobEvent&)>& send,
                     const std::function<bool()>& client_gone) const;

 private:
  struct Entry;
  class Context;

  // The checks every type shares, then (with_runner) the runner's validate.
  absl::Status ValidateSpec(const latentd::v1::JobSpec& spec, bool with_runner = true) const;
  // Checks a submitted spec's after_job_ids and bindings and returns the spec as it would run
  // now: its bindings applied when every bound job has SUCCEEDED, nullopt while one has not
  // (the values do not exist yet). FAILED_PRECONDITION when a job it waits for has failed.
  absl::StatusOr<std::optional<latentd::v1::JobSpec>> ResolveSubmitted(
      const latentd::v1::JobSpec& spec) const;
  // The results of the jobs `spec` binds to, by id; nullopt while one has not SUCCEEDED.
  std::optional<std::map<uint64_t, latentd::v1::JobResult>> BoundResultsLocked(
      const latentd::v1::JobSpec& spec) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `spec` with the bindings whose jobs have SUCCEEDED applied, each on its own (one whose
  // value does not fit is left out: the job fails on it when it binds).
  latentd::v1::JobSpec PreviewBindingsLocked(const latentd::v1::JobSpec& spec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `spec`'s after_job_ids all SUCCEEDED (kReady), one FAILED, was CANCELLED or is gone
  // (kFailed, `why` says which), or else (kWaiting).
  enum class Dependencies { kReady, kWaiting, kFailed };
  Dependencies DependenciesLocked(const latentd::v1::JobSpec& spec, std::string* why) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends one event to `entry` (updating its record) and writes both; caller holds mu_.
  absl::Status AppendEventLocked(Entry* entry, latentd::v1::JobEvent event, bool sync)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SetStateLocked(Entry* entry, latentd::v1::JobState state,
                              latentd::v1::JobReason reason, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SchedulerLoop();
  // Whether jobs of the spec's type hold devices (JobRunner::holds_devices).
  bool HoldsDevices(const latentd::v1::JobSpec& spec) const;
  // Applies the bindings of a ready job once (Job.submitted_spec keeps the spec as submitted,
  // the log says what each took). False when one fails: the job is then FAILED.
  bool BindLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartJobLocked(Entry* entry, std::vector<engine::DeviceRef> devices)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunJob(Entry* entry);
  void FinishJob(Entry* entry, const absl::StatusOr<latentd::v1::JobResult>& result);
  // Joins the threads of finished runners. Lets go of mu_ while it joins: state read before the
  // call (shutting_down_ included) must be read again after it.
  void JoinFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobStore* const store_;
  engine::DevicePool* const pool_;
  const std::map<latentd::v1::JobType, JobRunner> runners_;
  const JobManagerOptions options_;

  mutable absl::Mutex mu_;
  // Signalled on every event, state change, device release and on shutdown.
  mutable absl::CondVar changed_;
  std::map<uint64_t, std::unique_ptr<Entry>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> by_request_id_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool schedule_dirty_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> finished_threads_ ABSL_GUARDED_BY(mu_);
  std::thread scheduler_;
  std::vector<std::string> startup_warnings_;
};

// Devices a job asks for: num_devices, 1 when unset.
int DevicesRequested(const latentd::v1::JobSpec& spec);

// Whether no further state change can happen.
bool IsTerminal(latentd::v1::JobState state);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_JOB_MANAGER_H_
