#include "storage/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace latentd::storage {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // reflected Castagnoli polynomial

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

const Tables& GetTables() {
  static const Tables* tables = new Tables();
  return *tables;
}

#if defined(__x86_64__)
// The crc32 instruction has a latency of 3 cycles and a throughput of 1: three independent
// streams over three lanes of kLane bytes keep it busy. The lanes are then joined with "the state
// after kLane more zero bytes", a linear map of the 32-bit state (no inversions inside), applied
// as four 256-entry tables: crc(A B) = shift(crc(A)) ^ crc_from_zero(B).
constexpr size_t kLane = 1024;

struct LaneShift {
  uint32_t t[4][256];
};

__attribute__((target("sse4.2"))) uint32_t AfterLaneOfZeros(uint32_t state) {
  uint64_t c = state;
  for (size_t i = 0; i < kLane / 8; ++i) c = _mm_crc32_u64(c, 0);
  return static_cast<uint32_t>(c);
}

const LaneShift& GetLaneShift() {
  static const LaneShift* shift = [] {
    auto* s = new LaneShift;
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) s->t[k][b] = AfterLaneOfZeros(b << (8 * k));
    }
    return s;
  }();
  return *shift;
}

inline uint32_t ShiftLane(const LaneShift& s, uint32_t x) {
  return s.t[0][x & 0xff] ^ s.t[1][(x >> 8) & 0xff] ^ s.t[2][(x >> 16) & 0xff] ^ s.t[3][x >> 24];
}

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p,
                                                          size_t n) {
  uint64_t c = ~crc;
  if (n >= 3 * kLane) {
    const LaneShift& shift = GetLaneShift();
    do {
      uint64_t c0 = c, c1 = 0, c2 = 0;
      for (size_t i = 0; i < kLane; i += 8) {
        uint64_t w0, w1, w2;
        std::memcpy(&w0, p + i, 8);
        std::memcpy(&w1, p + kLane + i, 8);
        std::memcpy(&w2, p + 2 * kLane + i, 8);
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
      }
      c = ShiftLane(shift,
                    ShiftLane(shift, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^
          static_cast<uint32_t>(c2);
      p += 3 * kLane;
      n -= 3 * kLane;
    } while (n >= 3 * kLane);
  }
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return ~c32;
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size) {
  const Tables& tb = GetTables();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // little-endian hosts only (x86-64, aarch64)
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = tb.t[7][lo & 0xff] ^ tb.t[6][(lo >> 8) & 0xff] ^ tb.t[5][(lo >> 16) & 0xff] ^
        tb.t[4][lo >> 24] ^ tb.t[3][hi & 0xff] ^ tb.t[2][(hi >> 8) & 0xff] ^
        tb.t[1][(hi >> 16) & 0xff] ^ tb.t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    c = tb.t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --size;
  }
  return ~c;
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  if (HasSse42()) return ExtendHardware(crc, static_cast<const uint8_t*>(data), size);
#endif
  return Crc32cExtendPortable(crc, data, size);
}

}  // namespace latentd::storage
