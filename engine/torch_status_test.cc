#include "engine/torch_status.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

TEST(TorchStatusTest, AllocationFailuresAreResourceExhaustedAndTheRestInternal) {
  try {
    at::empty({int64_t{1} << 40}, at::kFloat);  // 4 TiB: more than any test machine has
    FAIL() << "allocated 4 TiB";
  } catch (const c10::Error& e) {
    const absl::Status s = TorchErrorStatus(e, "batch 3");
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), "batch 3: ")) << s;
  }
  try {
    at::ones({2, 3}).mm(at::ones({2, 3}));  // shapes do not chain
    FAIL() << "multiplied [2, 3] by [2, 3]";
  } catch (const c10::Error& e) {
    const absl::Status s = TorchErrorStatus(e, "encode");
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_EQ(s.message().find("Exception raised from"), std::string::npos) << s;  // no backtrace
  }
  const absl::Status plain = TorchErrorStatus(std::runtime_error("boom"), "step");
  EXPECT_EQ(plain.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(plain.message(), "step: boom");
}

}  // namespace
}  // namespace latentd::engine
