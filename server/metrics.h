// The daemon's state as Prometheus text exposition (format 0.0.4), for GET /metrics.
//
// Every figure comes from memory or from cheap file-system calls (no database scan), so a scrape
// every few seconds costs the daemon nothing visible. Metric names (all prefixed latentd_, bytes
// in bytes, times in seconds, rates per second):
//   jobs by type and state (every combination, 0 included, so a query never finds a gap);
//   per running job (labels job, type): progress, attempts, running seconds, and the figures of
//     its latest telemetry sample (EXTRACT: tokens/s, bytes committed and per token, fit;
//     TRAIN: step, loss, FVU, L0, dead latents, step time, rows/s, lr, optimizer state by
//     component beside what the dense M-FAC history would take, device memory);
//   per device (label device): memory total and used, whether a job holds it;
//   the store's bytes on disk and the free space left; the process's RSS and start time.
// docs/SERVICE.md lists every metric with its meaning.
#ifndef LATENTD_SERVER_METRICS_H_
#define LATENTD_SERVER_METRICS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "engine/device_pool.h"
#include "server/job_manager.h"

namespace latentd::server {

// Everything one scrape shows, gathered by the caller.
struct DaemonFigures {
  JobFigures jobs;
  std::vector<engine::DeviceStatus> devices;
  // Bytes of every file of the store's database (tables, blobs, log, manifest); -1: unknown
  // (left out).
  int64_t store_bytes_on_disk = -1;
  // What the file system holding the store still has for latentd; -1: unknown (left out).
  int64_t free_disk_bytes = -1;
  // Resident set size of the daemon; -1: unknown (left out).
  int64_t process_rss_bytes = -1;
  absl::Time start_time = absl::UnixEpoch();
  absl::Time now = absl::UnixEpoch();
};

// The content type a /metrics answer carries.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

std::string RenderPrometheusMetrics(const DaemonFigures& figures);

// Builds exposition text family by family. Samples of one family come out together under its
// HELP and TYPE lines, in the order families were first declared; a family with no sample is
// left out. Label values are escaped (\\, \", \n); non-finite values print as NaN, +Inf, -Inf.
class PrometheusText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;

  // Declares `name` (type "gauge" or "counter") if new; later samples of `name` join it.
  void Declare(const std::string& name, const std::string& type, const std::string& help);
  // Adds a sample to the declared family `name`.
  void Add(const std::string& name, const Labels& labels, double value);
  std::string Text() const;

 private:
  struct Family {
    std::string name, type, help;
    std::vector<std::string> samples;
  };
  Family* Find(const std::string& name);
  std::vector<Family> families_;
};

}  // namespace latentd::server

#endif  // LATENTD_SERVER_METRICS_H_
