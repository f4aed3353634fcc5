#include "engine/sparse_codes.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

// Decoding ragged codes, an empty row among them, gives z W_dec + b_dec of the dense codes.
TEST(SparseCodesTest, RaggedCodesDecodeAsTheirDenseCodes) {
  at::manual_seed(3);
  const at::Tensor W_dec = at::randn({10, 4}), b_dec = at::randn({4});
  SparseCodes codes;
  codes.indices =
      at::tensor(std::vector<int32_t>{2, 7, 9, 0}, at::kInt);  // rows: {2, 7}, {}, {9, 0}
  codes.values = at::tensor(std::vector<float>{0.5f, 2.0f, 1.0f, -1.0f});
  codes.row_counts = at::tensor(std::vector<int64_t>{2, 0, 2});
  at::Tensor z = at::zeros({3, 10});
  z[0][2] = 0.5;
  z[0][7] = 2.0;
  z[2][9] = 1.0;
  z[2][0] = -1.0;
  EXPECT_TRUE(
      at::allclose(DecodeSparseCodes(W_dec, b_dec, codes, 3), z.mm(W_dec) + b_dec, 1e-5, 1e-6));
}

// The sums reconstruction figures are made of, rows that are not kept (NaN ones) left out.
// The fused CPU pass keeps exactly the non-zero entries of z, by row, columns ascending, for
// ReLU and JumpReLU (thresholds of both signs, exact zeros, an empty row, a strided input), as
// the dense z the ATen ops build.
TEST(SparseCodesTest, RaggedCodesAreTheNonZerosOfTheDenseCodes) {
  at::manual_seed(5);
  at::Tensor pre = at::randn({300, 70});
  pre.index_put_({at::rand({300, 70}) < 0.05}, 0.0f);   // exact zeros
  pre[7].fill_(-1.0f);                                  // a row that fires nothing
  const at::Tensor threshold = at::randn({70}) * 0.5;   // some thresholds below zero
  const at::Tensor strided = at::randn({70, 300}).t();  // not contiguous
  for (const at::Tensor& p : {pre, strided}) {
    for (const at::Tensor& t : {at::Tensor(), threshold}) {
      const at::Tensor z = t.defined() ? p * (p > t).to(at::kFloat) : at::relu(p);
      const SparseCodes codes = RaggedCodes(p, t);
      ASSERT_FALSE(codes.fixed_k());
      const at::Tensor mask = z != 0;
      EXPECT_TRUE(at::equal(codes.row_counts, mask.sum(1, false, at::kLong)));
      EXPECT_TRUE(at::equal(codes.indices, mask.nonzero().select(1, 1).to(at::kInt)));
      EXPECT_TRUE(at::equal(codes.values, z.masked_select(mask)));
    }
  }
  EXPECT_EQ(RaggedCodes(pre, threshold).row_counts[7].item<int64_t>(),
            (threshold < -1.0f).sum().item<int64_t>());
}

// The heap kernel keeps each row's k largest entries, indices ascending, ReLU'd, as at::topk +
// sort + gather do (no ties here: random floats), for k from 1 to the width, and keeps k of tied
// entries.
TEST(SparseCodesTest, FixedKCodesAreEachRowsKLargest) {
  at::manual_seed(6);
  at::Tensor pre = at::randn({257, 90});
  pre[3] = -2.0f - at::rand({90});  // all negative: k entries, all 0 once ReLU'd
  const at::Tensor strided = at::randn({90, 257}).t();
  for (const at::Tensor& p : {pre, strided}) {
    for (int64_t k : {1, 7, 32, 90}) {
      SCOPED_TRACE(k);
      const SparseCodes codes = FixedKCodes(p, k);
      ASSERT_TRUE(codes.fixed_k());
      auto [values, indices] = p.topk(k, 1, /*largest=*/true, /*sorted=*/false);
      auto [sorted_indices, order] = indices.sort(1);
      EXPECT_TRUE(at::equal(codes.indices, sorted_indices.to(at::kInt)));
      EXPECT_TRUE(at::equal(codes.values, values.gather(1, order).relu()));
    }
  }
  EXPECT_EQ(FixedKCodes(pre, 7).values[3].abs().sum().item<float>(), 0.0f);
  const SparseCodes tied = FixedKCodes(at::ones({2, 10}), 4);
  EXPECT_EQ(std::get<0>(at::_unique(tied.indices[0])).numel(), 4);
  EXPECT_TRUE(at::equal(tied.values, at::ones({2, 4})));
}

TEST(SparseCodesTest, ReconstructionSumsLeaveOutTheRowsNotKept) {
  at::manual_seed(8);
  at::Tensor x = at::randn({6, 4}), x_hat = x + 0.1 * at::randn({6, 4});
  x[2].fill_(std::nanf(""));
  x_hat[4].fill_(std::numeric_limits<float>::infinity());
  const at::Tensor keep = at::tensor(std::vector<uint8_t>{1, 1, 0, 1, 0, 1}).to(at::kBool);
  const at::Tensor sums = ReconstructionSums(x, x_hat, keep);
  ASSERT_EQ(sums.numel(), 4 + 4);
  const at::Tensor kept = at::tensor(std::vector<int64_t>{0, 1, 3, 5});
  const at::Tensor xs = x.index_select(0, kept).to(at::kDouble);
  const at::Tensor hs = x_hat.index_select(0, kept).to(at::kDouble);
  EXPECT_NEAR(sums[0].item<double>(), (xs - hs).pow(2).sum().item<double>(), 1e-5);
  EXPECT_NEAR(sums[1].item<double>(), xs.pow(2).sum().item<double>(), 1e-5);
  EXPECT_NEAR(sums[2].item<double>(), at::cosine_similarity(xs, hs, 1).sum().item<double>(), 1e-5);
  EXPECT_EQ(sums[3].item<double>(), 4);
  EXPECT_TRUE(at::allclose(sums.slice(0, 4), xs.sum(0), 1e-5, 1e-6));
}

}  // namespace
}  // namespace latentd::engine
