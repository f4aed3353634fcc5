// The daemon: opens the database, builds the device pool, the job manager and the gRPC services,
// serves until Shutdown(). main.cc only turns flags into DaemonOptions.
#ifndef LATENTD_SERVER_DAEMON_H_
#define LATENTD_SERVER_DAEMON_H_

#include <grpcpp/server.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace latentd::server {

struct DaemonOptions {
  // host:port to listen on. Port 0 picks a free port (see bound_port()). Default 127.0.0.1:50051.
  std::string listen = "127.0.0.1:50051";
  // Where the RocksDB database (and exports, artifacts by default) live. Default DefaultDataDir().
  std::string data_dir;
  // Device spec, see engine/device_pool.h. Default "auto".
  std::string devices = "auto";
  // File whose first line is the bearer token; empty disables authentication.
  std::string auth_token_file;
  // Allow a non-loopback listen address without a token. Default false.
  bool insecure = false;
  // Directories job inputs (models, SAEs, tokens) must lie under. Default: the data dir and /tmp.
  std::vector<std::string> data_roots;
  // Directory server-side exports are written under. Default <data_dir>/exports.
  std::string export_root;
  // EXPORT jobs running at once (JobManagerOptions::max_deviceless_jobs). Default 2; at least 1.
  int max_export_jobs = 2;
  // host:port of an HTTP endpoint beside the gRPC port: GET /metrics answers Prometheus text
  // (server/metrics.h), GET /healthz 200 while serving and 503 once shutdown begins. Empty (the
  // default) serves none; port 0 picks a free port (see metrics_port()). The rule of `listen`
  // holds: off loopback it needs auth_token_file (scrapers then send "Authorization: Bearer
  // <token>"; /healthz needs none) or insecure.
  std::string metrics_listen;
  // Largest request message accepted. Default 16 MiB.
  int max_message_bytes = 16 << 20;
  // How long in-flight RPCs may run on after Shutdown() begins. Default 5 s.
  absl::Duration grace = absl::Seconds(5);
  // RocksDB block cache shared by every family, in MiB: what repeated dataset queries (row
  // ranges, latent scans, top-N contexts) find in memory. Default 256; at least 1.
  int64_t block_cache_mb = 256;
  // Memory for the SAEs and models GetLatentWeights and EncodePrompt keep loaded between calls
  // (engine::DatasetModelsOptions::cache_bytes), in MiB. Default 2048; 0 keeps nothing.
  int64_t dataset_models_cache_mb = 2048;
};

// $XDG_DATA_HOME/latentd, else $HOME/.local/share/latentd.
std::string DefaultDataDir();

// Whether `listen` (host:port) names a loopback address.
bool IsLoopbackListenAddress(const std::string& listen);

class Daemon {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon();

  // Validates the options, opens everything and starts serving.
  absl::Status Start();
  // The port actually bound (useful with port 0).
  int bound_port() const { return bound_port_; }
  // The port of the metrics endpoint, 0 when there is none.
  int metrics_port() const;
  // What Start() found damaged and left out (unreadable job records), one line each, for the log.
  std::vector<std::string> startup_warnings() const;
  // Health NOT_SERVING, running jobs stopped at a safe point (left resumable), in-flight RPCs given
  // the grace deadline, database closed. Idempotent.
  void Shutdown();

 private:
  struct State;
  DaemonOptions options_;
  std::unique_ptr<State> state_;
  int bound_port_ = 0;
};

}  // namespace latentd::server

#endif  // LATENTD_SERVER_DAEMON_H_
