// GPU check kit: the project's own engine/sparse_codes.cc, which EXTRACT runs on the device for
// every batch to report each SAE's fit:
//   - DecodeSparseCodes (an embedding_bag of decoder rows weighted by the codes' values) equals
//     z W_dec + b_dec of the dense codes, for fixed-k (TopK) and ragged (ReLU) layouts;
//   - ReconstructionSums equals the same sums computed in float64, rows not kept (NaN) left out;
//   - on CUDA both give the CPU's answers for the same inputs;
//   - RaggedCodes (the ReLU / JumpReLU encoder's codes) on CUDA, where the ATen ops build them,
//     keeps the same entries as the CPU's fused kernel.

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/sparse_codes.h"
#include "tests/gpu/kit_report.h"

namespace gpu_kit {
namespace {

using latentd::engine::DecodeSparseCodes;
using latentd::engine::RaggedCodes;
using latentd::engine::ReconstructionSums;
using latentd::engine::SparseCodes;

struct Inputs {
  at::Tensor W_dec, b_dec, x, keep;
  SparseCodes fixed, ragged;
  at::Tensor z_fixed, z_ragged;  // the dense codes the sparse ones hold
};

// 300 rows of d_in 64, 512 latents: TopK codes of k 8, and ReLU-like ragged codes of 0..12
// latents a row; row 7 of x is NaN.
Inputs MakeInputs() {
  at::manual_seed(5);
  Inputs in;
  const int64_t n = 300, d = 64, d_sae = 512, k = 8;
  in.W_dec = at::randn({d_sae, d});
  in.b_dec = at::randn({d}) * 0.1;
  in.x = at::randn({n, d});
  in.x[7].fill_(std::nanf(""));
  in.keep = at::isfinite(in.x).all(1);
  const at::Tensor pre = at::randn({n, d_sae});
  auto top = at::topk(pre, k, 1);
  in.fixed.indices = std::get<1>(top).to(at::kInt);
  in.fixed.values = std::get<0>(top).relu();
  in.z_fixed = at::zeros({n, d_sae}).scatter(1, std::get<1>(top), in.fixed.values);
  std::vector<int64_t> counts;
  std::vector<int32_t> indices;
  std::vector<float> values;
  in.z_ragged = at::zeros({n, d_sae});
  for (int64_t r = 0; r < n; ++r) {
    const int64_t c = r % 13;
    counts.push_back(c);
    for (int64_t j = 0; j < c; ++j) {
      const int32_t latent = static_cast<int32_t>((r * 37 + j * 41) % d_sae);
      const float v = 0.1f + 0.01f * static_cast<float>(j);
      indices.push_back(latent);
      values.push_back(v);
      in.z_ragged[r][latent] = v;
    }
  }
  in.ragged.indices = at::tensor(indices, at::kInt);
  in.ragged.values = at::tensor(values, at::kFloat);
  in.ragged.row_counts = at::tensor(counts, at::kLong);
  return in;
}

SparseCodes To(const SparseCodes& c, const at::Device& dev) {
  SparseCodes out;
  out.indices = c.indices.to(dev);
  out.values = c.values.to(dev);
  if (c.row_counts.defined()) out.row_counts = c.row_counts.to(dev);
  return out;
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kCPU).to(at::kDouble) - b.to(at::kCPU).to(at::kDouble))
      .abs()
      .max()
      .item<double>();
}

