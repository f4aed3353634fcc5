// What a running job sees of the daemon: its devices, its cancellation flag, and where to report
// progress, telemetry and log lines. The server implements it; engine code (PROBE, EXTRACT, TRAIN
// runners) only calls it. Torch-free so that server code can include it cheaply.
//
// Contract for runners:
//  - check cancel_requested() at every safe point (between batches / steps, after a commit or
//    checkpoint) and return absl::CancelledError() promptly when it is set; what was committed
//    stays committed, and the job may be started again later (after a daemon restart) to resume;
//  - return the error that explains a failure: INVALID_ARGUMENT / NOT_FOUND / PERMISSION_DENIED for
//  bad
//    input, RESOURCE_EXHAUSTED for out-of-memory, DATA_LOSS for corrupt stored data, INTERNAL else;
//  - every Report*/Log call is thread-safe and cheap (it appends an event); rate-limit telemetry
//  yourself.
#ifndef LATENTD_ENGINE_JOB_CONTEXT_H_
#define LATENTD_ENGINE_JOB_CONTEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/latentd/v1/jobs.pb.h"

namespace latentd::engine {

enum class DeviceKind { kCpu, kCuda };

// A device held by the job. `name` is "cpu:0" or "cuda:1"; a CPU device is a share of the host's
// cores (the pool gives each CPU device host_cores / cpu_devices intra-op threads).
struct DeviceRef {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  std::string name;
  int64_t memory_total_bytes = 0;
};

class JobContext {
 public:
  virtual ~JobContext() = default;

  virtual uint64_t job_id() const = 0;
  // 1 on a job's first run, 2 after the first restart, ...
  virtual int attempt() const = 0;
  virtual const std::vector<DeviceRef>& devices() const = 0;
  virtual bool cancel_requested() const = 0;

  // The rate shown with the progress counts from a run's first report: a runner reports where it
  // starts (0, or where it resumes) before its first piece of work, so a run whose work comes in
  // one piece still shows one.
  virtual void ReportProgress(int64_t units_done, int64_t units_total, const std::string& unit) = 0;
  virtual void ReportTelemetry(const latentd::v1::Telemetry& sample) = 0;
  virtual void Log(latentd::v1::LogLine::Level level, const std::string& text) = 0;
};

// A runner that wants a reason other than the one its status code implies (e.g. NUMERICAL for a NaN
// loss, which is an INTERNAL-looking failure to the code but not to the user) attaches it here.
absl::Status WithReason(absl::Status status, latentd::v1::JobReason reason);
// `status` with its message replaced by `message`; its code and payloads (a reason attached by
// WithReason) stay. For runners that add what the user can do next to an error from below.
absl::Status WithMessage(const absl::Status& status, absl::string_view message);
// The reason attached by WithReason, or JOB_REASON_UNSPECIFIED.
latentd::v1::JobReason AttachedReason(const absl::Status& status);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_JOB_CONTEXT_H_
