#include "engine/extract_job.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/chunk_store.h"

namespace latentd::engine {
namespace {

// RowSink over a storage::DatasetWriter.
class ChunkStoreSink : public RowSink {
 public:
  ChunkStoreSink(storage::ChunkStore* store, uint64_t id,
                 std::unique_ptr<storage::DatasetWriter> writer)
      : store_(store), id_(id), writer_(std::move(writer)) {
    RefreshBytes();
  }
  int64_t rows_committed() const override { return writer_->rows_committed(); }
  int64_t rows_pending() const override { return writer_->rows_pending(); }
  absl::Status AppendSparse(int64_t num_rows, const int64_t* indptr, const int32_t* indices,
                            const float* values, const int32_t* token_ids) override {
    return writer_->AppendSparse(num_rows, indptr, indices, values, token_ids);
  }
  absl::Status AppendDense(int64_t num_rows, const float* values,
                           const int32_t* token_ids) override {
    return writer_->AppendDense(num_rows, values, token_ids);
  }
  absl::Status AddReconstructionSums(const storage::ReconstructionFit& sums) override {
    return writer_->AddReconstructionSums(sums);
  }
  storage::ReconstructionFit fit_committed() const override {
    auto fit = store_->GetReconstructionFit(id_);
    return fit.ok() ? *std::move(fit) : storage::ReconstructionFit();
  }
  absl::Status Commit() override {
    RETURN_IF_ERROR(writer_->Commit());
    RefreshBytes();
    return absl::OkStatus();
  }
  absl::Status CommitAsync() override {
    RETURN_IF_ERROR(writer_->CommitAsync());
    RefreshBytes();  // what is durable so far
    return absl::OkStatus();
  }
  absl::Status WaitDurable() override {
    RETURN_IF_ERROR(writer_->WaitDurable());
    RefreshBytes();
    return absl::OkStatus();
  }
  absl::Status MarkComplete() override {
    RETURN_IF_ERROR(writer_->MarkComplete());
    RefreshBytes();
    return absl::OkStatus();
  }
  int64_t bytes_committed() const override { return bytes_; }
  int64_t nnz_committed() const override { return nnz_; }
  int64_t free_disk_bytes() const override { return store_->db()->FreeDiskBytes(); }

 private:
  void RefreshBytes() {
    auto info = store_->GetDataset(id_);
    if (!info.ok()) return;
    bytes_ = info->bytes_on_disk();
    nnz_ = info->nnz();
  }
  storage::ChunkStore* store_;
  uint64_t id_;
  std::unique_ptr<storage::DatasetWriter> writer_;
  int64_t bytes_ = -1, nnz_ = -1;
};

// A dataset committed and flagged complete in an earlier run: nothing left to write.
class CompleteSink : public RowSink {
 public:
  CompleteSink(int64_t rows, int64_t bytes, int64_t nnz, storage::ReconstructionFit fit)
      : rows_(rows), bytes_(bytes), nnz_(nnz), fit_(std::move(fit)) {}
  int64_t rows_committed() const override { return rows_; }
  int64_t rows_pending() const override { return 0; }
  absl::Status AppendSparse(int64_t, const int64_t*, const int32_t*, const float*,
                            const int32_t*) override {
    return absl::FailedPreconditionError("dataset complete");
  }
  absl::Status AppendDense(int64_t, const float*, const int32_t*) override {
    return absl::FailedPreconditionError("dataset complete");
  }
  absl::Status Commit() override { return absl::OkStatus(); }
  absl::Status MarkComplete() override { return absl::OkStatus(); }
  int64_t bytes_committed() const override { return bytes_; }
  int64_t nnz_committed() const override { return nnz_; }
  storage::ReconstructionFit fit_committed() const override { return fit_; }

