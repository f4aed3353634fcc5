// A model's hidden states as a DenseRowSource: rows are computed when the trainer reads them
// (a forward pass over the sequences that hold them), so an SAE trains on a model's activations
// without a DENSE dataset on disk. Row r is position r % L of sequence r / L of the token shard,
// as in the dataset an EXTRACT job of the same spec would write, and chunks are cut where that
// dataset's are (every chunk_rows rows), so the trainer visits the rows in the same order.
// Torch-free header; not thread-safe (one source per rank).
#ifndef LATENTD_ENGINE_TRAIN_MODEL_SOURCE_H_
#define LATENTD_ENGINE_TRAIN_MODEL_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/dense_row_source.h"
#include "engine/extract_runner.h"
#include "engine/job_context.h"
#include "proto/latentd/v1/extract.pb.h"

namespace latentd::engine {

class ModelRowSource : public DenseRowSource {
 public:
  // `spec`: model, hook_name, tokens (and batch_sequences) of a DENSE extraction; errors name
  // "extract.<field>". The model is loaded on `device`.
  static absl::StatusOr<std::unique_ptr<ModelRowSource>> Open(const latentd::v1::ExtractSpec& spec,
                                                              const ExtractEnv& env,
                                                              const DeviceRef& device,
                                                              int64_t chunk_rows);
  ~ModelRowSource() override;

  int64_t num_rows() const override;
  int64_t width() const override;
  std::vector<int64_t> chunk_starts() const override;
  // Runs the model over the sequences holding rows [row_start, row_start + row_count), in
  // batches of batch_sequences. INVALID_ARGUMENT naming train.activations.tokens and the
  // sequence for a token id outside the model's vocabulary; INTERNAL for a failed forward pass.
  absl::Status Read(int64_t row_start, int64_t row_count, float* out) override;

  const std::string& model_id() const;

 private:
  ModelRowSource(ExtractInputs inputs, DeviceRef device, int64_t chunk_rows);

  ExtractInputs inputs_;
  DeviceRef device_;
  int64_t chunk_rows_;
  std::vector<int64_t> ids_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TRAIN_MODEL_SOURCE_H_
