// latentd: the daemon. Parses flags, starts the Daemon, waits for SIGTERM/SIGINT.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "server/daemon.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "host:port to serve gRPC on (port 0: any free)");
ABSL_FLAG(std::string, data_dir, "",
          "data directory (default $XDG_DATA_HOME/latentd or ~/.local/share/latentd)");
ABSL_FLAG(std::string, devices, "auto", "devices to own: auto, cpu[:N], cuda[:i,j,...]");
ABSL_FLAG(std::string, auth_token_file, "", "file holding the bearer token every RPC must present");
ABSL_FLAG(bool, insecure, false, "allow a non-loopback --listen without --auth_token_file");
ABSL_FLAG(std::string, data_roots, "",
          "comma-separated directories job inputs must lie under (default: data dir, /tmp)");
ABSL_FLAG(std::string, export_root, "",
          "directory server-side exports go under (default <data_dir>/exports)");
ABSL_FLAG(int, max_export_jobs, 2, "EXPORT jobs running at once (they hold no device)");
ABSL_FLAG(std::string, port_file, "",
          "write the bound port to this file once serving (for tests and scripts)");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port of an HTTP endpoint with GET /metrics (Prometheus) and GET /healthz "
          "(default: none; port 0: any free)");
ABSL_FLAG(std::string, metrics_port_file, "",
          "write the metrics endpoint's bound port to this file once serving");
ABSL_FLAG(int, grace_seconds, 5, "how long in-flight RPCs may run on after SIGTERM");
ABSL_FLAG(int64_t, block_cache_mb, 256,
          "RocksDB block cache in MiB, shared by every dataset query");
ABSL_FLAG(int64_t, dataset_models_cache_mb, 2048,
          "MiB of SAEs and models kept loaded for GetLatentWeights and EncodePrompt (0: none)");

namespace {

// Writes `port` to `path` whole or not at all: readers never see a half-written file.
void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("latentd: the Latentd daemon (see README.md)");
  absl::ParseCommandLine(argc, argv);

  // Block the stop signals in every thread; the main thread takes them with sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  latentd::server::DaemonOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.devices = absl::GetFlag(FLAGS_devices);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.insecure = absl::GetFlag(FLAGS_insecure);
  for (absl::string_view root :
       absl::StrSplit(absl::GetFlag(FLAGS_data_roots), ',', absl::SkipEmpty())) {
    options.data_roots.emplace_back(root);
  }
  options.export_root = absl::GetFlag(FLAGS_export_root);
  options.max_export_jobs = absl::GetFlag(FLAGS_max_export_jobs);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.grace = absl::Seconds(absl::GetFlag(FLAGS_grace_seconds));
  options.block_cache_mb = absl::GetFlag(FLAGS_block_cache_mb);
  options.dataset_models_cache_mb = absl::GetFlag(FLAGS_dataset_models_cache_mb);

  latentd::server::Daemon daemon(options);
  if (absl::Status s = daemon.Start(); !s.ok()) {
    std::fprintf(stderr, "latentd: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  for (const std::string& warning : daemon.startup_warnings()) {
    std::fprintf(stderr, "latentd: WARNING: %s\n", warning.c_str());
  }
  std::fprintf(stderr, "latentd: serving on port %d\n", daemon.bound_port());
  if (daemon.metrics_port() != 0) {
    std::fprintf(stderr, "latentd: metrics on port %d (GET /metrics, /healthz)\n",
                 daemon.metrics_port());
  }
  // The metrics port first: a script that sees the gRPC port file finds both.
  WritePortFile(absl::GetFlag(FLAGS_metrics_port_file), daemon.metrics_port());
  WritePortFile(absl::GetFlag(FLAGS_port_file), daemon.bound_port());
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::fprintf(stderr, "latentd: signal %d, shutting down\n", signal_number);
  daemon.Shutdown();
  std::fprintf(stderr, "latentd: stopped\n");
  return 0;
}
