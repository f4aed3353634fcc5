// GPU check kit, main binary. It uses only the device-generic LibTorch API (no CUDA headers), so
// that it builds against Debian's CPU LibTorch 1.13 and against a CUDA wheel's LibTorch 2.x:
//  1. devices: how many LibTorch sees, and 1 GiB allocated, written and read back on each;
//  2. the efcp optimizers on cuda:0 against the same run on the CPU;
//  3. a device-to-pinned-host copy fenced by a c10::Event and polled the way
//     engine/device_util.cc's DeviceFence does it (engine_fence_check runs the real class).
// Without CUDA the CPU halves run (each optimizer twice on the CPU: determinism, accounting, state
// placement) and the CUDA checks print SKIP.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>
#include <torch/serialize/archive.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "efcp/accounted_optimizer.h"
#include "efcp/ggt.h"
#include "efcp/low_rank_mfac.h"
#include "efcp/mfac.h"
#include "efcp/sparse_mfac.h"
#include "tests/gpu/kit_report.h"

namespace gpu_kit {
namespace {

constexpr int kSteps = 20;
// CPU and CUDA see bit-identical gradients and initial weights, and their windows hold identical
// rows (Top-K of identical inputs selects the same entries); they differ only in the order of
// reductions (dot products, mat-vec, Top-K output order) and in the float64 Cholesky / eigh. The
// damped window system amplifies rounding about 3000-fold over 20 steps: the fp32 CPU run lies
// 1.5e-5 .. 1.7e-4 of the weights' total displacement from a float64 run (measured on Debian's
// LibTorch 1.13; printed for scale). Two fp32 implementations may each be that far from the exact
// result, so fp32 CUDA vs fp32 CPU must agree within 1e-3 of the displacement (TF32 matmuls, a
// lost row or a wrong kernel give 1e-3 .. 1); float64 CUDA vs float64 CPU, where rounding is
// 1e-16 and so the same amplification gives ~1e-13, within 1e-9.
constexpr double kToleranceFp32 = 1e-3;
constexpr double kToleranceFp64 = 1e-9;
// A state tensor of these optimizers is at least a 64-entry coefficient vector or an 8 x 8 Gram
// matrix (512 B); a host allocation of 256 B or more during a CUDA step means something went to
// the CPU. Scalars that a step reads back (the finite-gradient check) take a few bytes.
constexpr size_t kHostAllocLimit = 256;

std::string Str(const efcp::MemoryBreakdown& b) { return b.ToString(); }

// Counts the CPU allocations made while armed. LibTorch 1.13 declares Allocator::allocate() const
// and has no copy_data(); 2.x declares allocate() non-const and copy_data() pure virtual.
// Declaring both allocate()s and copy_data() without `override` implements whichever the headers
// ask for.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) const {
    if (armed_.load()) {
      count_.fetch_add(1);
      bytes_.fetch_add(static_cast<int64_t>(n));
      size_t seen = largest_.load();
      while (n > seen && !largest_.compare_exchange_weak(seen, n)) {
      }
    }
    return base_->allocate(n);
  }
  c10::DataPtr allocate(size_t n) {
    return static_cast<const CountingCpuAllocator*>(this)->allocate(n);
  }
  void copy_data(void* dest, const void* src, size_t count) const { std::memcpy(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }

  void Arm() {
    count_ = 0;
    bytes_ = 0;
    largest_ = 0;
    armed_ = true;
  }
  void Disarm() { armed_ = false; }
  int64_t count() const { return count_.load(); }
  int64_t bytes() const { return bytes_.load(); }
  size_t largest() const { return largest_.load(); }

 private:
  c10::Allocator* base_;
  std::atomic<bool> armed_{false};
  mutable std::atomic<int64_t> count_{0};
  mutable std::atomic<int64_t> bytes_{0};
  mutable std::atomic<size_t> largest_{0};
};

// Installs the counter as LibTorch's CPU allocator for its lifetime.
class ScopedCpuAllocatorCount {
 public:
  ScopedCpuAllocatorCount() : base_(c10::GetCPUAllocator()), counter_(base_) {
    // The highest priority wins over whatever registered the default; restoring needs it again.
    c10::SetCPUAllocator(&counter_, /*priority=*/255);
  }
  ~ScopedCpuAllocatorCount() { c10::SetCPUAllocator(base_, /*priority=*/255); }
  CountingCpuAllocator& counter() { return counter_; }

