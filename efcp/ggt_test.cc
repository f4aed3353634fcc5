#include "efcp/ggt.h"

#include <gtest/gtest.h>

#include "efcp/test_util.h"

namespace efcp {
namespace {

using testing::Param;
using testing::RelErr;
using testing::StepDirection;

// (eps*I + (G^T G)^{1/2})^{-1} x by a d x d eigendecomposition, float64.
at::Tensor ExplicitGgt(const at::Tensor& rows, const at::Tensor& x, double eps) {
  auto eig = at::linalg_eigh(rows.t().mm(rows));
  at::Tensor lam = std::get<0>(eig);
  // Eigenvalues at rounding level are zeros of the rank-r matrix.
  lam = at::where(lam > lam.max() * 1e-12, lam, at::zeros_like(lam));
  const at::Tensor& v = std::get<1>(eig);
  return v.mv(v.t().mv(x) / (lam.sqrt() + eps));
}

TEST(GGTTest, EqualsEigendecompositionReferenceBeforeAndAfterWrap) {
  at::manual_seed(1);
  const int64_t d = 15, r = 4;
  const double eps = 1e-2;
  at::Tensor p = Param(d);
  GGT opt({p}, GGTOptions(1.0).window(r).epsilon(eps));
  at::Tensor g = at::randn({10, d}, at::kDouble);
  for (int64_t t = 0; t < 10; ++t) {
    at::Tensor u = StepDirection(opt, p, g[t]);
    const int64_t n = std::min<int64_t>(t + 1, r);
    EXPECT_LT(RelErr(u, ExplicitGgt(g.narrow(0, t + 1 - n, n), g[t], eps)), 1e-12) << t;
  }
}

TEST(GGTTest, SparseErrorFeedbackVariantPreconditionsStoredRows) {
  at::manual_seed(2);
  const int64_t d = 60, r = 5;
  const double eps = 1e-2;
  at::Tensor p = Param(d);
  GGT opt({p}, GGTOptions(1.0).window(r).epsilon(eps).density(0.1).block_size(20).value_dtype(
                   at::kDouble));
  for (int64_t t = 0; t < 9; ++t) {
    at::Tensor u = StepDirection(opt, p, at::randn({d}, at::kDouble));
    std::vector<at::Tensor> rows;
    for (int64_t j = 0; j < opt.rows(); ++j) rows.push_back(opt.DenseRow(0, j));
    at::Tensor c = opt.DenseRow(0, opt.newest_slot());
    EXPECT_EQ(c.ne(0).sum().item<int64_t>(), 6);
    EXPECT_LT(RelErr(u, ExplicitGgt(at::stack(rows), c, eps)), 1e-12) << t;
  }
  EXPECT_TRUE(opt.ErrorBuffer(0).defined());
}

TEST(GGTTest, WindowOrderDoesNotChangeDirection) {
  at::manual_seed(3);
  const int64_t d = 9, r = 4;
  at::Tensor g = at::randn({r, d}, at::kDouble);
  at::Tensor p1 = Param(d), p2 = Param(d);
  GGT a({p1}, GGTOptions(1.0).window(r));
  GGT b({p2}, GGTOptions(1.0).window(r));
  for (int64_t i : {0, 1, 2}) StepDirection(a, p1, g[i]);
  for (int64_t i : {2, 0, 1}) StepDirection(b, p2, g[i]);
  EXPECT_LT(RelErr(StepDirection(a, p1, g[3]), StepDirection(b, p2, g[3])), 1e-12);
}

TEST(GGTTest, MemoryEstimateBadOptionsAndSaveLoad) {
  const GGTOptions o = GGTOptions(0.01).window(6).momentum(0.5);
  at::Tensor p = at::randn({40}).set_requires_grad(true);
  GGT opt({p}, o);
  EXPECT_EQ(opt.memory_breakdown(), GGT::EstimateMemory({{40}}, o));
  EXPECT_NE(
      std::string(ValidateGGTOptions(GGTOptions().epsilon(0)).message()).find("GGTOptions.epsilon"),
      std::string::npos);
  EXPECT_NE(
      std::string(ValidateGGTOptions(GGTOptions().window(0)).message()).find("GGTOptions.window"),
      std::string::npos);
  EXPECT_NE(
      std::string(ValidateGGTOptions(GGTOptions().density(2)).message()).find("GGTOptions.density"),
      std::string::npos);
  at::manual_seed(4);
  at::Tensor g = at::randn({10, 40});
  std::string saved;
  at::Tensor mid;
  for (int64_t t = 0; t < 10; ++t) {
    if (t == 5) {
      saved = testing::SaveState(opt);
      mid = p.detach().clone();
    }
    p.mutable_grad() = g[t];
    opt.step();
  }
  at::Tensor q = mid.set_requires_grad(true);
  GGT resumed({q}, o);
  testing::LoadState(resumed, saved);
  for (int64_t t = 5; t < 10; ++t) {
    q.mutable_grad() = g[t];
    resumed.step();
  }
  EXPECT_TRUE(q.detach().equal(p.detach()));
}

}  // namespace
}  // namespace efcp
