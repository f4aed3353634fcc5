#include "engine/train_store_source.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::engine {

absl::StatusOr<std::unique_ptr<StoreDenseRowSource>> StoreDenseRowSource::Open(
    const storage::ChunkStore* store, uint64_t dataset_id) {
  auto record = store->GetRecord(dataset_id);
  if (absl::IsNotFound(record.status())) {
    return absl::NotFoundError(absl::StrCat("train.dataset_id: no dataset ", dataset_id));
  }
  if (!record.ok()) return record.status();
  if (record->meta.kind != storage::DatasetKind::kDense) {
    return absl::InvalidArgumentError(absl::StrCat("train.dataset_id: dataset ", dataset_id, " (\"",
                                                   record->meta.name,
                                                   "\") is SPARSE; TRAIN needs a DENSE dataset"));
  }
  if (record->rows_committed <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("train.dataset_id: dataset ", dataset_id, " has no committed rows yet"));
  }
  std::unique_ptr<StoreDenseRowSource> source(new StoreDenseRowSource());
  source->store_ = store;
  source->record_ = *record;
  source->num_rows_ = record->rows_committed;
  source->width_ = record->meta.width;
  ASSIGN_OR_RETURN(source->chunk_starts_, store->ChunkRowStarts(dataset_id));
  return source;
}

absl::Status StoreDenseRowSource::Read(int64_t row_start, int64_t row_count, float* out) {
  if (row_start < 0 || row_count < 0 || row_start + row_count > num_rows_) {
    return absl::OutOfRangeError(absl::StrCat("rows [", row_start, ", ", row_start + row_count,
                                              ") past the dataset's ", num_rows_, " rows"));
  }
  if (row_count == 0) return absl::OkStatus();
  RETURN_IF_ERROR(store_->ReadDense(record_.id, row_start, row_count, &buffer_, &tokens_));
  if (static_cast<int64_t>(buffer_.size()) != row_count * width_) {
    return absl::DataLossError(absl::StrCat("dataset ", record_.id, ": rows [", row_start, ", ",
                                            row_start + row_count, ") read ", buffer_.size(),
                                            " values, expected ", row_count * width_));
  }
  std::memcpy(out, buffer_.data(), sizeof(float) * buffer_.size());
  return absl::OkStatus();
}

}  // namespace latentd::engine
