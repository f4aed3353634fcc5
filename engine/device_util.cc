#include "engine/device_util.h"

#include <ATen/Parallel.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/process_memory.h"
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

int64_t DeviceMemoryInUse(const at::Device& device) {
  if (device.is_cuda()) return QueryCudaDevice(device.index()).memory_used_bytes;
  return ProcessRssBytes();
}

void DeviceFence::Record(const at::Device& device) {
  if (!device.is_cuda()) return;
  const c10::impl::VirtualGuardImpl guard(device.type());
  event_.emplace(device.type());
  event_->record(guard.getStream(device));
}

absl::Status DeviceFence::Wait() {
  if (!event_.has_value()) return absl::OkStatus();
  try {
    // LibTorch 1.13's device-generic event offers query() but no blocking wait; a batch takes
    // milliseconds, so polling every 20 us costs nothing measurable.
    while (!event_->query()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  } catch (const std::exception& e) {
    event_.reset();
    return absl::InternalError(absl::StrCat("device error while waiting for a batch: ", e.what()));
  }
  event_.reset();
  return absl::OkStatus();
}

}  // namespace latentd::engine
