// Which engine entry point checks and runs each job type, and what those runners need of the
// daemon (stores, data roots, devices).
#ifndef LATENTD_SERVER_JOB_RUNNERS_H_
#define LATENTD_SERVER_JOB_RUNNERS_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/device_pool.h"
#include "engine/extract_runner.h"
#include "server/job_manager.h"
#include "storage/artifact_store.h"
#include "storage/chunk_store.h"

namespace latentd::server {

struct RunnerEnvironment {
  storage::ChunkStore* store = nullptr;
  storage::ArtifactStore* artifacts = nullptr;
  const engine::DevicePool* pool = nullptr;
  // Job inputs (models, SAEs, tokens) must lie under one of these.
  std::vector<std::string> data_roots;
  // Trained SAEs are written under this directory.
  std::string artifact_dir;
  // EXPORT jobs write only under this directory (as the ExportDataset RPC).
  std::string export_root;
  // The daemon's job records (TRAIN's resume_from_job_id reads the job it continues). Called
  // only from validation at submit, so it may reach a JobManager built after the runners.
  std::function<absl::StatusOr<latentd::v1::Job>(uint64_t job_id)> find_job;
};

// What EXTRACT jobs (and readers of their inputs, as GetLatentWeights) resolve paths against:
// the data roots plus the artifact directory, trained SAEs by artifact id, the job records.
engine::ExtractEnv MakeExtractEnv(const RunnerEnvironment& env);

// PROBE, EXTRACT, TRAIN and EXPORT. The environment's pointers must outlive the runners.
std::map<latentd::v1::JobType, JobRunner> MakeJobRunners(const RunnerEnvironment& env);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_JOB_RUNNERS_H_
