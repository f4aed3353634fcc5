// A pipeline file: an experiment's jobs in one JSON file, each naming the jobs it waits for and
// takes values from, submitted in order by `latentctl pipeline FILE` (docs/SERVICE.md,
// "Pipelines"):
//
//   {"name": "l2-sae",
//    "jobs": [
//      {"name": "dense", "type": "EXTRACT", "spec": {... "mode": "DENSE"}},
//      {"name": "sae", "type": "TRAIN", "spec": {...},
//       "bind": {"train.dataset_id": "dense:extract.dataset_id"}},
//      {"name": "latents", "type": "EXTRACT", "spec": {...},
//       "bind": {"extract.sae.artifact_id": "sae:train.artifact_id"}, "label": "l2"}]}
//
// Each job: "name" (unique in the file), "type", "spec" (the type's spec in the protobuf JSON
// mapping), and optionally "bind" ({field: "JOB:OUTPUT"}), "after" (["JOB", ...]: waits without
// taking a value), "label", "priority", "numDevices". JOB is the name of an earlier job of the
// file or the id of a job already on the daemon. With a pipeline "name", each job is submitted
// with request id "<pipeline name>/<job name>", so running the file again (after a dropped
// connection, say) finds the jobs already made instead of making them twice.
#ifndef LATENTD_CLIENT_PIPELINE_FILE_H_
#define LATENTD_CLIENT_PIPELINE_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/latentd/v1/jobs.pb.h"

namespace latentd::client {

struct PipelineJob {
  std::string name;
  // The job's spec, with what it takes from jobs already on the daemon (given by id) in
  // after_job_ids and bindings; what it takes from jobs of the file is below.
  latentd::v1::JobSpec spec;
  struct FileBinding {
    int job = 0;  // index of an earlier job of the file
    std::string output;
    std::string field;
  };
  std::vector<FileBinding> bindings;
  std::vector<int> after;  // earlier jobs of the file it waits for, bound ones included
  std::string request_id;  // "<pipeline name>/<job name>", or empty
};

// The member of `spec`'s oneof that holds a `type` job's spec (named after the type: EXTRACT's is
// `extract`), made present; nullptr for JOB_TYPE_UNSPECIFIED or a type without one.
google::protobuf::Message* MutableTypeSpec(latentd::v1::JobSpec* spec, latentd::v1::JobType type);

// Parses and checks a pipeline file's text. INVALID_ARGUMENT naming the place ("jobs[1].bind:
// \"dense2\" is no earlier job of the file and no job id") for anything malformed; nothing is
// submitted by then, so a bad file submits nothing.
absl::StatusOr<std::vector<PipelineJob>> ParsePipeline(const std::string& json_text);

// Adds `id` to spec's after_job_ids unless it is there already.
void AddAfterJob(latentd::v1::JobSpec* spec, uint64_t id);

// The spec job `job` is submitted with, its references to jobs of the file resolved: ids[i] is
// the id job i of the file was given.
latentd::v1::JobSpec ResolvedSpec(const PipelineJob& job, const std::vector<uint64_t>& ids);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_PIPELINE_FILE_H_
