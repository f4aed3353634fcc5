// How the exports of storage/export.h cut a range into blocks (private to //storage:export).
#ifndef LATENTD_STORAGE_EXPORT_BLOCKS_H_
#define LATENTD_STORAGE_EXPORT_BLOCKS_H_

#include <algorithm>
#include <cstdint>

#include "storage/chunk_store.h"

namespace latentd::storage {

// Rows read and written per block at most, whatever the value budget allows.
inline constexpr int64_t kMaxExportBlockRows = int64_t{1} << 20;

// Rows per block: `block_values` at the dataset's mean row (MeanValuesPerRow), within
// [1, kMaxExportBlockRows].
inline int64_t ExportBlockRows(const DatasetRecord& rec, int64_t block_values) {
  const double per_row = std::max(1.0, MeanValuesPerRow(rec));
  return std::clamp<int64_t>(static_cast<int64_t>(block_values / per_row), 1, kMaxExportBlockRows);
}

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_EXPORT_BLOCKS_H_
