#include "engine/probe.h"

#include <vector>

#include "engine/job_context_testing.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

TEST(Probe, MeasuresEveryHeldDevice) {
  RecordingJobContext ctx(2);
  latentd::v1::ProbeSpec spec;
  spec.set_matmul_size(128);
  spec.set_iterations(3);
  spec.set_bandwidth_bytes(1 << 20);
  auto result = RunProbe(spec, &ctx);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->devices_size(), 2);
  for (const auto& d : result->devices()) {
    EXPECT_GT(d.matmul_gflops(), 0.01);  // any working device multiplies faster than this
    EXPECT_GT(d.memory_bandwidth_gbps(), 0.01);
  }
  EXPECT_EQ(result->devices(1).device(), "cpu:1");
  ASSERT_FALSE(ctx.progress().empty());
  EXPECT_EQ(ctx.progress().back().done, 2);
  EXPECT_EQ(ctx.progress().back().total, 2);
  EXPECT_EQ(ctx.logs().size(), 2u);
}

TEST(Probe, StopsWhenCancelled) {
  RecordingJobContext ctx(1);
  ctx.Cancel();
  latentd::v1::ProbeSpec spec;
  spec.set_matmul_size(64);
  EXPECT_EQ(RunProbe(spec, &ctx).status().code(), absl::StatusCode::kCancelled);
}

TEST(Probe, RejectsBadSizesNamingTheField) {
  latentd::v1::ProbeSpec spec;
  spec.set_matmul_size(-1);
  auto s = ValidateProbeSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("probe.matmul_size"), absl::string_view::npos);
  spec.set_matmul_size(0);
  spec.set_bandwidth_bytes(int64_t{1} << 40);
  EXPECT_NE(ValidateProbeSpec(spec).message().find("probe.bandwidth_bytes"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace latentd::engine
