// Stored DENSE datasets as the model of an EXTRACT job (ModelSpec.stored): a batch's "forward
// pass" reads its rows from the store, every source's side by side, so the pipeline encodes
// stored activations as it encodes a model's (batching, commits, resume, several devices).
#ifndef LATENTD_ENGINE_STORED_ACTIVATIONS_MODEL_H_
#define LATENTD_ENGINE_STORED_ACTIVATIONS_MODEL_H_

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/activation_model.h"
#include "engine/stored_dense.h"

namespace latentd::engine {

// One activation: the sources' rows side by side (a crosscoder's input; an SAE's is one
// source), given once per output of the job (each output encodes it with its own SAE).
class StoredActivationsModel final : public ActivationModel {
 public:
  // `sources` hold the same rows; the shard's row 0 is their row `shard_first_row`; batches go to
  // `device`; `outputs` >= 1 hooks, each the same tensor.
  StoredActivationsModel(std::vector<std::shared_ptr<const StoredDenseRows>> sources,
                         int64_t shard_first_row, const at::Device& device, int outputs = 1);

  // Throws: rows are read by position (HooksOfRows).
  at::Tensor Forward(const at::Tensor& tokens) override;
  // [batch, seq, hook_width()] float32 on the device, tokens [batch, seq] giving the shape.
  absl::StatusOr<std::vector<at::Tensor>> HooksOfRows(int64_t shard_row,
                                                      const at::Tensor& tokens) override;

  int64_t hook_width() const override { return width_; }
  std::vector<int64_t> hook_widths() const override {
    return std::vector<int64_t>(outputs_, width_);
  }
  int64_t vocab_size() const override { return 0; }
  int64_t max_context() const override { return 0; }
  int64_t parameter_bytes() const override { return 0; }
  int64_t activation_bytes_per_token(int64_t) const override { return 8 * width_; }
  // The sources' models, " + "-joined where they differ (a crosscoder diffing two models).
  const std::string& model_id() const override { return model_id_; }
  const std::string& weight_hash() const override { return weight_hash_; }

 private:
  std::vector<std::shared_ptr<const StoredDenseRows>> sources_;
  int64_t shard_first_row_;
  at::Device device_;
  int outputs_;
  int64_t width_ = 0;
  std::string model_id_, weight_hash_;
};

// Token ids of the shard's sequences [first, first + count) (context_length rows each, the
// shard's row 0 being the sources' row `shard_first_row`) into `out`, from the first source; the
// others must hold the same ids there: INVALID_ARGUMENT naming `field`[i], the row and both ids
// otherwise (datasets of other tokens side by side would pair unrelated rows).
absl::Status ReadStoredSequences(const std::vector<std::shared_ptr<const StoredDenseRows>>& sources,
                                 int64_t shard_first_row, int64_t context_length,
                                 const std::string& field, int64_t first, int64_t count,
                                 int64_t* out);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_STORED_ACTIVATIONS_MODEL_H_
