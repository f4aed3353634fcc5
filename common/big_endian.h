// Fixed-width big-endian integers for RocksDB keys: byte order equals numeric order, so range scans
// over ids come out sorted.
#ifndef LATENTD_COMMON_BIG_ENDIAN_H_
#define LATENTD_COMMON_BIG_ENDIAN_H_

#include <cstdint>
#include <string>

namespace latentd {

inline void AppendBigEndian64(uint64_t value, std::string* out) {
  for (int shift = 56; shift >= 0; shift -= 8) {
    out->push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

inline void AppendBigEndian32(uint32_t value, std::string* out) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out->push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

// Reads 8 bytes at `p`; the caller guarantees they exist.
inline uint64_t ReadBigEndian64(const char* p) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | static_cast<unsigned char>(p[i]);
  return value;
}

inline uint32_t ReadBigEndian32(const char* p) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value = (value << 8) | static_cast<unsigned char>(p[i]);
  return value;
}

}  // namespace latentd

#endif  // LATENTD_COMMON_BIG_ENDIAN_H_
