// LowRankMFAC: M-FAC over a window of low-rank gradients with error feedback
// (the LR-MFAC variant of the EFCP paper).
//
// Each parameter with dim >= 2 is viewed as a matrix W (size(0) x rest). Per step:
//   a = e + g;  P = orth(a Q);  Q = a^T P;  g_hat = P Q^T;  e = a - g_hat
// (one power iteration, warm-started from the previous Q when warm_start is
// on, else always from the same seeded random Q). The window stores (P, Q).
// Parameters with dim < 2 are stored densely (no compression, no error).
// The Gram entries <g_hat_i, g_hat_j> = sum_layers sum((P_i^T P_j) .* (Q_i^T Q_j))
// feed one shared m x m system, solved as in MFAC; the update of each matrix
// is sum_j coef_j P_j Q_j^T, never forming the d-vector of the window.
//
// Memory: m * r * (rows + cols) per matrix (+ m * n per vector), the error
// (rows * cols), Q (cols * r), 8 m^2.
#ifndef EFCP_LOW_RANK_MFAC_H_
#define EFCP_LOW_RANK_MFAC_H_

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "efcp/accounted_optimizer.h"
#include "efcp/memory.h"
#include "efcp/options_common.h"

namespace efcp {

struct LowRankMFACOptions : public torch::optim::OptimizerCloneableOptions<LowRankMFACOptions> {
  LowRankMFACOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT(runtime/explicit)
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(double, damp) = 1e-4;     // > 0
  TORCH_ARG(int64_t, window) = 1024;  // m >= 1
  TORCH_ARG(double, momentum) = 0.0;
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(WeightDecayKind, weight_decay_kind) = WeightDecayKind::kCoupled;
  TORCH_ARG(Scaling, scaling) = Scaling::kCount;
  TORCH_ARG(NonFinitePolicy, non_finite) = NonFinitePolicy::kSkip;
  TORCH_ARG(int64_t, memory_budget_bytes) = 0;
  // r >= 1; a matrix uses min(r, rows, cols) (full rank = exact gradient).
  TORCH_ARG(int64_t, rank) = 4;
  TORCH_ARG(bool, error_feedback) = true;
  // Start each power iteration from the previous Q (PowerSGD style).
  TORCH_ARG(bool, power_iteration_warm_start) = true;
  // Seed of the initial random Q.
  TORCH_ARG(uint64_t, seed) = 0;

  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }
};

// INVALID_ARGUMENT naming the option ("LowRankMFACOptions.rank must be >= 1, got 0").
absl::Status ValidateLowRankMFACOptions(const LowRankMFACOptions& options);

class LowRankMFAC : public AccountedOptimizer {
 public:
  LowRankMFAC(std::vector<torch::optim::OptimizerParamGroup> groups,
              LowRankMFACOptions options = {});
  explicit LowRankMFAC(std::vector<at::Tensor> params, LowRankMFACOptions options = {})
      : LowRankMFAC(
            std::vector<torch::optim::OptimizerParamGroup>{
                torch::optim::OptimizerParamGroup(std::move(params))},
            std::move(options)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
  MemoryBreakdown memory_breakdown() const override;
  // Estimate for parameters of `shapes` in `dtype`; equals memory_breakdown().
  static MemoryBreakdown EstimateMemory(const std::vector<std::vector<int64_t>>& shapes,
                                        const LowRankMFACOptions& options,
                                        at::ScalarType dtype = at::kFloat);

  int64_t rows() const { return count_; }
  // Error-feedback buffer of parameter `slot` (undefined for vectors or without EF).
  at::Tensor ErrorBuffer(size_t slot) const;

 protected:
  Hyper HyperOf(const torch::optim::OptimizerOptions& options) const override;
  void SaveState(torch::serialize::OutputArchive& archive) const override;
  void LoadState(torch::serialize::InputArchive& archive) override;

 private:
  struct Factors {
    bool matrix = false;
    int64_t rows = 0, cols = 0, rank = 0;
    at::Tensor p_hist;  // [rows, m * rank]; slot j owns columns j*rank .. (j+1)*rank
    at::Tensor q_hist;  // [cols, m * rank]
    at::Tensor dense;   // vectors: [m, numel]
    at::Tensor error;   // [rows, cols]
    at::Tensor q;       // [cols, rank] power-iteration start
  };

  LowRankMFACOptions options_;
  std::vector<Factors> factors_;
  at::Tensor gram_;
  int64_t count_ = 0;
  int64_t rows_written_ = 0;
};

}  // namespace efcp

#endif  // EFCP_LOW_RANK_MFAC_H_
