// A model's hidden states as a DenseRowSource: rows are computed when the trainer reads them
// (a forward pass over the sequences that hold them), so an SAE trains on a model's activations
// without a DENSE dataset on disk. Row r is position r % L of sequence r / L of the token shard,
// as in the dataset an EXTRACT job of the same spec would write, and chunks are cut where that
// dataset's are (every chunk_rows rows), so the trainer visits the rows in the same order. A
// spec with more_outputs gives every hook's values side by side in a row (hook_name's first):
// a transcoder's input and target, as PairedDenseRowSource gives them from two datasets.
//
// Data-parallel ranks that each hold such a source can share the forward passes (ShareWork):
// every rank then runs the model over its own part of the sequences a read covers (a whole
// window's chunks, through ReadRanges) and the parts are all-gathered, so n ranks do the model's
// work once instead of n times.
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

class GradientSync;

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
  // When shared, a collective: every rank of the group must make the same calls in the same
  // order; a rank that fails still takes part, and the others then fail too, naming it.
  absl::Status Read(int64_t row_start, int64_t row_count, float* out) override;
  // As Read, over the sequences of all the ranges at once (each run once, however many ranges
  // hold its rows), so that shared ranks split a whole window's sequences.
  absl::Status ReadRanges(const std::vector<RowRange>& ranges, float* out) override;

  // From now on, Read splits its sequences over the ranks of `sync` (null or a world of one:
  // each Read runs them all here). `sync` must outlive the reads; its world's ranks must all
  // share sources opened from the same spec.
  void ShareWork(GradientSync* sync);

  // Sequences this source has run through the model so far.
  int64_t sequences_computed() const { return sequences_computed_; }

  const std::string& model_id() const;

 private:
  ModelRowSource(ExtractInputs inputs, DeviceRef device, int64_t chunk_rows);

  ExtractInputs inputs_;
  DeviceRef device_;
  int64_t chunk_rows_;
  GradientSync* sync_ = nullptr;
  int64_t sequences_computed_ = 0;
  std::vector<int64_t> ids_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TRAIN_MODEL_SOURCE_H_
