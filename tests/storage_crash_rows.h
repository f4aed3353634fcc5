// The rows the crash-test writer writes: a pure function of the row number, so the parent can
// check any committed prefix and a resumed writer continues the same sequence.
#ifndef LATENTD_TESTS_STORAGE_CRASH_ROWS_H_
#define LATENTD_TESTS_STORAGE_CRASH_ROWS_H_

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "storage/reconstruction_fit.h"

namespace latentd::tests {

inline constexpr int32_t kCrashWidth = 512;
inline constexpr int64_t kCrashRows = 3000;
inline constexpr int64_t kCrashCommitRows = 50;

struct CrashRows {
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices;
  std::vector<float> values;
  std::vector<int32_t> tokens;
};

inline CrashRows MakeCrashRows(int64_t first, int64_t n) {
  CrashRows rows;
  for (int64_t r = first; r < first + n; ++r) {
    std::mt19937 rng(static_cast<uint32_t>(r * 2654435761u + 17));
    std::set<int32_t> cols;
    const int k = 4 + static_cast<int>(rng() % 13);
    while (static_cast<int>(cols.size()) < k)
      cols.insert(static_cast<int32_t>(rng() % kCrashWidth));
    for (int32_t c : cols) {
      rows.indices.push_back(c);
      rows.values.push_back(static_cast<float>(rng() % 100000) / 1000.0f);
    }
    rows.indptr.push_back(static_cast<int64_t>(rows.indices.size()));
    rows.tokens.push_back(static_cast<int32_t>(rng() % 50257));
  }
  return rows;
}

// The reconstruction sums the writer gives with rows [first, first + n): integer-valued, so that
// any grouping of them adds up to the same doubles and the parent can check the totals exactly.
inline storage::ReconstructionFit MakeCrashSums(int64_t first, int64_t n) {
  storage::ReconstructionFit fit;
  fit.rows = n;
  fit.sum_x.assign(2, 0.0);
  for (int64_t r = first; r < first + n; ++r) {
    fit.squared_error += static_cast<double>(r % 7);
    fit.sum_squares += static_cast<double>(r % 11 + 20);
    fit.cosine_sum += 1;
    fit.sum_x[0] += static_cast<double>(r);
    fit.sum_x[1] -= 1;
  }
  return fit;
}

}  // namespace latentd::tests

#endif  // LATENTD_TESTS_STORAGE_CRASH_ROWS_H_
