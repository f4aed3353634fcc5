// A token file as rows for TRAIN: row i is sequence i (context_length token ids, stored as floats,
// exact below 2^24), so the shuffled stream, data parallelism and checkpoints work unchanged; a
// TorchScript module trained on tokens gets them back as int64 (train_models.h). Chunks of 64
// sequences are the shuffling unit.
#ifndef LATENTD_ENGINE_TRAIN_TOKEN_SOURCE_H_
#define LATENTD_ENGINE_TRAIN_TOKEN_SOURCE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dense_row_source.h"
#include "engine/token_source.h"
#include "proto/latentd/v1/extract.pb.h"

namespace latentd::engine {

class TokenRowSource : public DenseRowSource {
 public:
  // Errors name "train.tokens.<field>".
  static absl::StatusOr<std::unique_ptr<TokenRowSource>> Open(const latentd::v1::TokenSource& spec);

  int64_t num_rows() const override { return tokens_->num_sequences(); }
  int64_t width() const override { return tokens_->context_length(); }
  std::vector<int64_t> chunk_starts() const override;
  // INVALID_ARGUMENT for a token id >= 2^24 (not exact as a float).
  absl::Status Read(int64_t row_start, int64_t row_count, float* out) override;

 private:
  explicit TokenRowSource(std::unique_ptr<TokenSource> tokens) : tokens_(std::move(tokens)) {}
  std::unique_ptr<TokenSource> tokens_;
  std::vector<int64_t> buffer_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TRAIN_TOKEN_SOURCE_H_
