// The few CUDA facts the device pool needs, behind a torch-free header. On Debian's CPU LibTorch
// every device count is 0; on a CUDA build the figures come from LibTorch's CUDA runtime.
#ifndef LATENTD_ENGINE_CUDA_INFO_H_
#define LATENTD_ENGINE_CUDA_INFO_H_

#include <cstdint>
#include <string>

namespace latentd::engine {

struct CudaDeviceInfo {
  std::string name;
  int64_t memory_total_bytes = 0;
  int64_t memory_used_bytes = 0;  // by LibTorch's caching allocator in this process (reserved)
};

// LibTorch's caching allocator on one CUDA device, in this process (all pools).
struct CudaAllocatorStats {
  int64_t allocated_bytes = 0;       // held by live tensors
  int64_t reserved_bytes = 0;        // taken from the driver by the cache
  int64_t peak_allocated_bytes = 0;  // since the process started (or the peaks were reset)
};

int CudaDeviceCount();
CudaDeviceInfo QueryCudaDevice(int index);
// Zeros on a build without CUDA.
CudaAllocatorStats QueryCudaAllocator(int index);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_CUDA_INFO_H_
