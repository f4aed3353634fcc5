#include "storage/chunk_codec.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/byte_io.h"
#include "storage/crc32c.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

constexpr uint32_t kMagic = 0x3143544c;        // "LTC1" little-endian: values as plain arrays
constexpr uint32_t kMagicPacked = 0x3243544c;  // "LTC2": SPARSE 16-bit values bit-packed
constexpr size_t kHeaderBytes = 4 + 4 + 4 + 4 + 8 + 8;
constexpr uint32_t kVariableNnz = 0xffffffffu;

int BitsFor(uint64_t v) {  // bits needed to write values in [0, v]
  int b = 0;
  while (b < 64 && (v >> b) != 0) ++b;
  return b;
}

class BitWriter {
 public:
  explicit BitWriter(std::string* out) : out_(out) {}
  void Write(uint64_t value, int bits) {
    if (bits == 0) return;
    acc_ |= (value & ((bits == 64) ? ~0ull : ((1ull << bits) - 1))) << used_;
    used_ += bits;
    while (used_ >= 8) {
      out_->push_back(static_cast<char>(acc_ & 0xff));
      acc_ >>= 8;
      used_ -= 8;
    }
  }
  void Finish() {
    if (used_ > 0) out_->push_back(static_cast<char>(acc_ & 0xff));
    acc_ = 0;
    used_ = 0;
  }

 private:
  std::string* out_;
  uint64_t acc_ = 0;
  int used_ = 0;
};

class BitReader {
 public:
  BitReader(const uint8_t* p, size_t size) : p_(p), size_(size) {}
  // Reads `bits` (<= 32) bits; false past the end.
  bool Read(int bits, uint32_t* value) {
    while (used_ < bits) {
      if (pos_ >= size_) return false;
      acc_ |= static_cast<uint64_t>(p_[pos_++]) << used_;
      used_ += 8;
    }
    *value = static_cast<uint32_t>(acc_ & ((1ull << bits) - 1));
    acc_ = bits == 64 ? 0 : acc_ >> bits;
    used_ -= bits;
    return true;
  }
  size_t bytes_consumed() const { return pos_; }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  uint64_t acc_ = 0;
  int used_ = 0;
};

void PutValues(const float* v, size_t n, ChunkDtype dtype, std::string* out) {
  size_t at = out->size();
  out->resize(at + n * DtypeBytes(dtype));
  char* p = &(*out)[at];
  switch (dtype) {
    case ChunkDtype::kFloat16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = FloatToHalf(v[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      break;
    case ChunkDtype::kBFloat16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = FloatToBFloat16(v[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      break;
    case ChunkDtype::kFloat32:
      std::memcpy(p, v, n * 4);
      break;
  }
}

void GetValues(const char* p, size_t n, ChunkDtype dtype, float* v) {
  switch (dtype) {
    case ChunkDtype::kFloat16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        v[i] = HalfToFloat(h);
      }
      break;
    case ChunkDtype::kBFloat16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        v[i] = BFloat16ToFloat(h);
      }
      break;
    case ChunkDtype::kFloat32:
      std::memcpy(v, p, n * 4);
      break;
  }
}

absl::Status Malformed(const std::string& what) {
  return absl::DataLossError(absl::StrCat("malformed chunk: ", what));
}

// 16-bit values as u16 smallest head h0, u8 head bits hb, then per value
// ((head - h0) << m | mantissa) in hb + m bits (head = sign + exponent; m = 10 fp16, 7 bf16).
int MantissaBits(ChunkDtype dtype) { return dtype == ChunkDtype::kFloat16 ? 10 : 7; }

void PutPackedValues(const float* v, size_t n, ChunkDtype dtype, std::string* out) {
  const int m = MantissaBits(dtype);
  std::vector<uint16_t> h(n);
  uint32_t lo = 0xffff, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    h[i] = dtype == ChunkDtype::kFloat16 ? FloatToHalf(v[i]) : FloatToBFloat16(v[i]);
    lo = std::min<uint32_t>(lo, h[i] >> m);
    hi = std::max<uint32_t>(hi, h[i] >> m);
  }
  if (n == 0) lo = hi = 0;
  const int hb = BitsFor(hi - lo);
  PutRaw<uint16_t>(static_cast<uint16_t>(lo), out);
  out->push_back(static_cast<char>(hb));
  BitWriter bits(out);
  for (size_t i = 0; i < n; ++i) {
    bits.Write((((h[i] >> m) - lo) << m) | (h[i] & ((1u << m) - 1)), hb + m);
  }
  bits.Finish();
}

absl::Status GetPackedValues(const char* p, size_t size, uint64_t n, ChunkDtype dtype, float* v) {
  const int m = MantissaBits(dtype);
  if (size < 3) return Malformed("value header");
  uint16_t lo;
  std::memcpy(&lo, p, 2);
  const int hb = static_cast<uint8_t>(p[2]);
  if (hb > 16 - m || (n * (hb + m) + 7) / 8 != size - 3) return Malformed("value section size");
  BitReader bits(reinterpret_cast<const uint8_t*>(p + 3), size - 3);
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t x;
    if (!bits.Read(hb + m, &x)) return Malformed("value bits");
    const uint16_t h = static_cast<uint16_t>((((x >> m) + lo) << m) | (x & ((1u << m) - 1)));
    v[i] = dtype == ChunkDtype::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
  }
  return absl::OkStatus();
}

