#include "efcp/low_rank_mfac.h"

#include <gtest/gtest.h>

#include "efcp/mfac.h"
#include "efcp/test_util.h"

namespace efcp {
namespace {

using testing::RelErr;

std::vector<at::Tensor> MakeParams(at::ScalarType dtype) {
  return {at::zeros({5, 3}, dtype).set_requires_grad(true),
          at::zeros({3, 6}, dtype).set_requires_grad(true),
          at::zeros({4}, dtype).set_requires_grad(true)};
}

// Steps both optimizers on the same gradients from zeroed parameters and
// returns the max relative difference of the directions.
double CompareSteps(torch::optim::Optimizer& a, std::vector<at::Tensor>& pa,
                    torch::optim::Optimizer& b, std::vector<at::Tensor>& pb, int steps) {
  double worst = 0;
  for (int t = 0; t < steps; ++t) {
    for (size_t i = 0; i < pa.size(); ++i) {
      at::Tensor g = at::randn(pa[i].sizes(), pa[i].options());
      {
        at::NoGradGuard ng;
        pa[i].zero_();
        pb[i].zero_();
      }
      pa[i].mutable_grad() = g.clone();
      pb[i].mutable_grad() = g.clone();
    }
    a.step();
    b.step();
    for (size_t i = 0; i < pa.size(); ++i) {
      worst = std::max(worst, RelErr(pa[i].detach(), pb[i].detach()));
    }
  }
  return worst;
}

TEST(LowRankMFACTest, FullRankEqualsMFAC) {
  at::manual_seed(1);
  for (bool warm : {true, false}) {
    auto pa = MakeParams(at::kDouble), pb = MakeParams(at::kDouble);
    LowRankMFAC lr(
        pa,
        LowRankMFACOptions(1.0).window(4).damp(1e-2).rank(100).power_iteration_warm_start(warm));
    MFAC dense(pb, MFACOptions(1.0).window(4).damp(1e-2));
    EXPECT_LT(CompareSteps(lr, pa, dense, pb, 9), 1e-10) << "warm " << warm;
  }
}

TEST(LowRankMFACTest, LowRankDiffersAndErrorFeedbackCarriesTheRest) {
  at::manual_seed(2);
  auto pa = MakeParams(at::kDouble), pb = MakeParams(at::kDouble);
  LowRankMFAC lr(pa, LowRankMFACOptions(1.0).window(4).damp(1e-2).rank(1));
  MFAC dense(pb, MFACOptions(1.0).window(4).damp(1e-2));
  EXPECT_GT(CompareSteps(lr, pa, dense, pb, 3), 1e-3);
  // After one step from zero error: e = g - g_hat with g_hat of rank 1.
  at::Tensor w = at::zeros({6, 5}, at::kDouble).set_requires_grad(true);
  LowRankMFAC one({w}, LowRankMFACOptions(1.0).window(2).rank(1));
  at::Tensor g = at::randn({6, 5}, at::kDouble);
  w.mutable_grad() = g;
  one.step();
  at::Tensor g_hat = g - one.ErrorBuffer(0);
  auto sv = at::linalg_svdvals(g_hat);
  EXPECT_LT(sv[1].item<double>(), 1e-12 * sv[0].item<double>());
  EXPECT_GT(one.ErrorBuffer(0).abs().max().item<double>(), 1e-3);
}

TEST(LowRankMFACTest, MemoryEstimateAndBadOptions) {
  const LowRankMFACOptions o = LowRankMFACOptions().window(8).rank(2).momentum(0.9);
  auto params = MakeParams(at::kFloat);
  LowRankMFAC opt(params, o);
  const MemoryBreakdown est = LowRankMFAC::EstimateMemory({{5, 3}, {3, 6}, {4}}, o);
  EXPECT_EQ(opt.memory_breakdown(), est)
      << opt.memory_breakdown().ToString() << " vs " << est.ToString();
  EXPECT_EQ(est.get("history_values"), 4 * 8 * (2 * (5 + 3) + 2 * (3 + 6) + 4));
  EXPECT_EQ(std::string(ValidateLowRankMFACOptions(LowRankMFACOptions().rank(0)).message()),
            "LowRankMFACOptions.rank must be >= 1, got 0");
  EXPECT_NE(std::string(ValidateLowRankMFACOptions(LowRankMFACOptions().damp(0)).message())
                .find("LowRankMFACOptions.damp"),
            std::string::npos);
  EXPECT_THROW(LowRankMFAC(params, LowRankMFACOptions().window(0)), c10::Error);
}

TEST(LowRankMFACTest, SaveLoadMidRunContinuesBitIdentically) {
  at::manual_seed(3);
  const LowRankMFACOptions o = LowRankMFACOptions(0.01).window(3).rank(2).momentum(0.5);
  auto p = MakeParams(at::kFloat);
  for (auto& t : p) t.detach().normal_();
  LowRankMFAC ref(p, o);
  std::vector<std::vector<at::Tensor>> grads;
  for (int t = 0; t < 8; ++t) {
    std::vector<at::Tensor> g;
    for (auto& x : p) g.push_back(at::randn(x.sizes()));
    grads.push_back(g);
  }
  std::string saved;
  std::vector<at::Tensor> mid;
  for (int t = 0; t < 8; ++t) {
    if (t == 4) {
      saved = testing::SaveState(ref);
      for (auto& x : p) mid.push_back(x.detach().clone().set_requires_grad(true));
    }
    for (size_t i = 0; i < p.size(); ++i) p[i].mutable_grad() = grads[t][i];
    ref.step();
  }
  LowRankMFAC resumed(mid, o);
  testing::LoadState(resumed, saved);
  for (int t = 4; t < 8; ++t) {
    for (size_t i = 0; i < mid.size(); ++i) mid[i].mutable_grad() = grads[t][i];
    resumed.step();
  }
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(mid[i].detach().equal(p[i].detach())) << i;
}

}  // namespace
}  // namespace efcp
