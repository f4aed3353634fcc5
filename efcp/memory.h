// Memory accounting shared by every efcp optimizer.
//
// A MemoryBreakdown lists the bytes an optimizer holds, by component. The
// component names are stable (a scheduler and the TRAIN job key on them):
//   "history_values"   values of the stored gradient window (dense rows, sparse
//                      values, or low-rank factors)
//   "history_indices"  indices of the sparse rows (0 for dense / low rank)
//   "gram"             the m x m float64 Gram matrix of the window
//   "error_buffer"     error-feedback accumulator
//   "momentum"         momentum buffers
//   "power_iteration"  warm-start factors of the low-rank compressor
//   "scratch"          persistent per-step workspace (the direction buffer)
// Components that an optimizer does not use are present with 0 bytes, so the
// same names appear in every breakdown of one optimizer kind.
//
// This header does not include torch: server and scheduler code may use it.
#ifndef EFCP_MEMORY_H_
#define EFCP_MEMORY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace efcp {

struct MemoryBreakdown {
  std::vector<std::pair<std::string, int64_t>> components;

  // Sum of all components.
  int64_t total() const;
  // Bytes of the named component; 0 when absent.
  int64_t get(std::string_view name) const;
  // Adds `bytes` to the named component (appends it when absent).
  void add(std::string_view name, int64_t bytes);
  // "history_values=123 history_indices=0 ... total=456".
  std::string ToString() const;
};

bool operator==(const MemoryBreakdown& a, const MemoryBreakdown& b);

// Bytes of dense M-FAC's fp32 gradient history: 4 * m * d.
int64_t DenseMfacHistoryBytes(int64_t d, int64_t m);

// Admission check for a scheduler: OK when estimate.total() <= budget_bytes,
// otherwise RESOURCE_EXHAUSTED naming `what`, the estimate and the budget.
absl::Status AdmitMemory(const MemoryBreakdown& estimate, int64_t budget_bytes,
                         std::string_view what);

}  // namespace efcp

#endif  // EFCP_MEMORY_H_
