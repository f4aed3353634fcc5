// FNV-1a (64-bit) over byte strings: the weight hashes datasets record for their model and SAE
// ("fnv1a64:<16 hex digits>"). Not cryptographic; it tells a changed file from the one a dataset
// was made with.
#ifndef LATENTD_COMMON_FNV1A_H_
#define LATENTD_COMMON_FNV1A_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace latentd {

class Fnv1a64 {
 public:
  void Add(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    uint64_t h = hash_;
    for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 1099511628211ull;
    hash_ = h;
  }
  void Add(const std::string& bytes) { Add(bytes.data(), bytes.size()); }
  uint64_t value() const { return hash_; }
  // "fnv1a64:" and the value as 16 lower-case hex digits.
  std::string ToString() const {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "fnv1a64:%016llx", static_cast<unsigned long long>(hash_));
    return buf;
  }

 private:
  uint64_t hash_ = 1469598103934665603ull;
};

}  // namespace latentd

#endif  // LATENTD_COMMON_FNV1A_H_