 private:
  int64_t rows_, bytes_, nnz_;
  storage::ReconstructionFit fit_;
};

// resume_from_job_id named a job whose dataset was deleted since.
absl::Status ContinuedDatasetGone(uint64_t from_job, const std::string& name) {
  return absl::FailedPreconditionError(absl::StrCat("extract.resume_from_job_id: job ", from_job,
                                                    "'s dataset ", name, " no longer exists"));
}

storage::ValueDtype ToStorage(latentd::v1::ValueDtype d) {
  switch (d) {
    case latentd::v1::BFLOAT16:
      return storage::ValueDtype::kBFloat16;
    case latentd::v1::FLOAT32:
      return storage::ValueDtype::kFloat32;
    default:
      return storage::ValueDtype::kFloat16;
  }
}

}  // namespace

SinkOpener ChunkStoreSinkOpener(storage::ChunkStore* store) {
  return [store](const ExtractDatasetMeta& m) -> absl::StatusOr<OpenedSink> {
    if (store == nullptr) return absl::FailedPreconditionError("no chunk store");
    OpenedSink opened;
    auto found = store->FindDataset(m.name);
    if (found.ok()) {
      ASSIGN_OR_RETURN(storage::DatasetRecord rec, store->GetRecord(*found));
      const bool adopting = m.adopt_from_job != 0 && rec.meta.job_id == m.adopt_from_job;
      if (rec.meta.job_id != m.job_id && !adopting) {
        return absl::AlreadyExistsError(absl::StrCat("extract.dataset_name: dataset ", m.name,
                                                     " belongs to job ", rec.meta.job_id));
      }
      if (rec.meta.rows_planned != m.rows_planned || rec.meta.width != m.width ||
          rec.meta.context_length != m.context_length ||
          rec.meta.model_weight_hash != m.model_weight_hash) {
        return absl::FailedPreconditionError(
            absl::StrCat("dataset ", m.name,
                         " was started with other inputs (rows, width, context or model "
                         "weights differ); cannot resume it"));
      }
      // Datasets from before the SAE's hash was recorded carry none: nothing to compare.
      if (rec.meta.encoder != m.encoder || rec.meta.k != m.k ||
          (!rec.meta.sae_weight_hash.empty() && rec.meta.sae_weight_hash != m.sae_weight_hash)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "dataset ", m.name, " was started with another SAE (", rec.meta.encoder,
            " k=", rec.meta.k, ", weights ", rec.meta.sae_weight_hash, "; now ", m.encoder,
            " k=", m.k, ", weights ", m.sae_weight_hash, "); cannot resume it"));
      }
      if (adopting) RETURN_IF_ERROR(store->ReassignDataset(*found, m.adopt_from_job, m.job_id));
      opened.dataset_id = *found;
      if (rec.complete) {
        auto info = store->GetDataset(*found);
        auto fit = store->GetReconstructionFit(*found);
        opened.sink = std::make_unique<CompleteSink>(
            rec.rows_committed, info.ok() ? info->bytes_on_disk() : -1, rec.nnz,
            fit.ok() ? *std::move(fit) : storage::ReconstructionFit());
        return opened;
      }
    } else if (found.status().code() == absl::StatusCode::kNotFound && m.adopt_from_job != 0) {
      // Starting over would look like a continuation while recomputing everything.
      return ContinuedDatasetGone(m.adopt_from_job, m.name);
    } else if (found.status().code() == absl::StatusCode::kNotFound) {
      storage::DatasetMeta meta;
      meta.name = m.name;
      meta.kind = m.sparse ? storage::DatasetKind::kSparse : storage::DatasetKind::kDense;
      meta.value_dtype = ToStorage(m.value_dtype);
      meta.model_id = m.model_id;
      meta.model_weight_hash = m.model_weight_hash;
      meta.sae_weight_hash = m.sae_weight_hash;
      meta.hook_name = m.hook_name;
      meta.hook_name_out = m.hook_name_out;
      meta.layer = m.layer;
      meta.d_in = m.d_in;
      meta.encoder = m.encoder;
      meta.k = m.k;
      meta.threshold_policy = m.threshold_policy;
      meta.apply_b_dec_to_input = m.apply_b_dec_to_input;
      meta.width = m.width;
      meta.context_length = m.context_length;
      meta.token_source = m.token_source;
      meta.token_order_start = m.token_order_start;
      meta.job_id = m.job_id;
      meta.rows_planned = m.rows_planned;
      meta.postings = m.postings;
      meta.top_n = m.top_n;
      ASSIGN_OR_RETURN(opened.dataset_id, store->CreateDataset(meta));
    } else {
      return found.status();
    }
    ASSIGN_OR_RETURN(std::unique_ptr<storage::DatasetWriter> writer,
                     store->OpenWriter(opened.dataset_id));
    opened.sink = std::make_unique<ChunkStoreSink>(store, opened.dataset_id, std::move(writer));
    return opened;
  };
}

