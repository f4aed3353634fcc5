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
// Rows stream through in blocks (ExportOptions::block_values), so an export of any size runs in
// the memory of one block: NPZ members larger than 4 GiB go in ZIP64 fields, and every member
// but the largest passes through a side file beside `path` (NpzWriter); HDF5 arrays are chunked
// and grow block by block. The file is written to `path` + ".tmp" and renamed, so a failed or
// cancelled export leaves no partial file under `path`.
#ifndef LATENTD_STORAGE_EXPORT_H_
#define LATENTD_STORAGE_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "storage/chunk_store.h"

namespace latentd::storage {

enum class ExportFormat { kNpz, kHdf5, kParquet, kDelphi };

// delphi's default n_splits.
inline constexpr int kDefaultDelphiSplits = 5;

// Called after each block with the rows read so far and the rows the export reads in all
// (DELPHI reads its range once per group of splits, so its total counts every pass). Returning
// false stops the export: CANCELLED, and nothing is left under the path.
using ExportProgress = std::function<bool(int64_t rows_done, int64_t rows_total)>;

// DELPHI's default bound on the firings gathered in memory per read pass (12 B each).
inline constexpr int64_t kDelphiGatherBytes = int64_t{512} << 20;

struct ExportOptions {
  // DELPHI: files per hook, each one range of latents; 0 means kDefaultDelphiSplits.
  int delphi_splits = 0;
  // DELPHI: memory for the firings gathered per read pass; splits beyond it are gathered in
  // further passes. Default kDelphiGatherBytes.
  int64_t delphi_gather_bytes = kDelphiGatherBytes;
  // Values read and written per block (SPARSE: firings at the dataset's mean per row; DENSE:
  // rows x width): the export's working memory, about 10 B a value. Default 4M (about 40 MB).
  int64_t block_values = int64_t{1} << 22;
  // Called with 0 rows done before the first block and again after each block; false stops the
  // export. May be empty (no progress, never stopped).
  ExportProgress progress;
  // NPZ sizes and offsets from this many bytes on are written as ZIP64 (NpzWriterOptions).
  // Default: the classic format's 4 GiB limit; tests lower it.
  uint64_t npz_zip64_from = 0xffffffffull;
};

struct ExportResult {
  std::string path;  // what was written: the file, or DELPHI's <latents_dir>/<hook> directory
  int64_t rows = 0;
  int64_t nnz = 0;
  int64_t bytes = 0;  // size of the written file (DELPHI: of every file written)
};

// Rows [row_start, row_start + row_count) (row_count 0: to the rows committed when it starts;
// rows an extraction commits meanwhile are not included). The caller has already checked that
// `path` is allowed. OUT_OF_RANGE / NOT_FOUND / DATA_LOSS as the readers; RESOURCE_EXHAUSTED
// when a write fails (a full disk); CANCELLED when `progress` says stop.
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
// [1, d_sae]. Takes delphi_splits, delphi_gather_bytes, block_values and progress from
// `options`.
absl::StatusOr<ExportResult> ExportDelphi(const ChunkStore& store, uint64_t id, int64_t row_start,
                                          int64_t row_count, const std::string& latents_dir,
                                          const ExportOptions& options = ExportOptions());

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_EXPORT_H_