 private:
  c10::Allocator* base_;
  CountingCpuAllocator counter_;
};

// ---- 1. devices -------------------------------------------------------------------------------

bool CheckDevices(Report& r) {
  const bool available = torch::cuda::is_available();
  const size_t count = torch::cuda::device_count();
  r.Info("devices.torch", std::string("LibTorch ") + TORCH_VERSION + ", cuda available " +
                              (available ? "yes" : "no") + ", devices " + std::to_string(count));
  if (!available || count == 0) {
    if (EnvFlag("KIT_EXPECT_CUDA")) {
      r.Fail("devices.count",
             "Python's torch sees CUDA but this binary does not: libtorch_cuda.so was not linked "
             "or not loaded (see the link line in build.log)");
    } else {
      r.Skip("devices.count", "SKIP (no CUDA)");
      r.Skip("devices.alloc_1gib", "SKIP (no CUDA)");
    }
    return false;
  }
  r.Pass("devices.count", std::to_string(count) + " CUDA device(s)");
  for (size_t i = 0; i < count; ++i) {
    const std::string name = "devices.alloc_1gib.cuda:" + std::to_string(i);
    r.Guard(name, [&] {
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t n = int64_t{1} << 28;  // 2^28 float32 = 1 GiB
      at::Tensor t =
          at::empty({n}, at::TensorOptions()
                             .dtype(at::kFloat)
                             .device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(i))));
      t.fill_(2.5);
      const bool all = t.eq(2.5).all().item<bool>();
      const double sum = t.sum(at::kDouble).item<double>();
      t.reset();
      r.Check(
          all && sum == 2.5 * static_cast<double>(n), name,
          "wrote and read back 1 GiB (sum " + Sci(sum) + ") in " + Sci(SecondsSince(t0)) + " s");
    });
  }
  return true;
}

// ---- 2. efcp optimizers -----------------------------------------------------------------------

using Weights = std::vector<at::Tensor>;  // CPU float64: [64, 32] and [32]
using Factory = std::function<std::unique_ptr<efcp::AccountedOptimizer>(std::vector<at::Tensor>)>;

struct OptimizerCase {
  std::string name;
  Factory make;
};

std::vector<OptimizerCase> Cases() {
  // Windows of 8 over 20 steps: the ring buffer wraps twice.
  return {
      {"mfac",
       [](std::vector<at::Tensor> p) {
         return std::make_unique<efcp::MFAC>(
             std::move(p), efcp::MFACOptions(1e-2).window(8).damp(1e-3).momentum(0.9));
       }},
      {"sparse_mfac_1pct",
       [](std::vector<at::Tensor> p) {
         return std::make_unique<efcp::SparseMFAC>(
             std::move(p), efcp::SparseMFACOptions(1e-2).window(8).damp(1e-3).density(0.01));
       }},
      {"sparse_mfac_100pct",
       [](std::vector<at::Tensor> p) {
         return std::make_unique<efcp::SparseMFAC>(
             std::move(p), efcp::SparseMFACOptions(1e-2).window(8).damp(1e-3).density(1.0));
       }},
      {"low_rank_mfac",
       [](std::vector<at::Tensor> p) {
         return std::make_unique<efcp::LowRankMFAC>(
             std::move(p), efcp::LowRankMFACOptions(1e-2).window(8).damp(1e-3).rank(4));
       }},
      {"ggt",
       [](std::vector<at::Tensor> p) {
         return std::make_unique<efcp::GGT>(
             std::move(p),
             efcp::GGTOptions(1e-2).window(8).epsilon(1e-4).weight_decay(1e-2).weight_decay_kind(
                 efcp::WeightDecayKind::kDecoupled));
       }},
  };
}

