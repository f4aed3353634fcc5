// Devices as LibTorch sees them. CUDA-only code is compiled only with LATENTD_WITH_CUDA (Debian's
// LibTorch is CPU-only) and guarded at run time by torch::cuda::is_available().
#ifndef LATENTD_ENGINE_DEVICE_UTIL_H_
#define LATENTD_ENGINE_DEVICE_UTIL_H_

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <cstdint>
#include <optional>

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

// A point in a device's work queue. Record() marks it after everything queued so far on the
// device's current stream; Wait() returns once the device has passed it. The extraction workers
// record one after a batch's asynchronous device-to-host copies and hand the batch on without
// waiting, so the device already runs the next batch while the committer waits for this one.
// CPU work is synchronous: on the CPU both calls do nothing. Movable, not copyable.
class DeviceFence {
 public:
  void Record(const at::Device& device);
  // OK once the device has passed the point (at once if nothing was recorded); INTERNAL with the
  // device's message if it reported an error meanwhile.
  absl::Status Wait();

 private:
  std::optional<c10::Event> event_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_DEVICE_UTIL_H_
