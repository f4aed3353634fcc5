// The order in which a TRAIN job visits the rows of a DenseRowSource: shuffled, streamed with
// bounded memory, and a pure function of (seed, global row position) so that a resumed job (or
// every rank of a data-parallel job) reads exactly the rows an uninterrupted run reads.
//
// Epoch e is a sequence of windows; window w holds `window_chunks` chunks, taken in an order
// permuted by (seed, e), and its rows are permuted by (seed, e, w). The stream is the concatenation
// of the epochs. Memory: one window of rows (window_chunks * chunk rows * width floats).
// Torch-free; not thread-safe (one stream per rank).
#ifndef LATENTD_ENGINE_TRAIN_DATA_H_
#define LATENTD_ENGINE_TRAIN_DATA_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/dense_row_source.h"

namespace latentd::engine {

struct ShuffledRowStreamOptions {
  uint64_t seed = 0;
  // Chunks whose rows are shuffled together. Default 4.
  int window_chunks = 4;
};

class ShuffledRowStream {
 public:
  ShuffledRowStream(DenseRowSource* source, ShuffledRowStreamOptions options);

  // Copies stream rows [position, position + count) into `out` (count * width floats); the stream
  // wraps into the next epoch at the end of one.
  absl::Status Read(int64_t position, int64_t count, float* out);

 private:
  struct Window {
    int64_t epoch = -1;
    int64_t index = -1;
    int64_t first_position = 0;  // in-epoch position of its first row
    std::vector<float> rows;     // already permuted
    int64_t num_rows = 0;
  };
  absl::Status LoadWindow(int64_t epoch, int64_t in_epoch_position);

  DenseRowSource* source_;
  ShuffledRowStreamOptions options_;
  std::vector<int64_t> starts_;  // chunk starts plus num_rows at the end
  int64_t epoch_order_epoch_ = -1;
  std::vector<int64_t> epoch_order_;     // chunk order of the current epoch
  std::vector<int64_t> window_offsets_;  // in-epoch position of each window's first row
  Window window_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TRAIN_DATA_H_
