#include "efcp/sparse_mfac.h"

#include <gtest/gtest.h>

#include "efcp/mfac.h"
#include "efcp/test_util.h"

namespace efcp {
namespace {

using testing::ExplicitMfac;
using testing::Param;
using testing::RelErr;
using testing::StepDirection;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(SparseMFACTest, DensityOneEqualsMFAC) {
  at::manual_seed(1);
  const int64_t d = 300, m = 6;
  for (TopKScope scope : {TopKScope::kPerBlock, TopKScope::kGlobal}) {
    at::Tensor p = Param(d, at::kFloat), q = Param(d, at::kFloat);
    MFAC dense({p}, MFACOptions(1.0).window(m).damp(1e-3));
    SparseMFAC sparse(
        {q}, SparseMFACOptions(1.0)
                 .window(m)
                 .damp(1e-3)
                 .density(1.0)
                 .topk_scope(scope)
                 .block_size(128)
                 .index_encoding(scope == TopKScope::kGlobal ? IndexEncoding::kInt32
                                                             : IndexEncoding::kUInt16Block));
    for (int64_t t = 0; t < 14; ++t) {
      at::Tensor g = at::randn({d});
      at::Tensor ud = StepDirection(dense, p, g);
      at::Tensor us = StepDirection(sparse, q, g);
      EXPECT_LT(RelErr(us, ud), 1e-5) << "step " << t;
    }
  }
}

TEST(SparseMFACTest, EqualsExplicitInverseOverStoredRowsAfterWrap) {
  at::manual_seed(2);
  const int64_t d = 40, m = 5;
  const double damp = 1e-2;
  at::Tensor p = Param(d);
  SparseMFAC opt(
      {p}, SparseMFACOptions(1.0).window(m).damp(damp).density(0.2).block_size(10).value_dtype(
               at::kDouble));
  for (int64_t t = 0; t < 12; ++t) {
    at::Tensor u = StepDirection(opt, p, at::randn({d}, at::kDouble));
    std::vector<at::Tensor> rows;
    for (int64_t j = 0; j < opt.rows(); ++j) rows.push_back(opt.DenseRow(0, j));
    at::Tensor c = opt.DenseRow(0, opt.newest_slot());
    EXPECT_LT(RelErr(u, ExplicitMfac(at::stack(rows), c, damp, opt.rows())), 1e-12) << t;
  }
}

void CheckInvariant(at::ScalarType param_dtype, at::ScalarType value_dtype, double tol) {
  at::manual_seed(3);
  const int64_t d = 257, m = 8;
  at::Tensor p = Param(d, param_dtype);
  SparseMFAC opt(
      {p}, SparseMFACOptions(0.01).window(m).density(0.05).block_size(64).value_dtype(value_dtype));
  at::Tensor sum_g = at::zeros({d}, at::kDouble), sum_c = at::zeros({d}, at::kDouble);
  for (int64_t t = 0; t < 100; ++t) {
    at::Tensor g = at::randn({d}, param_dtype);
    p.mutable_grad() = g;
    opt.step();
    sum_g += g.to(at::kDouble);
    sum_c += opt.DenseRow(0, opt.newest_slot()).to(at::kDouble);
  }
  at::Tensor lhs = sum_c + opt.ErrorBuffer(0).to(at::kDouble);
  EXPECT_LT(RelErr(lhs, sum_g), tol);
  EXPECT_GT(opt.ErrorBuffer(0).abs().max().item<double>(), 0.0);
}

TEST(SparseMFACTest, ErrorFeedbackInvariantOver100StepsFloat64) {
  CheckInvariant(at::kDouble, at::kDouble, 1e-12);
}
TEST(SparseMFACTest, ErrorFeedbackInvariantOver100StepsBFloat16Values) {
  // The bf16 rounding of kept values goes back into e: the invariant holds to fp32 precision.
  CheckInvariant(at::kFloat, at::kBFloat16, 1e-5);
}

TEST(SparseMFACTest, TopKKeepsExactlyKLargestPerBlockWithUInt16Indices) {
  at::manual_seed(4);
  const int64_t d = 130000;  // two blocks of 65000: relative indices above 32767 need uint16
  at::Tensor p = Param(d, at::kFloat);
  SparseMFAC opt(
      {p}, SparseMFACOptions(1.0).window(2).density(0.01).block_size(65535).error_feedback(false));
  at::Tensor g = at::randn({d});
  p.mutable_grad() = g;
  opt.step();
  at::Tensor c = opt.DenseRow(0, 0);
  const int64_t block = 65000;
  const int64_t per_block = 650;  // ceil(0.01 * 65000)
  for (int64_t b0 = 0; b0 < d; b0 += block) {
    const int64_t n = std::min(block, d - b0);
    at::Tensor cb = c.narrow(0, b0, n), gb = g.narrow(0, b0, n);
    at::Tensor kept = cb.ne(0);
    EXPECT_EQ(kept.sum().item<int64_t>(), std::min(per_block, n)) << "block at " << b0;
    EXPECT_TRUE(cb.masked_select(kept).equal(gb.masked_select(kept)));
    if (per_block < n) {
      EXPECT_GE(gb.masked_select(kept).abs().min().item<float>(),
                gb.masked_select(kept.logical_not()).abs().max().item<float>());
    }
  }
  // The high half of the first block is represented (no int16 overflow).
  EXPECT_GT(c.narrow(0, 32768, block - 32768).ne(0).sum().item<int64_t>(), 0);
}

TEST(SparseMFACTest, GlobalTopKKeepsExactlyKLargest) {
  at::manual_seed(5);
  const int64_t d = 1000;
  at::Tensor p = Param(d, at::kFloat);
  SparseMFAC opt({p}, SparseMFACOptions(1.0)
                          .window(2)
                          .k(37)
                          .topk_scope(TopKScope::kGlobal)
                          .index_encoding(IndexEncoding::kInt64));
  at::Tensor g = at::randn({d});
  p.mutable_grad() = g;
  opt.step();
  at::Tensor c = opt.DenseRow(0, 0);
  at::Tensor kept = c.ne(0);
  EXPECT_EQ(kept.sum().item<int64_t>(), 37);
  EXPECT_GE(g.masked_select(kept).abs().min().item<float>(),
            g.masked_select(kept.logical_not()).abs().max().item<float>());
  // With error feedback on, e holds exactly what was dropped.
  EXPECT_LT(RelErr(c + opt.ErrorBuffer(0), g), 1e-7);
}

TEST(SparseMFACTest, MemoryBreakdownEqualsEstimateAndIsOnePercentOfDense) {
  const SparseMFACOptions o =
      SparseMFACOptions().window(32).density(0.01).value_dtype(at::kBFloat16).momentum(0.5);
  const std::vector<std::vector<int64_t>> shapes = {{512, 256}, {256}, {256, 512}, {512}};
  std::vector<at::Tensor> params;
  int64_t d = 0;
  for (const auto& s : shapes) {
    params.push_back(at::zeros(s).set_requires_grad(true));
    d += c10::multiply_integers(s);
  }
  SparseMFAC opt(params, o);
  const MemoryBreakdown est = SparseMFAC::EstimateMemory(shapes, o);
  EXPECT_EQ(opt.memory_breakdown(), est)
      << opt.memory_breakdown().ToString() << " vs " << est.ToString();
  const double history = est.get("history_values") + est.get("history_indices");
  EXPECT_LE(history / DenseMfacHistoryBytes(d, 32), 0.0102);
  const int64_t blocks = (d + 65534) / 65535;  // equal blocks of <= 65535
  EXPECT_EQ(est.get("error_buffer"), 4 * blocks * ((d + blocks - 1) / blocks));
  for (auto& p : params) p.mutable_grad() = at::randn(p.sizes());
  opt.step();
  EXPECT_EQ(opt.memory_breakdown(), est);
}

TEST(SparseMFACTest, BadOptionsNameTheOption) {
  EXPECT_EQ(Message(ValidateSparseMFACOptions(SparseMFACOptions().density(1.5))),
            "SparseMFACOptions.density must be in (0, 1], got 1.5");
  EXPECT_NE(Message(ValidateSparseMFACOptions(SparseMFACOptions().density(0)))
                .find("SparseMFACOptions.density"),
            std::string::npos);
  EXPECT_NE(Message(ValidateSparseMFACOptions(SparseMFACOptions().window(0)))
                .find("SparseMFACOptions.window"),
            std::string::npos);
  EXPECT_NE(Message(ValidateSparseMFACOptions(SparseMFACOptions().damp(0)))
                .find("SparseMFACOptions.damp"),
            std::string::npos);
  EXPECT_NE(
      Message(ValidateSparseMFACOptions(
                  SparseMFACOptions().index_encoding(IndexEncoding::kInt16Block).block_size(40000)))
          .find("SparseMFACOptions.block_size"),
      std::string::npos);
  EXPECT_NE(Message(ValidateSparseMFACOptions(SparseMFACOptions().topk_scope(TopKScope::kGlobal)))
                .find("SparseMFACOptions.index_encoding"),
            std::string::npos);
  at::Tensor p = Param(10);
  try {
    SparseMFAC opt({p}, SparseMFACOptions().density(1.5));
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("SparseMFACOptions.density must be in (0, 1], got 1.5"),
              std::string::npos);
  }
}

TEST(SparseMFACTest, NonFiniteGradientNeverReachesTheWeights) {
  at::Tensor p = Param(50, at::kFloat);
  SparseMFAC opt({p}, SparseMFACOptions(0.1).window(4).density(0.1).block_size(10));
  at::Tensor g = at::randn({50});
  g[7] = std::numeric_limits<float>::infinity();
  p.mutable_grad() = g;
  opt.step();
  EXPECT_EQ(opt.skipped_steps(), 1);
  EXPECT_TRUE(p.detach().eq(0).all().item<bool>());
  EXPECT_TRUE(opt.ErrorBuffer(0).eq(0).all().item<bool>());
}

TEST(SparseMFACTest, SaveLoadMidRunContinuesBitIdentically) {
  at::manual_seed(6);
  const int64_t d = 300;
  at::Tensor g = at::randn({14, d});
  const SparseMFACOptions o = SparseMFACOptions(0.01)
                                  .window(4)
                                  .density(0.05)
                                  .block_size(100)
                                  .value_dtype(at::kBFloat16)
                                  .momentum(0.9);
  at::Tensor p = at::randn({d}).set_requires_grad(true);
  SparseMFAC ref({p}, o);
  std::string saved;
  at::Tensor p_mid;
  for (int64_t t = 0; t < 14; ++t) {
    if (t == 7) {
      saved = testing::SaveState(ref);
      p_mid = p.detach().clone();
    }
    p.mutable_grad() = g[t];
    ref.step();
  }
  at::Tensor q = p_mid.clone().set_requires_grad(true);
  SparseMFAC resumed({q}, o);
  testing::LoadState(resumed, saved);
  for (int64_t t = 7; t < 14; ++t) {
    q.mutable_grad() = g[t];
    resumed.step();
  }
  EXPECT_TRUE(q.detach().equal(p.detach()));
  // Loading a dense MFAC archive into SparseMFAC is refused.
  at::Tensor r = at::randn({d}).set_requires_grad(true);
  MFAC dense({r}, MFACOptions().window(4));
  SparseMFAC other({q}, o);
  EXPECT_THROW(testing::LoadState(other, testing::SaveState(dense)), c10::Error);
}

}  // namespace
}  // namespace efcp
