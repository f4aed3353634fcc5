#include "common/status_macros.h"

#include <string>

#include "gtest/gtest.h"

namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status QuarterInto(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  return absl::OkStatus();
}

absl::Status CheckBoth(absl::Status a, absl::Status b) {
  RETURN_IF_ERROR(a);
  RETURN_IF_ERROR(b);
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnBindsValue) {
  int out = 0;
  ASSERT_TRUE(QuarterInto(8, &out).ok());
  EXPECT_EQ(out, 2);
}

TEST(StatusMacros, AssignOrReturnPropagatesError) {
  int out = -1;
  absl::Status s = QuarterInto(6, &out);  // 6 -> 3 -> odd
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, -1);
}

TEST(StatusMacros, ReturnIfErrorStopsAtFirstError) {
  absl::Status s = CheckBoth(absl::NotFoundError("a"), absl::InternalError("b"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(CheckBoth(absl::OkStatus(), absl::OkStatus()).ok());
}

}  // namespace
