#include "server/job_runners.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/extract_job.h"
#include "engine/probe.h"
#include "engine/train_job.h"
#include "server/export_request.h"

namespace latentd::server {
namespace {

// The memory of the smallest device, the bound a job must fit whichever devices it gets.
int64_t SmallestDeviceMemory(const engine::DevicePool* pool) {
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (const engine::DeviceRef& d : pool->devices()) {
    smallest = std::min(smallest, d.memory_total_bytes);
  }
  return pool->devices().empty() ? 0 : smallest;
}

engine::TrainEnv MakeTrainEnv(const RunnerEnvironment& env, const latentd::v1::JobSpec& spec) {
  engine::TrainEnv train;
  train.store = env.store;
  train.artifact_dir = env.artifact_dir;
  train.data_roots = env.data_roots;
  train.device_memory_bytes = SmallestDeviceMemory(env.pool);
  train.num_devices = DevicesRequested(spec);
  train.artifacts = env.artifacts;
  train.find_job = env.find_job;
  return train;
}

}  // namespace

engine::ExtractEnv MakeExtractEnv(const RunnerEnvironment& env) {
  engine::ExtractEnv extract;
  extract.store = env.store;
  extract.data_roots = env.data_roots;
  // SAEs that TRAIN jobs wrote are inputs too, wherever the user's data roots are.
  extract.data_roots.push_back(env.artifact_dir);
  extract.device_memory_bytes = SmallestDeviceMemory(env.pool);
  extract.cpu_only =
      std::all_of(env.pool->devices().begin(), env.pool->devices().end(),
                  [](const engine::DeviceRef& d) { return d.kind == engine::DeviceKind::kCpu; });
  extract.find_job = env.find_job;
  if (env.store != nullptr) extract.open_stored_dense = engine::ChunkStoreDenseOpener(env.store);
  storage::ArtifactStore* artifacts = env.artifacts;
  extract.sae_artifact_dir = [artifacts](uint64_t id) -> absl::StatusOr<std::string> {
    auto artifact = artifacts->Get(id);
    if (!artifact.ok()) {
      return absl::NotFoundError(
          absl::StrCat("extract.sae.artifact_id: artifact ", id, " not found"));
    }
    return artifact->path();
  };
  return extract;
}

std::map<latentd::v1::JobType, JobRunner> MakeJobRunners(const RunnerEnvironment& env) {
  std::map<latentd::v1::JobType, JobRunner> runners;

  JobRunner probe;
  probe.validate = [](const latentd::v1::JobSpec& spec) {
    return engine::ValidateProbeSpec(spec.probe());
  };
  probe.run = [](const latentd::v1::JobSpec& spec,
                 engine::JobContext* context) -> absl::StatusOr<latentd::v1::JobResult> {
    auto result = engine::RunProbe(spec.probe(), context);
    if (!result.ok()) return result.status();
    latentd::v1::JobResult out;
    *out.mutable_probe() = std::move(*result);
    return out;
  };
  runners[latentd::v1::PROBE] = probe;

  const engine::ExtractEnv extract_env = MakeExtractEnv(env);
  JobRunner extract;
  extract.validate = [extract_env](const latentd::v1::JobSpec& spec) {
    return engine::ValidateExtractJob(spec.extract(), extract_env);
  };
  extract.run = [extract_env](
                    const latentd::v1::JobSpec& spec,
                    engine::JobContext* context) -> absl::StatusOr<latentd::v1::JobResult> {
    auto result = engine::RunExtract(spec.extract(), extract_env, context);
    if (!result.ok()) return result.status();
    latentd::v1::JobResult out;
    *out.mutable_extract() = std::move(*result);
    return out;
  };
  extract.plan = [extract_env](const latentd::v1::JobSpec& spec) {
    return engine::DescribeExtractJob(spec.extract(), extract_env);
  };
  extract.continues = [](const latentd::v1::JobSpec& spec) {
    return spec.extract().resume_from_job_id();
  };
  runners[latentd::v1::EXTRACT] = extract;

  JobRunner train;
  train.validate = [env](const latentd::v1::JobSpec& spec) {
    return engine::ValidateTrainSpec(spec.train(), MakeTrainEnv(env, spec));
  };
  train.run = [env](const latentd::v1::JobSpec& spec,
                    engine::JobContext* context) -> absl::StatusOr<latentd::v1::JobResult> {
    auto result = engine::RunTrain(spec.train(), MakeTrainEnv(env, spec), context);
    if (!result.ok()) return result.status();
    latentd::v1::JobResult out;
    *out.mutable_train() = std::move(*result);
    return out;
  };
  train.plan = [env](const latentd::v1::JobSpec& spec) {
    return engine::DescribeTrainSpec(spec.train(), MakeTrainEnv(env, spec));
  };
  storage::ChunkStore* store = env.store;
  train.forget = [store](uint64_t job_id) { return engine::ForgetTrainJob(store, job_id); };
  train.continues = [](const latentd::v1::JobSpec& spec) {
    return spec.train().resume_from_job_id();
  };
  runners[latentd::v1::TRAIN] = train;

  JobRunner export_runner;
  const std::string export_root = env.export_root;
  export_runner.holds_devices = false;
  export_runner.validate = [store, export_root](const latentd::v1::JobSpec& spec) {
    return ValidateExportRequest(*store, export_root, spec.export_(), "export.");
  };
  export_runner.plan = [store, export_root](const latentd::v1::JobSpec& spec) {
    return DescribeExportRequest(*store, export_root, spec.export_(), "export.");
  };
  export_runner.run = [store, export_root](
                          const latentd::v1::JobSpec& spec,
                          engine::JobContext* context) -> absl::StatusOr<latentd::v1::JobResult> {
    // Progress in rows; CancelJob or a shutdown stops the export at the next block, leaving
    // nothing at the path (a restarted daemon runs the job again from the start).
    auto response = RunExportRequest(*store, export_root, spec.export_(), "export.",
                                     [context](int64_t done, int64_t total) {
                                       context->ReportProgress(done, total, "rows");
                                       return !context->cancel_requested();
                                     });
    if (!response.ok()) return response.status();
    latentd::v1::JobResult out;
    *out.mutable_export_() = std::move(*response);
    return out;
  };
  runners[latentd::v1::EXPORT] = export_runner;
  return runners;
}

}  // namespace latentd::server
