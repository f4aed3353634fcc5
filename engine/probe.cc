#include "engine/probe.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/torch_status.h"

namespace latentd::engine {
namespace {

constexpr int kDefaultMatmulSize = 1024;
constexpr int kDefaultIterations = 10;
constexpr int64_t kDefaultBandwidthBytes = 64 << 20;

c10::Device ToTorch(const DeviceRef& device) {
  return device.kind == DeviceKind::kCuda ? c10::Device(c10::kCUDA, device.index)
                                          : c10::Device(c10::kCPU);
}

void Sync(const DeviceRef& device) {
  if (device.kind == DeviceKind::kCuda) torch::cuda::synchronize(device.index);
}

// Median seconds of `iterations` timed calls of `op`, after one untimed warm-up.
template <typename Op>
absl::StatusOr<double> MedianSeconds(const DeviceRef& device, int iterations, JobContext* context,
                                     Op op) {
  op();
  Sync(device);
  std::vector<double> seconds;
  for (int i = 0; i < iterations; ++i) {
    if (context->cancel_requested()) return absl::CancelledError("probe cancelled");
    absl::Time start = absl::Now();
    op();
    Sync(device);
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return std::max(seconds[seconds.size() / 2], 1e-9);
}

}  // namespace

absl::Status ValidateProbeSpec(const latentd::v1::ProbeSpec& spec) {
  if (spec.matmul_size() < 0 || spec.matmul_size() > 32768) {
    return absl::InvalidArgumentError(
        absl::StrCat("probe.matmul_size: must be in [1, 32768], got ", spec.matmul_size()));
  }
  if (spec.iterations() < 0 || spec.iterations() > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("probe.iterations: must be in [1, 10000], got ", spec.iterations()));
  }
  if (spec.bandwidth_bytes() < 0 || spec.bandwidth_bytes() > (int64_t{16} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "probe.bandwidth_bytes: must be in [1, 16 GiB], got ", spec.bandwidth_bytes()));
  }
  return absl::OkStatus();
}

absl::StatusOr<latentd::v1::ProbeResult> RunProbe(const latentd::v1::ProbeSpec& spec,
                                                  JobContext* context) {
  if (absl::Status s = ValidateProbeSpec(spec); !s.ok()) return s;
  const int n = spec.matmul_size() > 0 ? spec.matmul_size() : kDefaultMatmulSize;
  const int iterations = spec.iterations() > 0 ? spec.iterations() : kDefaultIterations;
  const int64_t bytes =
      spec.bandwidth_bytes() > 0 ? spec.bandwidth_bytes() : kDefaultBandwidthBytes;
  latentd::v1::ProbeResult result;
  const auto& devices = context->devices();
  const int64_t total = static_cast<int64_t>(devices.size());
  context->ReportProgress(0, total, "devices");
  try {
    for (size_t i = 0; i < devices.size(); ++i) {
      const DeviceRef& device = devices[i];
      const absl::Time start = absl::Now();
      auto options = at::TensorOptions().dtype(at::kFloat).device(ToTorch(device));
      at::Tensor a = at::randn({n, n}, options);
      at::Tensor b = at::randn({n, n}, options);
      at::Tensor c = at::empty({n, n}, options);
      auto matmul = MedianSeconds(device, iterations, context, [&] { at::mm_out(c, a, b); });
      if (!matmul.ok()) return matmul.status();
      a = b = c = at::Tensor();

      const int64_t floats = std::max<int64_t>(bytes / 4, 1);
      at::Tensor src = at::rand({floats}, options);
      at::Tensor dst = at::empty({floats}, options);
      auto copy = MedianSeconds(device, iterations, context, [&] { dst.copy_(src); });
      if (!copy.ok()) return copy.status();

      latentd::v1::DeviceProbe* probe = result.add_devices();
      probe->set_device(device.name);
      probe->set_matmul_gflops(2.0 * n * n * static_cast<double>(n) / *matmul / 1e9);
      probe->set_memory_bandwidth_gbps(2.0 * static_cast<double>(floats * 4) / *copy / 1e9);
      probe->set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
      context->Log(latentd::v1::LogLine::INFO,
                   absl::StrFormat("%s: matmul %d^3 %.1f GFLOP/s, copy %.1f GB/s", device.name, n,
                                   probe->matmul_gflops(), probe->memory_bandwidth_gbps()));
      context->ReportProgress(static_cast<int64_t>(i + 1), total, "devices");
    }
  } catch (const c10::Error& e) {
    return TorchErrorStatus(e, "probe");
  }
  return result;
}

}  // namespace latentd::engine
