#include "engine/probe.h"

#include <vector>

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

class FakeContext : public JobContext {
 public:
  explicit FakeContext(int devices) {
    for (int i = 0; i < devices; ++i)
      devices_.push_back({DeviceKind::kCpu, i, "cpu:" + std::to_string(i), 0});
  }
  uint64_t job_id() const override { return 1; }
  int attempt() const override { return 1; }
  const std::vector<DeviceRef>& devices() const override { return devices_; }
  bool cancel_requested() const override { return cancel; }
  void ReportProgress(int64_t done, int64_t total, const std::string&) override {
    last_done = done;
    last_total = total;
  }
  void ReportTelemetry(const latentd::v1::Telemetry&) override {}
  void Log(latentd::v1::LogLine::Level, const std::string& text) override { logs.push_back(text); }

  bool cancel = false;
  int64_t last_done = -1, last_total = -1;
  std::vector<std::string> logs;

 private:
  std::vector<DeviceRef> devices_;
};

TEST(Probe, MeasuresEveryHeldDevice) {
  FakeContext ctx(2);
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
  EXPECT_EQ(ctx.last_done, 2);
  EXPECT_EQ(ctx.last_total, 2);
  EXPECT_EQ(ctx.logs.size(), 2u);
}

TEST(Probe, StopsWhenCancelled) {
  FakeContext ctx(1);
  ctx.cancel = true;
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
