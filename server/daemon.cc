#include "server/daemon.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/directory_bytes.h"
#include "common/process_memory.h"
#include "engine/dataset_models.h"
#include "engine/device_pool.h"
#include "server/auth.h"
#include "server/datasets_service.h"
#include "server/devices_service.h"
#include "server/http_endpoint.h"
#include "server/job_manager.h"
#include "server/job_runners.h"
#include "server/job_store.h"
#include "server/jobs_service.h"
#include "server/metrics.h"
#include "storage/artifact_store.h"
#include "storage/chunk_store.h"
#include "storage/db.h"

namespace latentd::server {

std::string DefaultDataDir() {
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/latentd");
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : "/tmp", "/.local/share/latentd");
}

bool IsLoopbackListenAddress(const std::string& listen) {
  std::string host = listen;
  if (auto colon = listen.rfind(':'); colon != std::string::npos) host = listen.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

struct Daemon::State {
  TokenAuth auth;
  std::unique_ptr<storage::Db> db;
  std::unique_ptr<JobStore> job_store;
  std::unique_ptr<storage::ChunkStore> chunk_store;
  std::unique_ptr<storage::ArtifactStore> artifacts;
  std::unique_ptr<engine::DevicePool> pool;
  std::unique_ptr<JobManager> manager;
  std::unique_ptr<JobsService> jobs_service;
  std::unique_ptr<DevicesService> devices_service;
  std::unique_ptr<engine::DatasetModels> dataset_models;
  std::unique_ptr<DatasetsService> datasets_service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<HttpEndpoint> metrics_endpoint;
  absl::Time start_time;
  // False once Shutdown() begins: /healthz then answers 503.
  std::atomic<bool> serving{false};
  bool shut_down = false;

  HttpResponse ServeHttp(const HttpRequest& request) const;
  DaemonFigures Figures() const;
};

DaemonFigures Daemon::State::Figures() const {
  DaemonFigures figures;
  figures.jobs = manager->Figures();
  figures.devices = pool->Snapshot();
  // Every file of the database (tables, blobs, write-ahead log, manifest): what the disk holds,
  // including what has not been flushed to a table yet.
  figures.store_bytes_on_disk = DirectoryBytes(db->path());
  figures.free_disk_bytes = db->FreeDiskBytes();
  figures.process_rss_bytes = ProcessRssBytes();
  figures.start_time = start_time;
  figures.now = absl::Now();
  return figures;
}

HttpResponse Daemon::State::ServeHttp(const HttpRequest& request) const {
  HttpResponse response;
  if (request.method != "GET") {
    response.status = 405;
    response.headers.push_back({"Allow", "GET, HEAD"});
    response.body = "only GET and HEAD\n";
    return response;
  }
  if (request.path == "/healthz") {
    // Exempt from auth, as gRPC health checking is: probes carry no credentials.
    const bool up = serving.load();
    response.status = up ? 200 : 503;
    response.body = up ? "serving\n" : "shutting down\n";
    return response;
  }
  if (request.path != "/metrics") {
    response.status = 404;
    response.body = "latentd serves /metrics (Prometheus text) and /healthz\n";
    return response;
  }
  if (!auth.Accepts(request.Header("authorization"))) {
    response.status = 401;
    response.headers.push_back({"WWW-Authenticate", "Bearer realm=\"latentd\""});
    response.body = "send 'Authorization: Bearer <token>' (the daemon's --auth_token_file)\n";
    return response;
  }
  response.content_type = kPrometheusContentType;
  response.body = RenderPrometheusMetrics(Figures());
  return response;
}

Daemon::Daemon(DaemonOptions options) : options_(std::move(options)) {}

Daemon::~Daemon() { Shutdown(); }

int Daemon::metrics_port() const {
  if (state_ == nullptr || state_->metrics_endpoint == nullptr) return 0;
  return state_->metrics_endpoint->port();
}

std::vector<std::string> Daemon::startup_warnings() const {
  if (state_ == nullptr || state_->manager == nullptr) return {};
  return state_->manager->startup_warnings();
}

absl::Status Daemon::Start() {
  if (state_) return absl::FailedPreconditionError("daemon already started");
  auto state = std::make_unique<State>();
  if (options_.data_dir.empty()) options_.data_dir = DefaultDataDir();
  if (options_.export_root.empty()) options_.export_root = options_.data_dir + "/exports";
  if (options_.data_roots.empty()) options_.data_roots = {options_.data_dir, "/tmp"};

  if (options_.max_export_jobs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_export_jobs: ", options_.max_export_jobs, " is below 1"));
  }
  if (options_.block_cache_mb < 1 || options_.block_cache_mb > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block_cache_mb: ", options_.block_cache_mb, " outside [1, 2^30]"));
  }
  if (!options_.auth_token_file.empty()) {
    auto auth = TokenAuth::FromFile(options_.auth_token_file);
    if (!auth.ok()) return auth.status();
    state->auth = std::move(*auth);
  }
  for (const auto& [flag, address] :
       {std::pair<const char*, const std::string&>{"--listen", options_.listen},
        {"--metrics_listen", options_.metrics_listen}}) {
    if (!address.empty() && !IsLoopbackListenAddress(address) && !state->auth.enabled() &&
        !options_.insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          flag, "=", address,
          " is not a loopback address: give --auth_token_file, or --insecure to serve without "
          "auth"));
    }
  }

  std::error_code ec;
  std::filesystem::create_directories(options_.data_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("--data_dir: cannot create ", options_.data_dir, ": ", ec.message()));
  }
  std::filesystem::create_directories(options_.export_root, ec);
  std::filesystem::create_directories(options_.data_dir + "/artifacts", ec);

  storage::DbOptions db_options;
  db_options.block_cache_bytes = static_cast<size_t>(options_.block_cache_mb) << 20;
  auto db = storage::Db::Open(options_.data_dir + "/db", db_options);
  if (!db.ok()) return db.status();
  state->db = std::move(*db);
  state->job_store = std::make_unique<JobStore>(state->db.get());
  state->chunk_store = std::make_unique<storage::ChunkStore>(state->db.get());
  state->artifacts = std::make_unique<storage::ArtifactStore>(state->db.get());
  auto pool = engine::DevicePool::Create(options_.devices);
  if (!pool.ok()) return pool.status();
  state->pool = std::move(*pool);

  RunnerEnvironment env;
  env.store = state->chunk_store.get();
  env.artifacts = state->artifacts.get();
  env.pool = state->pool.get();
  env.data_roots = options_.data_roots;
  env.artifact_dir = options_.data_dir + "/artifacts";
  env.export_root = options_.export_root;
  // The runners are built before the manager they serve; they ask it for jobs only at submit.
  auto manager_slot = std::make_shared<JobManager*>(nullptr);
  env.find_job = [manager_slot](uint64_t job_id) -> absl::StatusOr<latentd::v1::Job> {
    if (*manager_slot == nullptr) return absl::UnavailableError("latentd is starting");
    return (*manager_slot)->Get(job_id);
  };
  JobManagerOptions manager_options;
  manager_options.max_deviceless_jobs = options_.max_export_jobs;
  state->manager = std::make_unique<JobManager>(state->job_store.get(), state->pool.get(),
                                                MakeJobRunners(env), manager_options);
  *manager_slot = state->manager.get();
  if (absl::Status s = state->manager->Start(); !s.ok()) return s;

  state->jobs_service = std::make_unique<JobsService>(state->manager.get(), &state->auth);
  state->devices_service = std::make_unique<DevicesService>(state->pool.get(), &state->auth);
  DatasetsServiceOptions datasets_options;
  datasets_options.export_root = options_.export_root;
  datasets_options.artifact_dir = env.artifact_dir;
  JobManager* manager = state->manager.get();
  datasets_options.unfinished_jobs = [manager] { return manager->UnfinishedJobs(); };
  engine::DatasetModelsOptions models_options;
  models_options.cache_bytes = std::max<int64_t>(0, options_.dataset_models_cache_mb) << 20;
  state->dataset_models =
      std::make_unique<engine::DatasetModels>(MakeExtractEnv(env), models_options);
  datasets_options.dataset_models = state->dataset_models.get();
  state->datasets_service = std::make_unique<DatasetsService>(
      state->chunk_store.get(), state->artifacts.get(), std::move(datasets_options), &state->auth);

  state->start_time = absl::Now();
  if (!options_.metrics_listen.empty()) {
    const State* serving_state = state.get();
    auto endpoint = HttpEndpoint::Start(
        options_.metrics_listen,
        [serving_state](const HttpRequest& request) { return serving_state->ServeHttp(request); });
    if (!endpoint.ok()) {
      state->manager->Shutdown();
      return absl::Status(endpoint.status().code(),
                          absl::StrCat("--metrics_listen: ", endpoint.status().message()));
    }
    state->metrics_endpoint = std::move(*endpoint);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, grpc::InsecureServerCredentials(), &bound_port_);
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.RegisterService(state->jobs_service.get());
  builder.RegisterService(state->devices_service.get());
  builder.RegisterService(state->datasets_service.get());
  state->server = builder.BuildAndStart();
  if (state->server == nullptr || bound_port_ == 0) {
    state->manager->Shutdown();
    return absl::UnavailableError(absl::StrCat("--listen: cannot listen on ", options_.listen));
  }
  state->server->GetHealthCheckService()->SetServingStatus(true);
  state->serving = true;  // /healthz says so from now on
  state_ = std::move(state);
  return absl::OkStatus();
}

void Daemon::Shutdown() {
  if (!state_ || state_->shut_down) return;
  state_->shut_down = true;
  state_->serving = false;
  state_->server->GetHealthCheckService()->Shutdown();  // NOT_SERVING from now on
  // Stop jobs first: their watchers end, their state is written while the database is open.
  state_->manager->Shutdown();
  state_->server->Shutdown(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.grace)));
  state_->server->Wait();
  // Scrapes read the manager and the database: the endpoint goes before them.
  if (state_->metrics_endpoint != nullptr) state_->metrics_endpoint->Stop();
  state_->manager.reset();
  state_->job_store.reset();
  state_->datasets_service.reset();
  state_->artifacts.reset();
  state_->chunk_store.reset();
  state_->db.reset();  // closes RocksDB cleanly
}

}  // namespace latentd::server
