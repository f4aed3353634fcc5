// Where the extraction pipeline puts its rows: an append-then-commit writer with a watermark, the
// shape of storage::DatasetWriter (adapter: chunk_store_sink.h), plus an in-memory fake for tests.
// Torch-free.
#ifndef LATENTD_ENGINE_ROW_SINK_H_
#define LATENTD_ENGINE_ROW_SINK_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "storage/reconstruction_fit.h"

namespace latentd::engine {

class RowSink {
 public:
  virtual ~RowSink() = default;
  // Rows durably committed (the watermark): a resumed run starts there.
  virtual int64_t rows_committed() const = 0;
  virtual int64_t rows_pending() const = 0;
  // CSR rows: indptr has num_rows + 1 entries from 0; indices unique within a row.
  virtual absl::Status AppendSparse(int64_t num_rows, const int64_t* indptr, const int32_t* indices,
                                    const float* values, const int32_t* token_ids) = 0;
  // Dense rows: num_rows x width row-major floats.
  virtual absl::Status AppendDense(int64_t num_rows, const float* values,
                                   const int32_t* token_ids) = 0;
  // How well the SAE reconstructs the rows appended since the last commit: committed with them
  // (added to the dataset's totals) or lost with them. Default: not kept.
  virtual absl::Status AddReconstructionSums(const storage::ReconstructionFit&) {
    return absl::OkStatus();
  }
  // The totals over the committed rows; no rows when the sink keeps none.
  virtual storage::ReconstructionFit fit_committed() const { return {}; }
  // Makes every pending row durable at once; on failure nothing of it is.
  virtual absl::Status Commit() = 0;
  // Starts making every pending row durable and returns without waiting; rows_committed()
  // advances once they are. At most one commit is in flight: the next CommitAsync, Commit or
  // MarkComplete waits for it and reports its failure. Default: Commit().
  virtual absl::Status CommitAsync() { return Commit(); }
  // Waits for the commit in flight, if any; its status.
  virtual absl::Status WaitDurable() { return absl::OkStatus(); }
  // Commit + flag the dataset complete.
  virtual absl::Status MarkComplete() = 0;
  // Bytes the committed rows occupy as stored; -1 when the sink cannot tell cheaply.
  virtual int64_t bytes_committed() const { return -1; }
  // Nonzeros of every committed row, earlier runs' included; -1 when the sink cannot tell.
  virtual int64_t nnz_committed() const { return -1; }
  // Bytes the sink's disk has left; -1 when it has none or cannot tell.
  virtual int64_t free_disk_bytes() const { return -1; }
};

// The committed content of an in-memory dataset; outlives the sinks (writers) opened on it, the
// way a store outlives a crashed writer.
struct InMemoryDataset {
  int32_t width = 0;
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices;
  std::vector<float> values;  // sparse values, or dense rows x width
  std::vector<int32_t> token_ids;
  int64_t rows() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t commits = 0;
  bool complete = false;
  storage::ReconstructionFit fit;  // of the committed rows
};

// A writer on an InMemoryDataset. Pending rows die with it (as after a crash). `fail_commit_at`
// (1-based commit number; 0 = never) makes that Commit fail, for fault tests.
class InMemoryRowSink : public RowSink {
 public:
  explicit InMemoryRowSink(InMemoryDataset* dataset, int64_t fail_commit_at = 0)
      : ds_(dataset), fail_commit_at_(fail_commit_at) {}

  int64_t rows_committed() const override { return ds_->rows(); }
  int64_t rows_pending() const override { return static_cast<int64_t>(token_ids_.size()); }
  absl::Status AppendSparse(int64_t num_rows, const int64_t* indptr, const int32_t* indices,
                            const float* values, const int32_t* token_ids) override {
    if (ds_->complete) return absl::FailedPreconditionError("dataset complete");
    if (indptr[0] != 0) return absl::InvalidArgumentError("indptr[0] != 0");
    const int64_t base = indptr_.empty() ? 0 : indptr_.back();
    for (int64_t r = 0; r < num_rows; ++r) {
      if (indptr[r + 1] < indptr[r]) return absl::InvalidArgumentError("indptr not monotone");
      indptr_.push_back(base + indptr[r + 1]);
    }
    for (int64_t i = 0; i < indptr[num_rows]; ++i) {
      if (indices[i] < 0 || indices[i] >= ds_->width) {
        return absl::InvalidArgumentError("index out of range");
      }
    }
    indices_.insert(indices_.end(), indices, indices + indptr[num_rows]);
    values_.insert(values_.end(), values, values + indptr[num_rows]);
    token_ids_.insert(token_ids_.end(), token_ids, token_ids + num_rows);
    return absl::OkStatus();
  }
  absl::Status AppendDense(int64_t num_rows, const float* values,
                           const int32_t* token_ids) override {
    if (ds_->complete) return absl::FailedPreconditionError("dataset complete");
    values_.insert(values_.end(), values, values + num_rows * ds_->width);
    token_ids_.insert(token_ids_.end(), token_ids, token_ids + num_rows);
    return absl::OkStatus();
  }
  absl::Status AddReconstructionSums(const storage::ReconstructionFit& sums) override {
    return pending_fit_.Add(sums);
  }
  storage::ReconstructionFit fit_committed() const override { return ds_->fit; }
  absl::Status Commit() override {
    if (fail_commit_at_ > 0 && ds_->commits + 1 == fail_commit_at_) {
      return absl::UnavailableError("injected commit failure");
    }
    if (absl::Status s = ds_->fit.Add(pending_fit_); !s.ok()) return s;
    pending_fit_ = storage::ReconstructionFit();
    const int64_t base = ds_->indptr.back();
    for (int64_t p : indptr_) ds_->indptr.push_back(base + p);
    ds_->indices.insert(ds_->indices.end(), indices_.begin(), indices_.end());
    ds_->values.insert(ds_->values.end(), values_.begin(), values_.end());
    ds_->token_ids.insert(ds_->token_ids.end(), token_ids_.begin(), token_ids_.end());
    indptr_.clear();
    indices_.clear();
    values_.clear();
    token_ids_.clear();
    ++ds_->commits;
    return absl::OkStatus();
  }
  absl::Status MarkComplete() override {
    absl::Status s = Commit();
    if (s.ok()) ds_->complete = true;
    return s;
  }

 private:
  InMemoryDataset* ds_;
  int64_t fail_commit_at_;
  std::vector<int64_t> indptr_;  // per pending row, cumulative from the first pending row
  std::vector<int32_t> indices_;
  std::vector<float> values_;
  std::vector<int32_t> token_ids_;
  storage::ReconstructionFit pending_fit_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_ROW_SINK_H_
