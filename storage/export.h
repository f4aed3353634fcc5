// Export of a dataset's row range to files other tools read:
//  - NPZ: what scipy.sparse.save_npz writes (data, indices, indptr, format, shape; a stored zip),
//    plus token_ids and row_start arrays, which scipy.sparse.load_npz ignores. DENSE datasets
//    export "data" as a 2-D array plus token_ids (numpy.load reads it).
//  - HDF5: at the file root, datasets data, indices, indptr, token_ids (DENSE: data 2-D and
//    token_ids), attributes shape, format "csr" and the dataset's metadata.
//  - PARQUET: a row a row: row (int64), token_id (int32), latents (list<int32>) and values
//    (list<float32>), or for DENSE activation (list<float32>, width long); the metadata as JSON
//    under the footer key "latentd" (pandas, polars, DuckDB, `datasets` and the Hub read it).
// fp16 values stay fp16 (NPZ, HDF5); bf16 (which numpy lacks), and every value in Parquet, is
// written as fp32.
// The range is held in memory while exporting (about 8 B per stored value). The file is written
// to `path` + ".tmp" and renamed, so a failed export leaves no partial file under `path`.
#ifndef LATENTD_STORAGE_EXPORT_H_
#define LATENTD_STORAGE_EXPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "storage/chunk_store.h"

namespace latentd::storage {

enum class ExportFormat { kNpz, kHdf5, kParquet };

struct ExportResult {
  int64_t rows = 0;
  int64_t nnz = 0;
  int64_t bytes = 0;  // size of the written file
};

// Rows [row_start, row_start + row_count) (row_count 0: to the committed end). The caller has
// already checked that `path` is allowed. OUT_OF_RANGE / NOT_FOUND / DATA_LOSS as the readers;
// RESOURCE_EXHAUSTED when an NPZ member would pass 4 GiB (no ZIP64 support).
absl::StatusOr<ExportResult> ExportDataset(const ChunkStore& store, uint64_t id, int64_t row_start,
                                           int64_t row_count, ExportFormat format,
                                           const std::string& path);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_EXPORT_H_
