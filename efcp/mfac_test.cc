#include "efcp/mfac.h"

#include <gtest/gtest.h>

#include "efcp/test_util.h"

namespace efcp {
namespace {

using testing::ExplicitMfac;
using testing::Param;
using testing::RelErr;
using testing::StepDirection;

at::Tensor Randn(int64_t n, int64_t d) { return at::randn({n, d}, at::kDouble); }

void CheckExplicit(Scaling scaling) {
  at::manual_seed(1);
  const int64_t d = 12, m = 4;
  const double damp = 1e-2;
  at::Tensor p = Param(d);
  MFAC opt({p}, MFACOptions(1.0).damp(damp).window(m).scaling(scaling));
  at::Tensor g = Randn(11, d);  // wraps the ring buffer twice
  for (int64_t t = 0; t < 11; ++t) {
    at::Tensor u = StepDirection(opt, p, g[t]);
    const int64_t n = std::min<int64_t>(t + 1, m);
    at::Tensor rows = g.narrow(0, t + 1 - n, n);
    const double s = scaling == Scaling::kCount ? n : m;
    EXPECT_LT(RelErr(u, ExplicitMfac(rows, g[t], damp, s)), 1e-12) << "step " << t;
  }
  EXPECT_EQ(opt.rows(), m);
}

TEST(MFACTest, EqualsExplicitInverseBeforeAndAfterWrapCountScaling) {
  CheckExplicit(Scaling::kCount);
}
TEST(MFACTest, EqualsExplicitInverseBeforeAndAfterWrapWindowScaling) {
  CheckExplicit(Scaling::kWindow);
}

TEST(MFACTest, SmallDampIsAccurateInFloat32) {
  // The cancellation-free form keeps fp32 accurate at damp = 1e-6, where
  // (x - G^T(...)^{-1} G x) / damp would lose every digit.
  at::manual_seed(2);
  const int64_t d = 64, m = 8;
  at::Tensor p = Param(d, at::kFloat);
  MFAC opt({p}, MFACOptions(1.0).damp(1e-6).window(m));
  at::Tensor g = Randn(m, d);
  at::Tensor u;
  for (int64_t t = 0; t < m; ++t) u = StepDirection(opt, p, g[t].to(at::kFloat));
  EXPECT_LT(RelErr(u, ExplicitMfac(g, g[m - 1], 1e-6, m)), 1e-3);
}

TEST(MFACTest, WindowOrderDoesNotChangeDirection) {
  at::manual_seed(3);
  const int64_t d = 9, m = 5;
  at::Tensor g = Randn(m, d);
  at::Tensor p1 = Param(d), p2 = Param(d);
  MFAC a({p1}, MFACOptions(1.0).window(m).damp(1e-3));
  MFAC b({p2}, MFACOptions(1.0).window(m).damp(1e-3));
  const std::vector<int64_t> order_a = {0, 1, 2, 3}, order_b = {3, 1, 0, 2};
  for (int64_t i : order_a) StepDirection(a, p1, g[i]);
  for (int64_t i : order_b) StepDirection(b, p2, g[i]);
  at::Tensor ua = StepDirection(a, p1, g[4]);
  at::Tensor ub = StepDirection(b, p2, g[4]);
  EXPECT_LT(RelErr(ua, ub), 1e-12);
}

TEST(MFACTest, SeveralShapesOneFisherAndMissingGradsSkipped) {
  at::manual_seed(4);
  at::Tensor w = at::zeros({3, 4}, at::kDouble).set_requires_grad(true);
  at::Tensor b = at::zeros({4}, at::kDouble).set_requires_grad(true);
  at::Tensor frozen = at::ones({2}, at::kDouble).set_requires_grad(true);
  const double damp = 1e-2;
  MFAC opt({w, b, frozen}, MFACOptions(1.0).window(3).damp(damp));
  at::Tensor flat = Randn(2, 16);
  for (int64_t t = 0; t < 2; ++t) {
    {
      at::NoGradGuard ng;
      w.zero_();
      b.zero_();
    }
    w.mutable_grad() = flat[t].narrow(0, 0, 12).view({3, 4}).clone();
    b.mutable_grad() = flat[t].narrow(0, 12, 4).clone();
    opt.step();
  }
  at::Tensor u = -at::cat({w.detach().reshape(-1), b.detach().reshape(-1)});
  EXPECT_LT(RelErr(u, ExplicitMfac(flat, flat[1], damp, 2)), 1e-12);
  EXPECT_TRUE(frozen.detach().eq(1).all().item<bool>());
}

TEST(MFACTest, PerGroupLearningRateSharesOneFisher) {
  at::manual_seed(7);
  at::Tensor a = Param(3), b = Param(2);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a});
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<MFACOptions>(0.5));
  MFAC opt(std::move(groups), MFACOptions(1.0).window(2).damp(1e-2));
  at::Tensor g = Randn(1, 5)[0];
  a.mutable_grad() = g.narrow(0, 0, 3).clone();
  b.mutable_grad() = g.narrow(0, 3, 2).clone();
  opt.step();
  at::Tensor u = ExplicitMfac(g.unsqueeze(0), g, 1e-2, 1);
  EXPECT_LT(RelErr(-a.detach(), u.narrow(0, 0, 3)), 1e-12);
  EXPECT_LT(RelErr(-b.detach(), 0.5 * u.narrow(0, 3, 2)), 1e-12);
}

