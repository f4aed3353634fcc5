// GGT (Agarwal et al., "Efficient Full-Matrix Adaptive Regularization", ICML
// 2019) over a window of the last r gradients, and its sparse error-feedback
// variant (EFCP applied to GGT).
//
//   u = (epsilon*I + (G^T G)^{1/2})^{-1} x,   x = newest row of G (the gradient,
//   or its Top-K with error feedback when density < 1).
// With K = G G^T = U diag(lambda) U^T (r x r, float64 eigendecomposition) and
// sigma = sqrt(max(lambda, 0)), since x lies in the row space of G:
//   u = G^T U diag(1 / (epsilon + sigma)) U^T e_newest.
// No d x d matrix is formed; the work is O(r d) plus an O(r^3) eigh.
#ifndef EFCP_GGT_H_
#define EFCP_GGT_H_

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "efcp/memory.h"
#include "efcp/options_common.h"
#include "efcp/row_window.h"

namespace efcp {

struct GGTOptions : public torch::optim::OptimizerCloneableOptions<GGTOptions> {
  GGTOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT(runtime/explicit)
  TORCH_ARG(double, lr) = 1e-3;
  // r: gradients kept; >= 1 (the GGT paper uses 200).
  TORCH_ARG(int64_t, window) = 200;
  // epsilon of (epsilon*I + (G^T G)^{1/2})^{-1}; > 0.
  TORCH_ARG(double, epsilon) = 1e-4;
  TORCH_ARG(double, momentum) = 0.0;
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(WeightDecayKind, weight_decay_kind) = WeightDecayKind::kCoupled;
  TORCH_ARG(NonFinitePolicy, non_finite) = NonFinitePolicy::kSkip;
  TORCH_ARG(int64_t, memory_budget_bytes) = 0;
  // 1.0: dense rows. < 1: Top-K rows (the sparse variant), fields as in SparseMFACOptions.
  TORCH_ARG(double, density) = 1.0;
  TORCH_ARG(bool, error_feedback) = true;
  TORCH_ARG(TopKScope, topk_scope) = TopKScope::kPerBlock;
  TORCH_ARG(int64_t, block_size) = 65535;
  TORCH_ARG(IndexEncoding, index_encoding) = IndexEncoding::kUInt16Block;
  TORCH_ARG(at::ScalarType, value_dtype) = at::kFloat;

  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }
};

// INVALID_ARGUMENT naming the option ("GGTOptions.epsilon must be > 0, got 0").
absl::Status ValidateGGTOptions(const GGTOptions& options);

class GGT : public RowWindowOptimizer {
 public:
  GGT(std::vector<torch::optim::OptimizerParamGroup> groups, GGTOptions options = {});
  explicit GGT(std::vector<at::Tensor> params, GGTOptions options = {})
      : GGT(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                std::move(params))},
            std::move(options)) {}

  // State bytes for parameters of `shapes` in `dtype` on one device; equals
  // memory_breakdown() of the constructed optimizer.
  static MemoryBreakdown EstimateMemory(const std::vector<std::vector<int64_t>>& shapes,
                                        const GGTOptions& options,
                                        at::ScalarType dtype = at::kFloat);

 protected:
  Hyper HyperOf(const torch::optim::OptimizerOptions& options) const override;
  at::Tensor Coefficients(const at::Tensor& gram, int64_t count, int64_t newest) const override;

 private:
  GGTOptions options_;
};

}  // namespace efcp

#endif  // EFCP_GGT_H_
