// Tests' random SPARSE rows: each row 0 to max_k distinct sorted latents of `width`, values in
// [0.01, 20), a token id below 4096, drawn from the caller's generator (so that several calls
// continue one sequence, a commit at a time).
#ifndef LATENTD_STORAGE_SPARSE_ROWS_TESTING_H_
#define LATENTD_STORAGE_SPARSE_ROWS_TESTING_H_

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "storage/chunk_store.h"

namespace latentd::storage {

struct SparseRowsForTest {
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices;
  std::vector<float> values;
  std::vector<int32_t> tokens;
  int64_t rows() const { return static_cast<int64_t>(indptr.size()) - 1; }
};

inline SparseRowsForTest RandomSparseRows(std::mt19937& rng, int64_t rows, int32_t width,
                                          int max_k) {
  SparseRowsForTest out;
  for (int64_t r = 0; r < rows; ++r) {
    std::set<int32_t> cols;
    const int k = static_cast<int>(rng() % (max_k + 1));
    while (static_cast<int>(cols.size()) < k) cols.insert(static_cast<int32_t>(rng() % width));
    for (const int32_t c : cols) {
      out.indices.push_back(c);
      out.values.push_back(std::uniform_real_distribution<float>(0.01f, 20.0f)(rng));
    }
    out.indptr.push_back(static_cast<int64_t>(out.indices.size()));
    out.tokens.push_back(static_cast<int32_t>(rng() % 4096));
  }
  return out;
}

// Appends `rows` to `writer` and commits them.
inline absl::Status AppendAndCommit(DatasetWriter& writer, const SparseRowsForTest& rows) {
  if (absl::Status s = writer.AppendSparse(rows.rows(), rows.indptr.data(), rows.indices.data(),
                                           rows.values.data(), rows.tokens.data());
      !s.ok()) {
    return s;
  }
  return writer.Commit();
}

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_SPARSE_ROWS_TESTING_H_