Weights InitialWeights() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  return {at::randn({64, 32}, gen, f64).mul_(0.1), at::randn({32}, gen, f64).mul_(0.1)};
}

std::vector<Weights> Gradients() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  std::vector<Weights> out;
  for (int t = 0; t < kSteps; ++t)
    out.push_back({at::randn({64, 32}, gen, f64), at::randn({32}, gen, f64)});
  return out;
}

struct Trajectory {
  Weights final_weights;  // CPU float64
  efcp::MemoryBreakdown breakdown;
  int state_tensors = 0;
  std::vector<std::string> misplaced;  // state or parameters not on the run's device
  int64_t host_allocs = 0;
  int64_t host_bytes = 0;
  size_t largest_host_alloc = 0;
};

// Round-trips the optimizer's own archive: a state tensor comes back on the device it was saved
// from, so this lists where every tensor of the state lives without reaching into private members.
void InspectState(const efcp::AccountedOptimizer& opt, const at::Device& device, Trajectory* out) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream os;
  archive.save_to(os);
  torch::serialize::InputArchive in;
  std::istringstream is(os.str());
  in.load_from(is);
  for (const std::string& key : in.keys()) {
    c10::IValue v;
    if (!in.try_read(key, v) || !v.isTensor()) continue;
    ++out->state_tensors;
    const at::Tensor t = v.toTensor();
    if (t.device() != device) out->misplaced.push_back(key + "@" + t.device().str());
  }
}

Trajectory Run(const Factory& make, const at::Device& device, at::ScalarType dtype,
               const Weights& w0, const std::vector<Weights>& grads,
               CountingCpuAllocator* counter) {
  std::vector<at::Tensor> params;
  for (const at::Tensor& w : w0) {
    // copy = true: a float64 CPU run must not alias (and step) the shared initial weights.
    params.push_back(
        w.to(device, dtype, /*non_blocking=*/false, /*copy=*/true).set_requires_grad(true));
  }
  // Converted on the CPU first, so that both devices get the same fp32 bits.
  std::vector<Weights> g;
  for (const Weights& step : grads) {
    Weights gs;
    for (const at::Tensor& x : step) gs.push_back(x.to(dtype).to(device, dtype, false, true));
    g.push_back(std::move(gs));
  }
  std::unique_ptr<efcp::AccountedOptimizer> opt = make(params);
  Trajectory out;
  if (counter != nullptr) counter->Arm();
  for (int t = 0; t < kSteps; ++t) {
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = g[t][i];
    opt->step();
  }
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
  if (counter != nullptr) {
    counter->Disarm();
    out.host_allocs = counter->count();
    out.host_bytes = counter->bytes();
    out.largest_host_alloc = counter->largest();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].device() != device) {
      out.misplaced.push_back("param" + std::to_string(i) + "@" + params[i].device().str());
    }
    out.final_weights.push_back(params[i].detach().to(at::kCPU, at::kDouble, false, true));
  }
  out.breakdown = opt->memory_breakdown();
  InspectState(*opt, device, &out);
  return out;
}

// max |a - b| over the parameters, relative to the largest displacement max |ref - w0|.
double RelDiff(const Weights& a, const Weights& b, const Weights& ref, const Weights& w0) {
  double diff = 0, disp = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
    disp = std::max(disp, (ref[i] - w0[i]).abs().max().item<double>());
  }
  return disp > 0 ? diff / disp : std::numeric_limits<double>::infinity();
}

