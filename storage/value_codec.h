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

// v rounded to the nearest fp16 value and widened back: bit for bit HalfToFloat(FloatToHalf(v))
// for every v (NaN becomes the quiet NaN FloatToHalf stores), written as selects instead of
// branches, for the loops over whole arrays below.
inline float RoundToHalf(float v) {
  const uint32_t f = FloatBits(v);
  const uint32_t sign = f & 0x80000000u;
  const uint32_t mag = f ^ sign;
  // Half normals keep 10 of float's 23 mantissa bits (ties to even); a carry out of the
  // mantissa moves to the next binade, as it should.
  const uint32_t normal = (mag + 0xfffu + ((mag >> 13) & 1)) & ~0x1fffu;
  // Below 2^-14 halves are multiples of 2^-24, the spacing of floats in [0.5, 1): adding 0.5
  // lets the FPU round (ties to even), subtracting it is exact.
  const uint32_t subnormal = FloatBits((BitsFloat(mag) + 0.5f) - 0.5f);
  uint32_t out = mag < 0x38800000u ? subnormal : normal;
  out = normal >= 0x47800000u ? 0x7f800000u : out;  // rounds to 65536 or more: infinity
  out = mag > 0x7f800000u ? 0x7fc00000u : out;      // NaN
  return BitsFloat(out | sign);
}

// v rounded to the nearest bfloat16 and widened back: BFloat16ToFloat(FloatToBFloat16(v)).
inline float RoundToBFloat16(float v) {
  const uint32_t f = FloatBits(v);
  const uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1)) & 0xffff0000u;
  const uint32_t nan = (f | 0x400000u) & 0xffff0000u;
  return BitsFloat((f & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// values[0, n) rounded in place with RoundToHalf / RoundToBFloat16: about 2x a loop through
// the 16-bit form (bench/codec_bench).
inline void RoundArrayToHalf(float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) values[i] = RoundToHalf(values[i]);
}
inline void RoundArrayToBFloat16(float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) values[i] = RoundToBFloat16(values[i]);
}

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_VALUE_CODEC_H_
