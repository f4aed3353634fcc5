// Conversions between float and the stored value dtypes (IEEE fp16, bfloat16), round to nearest
// even, NaN preserved, overflow to infinity. Header-only so the codec and exporters inline them.
#ifndef LATENTD_STORAGE_VALUE_CODEC_H_
#define LATENTD_STORAGE_VALUE_CODEC_H_

#include <cstdint>
#include <cstring>

namespace latentd::storage {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t FloatToHalf(float value) {
  uint32_t f = FloatBits(value);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint16_t out;
  if (f >= 0x47800000u) {  // >= 65536, inf or NaN
    out = f > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (f < 0x38800000u) {  // below the smallest normal half: the FPU rounds for us
    out = static_cast<uint16_t>(FloatBits(BitsFloat(f) + 0.5f) - 0x3f000000u);
  } else {
    const uint32_t mantissa_odd = (f >> 13) & 1;
    f += (static_cast<uint32_t>(15 - 127) << 23) + 0xfff + mantissa_odd;
    out = static_cast<uint16_t>(f >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t em = h & 0x7fff;
  if (em >= 0x7c00) return BitsFloat(sign | 0x7f800000u | ((em & 0x3ff) << 13));
  if (em >= 0x400) return BitsFloat(sign | ((em << 13) + (static_cast<uint32_t>(127 - 15) << 23)));
  const float magnitude = static_cast<float>(em) * 5.9604644775390625e-8f;  // em * 2^-24
  return sign ? -magnitude : magnitude;
}

inline uint16_t FloatToBFloat16(float value) {
  const uint32_t f = FloatBits(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((f >> 16) | 0x40);  // NaN
  return static_cast<uint16_t>((f + 0x7fffu + ((f >> 16) & 1)) >> 16);
}

inline float BFloat16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_VALUE_CODEC_H_
