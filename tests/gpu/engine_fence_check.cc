// GPU check kit: the project's own engine/device_util.cc, built here without LATENTD_WITH_CUDA
// (engine_cuda_info_check covers that part), against a header with only DeviceKind / DeviceRef
// extracted from engine/job_context.h (the real one includes generated protobuf code).
//   - ToAtDevice: cpu:0 -> kCPU; cuda:0 -> kCUDA:0 where CUDA is, FAILED_PRECONDITION where not;
//   - DeviceFence: Record() after an asynchronous device-to-pinned-host copy, Wait() until the
//     device passed it, then the host values; on the CPU both calls must be no-ops.

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <chrono>
#include <string>

#include "engine/device_util.h"
#include "tests/gpu/kit_report.h"

namespace gpu_kit {
namespace {

using latentd::engine::DeviceFence;
using latentd::engine::DeviceKind;
using latentd::engine::DeviceRef;

DeviceRef Ref(DeviceKind kind, int index, const std::string& name) {
  DeviceRef ref;
  ref.kind = kind;
  ref.index = index;
  ref.name = name;
  return ref;
}

int Main() {
  Report r;
  const bool cuda = torch::cuda::is_available() && torch::cuda::device_count() > 0;
  if (!cuda && EnvFlag("KIT_EXPECT_CUDA")) {
    r.Fail("engine.cuda_visible", "Python's torch sees CUDA but this binary does not");
  }

  r.Guard("engine.to_at_device", [&] {
    auto cpu = latentd::engine::ToAtDevice(Ref(DeviceKind::kCpu, 0, "cpu:0"));
    auto gpu = latentd::engine::ToAtDevice(Ref(DeviceKind::kCuda, 0, "cuda:0"));
    const bool cpu_ok = cpu.ok() && cpu->type() == at::kCPU;
    const bool gpu_ok =
        cuda ? (gpu.ok() && gpu->is_cuda() && gpu->index() == 0)
             : (!gpu.ok() && gpu.status().code() == absl::StatusCode::kFailedPrecondition);
    r.Check(cpu_ok && gpu_ok, "engine.to_at_device",
            std::string("cpu:0 -> ") +
                (cpu.ok() ? cpu->str() : std::string(cpu.status().message())) + ", cuda:0 -> " +
                (gpu.ok() ? gpu->str() : std::string(gpu.status().ToString())));
  });

  r.Guard("engine.device_fence.cpu", [&] {
    DeviceFence fence;
    fence.Record(at::Device(at::kCPU));
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status s = fence.Wait();
    const absl::Status again = DeviceFence().Wait();  // nothing recorded
    r.Check(
        s.ok() && again.ok(), "engine.device_fence.cpu",
        "Record(cpu) + Wait() returned " + s.ToString() + " in " + Sci(SecondsSince(t0)) + " s");
  });

  if (!cuda) {
    r.Skip("engine.device_fence.cuda", "SKIP (no CUDA)");
    return r.exit_code();
  }
  r.Guard("engine.device_fence.cuda", [&] {
    const at::Device dev(at::kCUDA, 0);
    const int64_t count = int64_t{1} << 24;
    at::Tensor a = at::randn({4096, 4096}, at::TensorOptions().device(dev));
    for (int i = 0; i < 4; ++i) a = a.mm(a).div_(64.0);
    at::Tensor src = at::arange(count, at::TensorOptions().dtype(at::kFloat).device(dev)).mul_(3);
    at::Tensor host = at::empty({count}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
    const auto t0 = std::chrono::steady_clock::now();
    host.copy_(src, /*non_blocking=*/true);
    DeviceFence fence;
    fence.Record(dev);
    const double record_s = SecondsSince(t0);
    // Movable: the extraction workers hand the fence on with the batch.
    DeviceFence moved = std::move(fence);
    const absl::Status s = moved.Wait();
    const double wait_s = SecondsSince(t0);
    const at::Tensor want = at::arange(count, at::TensorOptions().dtype(at::kFloat)).mul_(3);
    const bool equal = s.ok() && at::equal(host, want);
    r.Check(s.ok() && equal, "engine.device_fence.cuda",
            "Wait() " + s.ToString() + ", host values " + (equal ? "correct" : "WRONG") +
                "; Record after " + Sci(record_s) + " s, Wait returned after " + Sci(wait_s) +
                " s; DeviceMemoryInUse(cuda:0) = " +
                std::to_string(latentd::engine::DeviceMemoryInUse(dev)) +
                " B (0 is expected: this build has no LATENTD_WITH_CUDA)");
  });
  return r.exit_code();
}

}  // namespace
}  // namespace gpu_kit

int main() { return gpu_kit::Main(); }
