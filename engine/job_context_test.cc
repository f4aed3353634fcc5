#include "engine/job_context.h"

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

TEST(JobContext, WithMessageKeepsTheCodeAndTheAttachedReason) {
  const absl::Status full =
      WithReason(absl::ResourceExhaustedError("disk full"), latentd::v1::NUMERICAL);
  const absl::Status hinted = WithMessage(full, "disk full (continue with job 3)");
  EXPECT_EQ(hinted.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(hinted.message(), "disk full (continue with job 3)");
  EXPECT_EQ(AttachedReason(hinted), latentd::v1::NUMERICAL);
  EXPECT_EQ(AttachedReason(WithMessage(absl::InternalError("x"), "y")),
            latentd::v1::JOB_REASON_UNSPECIFIED);
}

}  // namespace
}  // namespace latentd::engine
