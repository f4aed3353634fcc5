// Devices as LibTorch sees them. CUDA-only code is compiled only with LATENTD_WITH_CUDA (Debian's
// LibTorch is CPU-only) and guarded at run time by torch::cuda::is_available().
#ifndef LATENTD_ENGINE_DEVICE_UTIL_H_
#define LATENTD_ENGINE_DEVICE_UTIL_H_

#include <ATen/ATen.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/job_context.h"

namespace latentd::engine {

// cpu:N -> at::kCPU (every CPU device is the host); cuda:N -> at::Device(kCUDA, N).
// FAILED_PRECONDITION for a CUDA device this build or machine cannot drive.
absl::StatusOr<at::Device> ToAtDevice(const DeviceRef& ref);

// Intra-op threads for torch work issued from the calling thread (OpenMP's thread count is a
// per-thread setting, so each device worker sets its own share). n <= 0 leaves it alone.
void SetCpuThreadsForThisThread(int n);

// Memory the process uses on `device`: the CUDA caching allocator's reserved bytes on a CUDA
// device, the process RSS on the CPU.
int64_t DeviceMemoryInUse(const at::Device& device);
int64_t HostRssBytes();

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_DEVICE_UTIL_H_
