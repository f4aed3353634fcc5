#include "engine/cuda_info.h"

#include <torch/cuda.h>

#include "absl/strings/str_cat.h"

#ifdef LATENTD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
// The allocator's statistic types moved from c10::cuda::CUDACachingAllocator to
// c10::CachingDeviceAllocator (a header of its own) in LibTorch 2.x.
#if __has_include(<c10/core/CachingDeviceAllocator.h>)
#include <c10/core/CachingDeviceAllocator.h>
namespace allocator_stats = c10::CachingDeviceAllocator;
#else
namespace allocator_stats = c10::cuda::CUDACachingAllocator;
#endif
#endif

namespace latentd::engine {

int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

CudaDeviceInfo QueryCudaDevice(int index) {
  CudaDeviceInfo info;
  info.name = absl::StrCat("CUDA device ", index);
#ifdef LATENTD_WITH_CUDA
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) {
    info.name = prop.name;
    info.memory_total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  }
#endif
  info.memory_used_bytes = QueryCudaAllocator(index).reserved_bytes;
  return info;
}

CudaAllocatorStats QueryCudaAllocator(int index) {
  CudaAllocatorStats out;
#ifdef LATENTD_WITH_CUDA
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  constexpr size_t kAll = static_cast<size_t>(allocator_stats::StatType::AGGREGATE);
  out.allocated_bytes = stats.allocated_bytes[kAll].current;
  out.reserved_bytes = stats.reserved_bytes[kAll].current;
  out.peak_allocated_bytes = stats.allocated_bytes[kAll].peak;
#else
  (void)index;
#endif
  return out;
}

}  // namespace latentd::engine
