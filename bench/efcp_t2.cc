// T2 (docs/EFCP.md, shared/notes/workloads.md): optimizer state of SparseMFAC
// (m = 1024, density 1%, bf16 values, uint16 block-relative indices) on the
// d = 8.4M parameters of a TopK SAE (d_in 1024, d_sae 4096: W_enc, W_dec, biases)
// against dense M-FAC's 4*m*d and Adam's 8*d; peak process memory; step time
// against Adam and dense MFAC in the same run; and the admission refusal of dense
// MFAC at m = 1024, which would not fit.
//
//   efcp_t2 [--steps=3] [--small_window=32]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adam.h>
#include <torch/serialize/archive.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/process_memory.h"
#include "efcp/memory.h"
#include "efcp/mfac.h"
#include "efcp/sparse_mfac.h"

namespace {

double PeakMiB() { return latentd::ProcessPeakRssBytes() / 1048576.0; }
double RssMiB() { return latentd::ProcessRssBytes() / 1048576.0; }
double MiB(int64_t b) { return b / 1048576.0; }

std::vector<at::Tensor> SaeParams() {
  at::manual_seed(0);
  return {(at::randn({4096, 1024}) * 0.03).set_requires_grad(true),
          (at::randn({4096, 1024}) * 0.03).set_requires_grad(true),
          at::zeros({4096}).set_requires_grad(true), at::zeros({1024}).set_requires_grad(true)};
}

void SetGrads(std::vector<at::Tensor>& params) {
  for (auto& p : params) p.mutable_grad() = at::randn(p.sizes()) * 1e-3;
}

double TimeSteps(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params, int steps) {
  double total = 0;
  for (int i = 0; i < steps; ++i) {
    SetGrads(params);
    const auto t0 = std::chrono::steady_clock::now();
    opt.step();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return total / steps;
}

// Puts `opt` at a full window (count = m) with random rows, through load():
// the cost of a step depends on the window's size, not on its values, and
// filling it with 1024 real steps would take most of the benchmark.
void FillWindow(efcp::SparseMFAC& opt, const efcp::SparseMFACOptions& o, int64_t num_params) {
  const int64_t m = o.window();
  const efcp::MemoryBreakdown b = opt.memory_breakdown();
  const int64_t k = b.get("history_values") / (m * 2);
  const int64_t padded = b.get("error_buffer") / 4;
  torch::serialize::OutputArchive out;
  out.write("efcp.kind", c10::IValue(std::string("SparseMFAC")));
  out.write("efcp.num_slots", c10::IValue(num_params));
  out.write("efcp.applied_steps", c10::IValue(m));
  out.write("efcp.skipped_steps", c10::IValue(int64_t{0}));
  out.write("rw.count", c10::IValue(m));
  out.write("rw.rows_written", c10::IValue(m));
  out.write("rw.gram", at::eye(m, at::kDouble) * 1e-2, true);
  out.write("rw.0.history", at::empty({m, k}, at::kBFloat16).normal_(0, 1e-3), true);
  out.write("rw.0.indices", at::randint(0, 32767, {m, k}, at::kShort), true);
  out.write("rw.0.error", at::zeros({padded}), true);
  std::ostringstream os;
  out.save_to(os);
  torch::serialize::InputArchive in;
  std::istringstream is(os.str());
  in.load_from(is);
  opt.load(in);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 3;
  int64_t small_window = 32;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--steps=", 8) == 0)
      steps = std::atoi(argv[i] + 8);
    else if (std::strncmp(argv[i], "--small_window=", 15) == 0)
      small_window = std::atoll(argv[i] + 15);
  }
  std::vector<at::Tensor> params = SaeParams();
  std::vector<std::vector<int64_t>> shapes;
  int64_t d = 0;
  for (auto& p : params) {
    shapes.push_back(p.sizes().vec());
    d += p.numel();
  }
  const int64_t m = 1024;
  std::printf("T2: TopK SAE d_in 1024 d_sae 4096, d = %lld parameters, m = %lld, %d threads\n",
              static_cast<long long>(d), static_cast<long long>(m), at::get_num_threads());

  // --- Estimates before allocation.
  const efcp::SparseMFACOptions so = efcp::SparseMFACOptions(1e-3)
                                         .window(m)
                                         .density(0.01)
                                         .value_dtype(at::kBFloat16)
                                         .index_encoding(efcp::IndexEncoding::kUInt16Block);
  const efcp::MemoryBreakdown est = efcp::SparseMFAC::EstimateMemory(shapes, so);
  const int64_t dense = efcp::DenseMfacHistoryBytes(d, m);
  const int64_t adam = 8 * d;
  const int64_t history = est.get("history_values") + est.get("history_indices");
  std::printf("SparseMFAC estimate: %s\n", est.ToString().c_str());
  std::printf("dense M-FAC history 4*m*d = %.1f MiB; Adam 8*d = %.1f MiB\n", MiB(dense), MiB(adam));
  std::printf(
      "SparseMFAC history / dense = %.4f%%   total state / dense = %.4f%%   "
      "total / Adam = %.2fx\n",
      100.0 * history / dense, 100.0 * est.total() / dense,
      static_cast<double>(est.total()) / adam);

  // --- Dense MFAC at m = 1024 would not fit: refused from the estimate.
  const int64_t available = latentd::HostAvailableMemoryBytes();
  const efcp::MFACOptions dense_opts =
      efcp::MFACOptions(1e-3).window(m).memory_budget_bytes(available);
  const absl::Status admit =
      efcp::AdmitMemory(efcp::MFAC::EstimateMemory(shapes, dense_opts), available, "MFAC(m=1024)");
  std::printf("admission of dense MFAC(m=1024) against MemAvailable: %s\n",
              admit.ToString().c_str());
  try {
    efcp::MFAC refused(params, dense_opts);
    std::printf("ERROR: dense MFAC(m=1024) was constructed\n");
  } catch (const c10::Error& e) {
    std::printf("MFAC constructor refused: %s\n", e.what_without_backtrace());
  }

  // --- SparseMFAC at m = 1024: held bytes, peak memory, step time at a full window.
  const double rss_params = RssMiB();
  {
    efcp::SparseMFAC smfac(params, so);
    const efcp::MemoryBreakdown held = smfac.memory_breakdown();
    std::printf("SparseMFAC held:     %s  (equals estimate: %s)\n", held.ToString().c_str(),
                held == est ? "yes" : "NO");
    std::printf("RSS: parameters %.1f MiB, + optimizer %.1f MiB (held %.1f MiB)\n", rss_params,
                RssMiB() - rss_params, MiB(held.total()));
    FillWindow(smfac, so, static_cast<int64_t>(params.size()));
    latentd::ResetProcessPeakRss();
    const double t_smfac = TimeSteps(smfac, params, steps);
    std::printf(
        "SparseMFAC(m=1024, 1%%) step at full window: %.3f s   peak RSS during steps %.1f MiB\n",
        t_smfac, PeakMiB());
    torch::optim::Adam adam_opt(params, torch::optim::AdamOptions(1e-3));
    TimeSteps(adam_opt, params, 1);
    const double t_adam = TimeSteps(adam_opt, params, steps);
    std::printf("Adam step: %.4f s   SparseMFAC(m=1024) / Adam = %.1fx\n", t_adam,
                t_smfac / t_adam);
  }

  // --- Same window for dense and sparse where dense fits: step time side by side.
  {
    const int64_t ms = small_window;
    efcp::MFAC mfac(params, efcp::MFACOptions(1e-3).window(ms));
    efcp::SparseMFAC sm(
        params, efcp::SparseMFACOptions(1e-3).window(ms).density(0.01).value_dtype(at::kBFloat16));
    for (int64_t i = 0; i < ms; ++i) {
      SetGrads(params);
      mfac.step();
      sm.step();
    }
    const double t_mfac = TimeSteps(mfac, params, steps);
    const double t_sm = TimeSteps(sm, params, steps);
    torch::optim::Adam adam_opt(params, torch::optim::AdamOptions(1e-3));
    TimeSteps(adam_opt, params, 1);
    const double t_adam = TimeSteps(adam_opt, params, steps);
    std::printf(
        "m=%lld full window: MFAC %.3f s (state %.1f MiB), SparseMFAC 1%% %.3f s (state %.1f "
        "MiB), Adam %.4f s; MFAC/Adam %.1fx, SparseMFAC/Adam %.1fx, SparseMFAC/MFAC %.2fx\n",
        static_cast<long long>(ms), t_mfac, MiB(mfac.memory_breakdown().total()), t_sm,
        MiB(sm.memory_breakdown().total()), t_adam, t_mfac / t_adam, t_sm / t_adam, t_sm / t_mfac);
  }
  std::printf("peak RSS of the whole benchmark (VmHWM since the last reset): %.1f MiB\n",
              PeakMiB());
  return 0;
}
