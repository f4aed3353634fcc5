#include "engine/device_pool.h"

#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/process_memory.h"
#include "engine/cuda_info.h"

namespace latentd::engine {

namespace {

DeviceRef CpuDevice(int index, int count) {
  DeviceRef d;
  d.kind = DeviceKind::kCpu;
  d.index = index;
  d.name = absl::StrCat("cpu:", index);
  d.memory_total_bytes = HostMemoryBytes() / count;
  return d;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(const std::string& spec) {
  std::vector<DeviceRef> devices;
  std::vector<std::string> descriptions;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  auto add_cpus = [&](int n) {
    for (int i = 0; i < n; ++i) {
      devices.push_back(CpuDevice(i, n));
      descriptions.push_back(absl::StrCat("CPU share (", cores, " host cores)"));
    }
  };
  auto add_cuda = [&](int index) {
    CudaDeviceInfo info = QueryCudaDevice(index);
    DeviceRef d;
    d.kind = DeviceKind::kCuda;
    d.index = index;
    d.name = absl::StrCat("cuda:", index);
    d.memory_total_bytes = info.memory_total_bytes;
    devices.push_back(d);
    descriptions.push_back(info.name);
  };

  std::string kind = spec;
  std::string rest;
  if (auto colon = spec.find(':'); colon != std::string::npos) {
    kind = spec.substr(0, colon);
    rest = spec.substr(colon + 1);
  }
  const int cuda_count = CudaDeviceCount();
  if (kind == "auto" && rest.empty()) {
    if (cuda_count > 0) {
      for (int i = 0; i < cuda_count; ++i) add_cuda(i);
    } else {
      add_cpus(1);
    }
  } else if (kind == "cpu") {
    int n = 1;
    if (!rest.empty() && (!absl::SimpleAtoi(rest, &n) || n < 1 || n > 256)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: '", spec, "': cpu:N needs 1 <= N <= 256"));
    }
    add_cpus(n);
  } else if (kind == "cuda") {
    if (cuda_count == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: '", spec, "': LibTorch sees no CUDA device on this machine"));
    }
    if (rest.empty()) {
      for (int i = 0; i < cuda_count; ++i) add_cuda(i);
    } else {
      for (absl::string_view part : absl::StrSplit(rest, ',')) {
        int index = -1;
        if (!absl::SimpleAtoi(part, &index) || index < 0 || index >= cuda_count) {
          return absl::InvalidArgumentError(absl::StrCat("--devices: '", spec, "': cuda:", part,
                                                         " does not exist (", cuda_count,
                                                         " CUDA devices visible)"));
        }
        for (const DeviceRef& d : devices) {
          if (d.index == index) {
            return absl::InvalidArgumentError(
                absl::StrCat("--devices: '", spec, "': cuda:", index, " listed twice"));
          }
        }
        add_cuda(index);
      }
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices: '", spec, "' is not auto, cpu[:N] or cuda[:i,j,...]"));
  }
  return std::unique_ptr<DevicePool>(new DevicePool(std::move(devices), std::move(descriptions)));
}

DevicePool::DevicePool(std::vector<DeviceRef> devices, std::vector<std::string> descriptions)
    : devices_(std::move(devices)),
      descriptions_(std::move(descriptions)),
      holder_(devices_.size(), 0) {}

std::optional<std::vector<DeviceRef>> DevicePool::TryAcquire(int count, uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  std::vector<int> chosen;
  for (int i = 0; i < size() && static_cast<int>(chosen.size()) < count; ++i) {
    if (holder_[i] == 0) chosen.push_back(i);
  }
  if (count < 1 || static_cast<int>(chosen.size()) < count) return std::nullopt;
  std::vector<DeviceRef> out;
  for (int i : chosen) {
    holder_[i] = job_id;
    out.push_back(devices_[i]);
  }
  return out;
}

void DevicePool::Release(uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  for (uint64_t& h : holder_) {
    if (h == job_id) h = 0;
  }
}

int DevicePool::free_count() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (uint64_t h : holder_) n += h == 0;
  return n;
}

std::vector<DeviceStatus> DevicePool::Snapshot() const {
  std::vector<DeviceStatus> out;
  const int64_t rss = ProcessRssBytes();
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < size(); ++i) {
    DeviceStatus s;
    s.device = devices_[i];
    s.description = descriptions_[i];
    s.held_by_job = holder_[i];
    s.memory_used_bytes = devices_[i].kind == DeviceKind::kCuda
                              ? QueryCudaDevice(devices_[i].index).memory_used_bytes
                              : rss;  // CPU devices share the process's memory
    out.push_back(s);
  }
  return out;
}

}  // namespace latentd::engine