// Parses header and tokens; leaves `*cursor` after the tokens.
absl::Status DecodeHead(absl::string_view data, Chunk* out, size_t* cursor, uint64_t* nnz,
                        IndexEncoding* encoding, bool* packed_values) {
  if (data.size() < kHeaderBytes + 4) return Malformed("shorter than its header");
  uint32_t stored_crc;
  std::memcpy(&stored_crc, data.data() + data.size() - 4, 4);
  uint32_t actual_crc = Crc32c(data.data(), data.size() - 4);
  if (stored_crc != actual_crc) {
    return absl::DataLossError(absl::StrCat("chunk checksum mismatch (stored ", stored_crc,
                                            ", computed ", actual_crc, ")"));
  }
  const char* p = data.data();
  uint32_t magic;
  std::memcpy(&magic, p, 4);
  if (magic != kMagic && magic != kMagicPacked) return Malformed("bad magic");
  uint8_t kind = p[4], dtype = p[5], enc = p[6], token_bytes = p[7];
  if (kind > 1 || dtype > 2 || enc > 2 || (token_bytes != 2 && token_bytes != 4)) {
    return Malformed("bad header fields");
  }
  if (magic == kMagicPacked && (kind != 0 || dtype == 2)) return Malformed("bad header fields");
  *packed_values = magic == kMagicPacked;
  uint32_t num_rows, width;
  uint64_t row_start;
  std::memcpy(&num_rows, p + 8, 4);
  std::memcpy(&width, p + 12, 4);
  if (width == 0 || width > static_cast<uint32_t>(INT32_MAX)) return Malformed("width");
  std::memcpy(&row_start, p + 16, 8);
  std::memcpy(nnz, p + 24, 8);
  out->kind = static_cast<ChunkKind>(kind);
  out->dtype = static_cast<ChunkDtype>(dtype);
  out->num_rows = num_rows;
  out->width = static_cast<int32_t>(width);
  out->row_start = static_cast<int64_t>(row_start);
  *encoding = static_cast<IndexEncoding>(enc);
  size_t at = kHeaderBytes;
  const size_t body_end = data.size() - 4;
  if (static_cast<uint64_t>(num_rows) * token_bytes > body_end - at) return Malformed("tokens");
  out->token_ids.resize(num_rows);
  if (token_bytes == 2) {
    for (uint32_t i = 0; i < num_rows; ++i) {
      uint16_t t;
      std::memcpy(&t, p + at + 2 * i, 2);
      out->token_ids[i] = t;
    }
  } else {
    std::memcpy(out->token_ids.data(), p + at, 4ull * num_rows);
  }
  at += static_cast<size_t>(num_rows) * token_bytes;
  *cursor = at;
  return absl::OkStatus();
}

}  // namespace

int DtypeBytes(ChunkDtype dtype) { return dtype == ChunkDtype::kFloat32 ? 4 : 2; }

