// Pipelines: filling a job's spec from the results of the jobs it waits for.
//
// A job may wait for earlier jobs (JobSpec.after_job_ids) and take values from their results
// (JobSpec.bindings), so that extract DENSE -> train an SAE -> extract SPARSE with it is one
// submission of three jobs instead of a client script that polls. A binding names
//   * `output`: a field of the finished job's JobResult, as a dotted path of field names
//     ("extract.dataset_id", "train.artifact_id", "extract.more_outputs.1.dataset_id"), and
//   * `field`: a field of the waiting job's own spec ("train.dataset_id",
//     "extract.sae.artifact_id", "extract.more_outputs.0.sae.artifact_id").
// Path components are proto field names or their JSON (lowerCamelCase) names; a number after a
// repeated field picks an element. A `field` must lie inside the spec of the job's type (not
// priority, label, after_job_ids...) and end at a scalar; a repeated scalar without an index gets
// the value appended, in binding order. Setting a member of a oneof clears its siblings (a bound
// sae.artifact_id replaces a sae.path). Values convert between integer types when they fit and
// between integers and decimal strings; other conversions are refused.
//
// Torch-free, gRPC-free: the job manager checks bindings at submit (CheckBindings: the schema,
// before any value exists) and applies them when the job starts (ApplyBindings).
#ifndef LATENTD_SERVER_SPEC_BINDINGS_H_
#define LATENTD_SERVER_SPEC_BINDINGS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/latentd/v1/jobs.pb.h"

namespace latentd::server {

// At most this many jobs to wait for, and bindings, per spec.
inline constexpr int kMaxAfterJobs = 64;
inline constexpr int kMaxBindings = 64;

// Checks after_job_ids and bindings of `spec` against the schemas: each waited-for job exists
// (`type_of` answers its type, nullopt for an unknown id: NOT_FOUND naming it), every binding's
// job is one of after_job_ids, its output is a scalar of that job type's result, its field a
// scalar of this job type's spec, and the value can convert. INVALID_ARGUMENT naming the field
// ("spec.bindings[1].field: ...") otherwise.
absl::Status CheckBindings(
    const latentd::v1::JobSpec& spec,
    const std::function<std::optional<latentd::v1::JobType>(uint64_t)>& type_of);

// `spec` with every binding applied, given the results of its after_job_ids (keyed by job id;
// each must be present). `applied`, when given, receives one line per binding for the job's log
// ("train.dataset_id = 7 (job 5's extract.dataset_id)", paths in proto names). INVALID_ARGUMENT
// naming the binding when a value does not exist (an index past the end of a result's list) or does
// not convert.
absl::StatusOr<latentd::v1::JobSpec> ApplyBindings(
    const latentd::v1::JobSpec& spec, const std::map<uint64_t, latentd::v1::JobResult>& results,
    std::vector<std::string>* applied = nullptr);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_SPEC_BINDINGS_H_
