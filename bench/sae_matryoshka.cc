// Do a Matryoshka SAE's first latents stand on their own? A BatchTopK SAE trained with Adam on
// rows from a synthetic two-level dictionary (parent features, each with children that fire only
// alongside it: the setting where plain SAEs absorb a parent into its children's latents), once
// plain and once with Matryoshka levels, both from the same initial weights and rows. Reports the
// FVU of reconstructing from the first w latents alone, and how closely the first level's
// decoder directions (and all of them) match the parents: each parent's best cosine, averaged
// (docs/TRAIN.md "Matryoshka SAEs" has the figures).
//
//   bazel build -c opt //bench:sae_matryoshka
//   bazel-bin/bench/sae_matryoshka [steps=3000] [k=4]
//
// The rows hold 4.8 features on average (2.4 parents, 2.4 children), so k = 4 leaves a plain
// SAE short of latents: the pressure under which it merges a parent into its children's latents.
#include <ATen/ATen.h>
#include <torch/optim/adam.h>

#include <cstdio>
#include <vector>

#include "bench/bench_args.h"
#include "engine/sae_model.h"

namespace {

constexpr int64_t kDin = 32, kParents = 16, kChildren = 4, kDsae = 128, kRows = 256;

// Parents fire with probability 0.15; each child of a firing parent with probability 0.3.
// Magnitudes uniform in [0.5, 1.5].
struct Hierarchy {
  at::Tensor parents;   // [kParents, kDin], unit rows
  at::Tensor children;  // [kParents * kChildren, kDin], unit rows
  at::Generator gen = at::detail::createCPUGenerator(17);

  Hierarchy() {
    auto unit = [](at::Tensor t) { return t / t.norm(2, {1}, true); };
    parents = unit(at::randn({kParents, kDin}, gen, at::kFloat));
    children = unit(at::randn({kParents * kChildren, kDin}, gen, at::kFloat));
  }
  // n rows; `parent_on` [n, kParents] and `child_on` [n, kParents * kChildren] when asked.
  at::Tensor Rows(int64_t n, at::Tensor* parent_on = nullptr, at::Tensor* child_on = nullptr) {
    auto magnitude = [&](int64_t a, int64_t b) { return at::rand({a, b}, gen, at::kFloat) + 0.5; };
    const at::Tensor p_on = at::rand({n, kParents}, gen, at::kFloat) < 0.15;
    const at::Tensor c_on = (at::rand({n, kParents * kChildren}, gen, at::kFloat) < 0.3) &
                            p_on.repeat_interleave(kChildren, 1);
    if (parent_on != nullptr) *parent_on = p_on;
    if (child_on != nullptr) *child_on = c_on;
    return (magnitude(n, kParents) * p_on).matmul(parents) +
           (magnitude(n, kParents * kChildren) * c_on).matmul(children);
  }
};

// FVU of x reconstructed from z's first `width` latents.
double PrefixFvu(latentd::engine::SaeModel& sae, const at::Tensor& x, const at::Tensor& z,
                 int64_t width) {
  const at::Tensor x_hat = z.slice(1, 0, width).matmul(sae->W_dec.slice(0, 0, width)) + sae->b_dec;
  return ((x - x_hat).pow(2).sum() / (x - x.mean(0, true)).pow(2).sum()).item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  using latentd::engine::SaeForward;
  using latentd::engine::SaeModel;
  using latentd::engine::SaeModelOptions;
  const int64_t steps = latentd::bench::IntArg(argc, argv, "steps", 3000);
  const int64_t k = latentd::bench::IntArg(argc, argv, "k", 4);
  const std::vector<int64_t> widths = {16, 48, kDsae};
  std::printf(
      "BatchTopK d_in %lld, d_sae %lld, k %lld; %lld parents x %lld children (child only with its "
      "parent), Adam 1e-3, %lld steps of %lld rows; levels 16/48/128\n",
      static_cast<long long>(kDin), static_cast<long long>(kDsae), static_cast<long long>(k),
      static_cast<long long>(kParents), static_cast<long long>(kChildren),
      static_cast<long long>(steps), static_cast<long long>(kRows));
  std::printf("%-11s %-8s %-8s %-8s %-6s %-9s %-13s %-18s %s\n", "SAE", "FVU@16", "FVU@48", "FVU",
              "L0", "par. cos", "par. in <16", "fires w/ a child", "fires alone");
  for (const bool matryoshka : {false, true}) {
    SaeModelOptions options;
    options.architecture = latentd::v1::BATCHTOPK;
    options.d_in = kDin;
    options.d_sae = kDsae;
    options.k = k;
    options.seed = 5;
    if (matryoshka) options.matryoshka_widths = widths;
    SaeModel sae(options);
    Hierarchy data;  // the same rows for both
    sae->InitDecoderBiasFromData(data.Rows(4096));
    torch::optim::Adam adam(sae->ordered_parameters(), torch::optim::AdamOptions(1e-3));
    for (int64_t step = 1; step <= steps; ++step) {
      adam.zero_grad();
      SaeForward out = sae->Forward(data.Rows(kRows));
      out.loss.backward();
      sae->RemoveParallelDecoderGrad();
      adam.step();
      sae->NormalizeDecoder();
    }
    torch::NoGradGuard no_grad;
    at::Tensor parent_on, child_on;
    const at::Tensor x = data.Rows(8192, &parent_on, &child_on);
    const SaeForward eval = sae->Forward(x);
    // Each parent's latent: the one whose decoder direction is closest to it. Absorption shows
    // as that latent staying silent on rows where a child fires along with the parent.
    const at::Tensor cos = sae->W_dec.matmul(data.parents.t());  // [d_sae, parents]
    const auto [best_cos, best] = cos.max(0);
    const at::Tensor fires = eval.latents.index_select(1, best) > 0;  // [rows, parents]
    const at::Tensor with_child = parent_on & child_on.view({-1, kParents, kChildren}).any(2);
    const at::Tensor alone = parent_on & with_child.logical_not();
    auto recall = [&](const at::Tensor& rows) {
      return (fires & rows).sum().item<double>() / rows.sum().item<double>();
    };
    std::printf("%-11s %-8.4f %-8.4f %-8.4f %-6.2f %-9.3f %-13lld %-18.3f %.3f\n",
                matryoshka ? "matryoshka" : "plain", PrefixFvu(sae, x, eval.latents, 16),
                PrefixFvu(sae, x, eval.latents, 48), eval.fvu, eval.l0,
                best_cos.mean().item<double>(),
                static_cast<long long>((best < 16).sum().item<int64_t>()), recall(with_child),
                recall(alone));
  }
  return 0;
}