int Main() {
  Report r;
  const bool cuda = torch::cuda::is_available() && torch::cuda::device_count() > 0;
  const Inputs in = MakeInputs();
  const int64_t n = in.x.size(0);

  r.Guard("engine.sparse_decode.cpu", [&] {
    const double fixed = MaxDiff(DecodeSparseCodes(in.W_dec, in.b_dec, in.fixed, n),
                                 in.z_fixed.mm(in.W_dec) + in.b_dec);
    const double ragged = MaxDiff(DecodeSparseCodes(in.W_dec, in.b_dec, in.ragged, n),
                                  in.z_ragged.mm(in.W_dec) + in.b_dec);
    r.Check(fixed < 1e-4 && ragged < 1e-4, "engine.sparse_decode.cpu",
            "max |sparse - dense decode|: fixed-k " + Sci(fixed) + ", ragged " + Sci(ragged));
  });

  r.Guard("engine.reconstruction_sums.cpu", [&] {
    const at::Tensor x_hat = DecodeSparseCodes(in.W_dec, in.b_dec, in.fixed, n);
    const at::Tensor sums = ReconstructionSums(in.x, x_hat, in.keep);
    const at::Tensor kept = in.keep.nonzero().reshape({-1});
    const at::Tensor xs = in.x.index_select(0, kept).to(at::kDouble);
    const at::Tensor hs = x_hat.index_select(0, kept).to(at::kDouble);
    const double sse = (xs - hs).pow(2).sum().item<double>();
    const double rows = sums[3].item<double>();
    const double rel = std::abs(sums[0].item<double>() - sse) / sse;
    r.Check(rows == n - 1 && rel < 1e-5 && std::isfinite(sums.sum().item<double>()),
            "engine.reconstruction_sums.cpu",
            "rows " + std::to_string(static_cast<int64_t>(rows)) + " of " + std::to_string(n) +
                " (one NaN row left out); SSE off by " + Sci(rel) + " (relative)");
  });

  // The fused CPU kernel against the ATen formulation it replaces (what CUDA runs).
  const at::Tensor pre = at::randn({300, 512});
  const at::Tensor threshold = at::randn({512}) * 0.5;
  r.Guard("engine.ragged_codes.cpu", [&] {
    bool same = true;
    for (const at::Tensor& t : {at::Tensor(), threshold}) {
      const at::Tensor z = t.defined() ? pre * (pre > t).to(at::kFloat) : pre.relu();
      const at::Tensor mask = z != 0;
      const SparseCodes codes = RaggedCodes(pre, t);
      same = same && at::equal(codes.row_counts, mask.sum(1, false, at::kLong)) &&
             at::equal(codes.indices, mask.nonzero().select(1, 1).to(at::kInt)) &&
             at::equal(codes.values, z.masked_select(mask));
    }
    r.Check(same, "engine.ragged_codes.cpu",
            same ? "ReLU and JumpReLU codes equal the dense codes' non-zeros"
                 : "the fused kernel's codes differ from the dense codes' non-zeros");
  });

  if (!cuda) {
    r.Skip("engine.sparse_decode.cuda", "SKIP (no CUDA)");
    r.Skip("engine.ragged_codes.cuda", "SKIP (no CUDA)");
    return r.exit_code();
  }
  r.Guard("engine.ragged_codes.cuda", [&] {
    const at::Device dev(at::kCUDA, 0);
    bool same = true;
    for (const at::Tensor& t : {at::Tensor(), threshold}) {
      const SparseCodes on_cpu = RaggedCodes(pre, t);
      const SparseCodes on_gpu = RaggedCodes(pre.to(dev), t.defined() ? t.to(dev) : t);
      same = same && on_gpu.indices.device().is_cuda() &&
             at::equal(on_gpu.row_counts.to(at::kCPU), on_cpu.row_counts) &&
             at::equal(on_gpu.indices.to(at::kCPU), on_cpu.indices) &&
             at::equal(on_gpu.values.to(at::kCPU), on_cpu.values);
    }
    r.Check(same, "engine.ragged_codes.cuda",
            same ? "the device's codes equal the CPU kernel's (ReLU, JumpReLU)"
                 : "the device's codes differ from the CPU kernel's");
  });
  r.Guard("engine.sparse_decode.cuda", [&] {
    const at::Device dev(at::kCUDA, 0);
    const at::Tensor W = in.W_dec.to(dev), b = in.b_dec.to(dev);
    double worst = 0;
    for (const SparseCodes* c : {&in.fixed, &in.ragged}) {
      const at::Tensor on_cpu = DecodeSparseCodes(in.W_dec, in.b_dec, *c, n);
      const at::Tensor on_gpu = DecodeSparseCodes(W, b, To(*c, dev), n);
      worst = std::max(worst, MaxDiff(on_gpu, on_cpu));
      const at::Tensor sums_cpu = ReconstructionSums(in.x, on_cpu, in.keep);
      const at::Tensor sums_gpu = ReconstructionSums(in.x.to(dev), on_gpu, in.keep.to(dev));
      worst = std::max(
          worst, MaxDiff(sums_gpu, sums_cpu) / std::max(1.0, sums_cpu.abs().max().item<double>()));
    }
    r.Check(worst < 1e-4, "engine.sparse_decode.cuda",
            "largest difference from the CPU (decode, and sums relative): " + Sci(worst));
  });
  return r.exit_code();
}

}  // namespace
}  // namespace gpu_kit

int main() { return gpu_kit::Main(); }
