// GPU check kit: per-device facts from the CUDA runtime and LibTorch's CUDA caching allocator,
// written against both allocator APIs (its statistics types moved to c10::CachingDeviceAllocator
// in LibTorch 2.x), so that the figures come back even where engine/cuda_info.cc does not build.
// Built only where CUDA headers and cudart are found.

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>

#include <string>

#include "tests/gpu/kit_report.h"

#if __has_include(<c10/core/CachingDeviceAllocator.h>)
#include <c10/core/CachingDeviceAllocator.h>
namespace allocator_stats = c10::CachingDeviceAllocator;
#else
namespace allocator_stats = c10::cuda::CUDACachingAllocator;
#endif

namespace gpu_kit {
namespace {

constexpr size_t kAggregate = static_cast<size_t>(allocator_stats::StatType::AGGREGATE);

int64_t Allocated(int device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device))
      .allocated_bytes[kAggregate]
      .current;
}

int64_t Reserved(int device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device))
      .reserved_bytes[kAggregate]
      .current;
}

std::string Mib(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

int Main() {
  Report r;
  int runtime = 0, driver = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  const cudaError_t err = cudaGetDeviceCount(&count);
  r.Info("device_info.versions", "CUDA runtime " + std::to_string(runtime) + ", driver " +
                                     std::to_string(driver) +
                                     ", cudaGetDeviceCount: " + cudaGetErrorString(err));
  if (err != cudaSuccess || count == 0) {
    if (EnvFlag("KIT_EXPECT_CUDA")) {
      r.Fail("device_info",
             std::string("no device through the CUDA runtime: ") + cudaGetErrorString(err));
    } else {
      r.Skip("device_info", "SKIP (no CUDA)");
    }
    return r.exit_code();
  }
  r.Check(count == static_cast<int>(torch::cuda::device_count()), "device_info.count",
          "CUDA runtime " + std::to_string(count) + ", LibTorch " +
              std::to_string(torch::cuda::device_count()));
  for (int i = 0; i < count; ++i) {
    const std::string name = "device_info.cuda:" + std::to_string(i);
    r.Guard(name, [&] {
      cudaDeviceProp prop;
      const cudaError_t e = cudaGetDeviceProperties(&prop, i);
      size_t free_b = 0, total_b = 0;
      cudaSetDevice(i);
      cudaMemGetInfo(&free_b, &total_b);
      r.Check(e == cudaSuccess && prop.totalGlobalMem > 0, name,
              std::string(prop.name) + ", sm_" + std::to_string(prop.major) +
                  std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) +
                  " SMs, total " + Mib(static_cast<int64_t>(prop.totalGlobalMem)) + ", free " +
                  Mib(static_cast<int64_t>(free_b)));
    });
  }
  r.Guard("device_info.allocator_1gib", [&] {
    cudaSetDevice(0);
    const int64_t a0 = Allocated(0);
    at::Tensor t = at::empty(
        {int64_t{1} << 28}, at::TensorOptions().dtype(at::kFloat).device(at::Device(at::kCUDA, 0)));
    const int64_t a1 = Allocated(0);
    const int64_t r1 = Reserved(0);
    t.reset();
    const int64_t a2 = Allocated(0);
    c10::cuda::CUDACachingAllocator::emptyCache();
    const int64_t r2 = Reserved(0);
    const int64_t gib = int64_t{1} << 30;
    r.Check(a1 - a0 >= gib && a2 == a0 && r1 - r2 >= gib, "device_info.allocator_1gib",
            "allocated " + Mib(a0) + " -> " + Mib(a1) + " -> " + Mib(a2) +
                " after free; reserved " + Mib(r1) + " -> " + Mib(r2) + " after emptyCache()");
  });
  return r.exit_code();
}

}  // namespace
}  // namespace gpu_kit

int main() { return gpu_kit::Main(); }
