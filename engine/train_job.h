// TRAIN jobs: submit-time validation with memory admission, and the runner (resume from the job's
// last checkpoint, data parallel over the devices the job holds, artifact registration).
// Torch-free header: the server includes it.
#ifndef LATENTD_ENGINE_TRAIN_JOB_H_
#define LATENTD_ENGINE_TRAIN_JOB_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/job_context.h"
#include "proto/latentd/v1/jobs.pb.h"
#include "proto/latentd/v1/train.pb.h"

namespace latentd::storage {
class ArtifactStore;
class ChunkStore;
class Db;
}  // namespace latentd::storage

namespace latentd::engine {

struct TrainEnv {
  // Datasets (required). Checkpoints go to store->db() under "ckpt/" (see checkpoint.h).
  storage::ChunkStore* store = nullptr;
  // Trained models are written to <artifact_dir>/<artifact name>/ (required by RunTrain).
  std::string artifact_dir;
  // torchscript_path must resolve (symlinks followed) under one of these; PERMISSION_DENIED
  // otherwise (and with no roots at all).
  std::vector<std::string> data_roots;
  // Where the trained model is registered as an artifact; null: not registered (artifact_id is
  // then 0). With a store, a spec naming a taken artifact_name is refused at submit
  // (ALREADY_EXISTS), and a job that finds its name taken at the end (another job registered it
  // meanwhile) neither overwrites that artifact's files nor loses its own model: it saves under
  // "<name>.job<id>" and says so in a WARNING log line.
  storage::ArtifactStore* artifacts = nullptr;
  // Memory of each device the job would get, for admission; 0: unknown (no check).
  int64_t device_memory_bytes = 0;
  // Devices the job asks for (JobSpec.num_devices), for the per-rank batch in the estimate.
  int num_devices = 1;
  // The daemon's job records, for resume_from_job_id (its type, state and spec). Null: such
  // specs are refused (FAILED_PRECONDITION).
  std::function<absl::StatusOr<latentd::v1::Job>(uint64_t job_id)> find_job;
};

// Removes what a TRAIN job keeps in `store` besides its job record: its checkpoint, if any (a
// cancelled or failed job's, kept for resume_from_job_id).
absl::Status ForgetTrainJob(storage::ChunkStore* store, uint64_t job_id);

// Cheap checks at submit (INVALID_ARGUMENT naming the field, e.g. "train.optimizer.density";
// NOT_FOUND for a missing dataset or module; PERMISSION_DENIED for a path outside the data roots)
// and admission: RESOURCE_EXHAUSTED with the numbers when the model, its gradients, the
// optimizer's state (its static estimate) and the activations of a batch exceed the device.
absl::Status ValidateTrainSpec(const latentd::v1::TrainSpec& spec, const TrainEnv& env);
// What that job would do, after the same checks: its rows, model, optimizer (with what dense
// M-FAC's history would take), steps and device memory (a dry run's answer; lines for people).
absl::StatusOr<std::vector<std::string>> DescribeTrainSpec(const latentd::v1::TrainSpec& spec,
                                                           const TrainEnv& env);

// What a job of `spec` is estimated to need per device, in bytes, with the breakdown as text
// ("parameters 33.6 MB, gradients 33.6 MB, optimizer 1.2 GB (history_values ...), activations").
struct TrainMemoryEstimate {
  int64_t total_bytes = 0;
  int64_t optimizer_bytes = 0;
  std::string breakdown;
};
absl::StatusOr<TrainMemoryEstimate> EstimateTrainMemory(const latentd::v1::TrainSpec& spec,
                                                        const TrainEnv& env);

// Runs the job: resumes from its last checkpoint when there is one, trains on every device of
// `context` (one data-parallel rank each: Gloo on CPU devices, NCCL on CUDA ones), writes the
// model to <artifact_dir>/<name>, registers it, and returns the final metrics. CANCELLED at a
// step boundary (after checkpointing); a non-finite loss fails with reason NUMERICAL naming the
// step, the last good checkpoint kept.
absl::StatusOr<latentd::v1::TrainResult> RunTrain(const latentd::v1::TrainSpec& spec,
                                                  const TrainEnv& env, JobContext* context);

// The artifact name a spec gets: artifact_name, else "sae-<job id>".
std::string TrainArtifactName(const latentd::v1::TrainSpec& spec, uint64_t job_id);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TRAIN_JOB_H_
