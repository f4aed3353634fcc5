#include "storage/posting_codec.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/status_macros.h"
#include "storage/crc32c.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

size_t PutVarint(uint64_t v, char* p) {
  size_t i = 0;
  while (v >= 0x80) {
    p[i++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  p[i++] = static_cast<char>(v);
  return i;
}

int FloorLog2(uint64_t v) { return v == 0 ? -1 : 63 - __builtin_clzll(v); }

int BitsFor(uint32_t v) { return v == 0 ? 0 : 32 - __builtin_clz(v); }

int MantissaBits(ChunkDtype dtype) { return dtype == ChunkDtype::kFloat16 ? 10 : 7; }

uint16_t ToBits16(ChunkDtype dtype, float v) {
  return dtype == ChunkDtype::kFloat16 ? FloatToHalf(v) : FloatToBFloat16(v);
}

// LSB-first bit stream into a buffer the caller sized (fields of at most 32 bits; a word is
// stored once its 32 bits are complete, so nothing is written past the stream's last byte).
class BitSink {
 public:
  explicit BitSink(char* p) : p_(p) {}
  void Put(uint32_t v, int bits) {
    acc_ |= static_cast<uint64_t>(v) << used_;
    used_ += bits;
    if (used_ >= 32) {
      for (int b = 0; b < 4; ++b) p_[b] = static_cast<char>(acc_ >> (8 * b));
      p_ += 4;
      acc_ >>= 32;
      used_ -= 32;
    }
  }
  char* Finish() {
    for (; used_ > 0; used_ -= 8) {
      *p_++ = static_cast<char>(acc_ & 0xff);
      acc_ >>= 8;
    }
    used_ = 0;
    return p_;
  }

 private:
  char* p_;
  uint64_t acc_ = 0;
  int used_ = 0;
};

// `bits` (<= 56) bits starting at bit `pos` of [p, end), LSB first, with one unaligned 8-byte
// load where 8 bytes remain (the common case), else byte by byte. The caller checked that the
// field lies inside [p, end).
inline uint64_t BitsAt(const uint8_t* p, const uint8_t* end, uint64_t pos, int bits) {
  const uint8_t* q = p + (pos >> 3);
  uint64_t word = 0;
  if (end - q >= 8) {
    std::memcpy(&word, q, 8);
  } else {
    for (int i = 0; q + i < end; ++i) word |= static_cast<uint64_t>(q[i]) << (8 * i);
  }
  return (word >> (pos & 7)) & ((uint64_t{1} << bits) - 1);
}

// True when every fp16 head in [lo, lo + 2^bits) has a normal exponent (1..30), so a value
// converts to float by moving its bits (no subnormal, infinity or NaN among them).
bool AllHeadsNormalHalf(uint32_t lo, int bits) {
  for (uint32_t head = lo; head < lo + (1u << bits); ++head) {
    const uint32_t exponent = head & 0x1f;
    if (exponent == 0 || exponent == 0x1f || head > 0x3f) return false;
  }
  return true;
}

absl::Status Malformed(const char* what) {
  return absl::DataLossError(std::string("malformed posting: ") + what);
}

}  // namespace

void EncodePosting(int64_t row_start, const int64_t* rows, const float* values, size_t n,
                   ChunkDtype dtype, std::string* out) {
  const uint64_t last = static_cast<uint64_t>(rows[n - 1] - row_start);
  const uint64_t universe = last + 1;
  const int l = universe > n ? FloorLog2(universe / n) : 0;  // <= 62
  const size_t low_bytes = (static_cast<uint64_t>(n) * l + 7) / 8;
  const size_t high_bytes = ((last >> l) + n + 7) / 8;
  const int vbytes = DtypeBytes(dtype);
  out->assign(1 + 10 + 1 + 3 + n * vbytes + 8 + low_bytes + high_bytes + 4, '\0');
  char* const base = &(*out)[0];
  char* p = base;
  *p++ = static_cast<char>(kPostingFormat);
  p += PutVarint(n, p);
  *p++ = static_cast<char>(l);
  if (vbytes == 2) {
    // Sign + exponent (the "head": 6 bits of fp16, 9 of bf16) as offsets from the posting's
    // smallest head in just enough bits (a latent's values span few binades), then the mantissa.
    const int mbits = MantissaBits(dtype);
    thread_local std::vector<uint16_t> bits16;  // converted once, reused across calls
    bits16.resize(n);
    for (size_t i = 0; i < n; ++i) bits16[i] = ToBits16(dtype, values[i]);
    uint32_t lo_head = ~0u, hi_head = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t head = bits16[i] >> mbits;
      lo_head = std::min(lo_head, head);
      hi_head = std::max(hi_head, head);
    }
    const int hbits = BitsFor(hi_head - lo_head);
    *p++ = static_cast<char>(lo_head & 0xff);
    *p++ = static_cast<char>(lo_head >> 8);
    *p++ = static_cast<char>(hbits);
    BitSink sink(p);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t h = bits16[i];
      sink.Put((((h >> mbits) - lo_head) << mbits) | (h & ((1u << mbits) - 1)), hbits + mbits);
    }
    p = sink.Finish();
  } else {
    for (size_t i = 0; i < n; ++i) {
      const uint32_t f = FloatBits(values[i]);
      for (int b = 0; b < 4; ++b) p[b * n + i] = static_cast<char>(f >> (8 * b));
    }
    p += 4 * n;
  }
  // Elias-Fano low parts, LSB first.
  {
    BitSink sink(p);
    const uint64_t mask = l == 0 ? 0 : ~0ull >> (64 - l);
    for (size_t i = 0; i < n && l > 0; ++i) {
      const uint64_t x = static_cast<uint64_t>(rows[i] - row_start) & mask;
      if (l > 32) {
        sink.Put(static_cast<uint32_t>(x), 32);
        sink.Put(static_cast<uint32_t>(x >> 32), l - 32);
      } else {
        sink.Put(static_cast<uint32_t>(x), l);
      }
    }
    p = sink.Finish();
  }
  // High parts: bit (x_i >> l) + i, to the end of the value.
  uint8_t* high = reinterpret_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bit = (static_cast<uint64_t>(rows[i] - row_start) >> l) + i;
    high[bit >> 3] |= static_cast<uint8_t>(1u << (bit & 7));
  }
  p += high_bytes;
  const uint32_t crc = Crc32c(base, p - base);
  std::memcpy(p, &crc, 4);
  p += 4;
  out->resize(p - base);
}

