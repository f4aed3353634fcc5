// Export of a dataset's row range to files other tools read:
//  - NPZ: what scipy.sparse.save_npz writes (data, indices, indptr, format, shape; a stored zip),
//    plus token_ids and row_start arrays, which scipy.sparse.load_npz ignores. DENSE datasets
//    export "data" as a 2-D array plus token_ids (numpy.load reads it).
//  - HDF5: at the file root, datasets data, indices, indptr, token_ids (DENSE: data 2-D and
//    token_ids), attributes shape, format "csr" and the dataset's metadata.
//  - PARQUET: a row a row: row (int64), token_id (int32), latents (list<int32>) and values
//    (list<float32>), or for DENSE activation (list<float32>, width long); the metadata as JSON
//    under the footer key "latentd" (pandas, polars, DuckDB, `datasets` and the Hub read it).
//  - DELPHI (SPARSE): the latent cache EleutherAI's delphi writes and reads for automatic
//    interpretability; `path` is the latents directory and the dataset becomes <path>/<hook>/
//    (ExportDelphi below).
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

enum class ExportFormat { kNpz, kHdf5, kParquet, kDelphi };

// delphi's default n_splits.
inline constexpr int kDefaultDelphiSplits = 5;

struct ExportOptions {
  // DELPHI: files per hook, each one range of latents; 0 means kDefaultDelphiSplits.
  int delphi_splits = 0;
};

struct ExportResult {
  std::string path;  // what was written: the file, or DELPHI's <latents_dir>/<hook> directory
  int64_t rows = 0;
  int64_t nnz = 0;
  int64_t bytes = 0;  // size of the written file (DELPHI: of every file written)
};

// Rows [row_start, row_start + row_count) (row_count 0: to the committed end). The caller has
// already checked that `path` is allowed. OUT_OF_RANGE / NOT_FOUND / DATA_LOSS as the readers;
// RESOURCE_EXHAUSTED when an NPZ member would pass 4 GiB (no ZIP64 support).
absl::StatusOr<ExportResult> ExportDataset(const ChunkStore& store, uint64_t id, int64_t row_start,
                                           int64_t row_count, ExportFormat format,
                                           const std::string& path,
                                           const ExportOptions& options = ExportOptions());

// A SPARSE dataset's rows [row_start, row_start + row_count) as a delphi latent cache under
// `latents_dir` (LatentCache.save_splits' layout, which delphi's LatentDataset reads):
//   <latents_dir>/<hook>/<first>_<last>.safetensors for `splits` equal ranges of latents
//     (first = s * d_sae / splits), each with
//     locations    [n, 3] uint16 (uint32 when a value passes 65535): sequence within the range,
//                  position in it, latent - first; in row order, latents ascending in a row;
//     activations  [n] float16 (float32 when one passes 65504);
//     tokens       [sequences, context length] int32, in every file, as delphi's loader takes
//                  them from whichever file it opens first;
//   <latents_dir>/<hook>/config.json: model_name (delphi's tokenizer), ctx_len, n_tokens,
//     n_splits, dataset_repo (the token source) and the dataset's own description ("latentd").
// <hook> is the dataset's hook name ("dataset-<id>" when it has none), so the datasets of several
// layers exported into one directory are one cache. The range must be whole sequences
// (INVALID_ARGUMENT naming row_start / row_count otherwise); row_count 0 takes every sequence
// committed whole. An earlier export of the same hook is replaced only once the new one is
// complete (it is built in a hidden directory beside it). Reads the range once, gathering every
// split's firings (12 B each) when they fit `gather_bytes` (512 MiB), else in groups of splits
// that do, one read per group. INVALID_ARGUMENT for a DENSE dataset or splits outside
// [1, d_sae].
inline constexpr int64_t kDelphiGatherBytes = int64_t{512} << 20;
absl::StatusOr<ExportResult> ExportDelphi(const ChunkStore& store, uint64_t id, int64_t row_start,
                                          int64_t row_count, int splits,
                                          const std::string& latents_dir,
                                          int64_t gather_bytes = kDelphiGatherBytes);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_EXPORT_H_
