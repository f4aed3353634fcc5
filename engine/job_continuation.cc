#include "engine/job_continuation.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

namespace latentd::engine {

absl::StatusOr<latentd::v1::Job> FindContinuableJob(const FindJob& find_job, uint64_t from,
                                                    latentd::v1::JobSpec::SpecCase kind,
                                                    absl::string_view field) {
  if (!find_job) return absl::FailedPreconditionError(absl::StrCat(field, ": no job records here"));
  auto job = find_job(from);
  if (absl::IsNotFound(job.status())) {
    return absl::NotFoundError(absl::StrCat(field, ": no job ", from));
  }
  RETURN_IF_ERROR(job.status());
  if (job->spec().spec_case() != kind) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": job ", from, " is a job of another type"));
  }
  if (job->state() != latentd::v1::FAILED && job->state() != latentd::v1::CANCELLED) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": job ", from, " is ", latentd::v1::JobState_Name(job->state()),
        "; only a FAILED or CANCELLED job can be continued (an interrupted one resumes itself, "
        "a SUCCEEDED one left nothing to continue)"));
  }
  return job;
}

absl::Status CheckSameSpec(const google::protobuf::Message& theirs,
                           const google::protobuf::Message& mine, uint64_t from,
                           absl::string_view field, absl::string_view allowed_text) {
  google::protobuf::util::MessageDifferencer differencer;
  std::string report;
  differencer.ReportDifferencesToString(&report);
  if (differencer.Compare(theirs, mine)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": this spec differs from job ", from,
                                                 "'s: ", report.substr(0, report.find('\n')),
                                                 allowed_text.empty() ? "" : "; ", allowed_text));
}

}  // namespace latentd::engine
