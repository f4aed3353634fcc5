// GPU check kit: the project's engine/cuda_info.cc and engine/device_util.cc built WITH
// LATENTD_WITH_CUDA, as a CUDA build of latentd compiles them (CUDA runtime device properties,
// LibTorch's caching-allocator statistics). Built only where CUDA headers and cudart are found.
//   - CudaDeviceCount() agrees with LibTorch;
//   - QueryCudaDevice(i) reads the real name and total memory;
//   - memory_used_bytes (the allocator's reserved bytes, what TRAIN telemetry and admission read)
//     grows by at least 1 GiB while 1 GiB is held, and DeviceMemoryInUse(cuda:0) reports it.

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <string>

#include "engine/cuda_info.h"
#include "engine/device_util.h"
#include "tests/gpu/kit_report.h"

namespace gpu_kit {
namespace {

int Main() {
  Report r;
  const int torch_count = static_cast<int>(torch::cuda::device_count());
  if (torch_count == 0) {
    if (EnvFlag("KIT_EXPECT_CUDA")) {
      r.Fail("engine.cuda_info", "Python's torch sees CUDA but this binary does not");
    } else {
      r.Skip("engine.cuda_info", "SKIP (no CUDA)");
    }
    return r.exit_code();
  }
  r.Guard("engine.cuda_info.count", [&] {
    const int n = latentd::engine::CudaDeviceCount();
    r.Check(n == torch_count, "engine.cuda_info.count",
            "CudaDeviceCount() " + std::to_string(n) + ", LibTorch " + std::to_string(torch_count));
  });
  for (int i = 0; i < torch_count; ++i) {
    const std::string name = "engine.cuda_info.query.cuda:" + std::to_string(i);
    r.Guard(name, [&] {
      const latentd::engine::CudaDeviceInfo info = latentd::engine::QueryCudaDevice(i);
      const bool real_name = !info.name.empty() && info.name != "CUDA device " + std::to_string(i);
      r.Check(real_name && info.memory_total_bytes > 0, name,
              "name '" + info.name + "', total " + std::to_string(info.memory_total_bytes) +
                  " B, used (reserved) " + std::to_string(info.memory_used_bytes) + " B");
    });
  }
  r.Guard("engine.cuda_info.reserved_tracks_1gib", [&] {
    const int64_t before = latentd::engine::QueryCudaDevice(0).memory_used_bytes;
    at::Tensor t = at::empty(
        {int64_t{1} << 28}, at::TensorOptions().dtype(at::kFloat).device(at::Device(at::kCUDA, 0)));
    t.fill_(1.0);
    torch::cuda::synchronize(0);
    const int64_t during = latentd::engine::QueryCudaDevice(0).memory_used_bytes;
    const int64_t in_use = latentd::engine::DeviceMemoryInUse(at::Device(at::kCUDA, 0));
    const int64_t gib = int64_t{1} << 30;
    r.Check(during - before >= gib && in_use == during, "engine.cuda_info.reserved_tracks_1gib",
            "reserved " + std::to_string(before) + " -> " + std::to_string(during) +
                " B holding 1 GiB; DeviceMemoryInUse(cuda:0) " + std::to_string(in_use) + " B");
  });
  return r.exit_code();
}

}  // namespace
}  // namespace gpu_kit

int main() { return gpu_kit::Main(); }