std::string EncodeChunk(const Chunk& chunk, const EncodeOptions& options) {
  const bool sparse = chunk.kind == ChunkKind::kSparse;
  const uint64_t nnz = sparse ? chunk.indices.size() : 0;
  IndexEncoding enc = options.index_encoding;
  if (enc == IndexEncoding::kIndexU16 && chunk.width > 65536) enc = IndexEncoding::kIndexU32;
  bool small_tokens = true;
  for (int32_t t : chunk.token_ids) small_tokens &= (t >= 0 && t <= 0xffff);
  std::string out;
  out.reserve(kHeaderBytes + chunk.token_ids.size() * 4 + nnz * 6 + chunk.values.size() * 4 + 64);
  const bool packed = sparse && chunk.dtype != ChunkDtype::kFloat32;
  PutRaw<uint32_t>(packed ? kMagicPacked : kMagic, &out);
  out.push_back(static_cast<char>(chunk.kind));
  out.push_back(static_cast<char>(chunk.dtype));
  out.push_back(static_cast<char>(enc));
  out.push_back(static_cast<char>(small_tokens ? 2 : 4));
  PutRaw<uint32_t>(static_cast<uint32_t>(chunk.num_rows), &out);
  PutRaw<uint32_t>(static_cast<uint32_t>(chunk.width), &out);
  PutRaw<uint64_t>(static_cast<uint64_t>(chunk.row_start), &out);
  PutRaw<uint64_t>(nnz, &out);
  for (int32_t t : chunk.token_ids) {
    if (small_tokens) {
      PutRaw<uint16_t>(static_cast<uint16_t>(t), &out);
    } else {
      PutRaw<int32_t>(t, &out);
    }
  }
  if (sparse) {
    uint32_t fixed = chunk.num_rows > 0 ? static_cast<uint32_t>(chunk.indptr[1]) : 0;
    for (int64_t r = 0; r < chunk.num_rows; ++r) {
      if (chunk.indptr[r + 1] - chunk.indptr[r] != fixed) fixed = kVariableNnz;
    }
    PutRaw<uint32_t>(fixed, &out);
    if (fixed == kVariableNnz) {
      for (int64_t r = 0; r < chunk.num_rows; ++r) {
        PutVarint(chunk.indptr[r + 1] - chunk.indptr[r], &out);
      }
    }
    if (enc == IndexEncoding::kIndexBitPacked) {
      const int first_bits = BitsFor(chunk.width > 0 ? chunk.width - 1 : 0);
      BitWriter bits(&out);
      for (int64_t r = 0; r < chunk.num_rows; ++r) {
        const int64_t begin = chunk.indptr[r], end = chunk.indptr[r + 1];
        if (begin == end) continue;
        uint32_t max_gap = 0;
        for (int64_t i = begin + 1; i < end; ++i) {
          uint32_t gap = chunk.indices[i] - chunk.indices[i - 1] - 1;
          if (gap > max_gap) max_gap = gap;
        }
        const int gap_bits = BitsFor(max_gap);
        bits.Write(gap_bits, 6);
        bits.Write(chunk.indices[begin], first_bits);
        for (int64_t i = begin + 1; i < end; ++i) {
          bits.Write(chunk.indices[i] - chunk.indices[i - 1] - 1, gap_bits);
        }
      }
      bits.Finish();
    } else if (enc == IndexEncoding::kIndexU16) {
      for (int32_t c : chunk.indices) PutRaw<uint16_t>(static_cast<uint16_t>(c), &out);
    } else {
      for (int32_t c : chunk.indices) PutRaw<int32_t>(c, &out);
    }
  }
  if (packed) {
    PutPackedValues(chunk.values.data(), chunk.values.size(), chunk.dtype, &out);
  } else {
    PutValues(chunk.values.data(), chunk.values.size(), chunk.dtype, &out);
  }
  PutRaw<uint32_t>(Crc32c(out.data(), out.size()), &out);
  return out;
}

absl::Status DecodeChunkTokens(absl::string_view data, Chunk* out) {
  size_t cursor;
  uint64_t nnz;
  IndexEncoding enc;
  bool packed;
  return DecodeHead(data, out, &cursor, &nnz, &enc, &packed);
}

