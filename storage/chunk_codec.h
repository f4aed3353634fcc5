// The chunk codec: how a run of consecutive rows of one dataset is laid out in a RocksDB value.
//
// A chunk holds rows [row_start, row_start + num_rows) with their token ids next to them (stored
// once, never copied per split). Layout, little-endian:
//
//   u32 magic "LTC1" (values as arrays) or "LTC2" (SPARSE fp16/bf16, values bit-packed)
//   u8 kind | u8 value dtype | u8 index encoding | u8 token bytes (2 or 4)
//   u32 num_rows | u32 width | u64 row_start | u64 nnz
//   token ids        num_rows x (u16 | i32)
//   SPARSE only:
//     u32 fixed_nnz  (rows all have this many entries) or 0xffffffff, then num_rows varints
//     indices        kIndexBitPacked: one bit stream; per non-empty row a 6-bit gap width b,
//                    the first column in ceil(log2(width)) bits, then (n - 1) gaps
//                    (col[i] - col[i-1] - 1) in b bits each. kIndexU16 / kIndexU32: plain arrays.
//     values         LTC1: nnz x dtype. LTC2: u16 smallest head h0, u8 head bits hb, then per
//                    value ((head - h0) << m | mantissa) in hb + m bits, LSB first (head = sign
//                    + exponent; m = 10 fp16, 7 bf16): 14 bits instead of 16 at X1's shape
//   DENSE only:      values num_rows x width x dtype, row-major
//   u32 CRC32C of every byte before it
//
// Column indices within a row are sorted ascending and unique. The bit-packed form is the default
// (about 37 B per row instead of 64 B at k = 32, d_sae = 4096); u16/u32 stay decodable.
#ifndef LATENTD_STORAGE_CHUNK_CODEC_H_
#define LATENTD_STORAGE_CHUNK_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace latentd::storage {

enum class ChunkKind : uint8_t { kSparse = 0, kDense = 1 };
enum class ChunkDtype : uint8_t { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };
enum class IndexEncoding : uint8_t { kIndexU16 = 0, kIndexU32 = 1, kIndexBitPacked = 2 };

// Bytes one value takes in `dtype`.
int DtypeBytes(ChunkDtype dtype);

// A decoded chunk. indptr is relative to the chunk (num_rows + 1 entries, starting at 0); empty
// for dense chunks, whose values are num_rows x width.
struct Chunk {
  ChunkKind kind = ChunkKind::kSparse;
  ChunkDtype dtype = ChunkDtype::kFloat16;
  int64_t row_start = 0;
  int64_t num_rows = 0;
  int32_t width = 0;
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  std::vector<float> values;
  std::vector<int32_t> token_ids;
};

struct EncodeOptions {
  // How column indices are written. Default bit-packed gaps (smallest); kIndexU16 needs
  // width <= 65536.
  IndexEncoding index_encoding = IndexEncoding::kIndexBitPacked;
};

// Encodes `chunk` (indices sorted and unique within each row, all in [0, width); the caller
// checks). Values are rounded to chunk.dtype.
std::string EncodeChunk(const Chunk& chunk, const EncodeOptions& options = EncodeOptions());

// Decodes a whole chunk. A checksum mismatch or malformed bytes is DATA_LOSS (the caller names
// the dataset and chunk in the message it returns).
absl::Status DecodeChunk(absl::string_view data, Chunk* out);
// Decodes only the header and token ids (the checksum is still verified).
absl::Status DecodeChunkTokens(absl::string_view data, Chunk* out);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_CHUNK_CODEC_H_
