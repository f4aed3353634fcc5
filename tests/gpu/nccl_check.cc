// GPU check kit: NCCL through LibTorch's c10d, world size 1, with the kit's own code. The concrete
// c10d::ProcessGroupNCCL class offers the same allreduce() in LibTorch 1.13 (where it derives from
// c10d::ProcessGroup) and 2.x (where it derives from c10d::Backend), so this builds against both;
// engine_dp_check runs the project's engine/data_parallel.cc, which holds its groups as
// c10d::ProcessGroup and so fails to build against 2.x (see README.md).
//
// NCCL is compiled only with USE_C10D_NCCL (which LibTorch's own header checks; run.sh defines it
// when the wheel has NCCL and nccl.h is found); without it, or without CUDA, the checks print SKIP.

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "tests/gpu/kit_report.h"

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace gpu_kit {
namespace {

// A port that was free a moment ago (the kernel picks it); TCPStore then listens on it.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

#ifdef USE_C10D_NCCL
// Two collectives on one fresh communicator: fp32 [64, 32] and bf16 [32], SUM over one rank.
void AllReduce(Report& r, const std::string& name, const c10::intrusive_ptr<c10d::Store>& store) {
  const auto t0 = std::chrono::steady_clock::now();
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = std::chrono::milliseconds(60 * 1000);
  auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, /*rank=*/0, /*size=*/1, options);
  // Kept alive until _Exit: LibTorch 2.x's ProcessGroupNCCL destructor joins watchdog threads and
  // can take long or hang without a shutdown(), which 1.13 does not have.
  static auto* keep = new std::vector<c10::intrusive_ptr<c10d::ProcessGroupNCCL>>();
  keep->push_back(group);
  const auto dev = at::TensorOptions().device(at::Device(at::kCUDA, 0));
  const at::Tensor want_a = at::arange(64 * 32, at::kFloat).mul_(0.5).view({64, 32});
  const at::Tensor want_b = at::arange(32, at::kFloat).sub_(16).to(at::kBFloat16);
  std::vector<at::Tensor> a = {want_a.to(dev.device())};
  std::vector<at::Tensor> b = {want_b.to(dev.device())};
  c10d::AllreduceOptions sum;
  sum.reduceOp = c10d::ReduceOp::SUM;
  group->allreduce(a, sum)->wait();
  const double first_s = SecondsSince(t0);
  group->allreduce(b, sum)->wait();
  const bool ok_a = at::equal(a[0].cpu(), want_a);
  const bool ok_b = at::equal(b[0].cpu(), want_b);
  r.Check(ok_a && ok_b, name,
          std::string("fp32 [64,32] ") + (ok_a ? "correct" : "WRONG") + ", bf16 [32] " +
              (ok_b ? "correct" : "WRONG") + "; init + first all-reduce " + Sci(first_s) +
              " s, both " + Sci(SecondsSince(t0)) + " s");
}
#endif

int Main() {
  Report r;
#ifdef USE_C10D_NCCL
  r.Info("nccl.build", "compiled with USE_C10D_NCCL");
  const bool cuda = torch::cuda::is_available() && torch::cuda::device_count() > 0;
  if (!cuda) {
    if (EnvFlag("KIT_EXPECT_CUDA")) {
      r.Fail("nccl", "Python's torch sees CUDA but this binary does not");
    } else {
      r.Skip("nccl", "SKIP (no CUDA)");
    }
    return r.exit_code();
  }
  r.Guard("nccl.allreduce.filestore", [&] {
    const std::string path = "/tmp/gpu_kit_nccl_store_" + std::to_string(getpid());
    std::remove(path.c_str());
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::FileStore>(path, 1);
    AllReduce(r, "nccl.allreduce.filestore", store);
    std::remove(path.c_str());
  });
  r.Guard("nccl.allreduce.tcpstore", [&] {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(FreePort());
    options.isServer = true;
    options.numWorkers = 1;
    options.waitWorkers = true;
    options.timeout = std::chrono::milliseconds(30 * 1000);
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    AllReduce(r, "nccl.allreduce.tcpstore", store);
  });
#else
  if (EnvFlag("KIT_EXPECT_NCCL")) {
    r.Fail("nccl",
           "Python's torch has NCCL but this binary was built without USE_C10D_NCCL "
           "(nccl.h not found? see configure.log)");
  } else {
    r.Skip("nccl", "SKIP (no CUDA): this LibTorch has no NCCL (built without USE_C10D_NCCL)");
  }
  // The stores are what the NCCL checks rendezvous through; they work without CUDA.
  r.Guard("nccl.stores_cpu", [&] {
    const std::string path = "/tmp/gpu_kit_store_" + std::to_string(getpid());
    std::remove(path.c_str());
    c10d::FileStore file(path, 1);
    file.set("k", std::vector<uint8_t>{1, 2, 3});
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(FreePort());
    options.isServer = true;
    options.numWorkers = 1;
    options.timeout = std::chrono::milliseconds(30 * 1000);
    c10d::TCPStore tcp("127.0.0.1", options);
    tcp.set("k", std::vector<uint8_t>{4, 5});
    const bool ok = file.get("k") == std::vector<uint8_t>{1, 2, 3} &&
                    tcp.get("k") == std::vector<uint8_t>{4, 5};
    std::remove(path.c_str());
    r.Check(ok, "nccl.stores_cpu", "FileStore and TCPStore (127.0.0.1) set/get round trip");
  });
#endif
  return r.exit_code();
}

}  // namespace
}  // namespace gpu_kit

int main() {
  const int rc = gpu_kit::Main();
  std::fflush(stdout);
  // Skips the teardown of the process groups kept alive above; every result is already printed.
  std::_Exit(rc);
}
