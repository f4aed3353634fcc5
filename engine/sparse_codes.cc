#include "engine/sparse_codes.h"

#include <algorithm>
#include <tuple>

namespace latentd::engine {

at::Tensor DecodeSparseCodes(const at::Tensor& W_dec, const at::Tensor& b_dec,
                             const SparseCodes& codes, int64_t rows) {
  const at::Tensor indices = codes.indices.reshape({-1}).to(at::kLong);
  at::Tensor offsets;
  if (codes.fixed_k()) {
    const int64_t k = rows > 0 ? codes.indices.numel() / rows : 0;
    offsets = at::arange(0, rows * k, std::max<int64_t>(k, 1), indices.options());
  } else {
    offsets = at::cumsum(codes.row_counts, 0).sub_(codes.row_counts).to(at::kLong);
  }
  // mode 0 (sum) weighted by the values: zero values (TopK's inactive slots) add nothing.
  at::Tensor sums = std::get<0>(at::embedding_bag(W_dec, indices, offsets,
                                                  /*scale_grad_by_freq=*/false, /*mode=*/0,
                                                  /*sparse=*/false, codes.values.reshape({-1})));
  return sums.add_(b_dec);
}

at::Tensor ReconstructionSums(const at::Tensor& x, const at::Tensor& x_hat,
                              const at::Tensor& keep) {
  // Rows left out become zeros (NaN * 0 would stay NaN), then count for nothing.
  const at::Tensor k = keep.unsqueeze(1);
  const at::Tensor zero = at::zeros({}, x.options());
  const at::Tensor xs = at::where(k, x, zero), hs = at::where(k, x_hat, zero);
  // Per-row sums in float32 (d terms each), everything across rows in float64.
  const at::Tensor sse = (xs - hs).pow(2).sum(1).to(at::kDouble).sum();
  const at::Tensor sum_sq = xs.pow(2).sum(1).to(at::kDouble).sum();
  const at::Tensor cos = at::cosine_similarity(xs, hs, 1, 1e-8).to(at::kDouble).sum();
  const at::Tensor rows = keep.to(at::kDouble).sum();
  const at::Tensor sum_x = at::sum(xs, {0}, /*keepdim=*/false, at::kDouble);
  return at::cat({at::stack({sse, sum_sq, cos, rows}), sum_x});
}

}  // namespace latentd::engine