bool Finite(const Weights& w) {
  for (const at::Tensor& t : w) {
    if (!at::isfinite(t).all().item<bool>()) return false;
  }
  return true;
}

bool BitEqual(const Weights& a, const Weights& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

void CheckOptimizers(Report& r, bool cuda) {
  const Weights w0 = InitialWeights();
  const std::vector<Weights> grads = Gradients();
  const at::Device cpu(at::kCPU);
  const at::Device gpu(at::kCUDA, 0);
  std::unique_ptr<ScopedCpuAllocatorCount> count;
  if (cuda) count = std::make_unique<ScopedCpuAllocatorCount>();
  for (const OptimizerCase& c : Cases()) {
    const std::string n = "efcp." + c.name;
    r.Guard(n, [&] {
      const auto t0 = std::chrono::steady_clock::now();
      const Trajectory a = Run(c.make, cpu, at::kFloat, w0, grads, nullptr);
      const Trajectory b = Run(c.make, cpu, at::kFloat, w0, grads, nullptr);
      const Trajectory ref = Run(c.make, cpu, at::kDouble, w0, grads, nullptr);
      const double fp32_vs_fp64 =
          RelDiff(a.final_weights, ref.final_weights, ref.final_weights, w0);
      // The CPU smoke check: deterministic, accounted and kept on its device.
      const bool cpu_ok = Finite(a.final_weights) && BitEqual(a.final_weights, b.final_weights) &&
                          a.breakdown == b.breakdown && a.misplaced.empty() &&
                          a.state_tensors > 0 && fp32_vs_fp64 <= kToleranceFp32;
      r.Check(cpu_ok, n + ".cpu",
              "two fp32 CPU runs bit-equal " +
                  std::string(BitEqual(a.final_weights, b.final_weights) ? "yes" : "NO") +
                  ", state tensors " + std::to_string(a.state_tensors) + " misplaced [" +
                  Joined(a.misplaced) + "], fp32 vs fp64 " + Sci(fp32_vs_fp64) +
                  " of the displacement, memory " + Str(a.breakdown));
      if (!cuda) {
        r.Skip(n + ".cuda_vs_cpu", "SKIP (no CUDA)");
        r.Skip(n + ".cuda_vs_cpu_fp64", "SKIP (no CUDA)");
        r.Skip(n + ".cuda_memory", "SKIP (no CUDA)");
        r.Skip(n + ".cuda_state_on_device", "SKIP (no CUDA)");
        r.Skip(n + ".cuda_no_host_copies", "SKIP (no CUDA)");
        return;
      }
      const Trajectory g = Run(c.make, gpu, at::kFloat, w0, grads, &count->counter());
      const Trajectory g64 = Run(c.make, gpu, at::kDouble, w0, grads, nullptr);
      const double rel = RelDiff(g.final_weights, a.final_weights, a.final_weights, w0);
      const double rel64 = RelDiff(g64.final_weights, ref.final_weights, ref.final_weights, w0);
      r.Check(Finite(g.final_weights) && rel <= kToleranceFp32, n + ".cuda_vs_cpu",
              "fp32: max |w_cuda - w_cpu| = " + Sci(rel) + " of the displacement after " +
                  std::to_string(kSteps) + " steps (tolerance " + Sci(kToleranceFp32) +
                  "; CPU fp32 vs fp64: " + Sci(fp32_vs_fp64) + ")");
      r.Check(Finite(g64.final_weights) && rel64 <= kToleranceFp64, n + ".cuda_vs_cpu_fp64",
              "fp64: max |w_cuda - w_cpu| = " + Sci(rel64) + " of the displacement (tolerance " +
                  Sci(kToleranceFp64) + ")");
      r.Check(g.breakdown == a.breakdown, n + ".cuda_memory",
              "cuda total " + std::to_string(g.breakdown.total()) + " B, cpu total " +
                  std::to_string(a.breakdown.total()) +
                  (g.breakdown == a.breakdown ? " B, all components equal"
                                              : " B; cuda " + Str(g.breakdown)));
      r.Check(
          g.misplaced.empty() && g.state_tensors == a.state_tensors, n + ".cuda_state_on_device",
          std::to_string(g.state_tensors) +
              " state tensors + parameters checked, not on cuda:0: [" + Joined(g.misplaced) + "]");
      r.Check(g.largest_host_alloc < kHostAllocLimit, n + ".cuda_no_host_copies",
              std::to_string(g.host_allocs) + " CPU allocations (" + std::to_string(g.host_bytes) +
                  " B, largest " + std::to_string(g.largest_host_alloc) + " B; limit " +
                  std::to_string(kHostAllocLimit) + " B) during " + std::to_string(kSteps) +
                  " CUDA steps; " + Sci(SecondsSince(t0)) + " s for 5 runs");
    });
  }
}

// ---- 3. pinned copy + event -------------------------------------------------------------------

void CheckPinnedCopy(Report& r, bool cuda) {
  const std::string n = "pinned_copy_event";
  if (!cuda) {
    r.Skip(n, "SKIP (no CUDA)");
    return;
  }
  r.Guard(n, [&] {
    const at::Device dev(at::kCUDA, 0);
    const int64_t count = int64_t{1} << 24;  // 64 MiB of float32; 2 * i stays exact below 2^25
    // Queue enough work ahead of the copy that it cannot have finished when the event is recorded.
    at::Tensor a = at::randn({4096, 4096}, at::TensorOptions().device(dev));
    for (int i = 0; i < 4; ++i) a = a.mm(a).div_(64.0);
    at::Tensor src = at::arange(count, at::TensorOptions().dtype(at::kFloat).device(dev)).mul_(2);
    at::Tensor host = at::empty({count}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
    const bool pinned = host.is_pinned();
    const auto t0 = std::chrono::steady_clock::now();
    host.copy_(src, /*non_blocking=*/true);
    // What DeviceFence::Record does: an event on the device's current stream.
    const c10::impl::VirtualGuardImpl guard(dev.type());
    c10::Event event(dev.type());
    event.record(guard.getStream(dev));
    const double enqueue_s = SecondsSince(t0);
    const bool done_at_once = event.query();
    // What DeviceFence::Wait does: poll query() (LibTorch 1.13's device-generic event cannot
    // block).
    int64_t polls = 0;
    while (!event.query()) {
      ++polls;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      if (SecondsSince(t0) > 60) break;
    }
    const bool done = event.query();
    const double wait_s = SecondsSince(t0);
    const at::Tensor want = at::arange(count, at::TensorOptions().dtype(at::kFloat)).mul_(2);
    const bool equal = done && at::equal(host, want);
    r.Check(pinned && done && equal, n,
            std::string("pinned ") + (pinned ? "yes" : "NO") + ", event complete " +
                (done ? "yes" : "NO (60 s)") + ", host values " + (equal ? "correct" : "WRONG") +
                "; enqueue " + Sci(enqueue_s) + " s, complete after " + Sci(wait_s) + " s and " +
                std::to_string(polls) + " polls, complete at first query: " +
                (done_at_once ? "yes (copy was not overlapped)" : "no (asynchronous)"));
  });
}

int Main() {
  Report r;
  r.Info("build", std::string("LibTorch ") + TORCH_VERSION +
                      ", _GLIBCXX_USE_CXX11_ABI=" + std::to_string(_GLIBCXX_USE_CXX11_ABI) +
                      ", intra-op threads " + std::to_string(at::get_num_threads()));
  bool cuda = false;
  r.Guard("devices", [&] { cuda = CheckDevices(r); });
  CheckOptimizers(r, cuda);
  CheckPinnedCopy(r, cuda);
  return r.exit_code();
}

}  // namespace
}  // namespace gpu_kit

int main() { return gpu_kit::Main(); }
