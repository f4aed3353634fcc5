// Data parallelism for TRAIN jobs: every rank computes gradients on its slice of the global batch,
// the gradients are summed across ranks before the optimizer step, so every rank applies the same
// update and holds the same optimizer state.
//
// The transport is a LibTorch c10d process group: Gloo for CPU tensors, NCCL for CUDA tensors
// (compiled only when LibTorch has NCCL, i.e. USE_C10D_NCCL). Ranks find each other through a
// c10d Store: a HashStore for ranks that are threads of one latentd (one rank per device the job
// holds), a TCPStore for ranks on several latentd nodes (docs/TRAIN.md, "Several nodes").
#ifndef LATENTD_ENGINE_DATA_PARALLEL_H_
#define LATENTD_ENGINE_DATA_PARALLEL_H_

#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latentd::engine {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Replaces each tensor by its sum over all ranks, in place. Every rank must call it with tensors
  // of the same shapes in the same order. One flat buffer per call (one collective).
  virtual absl::Status AllReduceSum(const std::vector<torch::Tensor>& tensors) = 0;
  // Replaces `bytes` on every rank by rank 0's, sent as a byte tensor on `device` (the rank's
  // training device: NCCL sends only CUDA tensors). Every rank must call it.
  virtual absl::Status BroadcastBytes(std::string* bytes, c10::Device device) = 0;
  // Sets `gathered` to every rank's `local`, in rank order (this rank's included). Every rank
  // must call it with a contiguous tensor of the same shape and dtype, on its training device.
  virtual absl::Status AllGather(const torch::Tensor& local,
                                 std::vector<torch::Tensor>* gathered) = 0;
};

// World of one: AllReduceSum is a no-op.
class SingleProcessSync : public GradientSync {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status AllReduceSum(const std::vector<torch::Tensor>&) override { return absl::OkStatus(); }
  absl::Status BroadcastBytes(std::string*, c10::Device) override { return absl::OkStatus(); }
  absl::Status AllGather(const torch::Tensor& local,
                         std::vector<torch::Tensor>* gathered) override {
    *gathered = {local};
    return absl::OkStatus();
  }
};

// Backend of a process group.
enum class CollectiveBackend { kGloo, kNccl };

struct ProcessGroupOptions {
  CollectiveBackend backend = CollectiveBackend::kGloo;
  int rank = 0;
  int world_size = 1;
  // Network interface host name for Gloo; empty = loopback ("127.0.0.1"), the in-process case.
  std::string gloo_hostname;
  // Collective timeout in seconds. Default 300.
  int timeout_seconds = 300;
};

// Joins a process group through `store` (shared by all ranks). Blocks until all ranks have joined.
// UNIMPLEMENTED for NCCL on a LibTorch without it.
absl::StatusOr<std::unique_ptr<GradientSync>> JoinProcessGroup(
    c10::intrusive_ptr<c10d::Store> store, const ProcessGroupOptions& options);

// A store for ranks that are threads of this process.
c10::intrusive_ptr<c10d::Store> NewInProcessStore();
// A TCPStore rendezvous: rank 0 (is_master) listens on `port` (every interface), the others
// connect to host:port, retrying until the timeout (then UNAVAILABLE). Returns without waiting
// for the other ranks: CheckRanksAgree is where they meet. `timeout_seconds` also bounds every
// read of a key that is not there yet.
// `cancelled` (may be null) is polled while a client waits: CANCELLED when it turns true.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> NewTcpStore(
    const std::string& host, int port, int world_size, bool is_master, int timeout_seconds,
    const std::function<bool()>& cancelled = nullptr);

// Every rank publishes `value` under `key` and reads every other rank's; all must equal rank 0's.
// FAILED_PRECONDITION naming the first rank that differs and both values otherwise (every rank
// reaches the same verdict, so none goes on to wait for a collective the others left).
// UNAVAILABLE when a rank does not publish within the store's timeout; CANCELLED when
// `cancelled` (may be null, polled while waiting) turns true. Rank 0, whose node hosts a
// TCPStore, returns only once every rank has read the values (or the timeout has passed).
absl::Status CheckRanksAgree(c10d::Store& store, int rank, int world_size, const std::string& key,
                             const std::string& value,
                             const std::function<bool()>& cancelled = nullptr);

struct HostPort {
  std::string host;
  int port = 0;
};
// "host:port" or "[v6 address]:port", port in [1, 65535]; INVALID_ARGUMENT otherwise.
absl::StatusOr<HostPort> ParseHostPort(const std::string& address);

// The local address (numeric) of the route to host:port: the interface other nodes can reach
// this one on. No packet is sent (a UDP socket is connected, then asked for its name).
absl::StatusOr<std::string> LocalAddressTowards(const HostPort& peer);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_DATA_PARALLEL_H_
