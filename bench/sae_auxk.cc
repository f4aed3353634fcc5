// Does TopK's AuxK term revive dead latents? A TopK SAE trained with Adam on rows drawn from a
// synthetic dictionary with Zipf-like atom frequencies, once per AuxK weight, counting the
// latents that have not fired for `window` steps (docs/TRAIN.md "AuxK" has the figures).
//
//   bazel build -c opt //bench:sae_auxk
//   bazel-bin/bench/sae_auxk [atoms=128] [d_sae=256]
//
// The defaults give an SAE with more latents than the data has directions (surplus latents
// die); atoms=512 d_sae=128 gives one with fewer.
#include <ATen/ATen.h>
#include <torch/optim/adam.h>

#include <cstdio>

#include "bench/bench_args.h"
#include "engine/sae_model.h"

int main(int argc, char** argv) {
  using latentd::engine::SaeForward;
  using latentd::engine::SaeModel;
  using latentd::engine::SaeModelOptions;
  const int64_t atoms = latentd::bench::IntArg(argc, argv, "atoms", 128);
  const int64_t d_sae = latentd::bench::IntArg(argc, argv, "d_sae", 256);
  constexpr int64_t kDin = 16, kRows = 128, kSteps = 1500, kWindow = 50;
  std::printf(
      "TopK d_in %lld, d_sae %lld, k 4, aux_k 8; %lld atoms (frequency ~ 1/rank^%s), "
      "Adam 3e-3, %lld steps of %lld rows, dead after %lld steps without firing\n",
      static_cast<long long>(kDin), static_cast<long long>(d_sae), static_cast<long long>(atoms),
      atoms > d_sae ? "0.7" : "1", static_cast<long long>(kSteps), static_cast<long long>(kRows),
      static_cast<long long>(kWindow));
  std::printf("%-10s %-10s %-10s %-10s\n", "aux weight", "step", "dead", "FVU");
  for (double weight : {0.0, 1.0 / 32, 0.25}) {
    SaeModelOptions options;
    options.architecture = latentd::v1::TOPK;
    options.d_in = kDin;
    options.d_sae = d_sae;
    options.k = 4;
    options.seed = 3;
    options.aux_k = 8;
    options.aux_k_coefficient = weight;
    SaeModel sae(options);
    // The same rows for every weight.
    auto gen = at::detail::createCPUGenerator(11);
    at::Tensor dictionary = at::randn({atoms, kDin}, gen, at::kFloat);
    at::Tensor rate = at::arange(1, atoms + 1, at::kFloat).pow(atoms > d_sae ? -0.7 : -1.0) *
                      (atoms > d_sae ? 0.1 : 0.3);
    auto batch = [&] {
      at::Tensor codes = at::rand({kRows, atoms}, gen, at::kFloat);
      codes = codes * (at::rand({kRows, atoms}, gen, at::kFloat) < rate.unsqueeze(0));
      return codes.matmul(dictionary);
    };
    sae->InitDecoderBiasFromData(batch());
    torch::optim::Adam adam(sae->ordered_parameters(), torch::optim::AdamOptions(3e-3));
    at::Tensor since = at::zeros({d_sae}, at::kLong);
    for (int64_t step = 1; step <= kSteps; ++step) {
      adam.zero_grad();
      SaeForward out = sae->Forward(batch(), since >= kWindow);
      out.loss.backward();
      sae->RemoveParallelDecoderGrad();
      adam.step();
      sae->NormalizeDecoder();
      at::Tensor fired = (out.latents.detach() != 0).any(0);
      since = at::where(fired, at::zeros_like(since), since + 1);
      if (step % 300 == 0) {
        std::printf("%-10.4g %-10lld %-10lld %-10.4f\n", weight, static_cast<long long>(step),
                    static_cast<long long>((since >= kWindow).sum().item<int64_t>()), out.fvu);
      }
    }
  }
  return 0;
}
