#include "engine/data_parallel.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <chrono>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace latentd::engine {
namespace {

// What ProcessGroupGloo / ProcessGroupNCCL derive from: c10d::ProcessGroup up to LibTorch 1.13;
// since 2.0 a c10d::Backend (the ProcessGroup became a dispatcher in front of backends). Both
// bases offer the allreduce(tensors, options) used here.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveGroup = c10d::Backend;
#else
using CollectiveGroup = c10d::ProcessGroup;
#endif

class ProcessGroupSync : public GradientSync {
 public:
  ProcessGroupSync(c10::intrusive_ptr<CollectiveGroup> group, int rank, int world_size)
      : group_(std::move(group)), rank_(rank), world_size_(world_size) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::Status AllReduceSum(const std::vector<torch::Tensor>& tensors) override {
    if (tensors.empty()) return absl::OkStatus();
    try {
      std::vector<torch::Tensor> flat_parts;
      flat_parts.reserve(tensors.size());
      for (const auto& t : tensors) flat_parts.push_back(t.reshape({-1}).to(torch::kFloat32));
      std::vector<torch::Tensor> buffer = {torch::cat(flat_parts)};
      c10d::AllreduceOptions options;
      options.reduceOp = c10d::ReduceOp::SUM;
      group_->allreduce(buffer, options)->wait();
      int64_t offset = 0;
      for (const auto& t : tensors) {
        const int64_t n = t.numel();
        t.copy_(buffer[0].narrow(0, offset, n).view(t.sizes()));
        offset += n;
      }
    } catch (const c10::Error& e) {
      return absl::UnavailableError(
          absl::StrCat("all-reduce across ", world_size_, " ranks: ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("all-reduce across ", world_size_, " ranks: ", e.what()));
    }
    return absl::OkStatus();
  }

 private:
  c10::intrusive_ptr<CollectiveGroup> group_;
  int rank_;
  int world_size_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> NewInProcessStore() {
  return c10::make_intrusive<c10d::HashStore>();
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> NewTcpStore(const std::string& host, int port,
                                                            int world_size, bool is_master,
                                                            int timeout_seconds) {
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = is_master;
    options.numWorkers = world_size;
    options.waitWorkers = true;
    options.timeout = std::chrono::seconds(timeout_seconds);
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::TCPStore>(host, options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("TCPStore rendezvous at ", host, ":", port, ": ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<GradientSync>> JoinProcessGroup(
    c10::intrusive_ptr<c10d::Store> store, const ProcessGroupOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " of world ", options.world_size));
  }
  const auto timeout = std::chrono::milliseconds(options.timeout_seconds * 1000LL);
  try {
    if (options.backend == CollectiveBackend::kNccl) {
#ifdef USE_C10D_NCCL
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = timeout;
      auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, options.rank,
                                                               options.world_size, nccl_options);
      return std::unique_ptr<GradientSync>(
          new ProcessGroupSync(group, options.rank, options.world_size));
#else
      return absl::UnimplementedError("NCCL: this LibTorch was built without it (CPU-only)");
#endif
    }
    auto gloo_options = c10d::ProcessGroupGloo::Options::create();
    gloo_options->timeout = timeout;
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
        options.gloo_hostname.empty() ? "127.0.0.1" : options.gloo_hostname));
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank,
                                                             options.world_size, gloo_options);
    return std::unique_ptr<GradientSync>(
        new ProcessGroupSync(group, options.rank, options.world_size));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("joining the process group as rank ", options.rank,
                                               " of ", options.world_size, ": ", e.what()));
  }
}

}  // namespace latentd::engine
