// MFAC: dense M-FAC (Frantar, Kurtic, Alistarh, NeurIPS 2021), the baseline
// that the EFCP optimizers compress.
//
// Keeps the last m gradients g_1..g_m (rows of G, stored in the parameters'
// dtype on their device) and steps along u = F^{-1} g with the empirical Fisher
//   F = damp * I + (1/s) G^T G,  s = m (Scaling::kWindow) or min(count, m) (kCount).
// Since g is the newest stored row, the cancellation-free Woodbury form
//   u = s * G^T (s*damp*I + G G^T)^{-1} e_newest
// is used: one m x m Cholesky solve in float64 per step, plus one O(m d) Gram
// row and one O(m d) combination, all tensor ops on the parameters' device.
//
// State: 4*m*d bytes for fp32 parameters (DenseMfacHistoryBytes), m*m*8 for
// the Gram matrix, d for the direction scratch (+ d with momentum).
#ifndef EFCP_MFAC_H_
#define EFCP_MFAC_H_

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "efcp/memory.h"
#include "efcp/options_common.h"
#include "efcp/row_window.h"

namespace efcp {

struct MFACOptions : public torch::optim::OptimizerCloneableOptions<MFACOptions> {
  MFACOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT(runtime/explicit)
  // Step size.
  TORCH_ARG(double, lr) = 1e-3;
  // lambda of F = lambda*I + G^T G / s; must be > 0. 1e-4..1e-7 is typical.
  TORCH_ARG(double, damp) = 1e-4;
  // m: gradients kept; must be >= 1. The papers use 1024.
  TORCH_ARG(int64_t, window) = 1024;
  // v = momentum * v + u; p -= lr * v. 0 disables (and allocates nothing).
  TORCH_ARG(double, momentum) = 0.0;
  TORCH_ARG(double, weight_decay) = 0.0;
  // kCoupled (added to the gradient, as the M-FAC code) or kDecoupled.
  TORCH_ARG(WeightDecayKind, weight_decay_kind) = WeightDecayKind::kCoupled;
  // kCount: s = min(count, m) (avoids m-times-too-large first steps).
  TORCH_ARG(Scaling, scaling) = Scaling::kCount;
  TORCH_ARG(NonFinitePolicy, non_finite) = NonFinitePolicy::kSkip;
  // When > 0, construction throws if EstimateMemory().total() exceeds it.
  TORCH_ARG(int64_t, memory_budget_bytes) = 0;

  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }
};

// INVALID_ARGUMENT naming the option ("MFACOptions.damp must be > 0, got 0").
absl::Status ValidateMFACOptions(const MFACOptions& options);

class MFAC : public RowWindowOptimizer {
 public:
  // Throws c10::Error with the ValidateMFACOptions message on bad options, and
  // with the RESOURCE_EXHAUSTED message of AdmitMemory over the budget.
  MFAC(std::vector<torch::optim::OptimizerParamGroup> groups, MFACOptions options = {});
  explicit MFAC(std::vector<at::Tensor> params, MFACOptions options = {})
      : MFAC(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                 std::move(params))},
             std::move(options)) {}

  // State bytes before allocation, for parameters of `shapes` in `dtype` on
  // one device (the estimate of a multi-device optimizer is the sum over its
  // devices with the Gram matrix counted once). Equals memory_breakdown() of
  // the constructed optimizer.
  static MemoryBreakdown EstimateMemory(const std::vector<std::vector<int64_t>>& shapes,
                                        const MFACOptions& options,
                                        at::ScalarType dtype = at::kFloat);
  // Same for one flat parameter of d elements.
  static MemoryBreakdown EstimateMemory(int64_t d, const MFACOptions& options,
                                        at::ScalarType dtype = at::kFloat) {
    return EstimateMemory(std::vector<std::vector<int64_t>>{{d}}, options, dtype);
  }

 protected:
  Hyper HyperOf(const torch::optim::OptimizerOptions& options) const override;
  at::Tensor Coefficients(const at::Tensor& gram, int64_t count, int64_t newest) const override;

 private:
  MFACOptions options_;
};

}  // namespace efcp

#endif  // EFCP_MFAC_H_