TEST(MFACTest, MemoryBreakdownEqualsEstimate) {
  at::Tensor w = at::zeros({30, 7}).set_requires_grad(true);
  at::Tensor b = at::zeros({7}).set_requires_grad(true);
  const MFACOptions o = MFACOptions(0.1).window(16).momentum(0.9);
  MFAC opt({w, b}, o);
  const MemoryBreakdown est = MFAC::EstimateMemory({{30, 7}, {7}}, o);
  EXPECT_EQ(opt.memory_breakdown(), est)
      << opt.memory_breakdown().ToString() << " vs " << est.ToString();
  EXPECT_EQ(est.get("history_values"), DenseMfacHistoryBytes(217, 16));
  EXPECT_EQ(est.get("gram"), 16 * 16 * 8);
  EXPECT_EQ(est.get("momentum"), 217 * 4);
  w.mutable_grad() = at::randn({30, 7});
  b.mutable_grad() = at::randn({7});
  opt.step();
  EXPECT_EQ(opt.memory_breakdown(), est);
}

TEST(MFACTest, BudgetRefusesWithEstimate) {
  at::Tensor p = at::zeros({1000}).set_requires_grad(true);
  try {
    MFAC opt({p}, MFACOptions().window(1024).memory_budget_bytes(1 << 20));
    FAIL() << "expected a refusal";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("budget"), std::string::npos) << e.what();
  }
}

TEST(MFACTest, BadOptionsNameTheOption) {
  EXPECT_NE(
      std::string(ValidateMFACOptions(MFACOptions().damp(0)).message()).find("MFACOptions.damp"),
      std::string::npos);
  EXPECT_NE(std::string(ValidateMFACOptions(MFACOptions().window(0)).message())
                .find("MFACOptions.window"),
            std::string::npos);
  at::Tensor p = Param(3);
  EXPECT_THROW(MFAC({p}, MFACOptions().damp(-1)), c10::Error);
  try {
    MFAC opt({p}, MFACOptions().window(0));
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MFACOptions.window must be >= 1, got 0"),
              std::string::npos);
  }
}

TEST(MFACTest, NonFiniteGradientSkipsOrThrows) {
  at::Tensor p = Param(4);
  MFAC skip({p}, MFACOptions(1.0).window(2));
  p.mutable_grad() = at::ones({4}, at::kDouble);
  skip.step();
  at::Tensor before = p.detach().clone();
  at::Tensor bad = at::ones({4}, at::kDouble);
  bad[2] = std::numeric_limits<double>::quiet_NaN();
  p.mutable_grad() = bad;
  skip.step();
  EXPECT_EQ(skip.skipped_steps(), 1);
  EXPECT_EQ(skip.applied_steps(), 1);
  EXPECT_TRUE(p.detach().equal(before));
  EXPECT_EQ(skip.rows(), 1);

  at::Tensor q = Param(4);
  MFAC thrower({q}, MFACOptions(1.0).window(2).non_finite(NonFinitePolicy::kThrow));
  q.mutable_grad() = bad;
  try {
    thrower.step();
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite gradient at step 1"), std::string::npos);
  }
  EXPECT_TRUE(q.detach().isfinite().all().item<bool>());
}

TEST(MFACTest, ShapeChangeIsAnError) {
  at::Tensor p = Param(4);
  MFAC opt({p}, MFACOptions(1.0).window(2));
  p.mutable_grad() = at::ones({4}, at::kDouble);
  opt.step();
  p.set_data(at::zeros({5}, at::kDouble));
  p.mutable_grad() = at::ones({5}, at::kDouble);
  try {
    opt.step();
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("changed shape"), std::string::npos) << e.what();
  }
}

TEST(MFACTest, DecoupledAndCoupledWeightDecay) {
  at::Tensor p = at::full({3}, 2.0, at::kDouble).set_requires_grad(true);
  MFAC opt({p}, MFACOptions(0.1).window(2).weight_decay(0.5).weight_decay_kind(
                    WeightDecayKind::kDecoupled));
  p.mutable_grad() = at::zeros({3}, at::kDouble);
  opt.step();  // zero gradient: u = 0, only the decay acts
  EXPECT_NEAR(p.detach()[0].item<double>(), 2.0 * (1 - 0.1 * 0.5), 1e-15);
}

TEST(MFACTest, SaveLoadMidRunContinuesBitIdentically) {
  at::manual_seed(5);
  const int64_t d = 20;
  at::Tensor g = at::randn({12, d});
  const MFACOptions o = MFACOptions(0.05).window(4).momentum(0.9);
  at::Tensor p = at::randn({d}).set_requires_grad(true);
  at::Tensor p0 = p.detach().clone();
  MFAC ref({p}, o);
  std::string saved;
  at::Tensor p_mid;
  for (int64_t t = 0; t < 12; ++t) {
    if (t == 6) {
      saved = testing::SaveState(ref);
      p_mid = p.detach().clone();
    }
    p.mutable_grad() = g[t] + p.detach();
    ref.step();
  }
  at::Tensor q = p_mid.clone().set_requires_grad(true);
  MFAC resumed({q}, o);
  testing::LoadState(resumed, saved);
  for (int64_t t = 6; t < 12; ++t) {
    q.mutable_grad() = g[t] + q.detach();
    resumed.step();
  }
  EXPECT_TRUE(q.detach().equal(p.detach()));
  EXPECT_FALSE(p.detach().equal(p0));
}

}  // namespace
}  // namespace efcp
