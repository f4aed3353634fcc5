#include "engine/sparse_codes.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

namespace latentd::engine {

namespace {

// Whether an entry of pre survives: relu(v) != 0, i.e. !(v <= 0) (a NaN stays, as in ATen), or
// for JumpReLU v > threshold and v != 0.
inline bool Kept(float v, const float* threshold, int64_t j) {
  return threshold == nullptr ? !(v <= 0.0f) : (v > threshold[j] && v != 0.0f);
}

SparseCodes RaggedCodesAten(const at::Tensor& pre, const at::Tensor& threshold) {
  const at::Tensor z =
      threshold.defined() ? pre * (pre > threshold).to(pre.scalar_type()) : at::relu(pre);
  const at::Tensor mask = z != 0;
  SparseCodes codes;
  codes.row_counts = mask.sum(1, /*keepdim=*/false, at::kLong);
  codes.indices = mask.nonzero().select(1, 1).to(at::kInt);  // row-major, columns ascending
  codes.values = z.masked_select(mask);
  return codes;
}

SparseCodes FixedKCodesAten(const at::Tensor& pre, int64_t k) {
  auto [values, indices] = pre.topk(k, /*dim=*/1, /*largest=*/true, /*sorted=*/false);
  auto [sorted_indices, order] = indices.sort(/*dim=*/1);
  SparseCodes codes;
  codes.indices = sorted_indices.to(at::kInt);
  codes.values = at::relu(values.gather(1, order));
  return codes;
}

// Restores the min-heap order of (value, index) pairs below `at` (the root is the smallest).
void SiftDown(float* value, int32_t* index, int64_t k, int64_t at) {
  while (true) {
    const int64_t left = 2 * at + 1, right = left + 1;
    int64_t smallest = at;
    if (left < k && value[left] < value[smallest]) smallest = left;
    if (right < k && value[right] < value[smallest]) smallest = right;
    if (smallest == at) return;
    std::swap(value[at], value[smallest]);
    std::swap(index[at], index[smallest]);
    at = smallest;
  }
}

}  // namespace

SparseCodes FixedKCodes(const at::Tensor& pre, int64_t k) {
  if (!pre.device().is_cpu() || pre.scalar_type() != at::kFloat || pre.dim() != 2 || k < 1 ||
      k > pre.size(1)) {
    return FixedKCodesAten(pre, k);
  }
  const at::Tensor p = pre.contiguous();
  const int64_t n = p.size(0), width = p.size(1);
  const float* data = p.data_ptr<float>();
  SparseCodes codes;
  codes.indices = at::empty({n, k}, at::kInt);
  codes.values = at::empty({n, k}, at::kFloat);
  int32_t* out_index = codes.indices.data_ptr<int32_t>();
  float* out_value = codes.values.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / width);
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> value(k);
    std::vector<int32_t> index(k);
    std::vector<std::pair<int32_t, float>> kept(k);
    for (int64_t r = begin; r < end; ++r) {
      const float* row = data + r * width;
      for (int64_t j = 0; j < k; ++j) {
        value[j] = row[j];
        index[j] = static_cast<int32_t>(j);
      }
      for (int64_t j = k / 2 - 1; j >= 0; --j) SiftDown(value.data(), index.data(), k, j);
      for (int64_t j = k; j < width; ++j) {
        if (row[j] <= value[0]) continue;
        value[0] = row[j];
        index[0] = static_cast<int32_t>(j);
        SiftDown(value.data(), index.data(), k, 0);
      }
      for (int64_t j = 0; j < k; ++j) kept[j] = {index[j], value[j]};
      std::sort(kept.begin(), kept.end());
      for (int64_t j = 0; j < k; ++j) {
        out_index[r * k + j] = kept[j].first;
        out_value[r * k + j] = std::max(kept[j].second, 0.0f);
      }
    }
  });
  return codes;
}

SparseCodes RaggedCodes(const at::Tensor& pre, const at::Tensor& threshold) {
  if (!pre.device().is_cpu() || pre.scalar_type() != at::kFloat || pre.dim() != 2 ||
      (threshold.defined() &&
       (!threshold.device().is_cpu() || threshold.scalar_type() != at::kFloat ||
        threshold.numel() != pre.size(1)))) {
    return RaggedCodesAten(pre, threshold);
  }
  const at::Tensor p = pre.contiguous();
  const at::Tensor t = threshold.defined() ? threshold.contiguous() : at::Tensor();
  const int64_t n = p.size(0), width = p.size(1);
  const float* data = p.data_ptr<float>();
  const float* cut = t.defined() ? t.data_ptr<float>() : nullptr;
  SparseCodes codes;
  codes.row_counts = at::empty({n}, at::kLong);
  int64_t* counts = codes.row_counts.data_ptr<int64_t>();
  // About 64 Ki entries a task: enough to pay for the task, small enough to spread the rows.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(width, 1));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = data + r * width;
      int64_t count = 0;
      for (int64_t j = 0; j < width; ++j) count += Kept(row[j], cut, j);
      counts[r] = count;
    }
  });
  std::vector<int64_t> offsets(n + 1, 0);
  for (int64_t r = 0; r < n; ++r) offsets[r + 1] = offsets[r] + counts[r];
  codes.indices = at::empty({offsets[n]}, at::kInt);
  codes.values = at::empty({offsets[n]}, at::kFloat);
  int32_t* indices = codes.indices.data_ptr<int32_t>();
  float* values = codes.values.data_ptr<float>();
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = data + r * width;
      int64_t next = offsets[r];
      for (int64_t j = 0; j < width; ++j) {
        if (Kept(row[j], cut, j)) {
          indices[next] = static_cast<int32_t>(j);
          values[next] = row[j];
          ++next;
        }
      }
    }
  });
  return codes;
}

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
  return b_dec.defined() ? sums.add_(b_dec) : sums;
}

at::Tensor CodeValues(const SparseCodes& codes, int64_t rows, const at::Tensor& latents) {
  const at::Tensor wanted = latents.to(codes.indices.device(), at::kLong);
  // [entries, n]: which wanted latent each stored entry is, if any.
  const at::Tensor indices = codes.indices.reshape({-1, 1}).to(at::kLong);
  const at::Tensor match = indices.eq(wanted.unsqueeze(0));
  const at::Tensor weighted = match.to(at::kFloat).mul_(codes.values.reshape({-1, 1}));
  if (codes.fixed_k()) {
    const int64_t k = rows > 0 ? codes.indices.numel() / rows : 0;
    return weighted.view({rows, k, wanted.size(0)}).sum(1);
  }
  const at::Tensor row_of = at::repeat_interleave(
      at::arange(rows, codes.row_counts.options().dtype(at::kLong)), codes.row_counts);
  return at::zeros({rows, wanted.size(0)}, weighted.options()).index_add_(0, row_of, weighted);
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
