#include "engine/cuda_info.h"

#include <torch/cuda.h>

#include "absl/strings/str_cat.h"

#ifdef LATENTD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
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
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  info.memory_used_bytes =
      stats
          .reserved_bytes[static_cast<size_t>(c10::cuda::CUDACachingAllocator::StatType::AGGREGATE)]
          .current;
#endif
  return info;
}

}  // namespace latentd::engine
