// resume_from_job_id: a new job continues what a FAILED or CANCELLED job of its type left (a
// TRAIN job's checkpoint, an EXTRACT job's committed rows). These are the submit-time checks the
// two job types share. Torch-free.
#ifndef LATENTD_ENGINE_JOB_CONTINUATION_H_
#define LATENTD_ENGINE_JOB_CONTINUATION_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "proto/latentd/v1/jobs.pb.h"

namespace latentd::engine {

// The daemon's job records by id (NOT_FOUND for an unknown id).
using FindJob = std::function<absl::StatusOr<latentd::v1::Job>(uint64_t job_id)>;

// Job `from`, checked to be a job of the kind `kind` that is FAILED or CANCELLED (an interrupted
// job resumes by itself; a SUCCEEDED one left nothing to continue). Errors name `field` (e.g.
// "train.resume_from_job_id"): NOT_FOUND for an unknown job, INVALID_ARGUMENT for another kind,
// FAILED_PRECONDITION for another state or when `find_job` is null.
absl::StatusOr<latentd::v1::Job> FindContinuableJob(const FindJob& find_job, uint64_t from,
                                                    latentd::v1::JobSpec::SpecCase kind,
                                                    absl::string_view field);

// OK when `mine` equals `theirs` (job `from`'s spec) once `allowed` cleared, on copies of both,
// the fields a continuation may change; else INVALID_ARGUMENT naming `field` and quoting the
// first difference ("modified: sae.d_sae: 64 -> 128"), followed by `allowed_text`.
template <typename Spec>
absl::Status CheckSameSpecBut(const Spec& theirs, const Spec& mine,
                              const std::function<void(Spec*)>& allowed, uint64_t from,
                              absl::string_view field, absl::string_view allowed_text);

// The non-template part of CheckSameSpecBut: compares two messages of one type.
absl::Status CheckSameSpec(const google::protobuf::Message& theirs,
                           const google::protobuf::Message& mine, uint64_t from,
                           absl::string_view field, absl::string_view allowed_text);

template <typename Spec>
absl::Status CheckSameSpecBut(const Spec& theirs, const Spec& mine,
                              const std::function<void(Spec*)>& allowed, uint64_t from,
                              absl::string_view field, absl::string_view allowed_text) {
  Spec a = theirs, b = mine;
  allowed(&a);
  allowed(&b);
  return CheckSameSpec(a, b, from, field, allowed_text);
}

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_JOB_CONTINUATION_H_
