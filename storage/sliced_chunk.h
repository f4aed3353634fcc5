// Format-3 SPARSE chunks: one copy of the data that serves both access paths.
//
// A chunk of R consecutive rows is stored as several RocksDB values of the `chunks` family, under
// keys (dataset, part, chunk row_start) (keys::ChunkPart):
//
//   part 0       header: the row count, nnz and the entry count of every latent slice, CRC32C
//   part 1       the chunk's token ids (stored once, here), CRC32C
//   part 2 + s   latent slice s: every entry of the chunk whose latent lies in
//                [s * slice_width, (s + 1) * slice_width), latent-major
//
// A slice is an Elias-Fano posting (storage/posting_codec.h) of the keys
//   x = (latent - s * slice_width) << row_bits | (row - row_start),   row_bits = ceil(log2(R)),
// which are ascending in (latent, row), with the values packed exactly as the dtype stores them.
// The part comes before the row in the key, so every part is one contiguous range over the
// dataset's chunks: "every row where latent j fires" walks the headers and slice j / slice_width
// forward (reading 1 / num_slices of the data), a row range reads each stored part of the chunks
// it covers, and no value is stored twice: about 94 B per token at X1's shape with every query
// path served (format 2 needed 188 B for the same; docs/STORAGE.md).
// A slice with no entries is not written; the header says which exist, so a missing one is
// DATA_LOSS, not an empty slice.
#ifndef LATENTD_STORAGE_SLICED_CHUNK_H_
#define LATENTD_STORAGE_SLICED_CHUNK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "storage/chunk_codec.h"

namespace latentd::storage {

inline constexpr uint16_t kPartHeader = 0;
inline constexpr uint16_t kPartTokens = 1;
inline constexpr uint16_t kPartFirstSlice = 2;
// The part field is 16 bits: at most this many slices per chunk.
inline constexpr int32_t kMaxLatentSlices = 0xffff - kPartFirstSlice;

// How a dataset's latents are cut into slices: num_slices = ceil(width / slice_width).
struct SliceLayout {
  int32_t width = 0;
  int32_t slice_width = 0;
  int32_t num_slices = 0;
  int32_t SliceOf(int32_t latent) const { return latent / slice_width; }
  int32_t FirstLatent(int32_t slice) const { return slice * slice_width; }
};
// The layout with at most `max_slices` slices of equal width (max_slices is clamped to
// [1, kMaxLatentSlices]).
SliceLayout MakeSliceLayout(int32_t width, int32_t max_slices);

// Bits of the row part of a slice key: ceil(log2(num_rows)), 0 for one row.
int RowBits(int64_t num_rows);

struct SlicedChunkHeader {
  ChunkDtype dtype = ChunkDtype::kFloat16;
  int64_t row_start = 0;
  int64_t num_rows = 0;
  SliceLayout layout;
  int64_t nnz = 0;                  // the sum of slice_nnz
  std::vector<uint32_t> slice_nnz;  // layout.num_slices entries; 0: the slice is not stored
};

std::string EncodeSlicedHeader(const SlicedChunkHeader& header);
// DATA_LOSS on a checksum mismatch or malformed bytes (the caller names dataset and chunk).
absl::Status DecodeSlicedHeader(absl::string_view in, SlicedChunkHeader* out);

// Token ids as u16 when every id fits, else i32; CRC32C.
std::string EncodeTokenPart(const int32_t* token_ids, int64_t n);
// Replaces *out with the ids. DATA_LOSS as above.
absl::Status DecodeTokenPart(absl::string_view in, std::vector<int32_t>* out);

// One slice's entries in (latent, row) order, chunk-local: latent = first latent of the slice +
// latent_offset, row = row_start + row_offset.
struct SliceEntries {
  std::vector<int64_t> keys;  // x as above; scratch for the codec
  std::vector<float> values;
};
// Encodes n >= 1 keys (strictly ascending) and values (already rounded to dtype).
void EncodeSlice(const int64_t* keys, const float* values, size_t n, ChunkDtype dtype,
                 std::string* out);
// Replaces *out with the slice's entries whose chunk-local row lies in [row_lo, row_hi) (values
// are decoded only for those), checking that the slice holds as many entries as the header says
// and that every entry returned lies inside the slice (offset < slice width, row < num_rows).
// DATA_LOSS otherwise. With `keep` (a bitmap), only the rows r whose bit keep_offset + r - row_lo
// is set: a set of rows, whose values alone are decoded.
absl::Status DecodeSlice(absl::string_view in, const SlicedChunkHeader& header, int32_t slice,
                         int64_t row_lo, int64_t row_hi, SliceEntries* out,
                         const uint64_t* keep = nullptr, uint64_t keep_offset = 0);
// Appends the rows (absolute) and values of one latent of slice `slice`, decoding only its run of
// the slice. DATA_LOSS as DecodeSlice.
absl::Status DecodeSliceLatent(absl::string_view in, const SlicedChunkHeader& header, int32_t slice,
                               int32_t latent, std::vector<int64_t>* rows,
                               std::vector<float>* values);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_SLICED_CHUNK_H_
