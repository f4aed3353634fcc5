// The SAE encoder's last step on the CPU, side by side in one run: the codes of a batch's
// pre-activations built by engine/sparse_codes.h's kernels (FixedKCodes for TopK, RaggedCodes for
// JumpReLU) against the ATen formulation they replaced (topk + sort + gather; mask, product,
// nonzero, masked_select), on the same tensors, alternating, best of --rounds. Then what an
// SAE's run-time input normalization (SAELens' layer_norm, constant_norm_rescale) adds to a
// whole TopK encode + reconstruction (Sae::EncodeSparse + Predict) of --d_in wide rows.
//
//   bazel run -c opt //bench:sae_encode_bench -- [--rows=4096] [--d_sae=4096] [--k=32]
//       [--d_in=768] [--rounds=5] [--threads=all cores]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "engine/sae.h"
#include "engine/sparse_codes.h"

namespace {

using latentd::engine::SparseCodes;

// Milliseconds of the best of `rounds` calls.
double BestMs(int rounds, const std::function<SparseCodes()>& encode) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const SparseCodes codes = encode();
    best = std::min(
        best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 4096, d_sae = 4096, k = 32, d_in = 768;
  int rounds = 5;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (absl::StartsWith(a, "--rows=")) rows = std::atoll(a.c_str() + 7);
    if (absl::StartsWith(a, "--d_sae=")) d_sae = std::atoll(a.c_str() + 8);
    if (absl::StartsWith(a, "--k=")) k = std::atoll(a.c_str() + 4);
    if (absl::StartsWith(a, "--d_in=")) d_in = std::atoll(a.c_str() + 7);
    if (absl::StartsWith(a, "--rounds=")) rounds = std::atoi(a.c_str() + 9);
    if (absl::StartsWith(a, "--threads=")) threads = std::atoi(a.c_str() + 10);
  }
  at::set_num_threads(threads);
  at::manual_seed(1);
  const at::Tensor pre = at::randn({rows, d_sae});
  // One threshold with k entries a row above it on average, as a JumpReLU SAE's.
  const float cut = std::get<0>(pre.flatten().topk(rows * k)).min().item<float>();
  const at::Tensor threshold = at::full({d_sae}, cut);
  std::printf("sae_encode_bench: %lld rows x %lld latents, k %lld, %d threads, best of %d\n",
              static_cast<long long>(rows), static_cast<long long>(d_sae),
              static_cast<long long>(k), at::get_num_threads(), rounds);
  auto aten_topk = [&] {
    auto [values, indices] = pre.topk(k, 1, /*largest=*/true, /*sorted=*/false);
    auto [sorted, order] = indices.sort(1);
    SparseCodes codes;
    codes.indices = sorted.to(at::kInt);
    codes.values = at::relu(values.gather(1, order));
    return codes;
  };
  auto aten_jumprelu = [&] {
    const at::Tensor z = pre * (pre > threshold).to(at::kFloat);
    const at::Tensor mask = z != 0;
    SparseCodes codes;
    codes.row_counts = mask.sum(1, false, at::kLong);
    codes.indices = mask.nonzero().select(1, 1).to(at::kInt);
    codes.values = z.masked_select(mask);
    return codes;
  };
  const double topk_aten = BestMs(rounds, aten_topk);
  const double topk_kernel = BestMs(rounds, [&] { return latentd::engine::FixedKCodes(pre, k); });
  const double jump_aten = BestMs(rounds, aten_jumprelu);
  const double jump_kernel =
      BestMs(rounds, [&] { return latentd::engine::RaggedCodes(pre, threshold); });
  std::printf("%-10s %-12s %-12s %s\n", "ENCODER", "ATEN_MS", "KERNEL_MS", "SPEEDUP");
  std::printf("%-10s %-12.2f %-12.2f %.2fx\n", "topk", topk_aten, topk_kernel,
              topk_aten / topk_kernel);
  std::printf("%-10s %-12.2f %-12.2f %.2fx\n", "jumprelu", jump_aten, jump_kernel,
              jump_aten / jump_kernel);

  // Input normalization: the same TopK SAE read three ways, encoding and reconstructing one
  // batch, the normalizations taking turns with the plain one.
  using latentd::engine::InputNormalization;
  const at::Tensor x = at::randn({rows, d_in}) * 3 + 1;
  const latentd::engine::SaeWeights w{at::randn({d_in, d_sae}) / std::sqrt(double(d_in)),
                                      at::zeros({d_sae}), at::randn({d_sae, d_in}) * 0.05,
                                      at::zeros({d_in})};
  auto sae_with = [&](InputNormalization n) {
    latentd::engine::SaeConfig cfg;
    cfg.d_in = d_in;
    cfg.d_sae = d_sae;
    cfg.k = static_cast<int32_t>(k);
    cfg.input_normalization = n;
    return *latentd::engine::Sae::Create(cfg, w);
  };
  std::printf("\n%-22s %-12s %s\n", "INPUT NORMALIZATION", "ENCODE+PREDICT_MS", "VS NONE");
  const latentd::engine::Sae plain = sae_with(InputNormalization::kNone);
  auto encode = [&](const latentd::engine::Sae& sae) {
    return [&] {
      SparseCodes codes = sae.EncodeSparse(x);
      sae.Predict(x, codes);
      return codes;
    };
  };
  for (InputNormalization n :
       {InputNormalization::kLayerNorm, InputNormalization::kConstantNormRescale}) {
    const latentd::engine::Sae normalized = sae_with(n);
    // Round by round, one call of each, so that the machine's drift falls on both alike.
    double none_ms = 1e30, with_ms = 1e30;
    for (int r = 0; r < rounds; ++r) {
      none_ms = std::min(none_ms, BestMs(1, encode(plain)));
      with_ms = std::min(with_ms, BestMs(1, encode(normalized)));
    }
    std::printf("%-22s %-17.2f %+.1f%% (none %.2f ms)\n",
                latentd::engine::InputNormalizationName(n), with_ms, 100 * (with_ms / none_ms - 1),
                none_ms);
  }
  return 0;
}