namespace {

// The sections of an encoded posting, checked against its length and checksum.
struct Parsed {
  uint64_t n = 0;
  int l = 0;
  ChunkDtype dtype = ChunkDtype::kFloat16;
  // Values: 16-bit dtypes as (head - lo_head) << mbits | mantissa in hbits + mbits bits; fp32 as
  // byte planes.
  const uint8_t* values = nullptr;
  uint32_t lo_head = 0;
  int hbits = 0, mbits = 0;
  bool normal_half = false;  // every possible head is a normal fp16 exponent: convert by shifting
  const uint8_t* low = nullptr;
  const uint8_t* high = nullptr;
  const uint8_t* end = nullptr;  // of the high bits (the CRC follows)
};

absl::Status Parse(absl::string_view in, ChunkDtype dtype, Parsed* out) {
  if (in.size() < 1 + 1 + 1 + 4) return Malformed("too short");
  uint32_t crc;
  std::memcpy(&crc, in.data() + in.size() - 4, 4);
  if (crc != Crc32c(in.data(), in.size() - 4)) {
    return absl::DataLossError("posting checksum mismatch");
  }
  const uint8_t* p = reinterpret_cast<const uint8_t*>(in.data());
  const uint8_t* const end = p + in.size() - 4;
  if (*p++ != kPostingFormat) return Malformed("unknown format");
  uint64_t n = 0;
  for (int shift = 0;; shift += 7) {
    if (p >= end || shift > 63) return Malformed("count");
    const uint8_t b = *p++;
    n |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) break;
  }
  if (p >= end) return Malformed("count");
  const int l = *p++;
  if (n == 0 || l > 62 || n > static_cast<uint64_t>(end - p)) return Malformed("header");
  out->n = n;
  out->l = l;
  out->dtype = dtype;
  if (DtypeBytes(dtype) == 2) {
    if (end - p < 3) return Malformed("value header");
    out->lo_head = p[0] | (p[1] << 8);
    out->hbits = p[2];
    out->mbits = MantissaBits(dtype);
    p += 3;
    if (out->hbits > 16 - out->mbits ||
        ((n * (out->hbits + out->mbits) + 7) / 8) > static_cast<uint64_t>(end - p)) {
      return Malformed("values");
    }
    out->values = p;
    out->normal_half =
        dtype == ChunkDtype::kFloat16 && AllHeadsNormalHalf(out->lo_head, out->hbits);
    p += (n * (out->hbits + out->mbits) + 7) / 8;
  } else {
    if (4 * n > static_cast<uint64_t>(end - p)) return Malformed("values");
    out->values = p;
    p += 4 * n;
  }
  const size_t low_bytes = (n * l + 7) / 8;
  if (low_bytes > static_cast<size_t>(end - p)) return Malformed("row low bits");
  out->low = p;
  out->high = p + low_bytes;
  out->end = end;
  return absl::OkStatus();
}

