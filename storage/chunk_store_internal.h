// Private to //storage:chunk_store: what its two halves share. chunk_store.cc holds the store
// and its reads; dataset_writer.cc holds DatasetWriter, the commits. Not part of the storage API
// (the target lists this header in srcs: its dependents do not see it).

#ifndef LATENTD_STORAGE_CHUNK_STORE_INTERNAL_H_
#define LATENTD_STORAGE_CHUNK_STORE_INTERNAL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "storage/chunk_codec.h"
#include "storage/chunk_store.h"

namespace latentd::storage::chunk_store_internal {

// The watermark record: everything a commit advances.
struct Watermark {
  int64_t rows = 0, nnz = 0, chunks = 0, live_latents = 0, blob_bytes = 0;
  bool complete = false;
};
// The watermark value of `r` (rows, nnz, chunks, live latents, complete) with `blob_bytes`.
std::string EncodeWatermark(const DatasetRecord& r, int64_t blob_bytes);
// DATA_LOSS for a malformed record (wrong size, a negative count).
absl::Status DecodeWatermark(absl::string_view in, Watermark* w);

// The chunk codec's dtype of a dataset's value dtype.
ChunkDtype ToChunkDtype(ValueDtype d);

// A malformed statistics record or top-N list, named for the reader.
absl::Status LatentIndexError(uint64_t id, int32_t latent, const char* what, const absl::Status& s);

}  // namespace latentd::storage::chunk_store_internal

#endif  // LATENTD_STORAGE_CHUNK_STORE_INTERNAL_H_
