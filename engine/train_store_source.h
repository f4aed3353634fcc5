// A DENSE dataset of the chunk store as a DenseRowSource: the committed rows, read a chunk range
// at a time (ChunkStore reads run on one snapshot each, so a concurrent commit never tears a read).
#ifndef LATENTD_ENGINE_TRAIN_STORE_SOURCE_H_
#define LATENTD_ENGINE_TRAIN_STORE_SOURCE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dense_row_source.h"
#include "storage/chunk_store.h"

namespace latentd::engine {

class StoreDenseRowSource : public DenseRowSource {
 public:
  // NOT_FOUND for a missing dataset, INVALID_ARGUMENT naming "train.dataset_id" when it is not
  // DENSE, FAILED_PRECONDITION when it has no committed rows.
  static absl::StatusOr<std::unique_ptr<StoreDenseRowSource>> Open(const storage::ChunkStore* store,
                                                                   uint64_t dataset_id);

  int64_t num_rows() const override { return num_rows_; }
  int64_t width() const override { return width_; }
  std::vector<int64_t> chunk_starts() const override { return chunk_starts_; }
  absl::Status Read(int64_t row_start, int64_t row_count, float* out) override;

  const storage::DatasetRecord& record() const { return record_; }

 private:
  StoreDenseRowSource() = default;

  const storage::ChunkStore* store_ = nullptr;
  storage::DatasetRecord record_;
  int64_t num_rows_ = 0;
  int64_t width_ = 0;
  std::vector<int64_t> chunk_starts_;
  std::vector<float> buffer_;
  std::vector<int32_t> tokens_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TRAIN_STORE_SOURCE_H_
