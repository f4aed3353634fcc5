#include "engine/job_context.h"

#include <string>

#include "absl/strings/cord.h"

namespace latentd::engine {
namespace {
constexpr char kReasonPayload[] = "latentd.dev/job-reason";
}  // namespace

absl::Status WithReason(absl::Status status, latentd::v1::JobReason reason) {
  status.SetPayload(kReasonPayload, absl::Cord(latentd::v1::JobReason_Name(reason)));
  return status;
}

absl::Status WithMessage(const absl::Status& status, absl::string_view message) {
  absl::Status out(status.code(), message);
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

latentd::v1::JobReason AttachedReason(const absl::Status& status) {
  auto payload = status.GetPayload(kReasonPayload);
  latentd::v1::JobReason reason = latentd::v1::JOB_REASON_UNSPECIFIED;
  if (payload.has_value()) {
    latentd::v1::JobReason_Parse(std::string(*payload), &reason);
  }
  return reason;
}

}  // namespace latentd::engine
