#include "engine/device_util.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/cuda_info.h"

namespace latentd::engine {

absl::StatusOr<at::Device> ToAtDevice(const DeviceRef& ref) {
  if (ref.kind == DeviceKind::kCpu) return at::Device(at::kCPU);
  if (!torch::cuda::is_available() || ref.index >= static_cast<int>(torch::cuda::device_count())) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", ref.name, ": CUDA is not available in this build or machine"));
  }
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(ref.index));
}

void SetCpuThreadsForThisThread(int n) {
  if (n > 0) at::set_num_threads(n);
}

int64_t HostRssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

int64_t DeviceMemoryInUse(const at::Device& device) {
  if (device.is_cuda()) return QueryCudaDevice(device.index()).memory_used_bytes;
  return HostRssBytes();
}

}  // namespace latentd::engine
