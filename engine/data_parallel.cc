#include "engine/data_parallel.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace latentd::engine {
namespace {

// How often a waiting rank looks for the others (and for a cancel).
constexpr auto kPollInterval = std::chrono::milliseconds(50);

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

  absl::Status BroadcastBytes(std::string* bytes, c10::Device device) override {
    try {
      c10d::BroadcastOptions options;
      options.rootRank = 0;
      const int64_t root_size = rank_ == 0 ? static_cast<int64_t>(bytes->size()) : 0;
      std::vector<torch::Tensor> size = {torch::full({1}, root_size, torch::kInt64).to(device)};
      group_->broadcast(size, options)->wait();
      const int64_t n = size[0].cpu().item<int64_t>();
      if (n == 0) {
        bytes->clear();
        return absl::OkStatus();
      }
      std::vector<torch::Tensor> data;
      if (rank_ == 0) {
        data.push_back(torch::from_blob(bytes->data(), {n}, torch::kUInt8).to(device));
      } else {
        data.push_back(torch::empty({n}, torch::TensorOptions(torch::kUInt8).device(device)));
      }
      group_->broadcast(data, options)->wait();
      if (rank_ != 0) {
        const torch::Tensor host = data[0].cpu().contiguous();
        bytes->assign(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(n));
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("broadcast from rank 0 to ", world_size_, " ranks: ", e.what()));
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const torch::Tensor& local,
                         std::vector<torch::Tensor>* gathered) override {
    try {
      std::vector<torch::Tensor> input = {local.contiguous()};
      std::vector<std::vector<torch::Tensor>> output(1);
      for (int r = 0; r < world_size_; ++r) output[0].push_back(torch::empty_like(input[0]));
      group_->allgather(output, input)->wait();
      *gathered = std::move(output[0]);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("all-gather across ", world_size_, " ranks: ", e.what()));
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

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> NewTcpStore(
    const std::string& host, int port, int world_size, bool is_master, int timeout_seconds,
    const std::function<bool()>& cancelled) {
  const auto timeout = std::chrono::seconds(timeout_seconds);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = is_master;
  options.numWorkers = world_size;
  // Ranks meet in CheckRanksAgree, whose reads wait for the others' keys and fail with the
  // timeout; the store's own wait for workers gives up silently when it runs out.
  options.waitWorkers = false;
  // A client tries to connect for a second at a time, so that it can be cancelled while the
  // master's node has not started its job yet (nodes' jobs start in any order).
  options.timeout = is_master
                        ? std::chrono::milliseconds(timeout)
                        : std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(1));
  while (true) {
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
      store->setTimeout(timeout);
      return c10::intrusive_ptr<c10d::Store>(store);
    } catch (const std::exception& e) {
      if (is_master || std::chrono::steady_clock::now() >= deadline) {
        return absl::UnavailableError(absl::StrCat("TCPStore rendezvous at ", host, ":", port, " (",
                                                   timeout_seconds, " s): ", e.what()));
      }
    }
    if (cancelled != nullptr && cancelled()) {
      return absl::CancelledError(
          absl::StrCat("cancelled while connecting to the rendezvous at ", host, ":", port));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

absl::Status CheckRanksAgree(c10d::Store& store, int rank, int world_size, const std::string& key,
                             const std::string& value, const std::function<bool()>& cancelled) {
  auto key_of = [&](int r) { return absl::StrCat(key, "/", r); };
  auto text = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  const auto timeout = store.getTimeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Waits for rank r's key by polling, so that a cancel is seen.
  auto read = [&](int r) -> absl::StatusOr<std::string> {
    while (!store.check({key_of(r)})) {
      if (cancelled != nullptr && cancelled()) {
        return absl::CancelledError(
            absl::StrCat("cancelled while rank ", rank, " waited for rank ", r, " to join"));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::UnavailableError(absl::StrCat(
            "rank ", rank, " of ", world_size, ": no word from rank ", r, " on ", key, " within ",
            std::chrono::duration_cast<std::chrono::seconds>(timeout).count(), " s"));
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    return text(store.get(key_of(r)));
  };
  auto compare = [&]() -> absl::Status {
    std::string first = value;
    if (rank != 0) {
      ASSIGN_OR_RETURN(first, read(0));
    }
    for (int r = 1; r < world_size; ++r) {
      std::string other = value;
      if (r != rank) {
        ASSIGN_OR_RETURN(other, read(r));
      }
      if (other != first) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", r, (r == rank ? " (this one)" : ""), " and rank 0",
                         (rank == 0 ? " (this one)" : ""), " disagree on ", key, ": rank 0 has ",
                         first, "; rank ", r, " has ", other));
      }
    }
    return absl::OkStatus();
  };
  try {
    store.set(key_of(rank), std::vector<uint8_t>(value.begin(), value.end()));
    const absl::Status verdict = compare();
    // Rank 0's node hosts the store, and its job may end as soon as it has its verdict (a
    // disagreement): it waits until every rank has read what it needed, so that they fail
    // saying why rather than with a broken connection.
    const std::string done_key = absl::StrCat(key, "/read/");
    if (rank != 0) {
      store.set(done_key + std::to_string(rank), std::vector<uint8_t>{1});
      return verdict;
    }
    for (int r = 1; r < world_size; ++r) {
      while (!store.check({done_key + std::to_string(r)}) &&
             std::chrono::steady_clock::now() < deadline && !(cancelled && cancelled())) {
        std::this_thread::sleep_for(kPollInterval);
      }
    }
    return verdict;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", rank, " of ", world_size,
                                               ": the rendezvous store failed: ", e.what()));
  }
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& address) {
  HostPort out;
  std::string port;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", address, "\" is not \"[v6 address]:port\""));
    }
    out.host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || address.find(':') != colon) {
      return absl::InvalidArgumentError(absl::StrCat("\"", address, "\" is not \"host:port\""));
    }
    out.host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  if (out.host.empty() || port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(port) < 1 || std::stoi(port) > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", address, "\" needs a host and a port in [1, 65535]"));
  }
  out.port = std::stoi(port);
  return out;
}

absl::StatusOr<std::string> LocalAddressTowards(const HostPort& peer) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(peer.port);
  const int error = getaddrinfo(peer.host.c_str(), port.c_str(), &hints, &found);
  if (error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", peer.host, ": ", gai_strerror(error)));
  }
  std::string reason = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    char name[NI_MAXHOST];
    const bool named = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
                       getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
                       getnameinfo(reinterpret_cast<sockaddr*>(&local), length, name, sizeof(name),
                                   nullptr, 0, NI_NUMERICHOST) == 0;
    if (!named) reason = std::strerror(errno);
    ::close(fd);
    if (named) {
      freeaddrinfo(found);
      return std::string(name);
    }
  }
  freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("no route to ", peer.host, ": ", reason));
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
