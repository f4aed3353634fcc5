#include "storage/sliced_chunk.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/byte_io.h"
#include "storage/crc32c.h"
#include "storage/posting_codec.h"

namespace latentd::storage {
namespace {

constexpr uint32_t kHeaderMagic = 0x3348544c;  // "LTH3" little-endian
constexpr uint32_t kTokensMagic = 0x3354544c;  // "LTT3"

void AppendCrc(std::string* out) { PutRaw<uint32_t>(Crc32c(out->data(), out->size()), out); }

// Strips and checks the trailing CRC32C.
absl::Status CheckCrc(absl::string_view* in, const char* what) {
  if (in->size() < 4) return absl::DataLossError(absl::StrCat(what, " too short"));
  uint32_t crc;
  std::memcpy(&crc, in->data() + in->size() - 4, 4);
  in->remove_suffix(4);
  if (crc != Crc32c(in->data(), in->size())) {
    return absl::DataLossError(absl::StrCat(what, " checksum mismatch"));
  }
  return absl::OkStatus();
}

// A slice must hold exactly the entries its chunk header lists.
absl::Status CheckSliceCount(const SlicedChunkHeader& header, int32_t slice, uint64_t total) {
  if (total == header.slice_nnz[slice]) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("slice ", slice, " holds ", total,
                                          " entries, the header says ", header.slice_nnz[slice]));
}

}  // namespace

SliceLayout MakeSliceLayout(int32_t width, int32_t max_slices) {
  SliceLayout layout;
  layout.width = width;
  const int32_t slices = std::max(1, std::min({max_slices, kMaxLatentSlices, std::max(width, 1)}));
  layout.slice_width = (width + slices - 1) / slices;
  if (layout.slice_width < 1) layout.slice_width = 1;
  layout.num_slices = (width + layout.slice_width - 1) / layout.slice_width;
  return layout;
}

int RowBits(int64_t num_rows) {
  int bits = 0;
  while ((int64_t{1} << bits) < num_rows) ++bits;
  return bits;
}

std::string EncodeSlicedHeader(const SlicedChunkHeader& h) {
  std::string out;
  PutRaw<uint32_t>(kHeaderMagic, &out);
  PutRaw<uint8_t>(static_cast<uint8_t>(h.dtype), &out);
  PutRaw<uint32_t>(static_cast<uint32_t>(h.num_rows), &out);
  PutRaw<uint64_t>(static_cast<uint64_t>(h.row_start), &out);
  PutRaw<uint32_t>(static_cast<uint32_t>(h.layout.width), &out);
  PutRaw<uint32_t>(static_cast<uint32_t>(h.layout.slice_width), &out);
  PutRaw<uint64_t>(static_cast<uint64_t>(h.nnz), &out);
  for (uint32_t n : h.slice_nnz) PutVarint(n, &out);
  AppendCrc(&out);
  return out;
}

absl::Status DecodeSlicedHeader(absl::string_view in, SlicedChunkHeader* h) {
  absl::Status crc = CheckCrc(&in, "chunk header");
  if (!crc.ok()) return crc;
  ByteReader c(in);
  const uint32_t magic = c.Raw<uint32_t>();
  const uint8_t dtype = c.Raw<uint8_t>();
  h->num_rows = c.Raw<uint32_t>();
  h->row_start = static_cast<int64_t>(c.Raw<uint64_t>());
  const int64_t width = c.Raw<uint32_t>();
  const int64_t slice_width = c.Raw<uint32_t>();
  h->nnz = static_cast<int64_t>(c.Raw<uint64_t>());
  if (!c.ok() || magic != kHeaderMagic || dtype > 2 || h->num_rows <= 0 || width <= 0 ||
      width > INT32_MAX || slice_width <= 0 || slice_width > width || h->row_start < 0) {
    return absl::DataLossError("malformed chunk header");
  }
  h->dtype = static_cast<ChunkDtype>(dtype);
  h->layout.width = static_cast<int32_t>(width);
  h->layout.slice_width = static_cast<int32_t>(slice_width);
  h->layout.num_slices = static_cast<int32_t>((width + slice_width - 1) / slice_width);
  if (h->layout.num_slices > kMaxLatentSlices) {
    return absl::DataLossError("malformed chunk header: too many slices");
  }
  h->slice_nnz.resize(h->layout.num_slices);
  int64_t total = 0;
  for (uint32_t& n : h->slice_nnz) {
    const uint64_t v = c.Varint();
    if (v > static_cast<uint64_t>(h->num_rows) * static_cast<uint64_t>(slice_width)) {
      return absl::DataLossError("malformed chunk header: slice count");
    }
    n = static_cast<uint32_t>(v);
    total += n;
  }
  if (!c.ok() || !c.rest().empty() || total != h->nnz) {
    return absl::DataLossError("malformed chunk header");
  }
  return absl::OkStatus();
}

