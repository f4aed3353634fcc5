// Where a TRAIN job reads its dense rows from: a DENSE dataset of the store (through an adapter) or
// an in-memory matrix (tests, benchmarks). Torch-free.
//
// Rows are fp32, `width()` values each. Rows are grouped in chunks (the store's commit unit); the
// trainer shuffles chunk order and rows within a window of chunks, so it reads whole chunks and
// needs only their boundaries.
#ifndef LATENTD_ENGINE_DENSE_ROW_SOURCE_H_
#define LATENTD_ENGINE_DENSE_ROW_SOURCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latentd::engine {

// Rows [start, start + count).
struct RowRange {
  int64_t start = 0;
  int64_t count = 0;
};

class DenseRowSource {
 public:
  virtual ~DenseRowSource() = default;

  virtual int64_t num_rows() const = 0;
  virtual int64_t width() const = 0;
  // First row of each chunk, ascending, starting at 0; chunk i spans
  // [chunk_starts()[i], chunk_starts()[i + 1]) (the last one ends at num_rows()).
  virtual std::vector<int64_t> chunk_starts() const = 0;
  // Copies rows [row_start, row_start + row_count) into `out` (row_count * width() floats).
  // OUT_OF_RANGE past the end; DATA_LOSS naming the chunk for corrupt data.
  virtual absl::Status Read(int64_t row_start, int64_t row_count, float* out) = 0;
  // Copies the ranges' rows into `out`, one range after another (what Read would copy for each,
  // in turn, which is what this default does). A source that computes its rows does a window's
  // ranges in one go.
  virtual absl::Status ReadRanges(const std::vector<RowRange>& ranges, float* out);
};

// Chunks of `chunk_rows` rows each (the last may be shorter): 0, chunk_rows, 2 * chunk_rows, ...
// below num_rows; what chunk_starts() returns for sources cut at a fixed stride.
std::vector<int64_t> EvenChunkStarts(int64_t num_rows, int64_t chunk_rows);

// Rows held in memory, split into chunks of `chunk_rows` (the last may be shorter).
class InMemoryDenseRowSource : public DenseRowSource {
 public:
  InMemoryDenseRowSource(std::vector<float> values, int64_t width, int64_t chunk_rows);

  int64_t num_rows() const override { return num_rows_; }
  int64_t width() const override { return width_; }
  std::vector<int64_t> chunk_starts() const override;
  absl::Status Read(int64_t row_start, int64_t row_count, float* out) override;

 private:
  std::vector<float> values_;
  int64_t width_;
  int64_t chunk_rows_;
  int64_t num_rows_;
};

// Sources of the same rows side by side, row i being the first source's row i, then the
// second's, ... (width the sum of theirs): what a transcoder trains on (the hook it reads and the
// hook it predicts) and a cross-layer transcoder (every block's input, then every block's
// target), shuffled as one. Chunks are the first source's. The caller checks that all hold the
// same rows (Create checks only the counts).
class SideBySideDenseRowSource : public DenseRowSource {
 public:
  // INVALID_ARGUMENT for fewer than one source or row counts that differ.
  static absl::StatusOr<std::unique_ptr<SideBySideDenseRowSource>> Create(
      std::vector<std::unique_ptr<DenseRowSource>> sources);

  int64_t num_rows() const override { return sources_[0]->num_rows(); }
  int64_t width() const override { return width_; }
  std::vector<int64_t> chunk_starts() const override { return sources_[0]->chunk_starts(); }
  absl::Status Read(int64_t row_start, int64_t row_count, float* out) override;

 private:
  explicit SideBySideDenseRowSource(std::vector<std::unique_ptr<DenseRowSource>> sources);

  std::vector<std::unique_ptr<DenseRowSource>> sources_;
  int64_t width_ = 0;
  std::vector<float> part_;  // one source's rows of a Read
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_DENSE_ROW_SOURCE_H_
