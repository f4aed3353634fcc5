// The posting codec: the rows of one commit where one latent fires, with their values, as one
// RocksDB value of the `postings` family (format 2; see docs/STORAGE.md).
//
//   u8 format (2) | varint n (>= 1) | u8 l (Elias-Fano low bits per row)
//   values     fp16 / bf16: u16 smallest head h0, u8 head bits hb, then per value
//              ((head - h0) << m | mantissa) in hb + m bits (m = 10 fp16, 7 bf16), one
//              LSB-first bit stream. The head is sign + exponent; one latent's values span few
//              binades, so hb is small (about 4 at X1's shape: 14 bits per fp16 value, not 16).
//              fp32: byte planes (byte 0 of every value, then byte 1, ...).
//   low bits   n x l bits: the low l bits of x_i = row_i - commit_row_start, LSB first
//   high bits  bit (x_i >> l) + i set for every i (unary-coded high parts), up to the CRC
//   u32 CRC32C of everything before
//
// Rows cost about 2 + log2(rows / n) bits each (Elias-Fano). Values keep the dataset's dtype
// bit for bit, so LatentPostings returns exactly what ReadRows returns.
#ifndef LATENTD_STORAGE_POSTING_CODEC_H_
#define LATENTD_STORAGE_POSTING_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "storage/chunk_codec.h"

namespace latentd::storage {

inline constexpr uint8_t kPostingFormat = 2;

// Replaces *out with the encoding of n >= 1 strictly ascending rows, each >=
// row_start, and their values (already rounded to `dtype`: they are stored
// exactly). The caller checks order.
void EncodePosting(int64_t row_start, const int64_t* rows, const float* values, size_t n,
                   ChunkDtype dtype, std::string* out);

// Appends the rows and values of one posting to *rows / *values. DATA_LOSS on a
// checksum mismatch or malformed bytes (the caller names the dataset, latent
// and commit).
absl::Status DecodePosting(absl::string_view in, int64_t row_start, ChunkDtype dtype,
                           std::vector<int64_t>* rows, std::vector<float>* values);

// Appends the entries (keys x = rows - row_start, and values) whose masked key x & mask lies in
// [lo, hi), decoding values only for those: a row window of a latent slice, whose keys carry the
// chunk-local row in their low bits. With `keep`, only those whose bit keep_offset +
// (x & mask) - lo is set in it (a bitmap covering [lo, hi)): a set of rows. DATA_LOSS as above.
absl::Status DecodePostingMasked(absl::string_view in, ChunkDtype dtype, uint64_t mask, uint64_t lo,
                                 uint64_t hi, std::vector<int64_t>* keys,
                                 std::vector<float>* values, uint64_t* total = nullptr,
                                 const uint64_t* keep = nullptr, uint64_t keep_offset = 0);

// Appends only the entries whose row lies in [lo, hi), decoding just those: the unary high
// bits are skipped a 64-bit word at a time up to the first candidate. The whole value is still
// checksummed (DATA_LOSS as above). *total, if given, receives the posting's entry count.
absl::Status DecodePostingRange(absl::string_view in, int64_t row_start, ChunkDtype dtype,
                                int64_t lo, int64_t hi, std::vector<int64_t>* rows,
                                std::vector<float>* values, uint64_t* total = nullptr);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_POSTING_CODEC_H_