// LSB-first bits of [p, end), read front to back (fields of 0 to 32 bits): the sequential
// counterpart of BitsAt for whole-posting decodes.
class BitSource {
 public:
  BitSource(const uint8_t* p, const uint8_t* end) : p_(p), end_(end) {}
  uint32_t Get(int bits) {
    if (avail_ < bits) {
      uint64_t word = 0;
      if (end_ - p_ >= 4) {
        uint32_t w;
        std::memcpy(&w, p_, 4);
        word = w;
        p_ += 4;
      } else {
        for (int i = 0; p_ < end_ && i < 4; ++i) word |= static_cast<uint64_t>(*p_++) << (8 * i);
      }
      buffer_ |= word << avail_;
      avail_ += 32;
    }
    const uint32_t v = static_cast<uint32_t>(buffer_ & ((uint64_t{1} << bits) - 1));
    buffer_ >>= bits;
    avail_ -= bits;
    return v;
  }
  // A field of up to 64 bits.
  uint64_t GetWide(int bits) {
    if (bits <= 32) return Get(bits);
    const uint64_t low = Get(32);
    return low | static_cast<uint64_t>(Get(bits - 32)) << 32;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  uint64_t buffer_ = 0;
  int avail_ = 0;
};

// A 16-bit dtype's stored field (head offset and mantissa) as a float.
inline float ValueFromField(const Parsed& ps, uint32_t v) {
  const uint32_t h = ((v >> ps.mbits) + ps.lo_head) << ps.mbits | (v & ((1u << ps.mbits) - 1));
  if (ps.dtype == ChunkDtype::kBFloat16) return BitsFloat(h << 16);
  if (ps.normal_half) {
    // Sign to bit 31, exponent and mantissa up by 13, exponent bias up by 127 - 15.
    return BitsFloat(((h & 0x8000u) << 16) | (((h & 0x7fffu) << 13) + 0x38000000u));
  }
  return HalfToFloat(static_cast<uint16_t>(h));
}

// Value i of the posting.
inline float ValueAt(const Parsed& ps, uint64_t i) {
  if (ps.dtype == ChunkDtype::kFloat32) {
    uint32_t f = 0;
    for (int b = 0; b < 4; ++b) f |= static_cast<uint32_t>(ps.values[b * ps.n + i]) << (8 * b);
    return BitsFloat(f);
  }
  const int vbits = ps.hbits + ps.mbits;
  return ValueFromField(ps, static_cast<uint32_t>(BitsAt(ps.values, ps.end, i * vbits, vbits)));
}

// Low part of key i.
inline uint64_t LowAt(const Parsed& ps, uint64_t i) {
  if (ps.l <= 56) return BitsAt(ps.low, ps.high, i * ps.l, ps.l);
  return BitsAt(ps.low, ps.high, i * ps.l, 32) | BitsAt(ps.low, ps.high, i * ps.l + 32, ps.l - 32)
                                                     << 32;
}

// Calls visit(i, high part of key i) for the entries whose high part lies in [h_lo, h_hi], in
// order, skipping whole 64-bit words of the unary high bits that end below h_lo. In the high
// bits the i-th set bit, at position b, stands for high part b - i. Checks that there are exactly
// n set bits when the whole stream is walked (h_hi = UINT64_MAX).
template <typename Visit>
absl::Status ForHighParts(const Parsed& ps, uint64_t h_lo, uint64_t h_hi, Visit visit) {
  const size_t high_bytes = ps.end - ps.high;
  uint64_t i = 0;
  for (size_t byte = 0; byte < high_bytes; byte += 8) {
    const size_t len = std::min<size_t>(8, high_bytes - byte);
    uint64_t word = 0;
    std::memcpy(&word, ps.high + byte, len);
    const uint64_t ones = __builtin_popcountll(word);
    // Zeros up to the end of this word bound every high part in it.
    if (byte * 8 + len * 8 - (i + ones) < h_lo) {
      i += ones;
      if (i > ps.n) return Malformed("extra high bits");
      continue;
    }
    while (word) {
      if (i == ps.n) return Malformed("extra high bits");
      const uint64_t high = byte * 8 + __builtin_ctzll(word) - i;
      word &= word - 1;
      if (high > h_hi) return absl::OkStatus();
      if (high >= h_lo) visit(i, high);
      ++i;
    }
  }
  if (i != ps.n) return Malformed("missing high bits");
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodePosting(absl::string_view in, int64_t row_start, ChunkDtype dtype,
                           std::vector<int64_t>* rows, std::vector<float>* values) {
  Parsed ps;
  RETURN_IF_ERROR(Parse(in, dtype, &ps));
  const size_t first = rows->size();
  rows->resize(first + ps.n);
  values->resize(first + ps.n);
  int64_t* out_rows = rows->data() + first;
  float* out_values = values->data() + first;
  if (ps.dtype == ChunkDtype::kFloat32) {
    for (uint64_t i = 0; i < ps.n; ++i) out_values[i] = ValueAt(ps, i);
  } else {
    BitSource fields(ps.values, ps.end);
    const int vbits = ps.hbits + ps.mbits;
    for (uint64_t i = 0; i < ps.n; ++i) out_values[i] = ValueFromField(ps, fields.Get(vbits));
  }
  RETURN_IF_ERROR(ForHighParts(ps, 0, UINT64_MAX, [&](uint64_t i, uint64_t high) {
    out_rows[i] = static_cast<int64_t>(high);
  }));
  // Keys must ascend strictly and the rows stay representable: the high parts alone cannot
  // ensure that once a low part or the width l is corrupt, and every reader relies on it.
  BitSource lows(ps.low, ps.high);
  const uint64_t x_max = static_cast<uint64_t>(INT64_MAX - std::max<int64_t>(row_start, 0));
  uint64_t prev = 0;
  for (uint64_t i = 0; i < ps.n; ++i) {
    const uint64_t x = static_cast<uint64_t>(out_rows[i]) << ps.l | lows.GetWide(ps.l);
    if ((i > 0 && x <= prev) || x > x_max) return Malformed("keys not ascending");
    prev = x;
    out_rows[i] = row_start + static_cast<int64_t>(x);
  }
  return absl::OkStatus();
}

absl::Status DecodePostingMasked(absl::string_view in, ChunkDtype dtype, uint64_t mask, uint64_t lo,
                                 uint64_t hi, std::vector<int64_t>* keys,
                                 std::vector<float>* values, uint64_t* total, const uint64_t* keep,
                                 uint64_t keep_offset) {
  Parsed ps;
  RETURN_IF_ERROR(Parse(in, dtype, &ps));
  if (total != nullptr) *total = ps.n;
  if (hi <= lo) return ForHighParts(ps, 0, UINT64_MAX, [](uint64_t, uint64_t) {});
  // When the mask is 2^b - 1 with b >= l (a slice: the row in the low b bits, l of them in the
  // low part), the row's top b - l bits sit in the high part: entries whose high part rules the
  // window out are skipped before their low part is read (most of them for a small window).
  uint64_t high_mask = 0, high_lo = 0, high_span = UINT64_MAX;
  const int b = 64 - __builtin_clzll(mask | 1);
  if (mask != 0 && (mask & (mask + 1)) == 0 && hi <= mask + 1 && b >= ps.l && b - ps.l < 64) {
    high_mask = (uint64_t{1} << (b - ps.l)) - 1;
    high_lo = lo >> ps.l;
    high_span = ((hi - 1) >> ps.l) - high_lo;
  }
  const size_t first = keys->size();
  bool ascending = true;
  RETURN_IF_ERROR(ForHighParts(ps, 0, UINT64_MAX, [&](uint64_t i, uint64_t high) {
    if ((high & high_mask) - high_lo > high_span) return;  // unsigned: outside the window
    const uint64_t x = high << ps.l | LowAt(ps, i);
    if ((x & mask) - lo >= hi - lo) return;  // unsigned: outside [lo, hi)
    if (keep != nullptr) {
      const uint64_t bit = keep_offset + (x & mask) - lo;
      if (((keep[bit >> 6] >> (bit & 63)) & 1) == 0) return;
    }
    // The keys returned ascend strictly and are non-negative, as in an intact posting.
    ascending &= x <= static_cast<uint64_t>(INT64_MAX) &&
                 (keys->size() == first || static_cast<int64_t>(x) > keys->back());
    keys->push_back(static_cast<int64_t>(x));
    values->push_back(ValueAt(ps, i));
  }));
  return ascending ? absl::OkStatus() : Malformed("keys not ascending");
}

absl::Status DecodePostingRange(absl::string_view in, int64_t row_start, ChunkDtype dtype,
                                int64_t lo, int64_t hi, std::vector<int64_t>* rows,
                                std::vector<float>* values, uint64_t* total) {
  Parsed ps;
  RETURN_IF_ERROR(Parse(in, dtype, &ps));
  if (total != nullptr) *total = ps.n;
  if (hi <= lo || hi <= row_start) return absl::OkStatus();
  const uint64_t x_lo = static_cast<uint64_t>(std::max<int64_t>(lo - row_start, 0));
  const uint64_t x_hi = static_cast<uint64_t>(hi - row_start);  // exclusive
  const size_t first = rows->size();
  bool ascending = true;
  RETURN_IF_ERROR(
      ForHighParts(ps, x_lo >> ps.l, (x_hi - 1) >> ps.l, [&](uint64_t i, uint64_t high) {
        const uint64_t x = high << ps.l | LowAt(ps, i);
        if (x < x_lo || x >= x_hi) return;  // x_hi <= INT64_MAX - row_start: no overflow
        const int64_t row = row_start + static_cast<int64_t>(x);
        ascending &= rows->size() == first || row > rows->back();
        rows->push_back(row);
        values->push_back(ValueAt(ps, i));
      }));
  return ascending ? absl::OkStatus() : Malformed("rows not ascending");
}

}  // namespace latentd::storage