namespace {

class ChunkStoreDenseRows final : public StoredDenseRows {
 public:
  ChunkStoreDenseRows(const storage::ChunkStore* store, const storage::DatasetRecord& record)
      : store_(store) {
    info_.id = record.id;
    info_.name = record.meta.name;
    info_.rows = record.rows_committed;
    info_.rows_planned = record.meta.rows_planned;
    info_.complete = record.complete;
    info_.width = record.meta.width;
    info_.context_length = record.meta.context_length;
    info_.model_id = record.meta.model_id;
    info_.model_weight_hash = record.meta.model_weight_hash;
    info_.hook_name = record.meta.hook_name;
    info_.layer = record.meta.layer;
    info_.token_source = record.meta.token_source;
    info_.token_order_start = record.meta.token_order_start;
    info_.job_id = record.meta.job_id;
  }
  const StoredDenseInfo& info() const override { return info_; }
  absl::Status ReadValues(int64_t row_start, int64_t row_count,
                          std::vector<float>* values) const override {
    return store_->ReadDense(info_.id, row_start, row_count, values, nullptr);
  }
  absl::Status ReadTokens(int64_t row_start, int64_t row_count,
                          std::vector<int32_t>* token_ids) const override {
    return store_->ReadTokens(info_.id, row_start, row_count, token_ids);
  }

 private:
  const storage::ChunkStore* store_;
  StoredDenseInfo info_;
};

}  // namespace

StoredDenseOpener ChunkStoreDenseOpener(const storage::ChunkStore* store) {
  return
      [store](uint64_t id,
              const std::string& field) -> absl::StatusOr<std::shared_ptr<const StoredDenseRows>> {
        auto record = store->GetRecord(id);
        if (absl::IsNotFound(record.status())) {
          return absl::NotFoundError(absl::StrCat(field, ": no dataset ", id));
        }
        if (!record.ok()) return record.status();
        if (record->meta.kind != storage::DatasetKind::kDense) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ": dataset ", id, " (", record->meta.name,
              ") is SPARSE; a stored model reads hidden states, a DENSE dataset EXTRACT wrote"));
        }
        return std::make_shared<ChunkStoreDenseRows>(store, *record);
      };
}

namespace {

// The env with free_disk_bytes and open_stored_dense, when unset, from the store.
ExtractEnv WithStore(const ExtractEnv& env) {
  ExtractEnv checked = env;
  if (!checked.free_disk_bytes && env.store != nullptr) {
    storage::Db* db = env.store->db();
    checked.free_disk_bytes = [db] { return db->FreeDiskBytes(); };
  }
  if (!checked.open_stored_dense && env.store != nullptr) {
    checked.open_stored_dense = ChunkStoreDenseOpener(env.store);
  }
  return checked;
}

// A continuing spec's datasets are still there and still the continued job's.
absl::Status CheckContinuedDatasets(const latentd::v1::ExtractSpec& spec, const ExtractEnv& env) {
  const uint64_t from = spec.resume_from_job_id();
  if (from == 0 || env.store == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ExtractDatasetNamesFor(spec, env, 0));
  for (const std::string& name : names) {
    auto id = env.store->FindDataset(name);
    if (absl::IsNotFound(id.status())) return ContinuedDatasetGone(from, name);
    RETURN_IF_ERROR(id.status());
    ASSIGN_OR_RETURN(storage::DatasetRecord record, env.store->GetRecord(*id));
    if (record.meta.job_id != from) {
      return absl::FailedPreconditionError(absl::StrCat("extract.resume_from_job_id: dataset ",
                                                        name, " was taken over by job ",
                                                        record.meta.job_id));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateExtractJob(const latentd::v1::ExtractSpec& spec, const ExtractEnv& env) {
  RETURN_IF_ERROR(ValidateExtractSpec(spec, WithStore(env)));
  return CheckContinuedDatasets(spec, env);
}

absl::StatusOr<std::vector<std::string>> DescribeExtractJob(const latentd::v1::ExtractSpec& spec,
                                                            const ExtractEnv& env) {
  ASSIGN_OR_RETURN(std::vector<std::string> lines, DescribeExtractSpec(spec, WithStore(env)));
  RETURN_IF_ERROR(CheckContinuedDatasets(spec, env));
  if (spec.resume_from_job_id() != 0) {
    lines.push_back(absl::StrCat("continues job ", spec.resume_from_job_id(),
                                 "'s datasets from their committed rows"));
  }
  return lines;
}

absl::StatusOr<latentd::v1::ExtractResult> RunExtract(const latentd::v1::ExtractSpec& spec,
                                                      const ExtractEnv& env, JobContext* ctx) {
  if (env.store == nullptr) return absl::FailedPreconditionError("RunExtract: no chunk store");
  return RunExtractToSink(spec, WithStore(env), ctx, ChunkStoreSinkOpener(env.store));
}

}  // namespace latentd::engine
