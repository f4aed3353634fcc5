// Internal machinery shared by MFAC, SparseMFAC and GGT: a ring buffer of the
// last m gradient rows (dense, or Top-K sparse with error feedback) per device
// shard, the m x m float64 Gram matrix of the rows, and the coefficient rules
// that turn it into an update direction u = G^T coef.
//
// Users include efcp/mfac.h, efcp/sparse_mfac.h or efcp/ggt.h instead.
#ifndef EFCP_ROW_WINDOW_H_
#define EFCP_ROW_WINDOW_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "efcp/accounted_optimizer.h"
#include "efcp/memory.h"
#include "efcp/options_common.h"

namespace efcp {

struct RowWindowConfig {
  int64_t window = 0;  // m
  bool sparse = false;
  // Sparse rows only:
  double density = 1.0;
  // When > 0, entries kept per row (kGlobal) or per block (kPerBlock),
  // instead of ceil(density * n).
  int64_t k = 0;
  bool error_feedback = true;
  TopKScope topk_scope = TopKScope::kPerBlock;
  int64_t block_size = 65535;
  IndexEncoding index_encoding = IndexEncoding::kUInt16Block;
  at::ScalarType value_dtype = at::kFloat;
};

// INVALID_ARGUMENT naming `prefix`.field when the sparse fields do not fit together.
absl::Status ValidateSparseConfig(const RowWindowConfig& c, const std::string& prefix);

// Sizes of one device shard's sparse rows.
struct SparseGeometry {
  int64_t padded = 0;       // length of the error / scratch vectors
  int64_t blocks = 1;       // per-block scope: number of blocks
  int64_t per_block = 0;    // per-block scope: entries kept per block
  int64_t row_entries = 0;  // entries stored per row
};
SparseGeometry GeometryOf(int64_t numel, const RowWindowConfig& c);

// Breakdown of the window of one shard of `numel` elements of `dtype`
// (history_values, history_indices, error_buffer, scratch), no gram.
MemoryBreakdown EstimateShardWindow(int64_t numel, at::ScalarType dtype, const RowWindowConfig& c);
// Full estimate for one shard: the above + gram + momentum, in the stable order.
MemoryBreakdown EstimateRowWindow(const std::vector<std::vector<int64_t>>& shapes,
                                  at::ScalarType dtype, const RowWindowConfig& c, double momentum);

class RowWindowOptimizer : public AccountedOptimizer {
 public:
  MemoryBreakdown memory_breakdown() const override;
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Rows currently in the window (min(steps, m)) and the ring slot of the newest.
  int64_t rows() const { return count_; }
  int64_t newest_slot() const { return (rows_written_ - 1) % config_.window; }
  // Inspection (transient copies, for tests and debugging): the row in ring
  // slot `slot` of device shard `shard` as a dense flat vector, and the
  // error-feedback buffer (undefined without error feedback).
  at::Tensor DenseRow(size_t shard, int64_t slot) const;
  at::Tensor ErrorBuffer(size_t shard) const;

 protected:
  RowWindowOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                     std::unique_ptr<torch::optim::OptimizerOptions> defaults, std::string kind,
                     NonFinitePolicy policy, const RowWindowConfig& config);

  // Coefficients [m] (float64, on the Gram's device) of the direction
  // u = sum_j coef_j row_j, given the Gram matrix of the count_ filled rows
  // and the newest row's slot.
  virtual at::Tensor Coefficients(const at::Tensor& gram, int64_t count, int64_t newest) const = 0;

  void SaveState(torch::serialize::OutputArchive& archive) const override;
  void LoadState(torch::serialize::InputArchive& archive) override;

 private:
  struct ShardState {
    at::Tensor history;  // dense [m, numel] / sparse values [m, row_entries]
    at::Tensor indices;  // sparse [m, row_entries]
    at::Tensor error;    // sparse with error feedback [padded]
    at::Tensor scratch;  // [padded]: dense new row, then the direction
    SparseGeometry geo;
  };
  // Writes the new row of shard s into ring slot `slot`; leaves it densely in scratch.
  void Ingest(size_t s, int64_t slot, const std::vector<at::Tensor>& grads);
  // Dot products of the stored rows with the new row (in scratch), [m] float64.
  at::Tensor Dots(size_t s, int64_t slot) const;
  // scratch = sum_j coef_j row_j.
  void Combine(size_t s, const at::Tensor& coef);
  at::Tensor DecodeIndices(size_t s, int64_t row0, int64_t rows) const;
  int64_t ChunkRows(size_t s) const;

  RowWindowConfig config_;
  std::vector<ShardState> state_s_;
  at::Tensor gram_;  // [m, m] float64 on shard 0's device
  int64_t count_ = 0;
  int64_t rows_written_ = 0;
};

// coef = s * (s*damp*I + K + floor*I)^{-1} e_newest over the count filled rows;
// floor = eps(compute dtype) * max diag(K) keeps the Cholesky factor positive
// definite when K was accumulated in fp32. Zero beyond count.
at::Tensor WoodburyCoefficients(const at::Tensor& gram, int64_t count, int64_t newest, double s,
                                double damp, double floor_eps);

// M-FAC's coefficients (MFAC and SparseMFAC): WoodburyCoefficients with s = count or the window as
// `scaling` says, and the floor at the machine epsilon of the parameters' `dtype`.
at::Tensor MfacCoefficients(const at::Tensor& gram, int64_t count, int64_t newest, Scaling scaling,
                            int64_t window, double damp, at::ScalarType dtype);

}  // namespace efcp

#endif  // EFCP_ROW_WINDOW_H_
