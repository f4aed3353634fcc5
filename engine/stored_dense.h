// DENSE datasets of the store as an EXTRACT job reads them when it encodes stored activations
// (ModelSpec.stored) instead of running a model. Torch-free; extract_job.h binds it to the chunk
// store, and tests to rows in memory.
#ifndef LATENTD_ENGINE_STORED_DENSE_H_
#define LATENTD_ENGINE_STORED_DENSE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latentd::engine {

// What a stored DENSE dataset holds (its record in the store).
struct StoredDenseInfo {
  uint64_t id = 0;
  std::string name;
  int64_t rows = 0;  // committed
  int64_t rows_planned = 0;
  bool complete = false;
  int64_t width = 0;           // values a row
  int32_t context_length = 0;  // rows a sequence
  std::string model_id, model_weight_hash, hook_name;
  int32_t layer = 0;
  std::string token_source;  // as the job that wrote it described its tokens
  int64_t token_order_start = 0;
  uint64_t job_id = 0;  // the job that wrote it
};

// A stored DENSE dataset's committed rows. Reads are safe from several threads at once (each
// reads one consistent snapshot of the store).
class StoredDenseRows {
 public:
  virtual ~StoredDenseRows() = default;
  virtual const StoredDenseInfo& info() const = 0;
  // Rows [row_start, row_start + row_count) as row_count * width floats, row-major.
  // OUT_OF_RANGE past the committed rows; DATA_LOSS naming the chunk for corrupt data.
  virtual absl::Status ReadValues(int64_t row_start, int64_t row_count,
                                  std::vector<float>* values) const = 0;
  // Their token ids.
  virtual absl::Status ReadTokens(int64_t row_start, int64_t row_count,
                                  std::vector<int32_t>* token_ids) const = 0;
};

// Opens a DENSE dataset by id. Errors name `field` (e.g. "extract.model.stored.dataset_ids[1]"):
// NOT_FOUND for an unknown id, INVALID_ARGUMENT for a SPARSE dataset.
using StoredDenseOpener = std::function<absl::StatusOr<std::shared_ptr<const StoredDenseRows>>(
    uint64_t dataset_id, const std::string& field)>;

// Rows held in memory (tests): `values` is rows x info.width floats, `token_ids` rows ids;
// info.rows is set from them.
std::shared_ptr<const StoredDenseRows> InMemoryStoredDenseRows(StoredDenseInfo info,
                                                               std::vector<float> values,
                                                               std::vector<int32_t> token_ids);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_STORED_DENSE_H_
