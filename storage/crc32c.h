// CRC32C (Castagnoli), the checksum every stored chunk carries. Debian's abseil 20220623 has no
// crc32c library, so this is a small one: SSE4.2 crc32 instructions when the CPU has them, a
// slicing-by-8 table otherwise. Both give identical results.
#ifndef LATENTD_STORAGE_CRC32C_H_
#define LATENTD_STORAGE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace latentd::storage {

// Extends `crc` (the value returned for the bytes before) over `data[0, size)`. Start with 0.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

// The portable table implementation, exposed so tests can compare it with the hardware path.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_CRC32C_H_
