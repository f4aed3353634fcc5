// GPU check kit: the project's engine/data_parallel.cc as TRAIN uses it.
//   - Gloo on CPU tensors: world 1 through a TCPStore on 127.0.0.1 (the multi-node rendezvous
//     path), and world 2 as two threads sharing NewInProcessStore() (one rank per held device);
//   - NCCL on CUDA tensors, world 1, through NewInProcessStore() and through a TCPStore, where
//     LibTorch has NCCL (USE_C10D_NCCL); elsewhere JoinProcessGroup must answer UNIMPLEMENTED.
// Against LibTorch >= 2.0 this file is expected not to build until data_parallel.cc is ported
// (ProcessGroupGloo / ProcessGroupNCCL derive from c10d::Backend there, not c10d::ProcessGroup);
// nccl_check covers NCCL with the kit's own code meanwhile.

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/data_parallel.h"
#include "tests/gpu/kit_report.h"

namespace gpu_kit {
namespace {

using latentd::engine::CollectiveBackend;
using latentd::engine::GradientSync;
using latentd::engine::ProcessGroupOptions;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

ProcessGroupOptions Options(CollectiveBackend backend, int rank, int world) {
  ProcessGroupOptions o;
  o.backend = backend;
  o.rank = rank;
  o.world_size = world;
  o.timeout_seconds = 60;
  return o;
}

// A float32 matrix and a bfloat16 vector (AllReduceSum flattens both into one fp32 buffer and
// copies the sums back in each tensor's own dtype), scaled by `k`.
std::vector<at::Tensor> Grads(const at::TensorOptions& where, double k) {
  return {at::arange(64 * 32, at::kFloat).mul_(0.5 * k).view({64, 32}).to(where.device()),
          at::arange(32, at::kFloat).sub_(16).mul_(k).to(at::kBFloat16).to(where.device())};
}

bool Equal(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (!at::equal(got[i].cpu(), want[i].cpu())) return false;
  }
  return true;
}

// Groups stay alive until _Exit (see main).
std::vector<std::unique_ptr<GradientSync>>& Keep() {
  static auto* keep = new std::vector<std::unique_ptr<GradientSync>>();
  return *keep;
}

void WorldOne(Report& r, const std::string& name, CollectiveBackend backend,
              const absl::StatusOr<c10::intrusive_ptr<c10d::Store>>& store,
              const at::TensorOptions& where) {
  r.Guard(name, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    if (!store.ok()) {
      r.Fail(name, "store: " + store.status().ToString());
      return;
    }
    auto sync = latentd::engine::JoinProcessGroup(*store, Options(backend, 0, 1));
    if (!sync.ok()) {
      r.Fail(name, "JoinProcessGroup: " + sync.status().ToString());
      return;
    }
    std::vector<at::Tensor> g = Grads(where, 1.0);
    const absl::Status s = (*sync)->AllReduceSum(g);
    const bool ok = s.ok() && Equal(g, Grads(at::TensorOptions(), 1.0));
    Keep().push_back(std::move(*sync));
    r.Check(ok, name,
            "AllReduceSum " + s.ToString() + ", values " + (ok ? "correct" : "WRONG") + " in " +
                Sci(SecondsSince(t0)) + " s");
  });
}

int Main() {
  Report r;
  const at::TensorOptions cpu;
  WorldOne(r, "engine.dp.gloo_cpu_tcpstore", CollectiveBackend::kGloo,
           latentd::engine::NewTcpStore("127.0.0.1", FreePort(), 1, true, 30), cpu);

  r.Guard("engine.dp.gloo_cpu_two_threads", [&] {
    const auto t0 = std::chrono::steady_clock::now();
    auto store = latentd::engine::NewInProcessStore();
    std::vector<std::vector<at::Tensor>> grads = {Grads(cpu, 1.0), Grads(cpu, 2.0)};
    std::vector<absl::Status> status(2);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        auto sync =
            latentd::engine::JoinProcessGroup(store, Options(CollectiveBackend::kGloo, rank, 2));
        if (!sync.ok()) {
          status[rank] = sync.status();
          return;
        }
        status[rank] = (*sync)->AllReduceSum(grads[rank]);
      });
    }
    for (auto& t : ranks) t.join();
    const std::vector<at::Tensor> want = Grads(cpu, 3.0);
    const bool ok =
        status[0].ok() && status[1].ok() && Equal(grads[0], want) && Equal(grads[1], want);
    r.Check(ok, "engine.dp.gloo_cpu_two_threads",
            "rank 0 " + status[0].ToString() + ", rank 1 " + status[1].ToString() + ", sums " +
                (ok ? "correct" : "WRONG") + " in " + Sci(SecondsSince(t0)) + " s");
  });

  const bool cuda = torch::cuda::is_available() && torch::cuda::device_count() > 0;
#ifdef USE_C10D_NCCL
  if (cuda) {
    const at::TensorOptions gpu = at::TensorOptions().device(at::Device(at::kCUDA, 0));
    WorldOne(r, "engine.dp.nccl_in_process_store", CollectiveBackend::kNccl,
             latentd::engine::NewInProcessStore(), gpu);
    WorldOne(r, "engine.dp.nccl_tcpstore", CollectiveBackend::kNccl,
             latentd::engine::NewTcpStore("127.0.0.1", FreePort(), 1, true, 30), gpu);
  } else if (EnvFlag("KIT_EXPECT_CUDA")) {
    r.Fail("engine.dp.nccl", "Python's torch sees CUDA but this binary does not");
  } else {
    r.Skip("engine.dp.nccl", "SKIP (no CUDA)");
  }
#else
  (void)cuda;
  if (EnvFlag("KIT_EXPECT_NCCL")) {
    r.Fail("engine.dp.nccl",
           "Python's torch has NCCL but this binary was built without USE_C10D_NCCL");
  } else {
    r.Skip("engine.dp.nccl", "SKIP (no CUDA): this LibTorch has no NCCL");
  }
  r.Guard("engine.dp.nccl_unimplemented", [&] {
    auto sync = latentd::engine::JoinProcessGroup(latentd::engine::NewInProcessStore(),
                                                  Options(CollectiveBackend::kNccl, 0, 1));
    r.Check(!sync.ok() && sync.status().code() == absl::StatusCode::kUnimplemented,
            "engine.dp.nccl_unimplemented",
            "JoinProcessGroup(kNccl) without NCCL: " + sync.status().ToString());
  });
#endif
  return r.exit_code();
}

}  // namespace
}  // namespace gpu_kit

int main() {
  const int rc = gpu_kit::Main();
  std::fflush(stdout);
  // The groups are kept alive and never destroyed: LibTorch 2.x's NCCL watchdog threads can hold
  // up (or hang) their teardown, and every result is already printed.
  std::_Exit(rc);
}
