// A JobContext for tests of runners (testonly): CPU devices, a cancellation the test steers, and
// a record of the progress, telemetry and log lines the runner reported. Thread-safe.
#ifndef LATENTD_ENGINE_JOB_CONTEXT_TESTING_H_
#define LATENTD_ENGINE_JOB_CONTEXT_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/job_context.h"

namespace latentd::engine {

class RecordingJobContext : public JobContext {
 public:
  struct Progress {
    int64_t done = 0, total = 0;
    std::string unit;
    std::string ToString() const { return absl::StrCat(done, "/", total, " ", unit); }
  };
  struct LogLine {
    latentd::v1::LogLine::Level level;
    std::string text;
  };

  // `num_devices` CPU devices, "cpu:0", "cpu:1", ...
  explicit RecordingJobContext(int num_devices = 1, uint64_t job_id = 1) : job_id_(job_id) {
    for (int i = 0; i < num_devices; ++i) {
      devices_.push_back({DeviceKind::kCpu, i, absl::StrCat("cpu:", i), 0});
    }
  }

  // cancel_requested() answers true from check n + 1 on (0: at once); never by default.
  void CancelAfterChecks(int n) {
    absl::MutexLock lock(&mu_);
    cancel_after_checks_ = n;
  }
  void Cancel() { CancelAfterChecks(0); }

  std::vector<Progress> progress() const {
    absl::MutexLock lock(&mu_);
    return progress_;
  }
  std::vector<LogLine> logs() const {
    absl::MutexLock lock(&mu_);
    return logs_;
  }
  std::vector<latentd::v1::Telemetry> telemetry() const {
    absl::MutexLock lock(&mu_);
    return telemetry_;
  }

  uint64_t job_id() const override { return job_id_; }
  int attempt() const override { return 1; }
  const std::vector<DeviceRef>& devices() const override { return devices_; }
  bool cancel_requested() const override {
    absl::MutexLock lock(&mu_);
    return cancel_after_checks_ >= 0 && ++checks_ > cancel_after_checks_;
  }
  void ReportProgress(int64_t done, int64_t total, const std::string& unit) override {
    absl::MutexLock lock(&mu_);
    progress_.push_back({done, total, unit});
  }
  void ReportTelemetry(const latentd::v1::Telemetry& sample) override {
    absl::MutexLock lock(&mu_);
    telemetry_.push_back(sample);
  }
  void Log(latentd::v1::LogLine::Level level, const std::string& text) override {
    absl::MutexLock lock(&mu_);
    logs_.push_back({level, text});
  }

 private:
  const uint64_t job_id_;
  std::vector<DeviceRef> devices_;
  mutable absl::Mutex mu_;
  int cancel_after_checks_ ABSL_GUARDED_BY(mu_) = -1;
  mutable int checks_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Progress> progress_ ABSL_GUARDED_BY(mu_);
  std::vector<LogLine> logs_ ABSL_GUARDED_BY(mu_);
  std::vector<latentd::v1::Telemetry> telemetry_ ABSL_GUARDED_BY(mu_);
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_JOB_CONTEXT_TESTING_H_