std::string EncodeTokenPart(const int32_t* token_ids, int64_t n) {
  const bool narrow =
      std::all_of(token_ids, token_ids + n, [](int32_t t) { return t >= 0 && t < 65536; });
  std::string out;
  out.reserve(4 + 4 + 1 + n * (narrow ? 2 : 4) + 4);
  PutRaw<uint32_t>(kTokensMagic, &out);
  PutRaw<uint32_t>(static_cast<uint32_t>(n), &out);
  PutRaw<uint8_t>(narrow ? 2 : 4, &out);
  for (int64_t i = 0; i < n; ++i) {
    if (narrow) {
      PutRaw<uint16_t>(static_cast<uint16_t>(token_ids[i]), &out);
    } else {
      PutRaw<int32_t>(token_ids[i], &out);
    }
  }
  AppendCrc(&out);
  return out;
}

absl::Status DecodeTokenPart(absl::string_view in, std::vector<int32_t>* out) {
  absl::Status crc = CheckCrc(&in, "token ids");
  if (!crc.ok()) return crc;
  ByteReader c(in);
  const uint32_t magic = c.Raw<uint32_t>();
  const uint32_t n = c.Raw<uint32_t>();
  const uint8_t bytes = c.Raw<uint8_t>();
  if (!c.ok() || magic != kTokensMagic || (bytes != 2 && bytes != 4) ||
      c.rest().size() != static_cast<size_t>(n) * bytes) {
    return absl::DataLossError("malformed token ids");
  }
  out->resize(n);
  const char* p = c.rest().data();
  for (uint32_t i = 0; i < n; ++i) {
    if (bytes == 2) {
      uint16_t t;
      std::memcpy(&t, p + 2 * i, 2);
      (*out)[i] = t;
    } else {
      std::memcpy(&(*out)[i], p + 4 * i, 4);
    }
  }
  return absl::OkStatus();
}

void EncodeSlice(const int64_t* keys, const float* values, size_t n, ChunkDtype dtype,
                 std::string* out) {
  EncodePosting(0, keys, values, n, dtype, out);
}

absl::Status DecodeSlice(absl::string_view in, const SlicedChunkHeader& header, int32_t slice,
                         int64_t row_lo, int64_t row_hi, SliceEntries* out, const uint64_t* keep,
                         uint64_t keep_offset) {
  out->keys.clear();
  out->values.clear();
  const int row_bits = RowBits(header.num_rows);
  uint64_t total = 0;
  absl::Status s;
  if (keep == nullptr && row_lo <= 0 && row_hi >= header.num_rows) {
    s = DecodePosting(in, 0, header.dtype, &out->keys, &out->values);
    total = out->keys.size();
  } else {
    s = DecodePostingMasked(in, header.dtype, (uint64_t{1} << row_bits) - 1,
                            static_cast<uint64_t>(std::max<int64_t>(row_lo, 0)),
                            static_cast<uint64_t>(std::min(row_hi, header.num_rows)), &out->keys,
                            &out->values, &total, keep, keep_offset);
  }
  if (!s.ok()) return absl::DataLossError(absl::StrCat("slice ", slice, ": ", s.message()));
  RETURN_IF_ERROR(CheckSliceCount(header, slice, total));
  const int64_t slice_latents =
      std::min(header.layout.slice_width, header.layout.width - header.layout.FirstLatent(slice));
  const int64_t row_mask = (int64_t{1} << row_bits) - 1;
  for (int64_t x : out->keys) {
    if ((x >> row_bits) >= slice_latents || (x & row_mask) >= header.num_rows) {
      return absl::DataLossError(absl::StrCat("slice ", slice, ": entry outside the chunk"));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeSliceLatent(absl::string_view in, const SlicedChunkHeader& header, int32_t slice,
                               int32_t latent, std::vector<int64_t>* rows,
                               std::vector<float>* values) {
  const int row_bits = RowBits(header.num_rows);
  const int64_t offset = latent - header.layout.FirstLatent(slice);
  const size_t first = rows->size();
  uint64_t total = 0;
  absl::Status s = DecodePostingRange(in, 0, header.dtype, offset << row_bits,
                                      (offset + 1) << row_bits, rows, values, &total);
  if (!s.ok()) return absl::DataLossError(absl::StrCat("slice ", slice, ": ", s.message()));
  RETURN_IF_ERROR(CheckSliceCount(header, slice, total));
  const int64_t mask = (int64_t{1} << row_bits) - 1;
  for (size_t i = first; i < rows->size(); ++i) {
    const int64_t row = (*rows)[i] & mask;
    if (row >= header.num_rows) {
      return absl::DataLossError(absl::StrCat("slice ", slice, ": entry outside the chunk"));
    }
    (*rows)[i] = header.row_start + row;
  }
  return absl::OkStatus();
}

}  // namespace latentd::storage