absl::Status DecodeChunk(absl::string_view data, Chunk* out) {
  size_t at;
  uint64_t nnz;
  IndexEncoding enc;
  bool packed;
  if (absl::Status s = DecodeHead(data, out, &at, &nnz, &enc, &packed); !s.ok()) return s;
  const char* p = data.data();
  const size_t end = data.size() - 4;
  const int vbytes = DtypeBytes(out->dtype);
  out->indptr.clear();
  out->indices.clear();
  out->values.clear();
  if (out->kind == ChunkKind::kDense) {
    const uint64_t n = static_cast<uint64_t>(out->num_rows) * static_cast<uint64_t>(out->width);
    if (n * vbytes != end - at) return Malformed("dense value section size");
    out->values.resize(n);
    GetValues(p + at, n, out->dtype, out->values.data());
    return absl::OkStatus();
  }
  if (end - at < 4) return Malformed("row sizes");
  uint32_t fixed;
  std::memcpy(&fixed, p + at, 4);
  at += 4;
  out->indptr.resize(out->num_rows + 1);
  out->indptr[0] = 0;
  for (int64_t r = 0; r < out->num_rows; ++r) {
    uint64_t n = fixed;
    if (fixed == kVariableNnz) {
      n = 0;
      int shift = 0;
      while (true) {
        if (at >= end || shift > 63) return Malformed("row size varint");
        uint8_t b = static_cast<uint8_t>(p[at++]);
        n |= static_cast<uint64_t>(b & 0x7f) << shift;
        if (!(b & 0x80)) break;
        shift += 7;
      }
    }
    if (n > static_cast<uint64_t>(out->width)) return Malformed("row wider than the dataset");
    out->indptr[r + 1] = out->indptr[r] + static_cast<int64_t>(n);
  }
  if (static_cast<uint64_t>(out->indptr[out->num_rows]) != nnz) return Malformed("nnz");
  // Every entry takes at least 7 bits of value: a larger count is corrupt (and must not size
  // an allocation).
  if (nnz > 2 * static_cast<uint64_t>(end - at)) return Malformed("nnz");
  out->indices.resize(nnz);
  if (enc == IndexEncoding::kIndexBitPacked) {
    const int first_bits = BitsFor(out->width > 0 ? out->width - 1 : 0);
    BitReader bits(reinterpret_cast<const uint8_t*>(p + at), end - at);
    for (int64_t r = 0; r < out->num_rows; ++r) {
      const int64_t begin = out->indptr[r], stop = out->indptr[r + 1];
      if (begin == stop) continue;
      uint32_t gap_bits, col;
      if (!bits.Read(6, &gap_bits) || gap_bits > 32 || !bits.Read(first_bits, &col)) {
        return Malformed("index bits");
      }
      uint64_t c = col;
      out->indices[begin] = static_cast<int32_t>(c);
      for (int64_t i = begin + 1; i < stop; ++i) {
        uint32_t gap;
        if (!bits.Read(static_cast<int>(gap_bits), &gap)) return Malformed("index bits");
        c += static_cast<uint64_t>(gap) + 1;
        out->indices[i] = static_cast<int32_t>(c);
      }
      if (c >= static_cast<uint64_t>(out->width)) return Malformed("column out of range");
    }
    at += bits.bytes_consumed();
  } else {
    const int ib = enc == IndexEncoding::kIndexU16 ? 2 : 4;
    if (nnz * ib > end - at) return Malformed("index section");
    for (uint64_t i = 0; i < nnz; ++i) {
      if (ib == 2) {
        uint16_t c;
        std::memcpy(&c, p + at + 2 * i, 2);
        out->indices[i] = c;
      } else {
        std::memcpy(&out->indices[i], p + at + 4 * i, 4);
      }
    }
    at += nnz * ib;
    // The plain forms carry no structure that keeps columns in range and ascending: check.
    for (int64_t r = 0; r < out->num_rows; ++r) {
      int64_t prev = -1;
      for (int64_t i = out->indptr[r]; i < out->indptr[r + 1]; ++i) {
        const int64_t c = out->indices[i];
        if (c <= prev || c >= out->width) return Malformed("columns out of range or order");
        prev = c;
      }
    }
  }
  out->values.resize(nnz);
  if (packed) {
    return GetPackedValues(p + at, end - at, nnz, out->dtype, out->values.data());
  }
  if (nnz * vbytes != end - at) return Malformed("value section size");
  GetValues(p + at, nnz, out->dtype, out->values.data());
  return absl::OkStatus();
}

}  // namespace latentd::storage
