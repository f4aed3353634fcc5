// SparseMFAC: the EFCP optimizer (Modoranu et al., ICML 2024): M-FAC whose
// gradient window holds Top-K sparse rows, with error feedback.
//
// Per step, on each device shard's flat gradient vector:
//   a = e + g;  c = TopK(a);  e = a - c;  store c as the newest row;
//   u = F^{-1} c with F = damp*I + (1/s) sum_rows c_j c_j^T  (Woodbury, as MFAC);
//   p -= lr * u  (through momentum / weight decay).
// Invariant: sum of all rows ever stored (evicted ones included) + e == sum of
// all gradients, for every value dtype (the rounding of a bf16 value goes back
// into e too).
//
// Memory: m * k * (value bytes + index bytes) + d (error, param dtype) + d
// (scratch) + 8 m^2. With bf16 values and 16-bit block-relative indices at
// density 1% the history is 1% of dense M-FAC's 4*m*d.
#ifndef EFCP_SPARSE_MFAC_H_
#define EFCP_SPARSE_MFAC_H_

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "efcp/memory.h"
#include "efcp/options_common.h"
#include "efcp/row_window.h"

namespace efcp {

struct SparseMFACOptions : public torch::optim::OptimizerCloneableOptions<SparseMFACOptions> {
  SparseMFACOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT(runtime/explicit)
  // As MFACOptions:
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(double, damp) = 1e-4;     // > 0
  TORCH_ARG(int64_t, window) = 1024;  // m >= 1
  TORCH_ARG(double, momentum) = 0.0;
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(WeightDecayKind, weight_decay_kind) = WeightDecayKind::kCoupled;
  TORCH_ARG(Scaling, scaling) = Scaling::kCount;
  TORCH_ARG(NonFinitePolicy, non_finite) = NonFinitePolicy::kSkip;
  TORCH_ARG(int64_t, memory_budget_bytes) = 0;
  // Fraction of entries kept per row (per block with kPerBlock), in (0, 1].
  TORCH_ARG(double, density) = 0.01;
  // When > 0, entries kept per row (kGlobal) or per block (kPerBlock); overrides density.
  TORCH_ARG(int64_t, k) = 0;
  // Off: plain Top-K of each gradient (what is dropped is lost).
  TORCH_ARG(bool, error_feedback) = true;
  // kPerBlock: Top-K within each block of block_size entries of the flat
  // vector (fixed count per block, so 16-bit relative indices suffice).
  TORCH_ARG(TopKScope, topk_scope) = TopKScope::kPerBlock;
  // <= 65535 for kUInt16Block, <= 32767 for kInt16Block.
  TORCH_ARG(int64_t, block_size) = 65535;
  TORCH_ARG(IndexEncoding, index_encoding) = IndexEncoding::kUInt16Block;
  // Stored value dtype: float32 (default), bfloat16, float16 or float64.
  TORCH_ARG(at::ScalarType, value_dtype) = at::kFloat;

  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }
};

// INVALID_ARGUMENT naming the option, e.g.
// "SparseMFACOptions.density must be in (0, 1], got 1.5".
absl::Status ValidateSparseMFACOptions(const SparseMFACOptions& options);

class SparseMFAC : public RowWindowOptimizer {
 public:
  // Throws c10::Error with the ValidateSparseMFACOptions message, or the
  // AdmitMemory message over memory_budget_bytes.
  SparseMFAC(std::vector<torch::optim::OptimizerParamGroup> groups, SparseMFACOptions options = {});
  explicit SparseMFAC(std::vector<at::Tensor> params, SparseMFACOptions options = {})
      : SparseMFAC(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                       std::move(params))},
                   std::move(options)) {}

  // State bytes for parameters of `shapes` in `dtype` on one device; equals
  // memory_breakdown() of the constructed optimizer.
  static MemoryBreakdown EstimateMemory(const std::vector<std::vector<int64_t>>& shapes,
                                        const SparseMFACOptions& options,
                                        at::ScalarType dtype = at::kFloat);
  static MemoryBreakdown EstimateMemory(int64_t d, const SparseMFACOptions& options,
                                        at::ScalarType dtype = at::kFloat) {
    return EstimateMemory(std::vector<std::vector<int64_t>>{{d}}, options, dtype);
  }

 protected:
  Hyper HyperOf(const torch::optim::OptimizerOptions& options) const override;
  at::Tensor Coefficients(const at::Tensor& gram, int64_t count, int64_t newest) const override;

 private:
  SparseMFACOptions options_;
};

}  // namespace efcp

#endif  // EFCP_SPARSE_MFAC_H_
