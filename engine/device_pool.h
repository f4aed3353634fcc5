// The devices latentd owns, and which job holds each. A device is held by at most one job at a
// time.
//
// Device specs (the --devices flag):
//   "auto"        every CUDA device LibTorch sees, or one CPU device when there is none
//   "cpu", "cpu:N"  N CPU devices (default 1); each is a share of the host, not an isolated core
//   set "cuda", "cuda:0,2"  all CUDA devices, or the listed ones (INVALID_ARGUMENT if one does not
//   exist)
//
// Thread-safe. Torch-free header: the torch calls live in device_pool.cc.
#ifndef LATENTD_ENGINE_DEVICE_POOL_H_
#define LATENTD_ENGINE_DEVICE_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/job_context.h"

namespace latentd::engine {

struct DeviceStatus {
  DeviceRef device;
  std::string description;  // "CPU (2 cores)" or the GPU's name
  int64_t memory_used_bytes = 0;
  uint64_t held_by_job = 0;  // 0 when free
};

class DevicePool {
 public:
  static absl::StatusOr<std::unique_ptr<DevicePool>> Create(const std::string& spec);

  int size() const { return static_cast<int>(devices_.size()); }
  const std::vector<DeviceRef>& devices() const { return devices_; }

  // Gives `count` free devices to `job_id`, lowest indices first, or nothing when fewer are free.
  std::optional<std::vector<DeviceRef>> TryAcquire(int count, uint64_t job_id);
  // Gives back every device `job_id` holds. Releasing a job that holds none is a no-op.
  void Release(uint64_t job_id);
  int free_count() const;

  std::vector<DeviceStatus> Snapshot() const;

 private:
  explicit DevicePool(std::vector<DeviceRef> devices, std::vector<std::string> descriptions);

  const std::vector<DeviceRef> devices_;
  const std::vector<std::string> descriptions_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> holder_ ABSL_GUARDED_BY(mu_);
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_DEVICE_POOL_H_
