// EXTRACT jobs without the chunk store: submit-time validation and the runner against any RowSink
// (extract_job.h binds it to storage::ChunkStore). Torch-free header.
#ifndef LATENTD_ENGINE_EXTRACT_RUNNER_H_
#define LATENTD_ENGINE_EXTRACT_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/job_context.h"
#include "engine/row_sink.h"
#include "engine/stored_dense.h"
#include "proto/latentd/v1/extract.pb.h"
#include "proto/latentd/v1/jobs.pb.h"

namespace latentd::storage {
class ChunkStore;
}

namespace latentd::engine {

class ActivationModel;
class TokenSource;

struct ExtractEnv {
  storage::ChunkStore* store = nullptr;  // used by RunExtract (extract_job.h)
  // Model, SAE and token paths must resolve (symlinks followed) under one of these directories;
  // PERMISSION_DENIED otherwise (and with no roots at all).
  std::vector<std::string> data_roots;
  // SaeSource.artifact_id -> the SAE directory (NOT_FOUND for an unknown id). May be empty.
  std::function<absl::StatusOr<std::string>(uint64_t)> sae_artifact_dir;
  // Memory of the smallest device a job may get, for the submit-time memory check; 0: unknown.
  int64_t device_memory_bytes = 0;
  // Every device a job may get is a CPU: the submit-time memory check counts the batch a CPU
  // runs by default (DefaultBatchSequences), not 32 sequences. Default false.
  bool cpu_only = false;
  // Bytes free on the disk the dataset will go to: a new dataset that cannot fit (a lower bound
  // of its size; TopK and DENSE) is RESOURCE_EXHAUSTED at submit. Null: no check.
  std::function<int64_t()> free_disk_bytes;
  // The daemon's job records, for resume_from_job_id. Null: such specs are FAILED_PRECONDITION.
  std::function<absl::StatusOr<latentd::v1::Job>(uint64_t job_id)> find_job;
  // The store's DENSE datasets, for a stored model (ModelSpec.stored). Null: such specs are
  // FAILED_PRECONDITION.
  StoredDenseOpener open_stored_dense;
};

// What the dataset records about the job (mirrors storage::DatasetMeta).
struct ExtractDatasetMeta {
  std::string name;
  bool sparse = true;
  latentd::v1::ValueDtype value_dtype = latentd::v1::FLOAT16;
  std::string model_id, model_weight_hash, hook_name;
  std::string hook_name_out;    // a transcoder's output hook; "" for an SAE and DENSE
  std::string sae_weight_hash;  // Sae::weight_hash(); "" for DENSE
  int32_t layer = 0;
  int32_t d_in = 0;
  std::string encoder;  // "topk" | "relu" | "jumprelu" | "" (dense)
  int32_t k = 0;
  std::string threshold_policy;
  bool apply_b_dec_to_input = true;
  int32_t width = 0;
  int32_t context_length = 0;
  std::string token_source;
  int64_t token_order_start = 0;  // first source sequence's first row: sequence_start * L
  uint64_t job_id = 0;
  // resume_from_job_id: a dataset of this job is taken over (after the same checks as a resume).
  uint64_t adopt_from_job = 0;
  int64_t rows_planned = 0;
  bool postings = true;
  int32_t top_n = 64;
};

struct OpenedSink {
  uint64_t dataset_id = 0;
  std::unique_ptr<RowSink> sink;
};
// Creates the dataset, or reopens it at its watermark when it exists for the same job id, or for
// adopt_from_job (then it becomes this job's); ALREADY_EXISTS when it belongs to another job.
using SinkOpener = std::function<absl::StatusOr<OpenedSink>(const ExtractDatasetMeta&)>;

// Cheap checks at submit: paths under the data roots (PERMISSION_DENIED), files present
// (NOT_FOUND), hook name, token file header and shard, SAE cfg.json + safetensors header, hook
// width == SAE d_in where it is known without loading the model, batch sizes, memory estimate
// (INVALID_ARGUMENT naming the field, e.g. "extract.hook_name").
absl::Status ValidateExtractSpec(const latentd::v1::ExtractSpec& spec, const ExtractEnv& env);
// What the spec's job would do, after the same checks: the token source and its rows, the model,
// each dataset with its hook and how its SAE is read, batching, the disk it needs at least and
// the device memory it needs about (a dry run's answer; lines for people).
absl::StatusOr<std::vector<std::string>> DescribeExtractSpec(const latentd::v1::ExtractSpec& spec,
                                                             const ExtractEnv& env);

// What a DENSE spec computes its rows from, for callers that want the rows without a dataset
// (TRAIN on a model's hidden states): the model on `device` with the hooks of the spec's outputs
// (hook_name, then more_outputs': ForwardHooks gives them in that order), and the token shard.
// Checked as ValidateExtractSpec checks (errors name "extract.<field>").
struct ExtractInputs {
  ExtractInputs();
  ExtractInputs(ExtractInputs&&);
  ~ExtractInputs();
  std::unique_ptr<ActivationModel> model;
  std::unique_ptr<TokenSource> tokens;
  int64_t batch_sequences = 0;  // the spec's, or the default
};
absl::StatusOr<ExtractInputs> OpenExtractInputs(const latentd::v1::ExtractSpec& spec,
                                                const ExtractEnv& env, const DeviceRef& device);
// batch_sequences when a spec leaves it at 0: 32 sequences a forward pass; when every device is
// a CPU, fewer at long contexts, keeping B x L^2 (attention's [B, heads, L, L] scores) at most
// 32 x 128^2: 8 at 256 tokens, 2 at 512, 1 from 1024.
int64_t DefaultBatchSequences(int64_t context_length, bool all_cpu);
// The rows of the spec's token shard and the widths of its outputs' hooks: from the model's
// config where it is run natively, else (a TorchScript model) by loading it on the CPU.
struct ExtractRowShape {
  int64_t rows = 0;
  int64_t width = 0;            // of hook_name
  std::vector<int64_t> widths;  // of every output's hook, hook_name's first
};
absl::StatusOr<ExtractRowShape> ExtractRowShapeOf(const latentd::v1::ExtractSpec& spec,
                                                  const ExtractEnv& env);

// Runs the job into the sink `open_sink` gives (see RunExtract for the semantics).
absl::StatusOr<latentd::v1::ExtractResult> RunExtractToSink(const latentd::v1::ExtractSpec& spec,
                                                            const ExtractEnv& env, JobContext* ctx,
                                                            const SinkOpener& open_sink);

// `path` with symlinks resolved, when it lies under one of env.data_roots: PERMISSION_DENIED
// naming `field` otherwise (and with no roots), NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ResolveUnderRoots(const std::string& path, const ExtractEnv& env,
                                              const std::string& field);
// The SAE directory of a SPARSE spec (its path under the data roots, or its artifact's).
absl::StatusOr<std::string> ResolveSaeDir(const latentd::v1::ExtractSpec& spec,
                                          const ExtractEnv& env);

// A spec's outputs: 1 + more_outputs. Output 0 is the spec's own hook_name, sae and
// dataset_name; output i >= 1 is more_outputs[i - 1].
int ExtractOutputCount(const latentd::v1::ExtractSpec& spec);
// The spec with output `output`'s hook_name, sae and dataset_name in place of its own and no
// more_outputs: what that output's dataset was computed from (DatasetModels reads it).
latentd::v1::ExtractSpec ExtractOutputSpec(const latentd::v1::ExtractSpec& spec, int output);
// The field path of an output's field in error messages: "extract.sae" for output 0,
// "extract.more_outputs[0].sae" for output 1.
std::string ExtractOutputField(int output, absl::string_view field);

// The datasets a job of `spec` writes, one per output: output 0's is dataset_name, else
// "extract-<job id>"; output i's is its dataset_name, else output 0's + "." + its hook name. With
// resume_from_job_id they are the datasets of the job it continues (following that job's own
// continuation), after checking that job: a FAILED or CANCELLED EXTRACT job whose spec equals this
// one but for the dataset names (which must be empty or name its datasets). NOT_FOUND for an
// unknown job, INVALID_ARGUMENT quoting the first difference, FAILED_PRECONDITION for a job in
// another state. Two outputs naming one dataset: INVALID_ARGUMENT.
absl::StatusOr<std::vector<std::string>> ExtractDatasetNamesFor(
    const latentd::v1::ExtractSpec& spec, const ExtractEnv& env, uint64_t job_id);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_EXTRACT_RUNNER_H_
