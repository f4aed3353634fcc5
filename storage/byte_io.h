// Little-endian fixed-width fields and LEB128 varints: how the storage records (dataset record,
// watermark, chunk headers, statistics, top-N lists) are laid out. Header-only so every codec
// inlines them.
#ifndef LATENTD_STORAGE_BYTE_IO_H_
#define LATENTD_STORAGE_BYTE_IO_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace latentd::storage {

template <typename T>
void PutRaw(T v, std::string* out) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

inline void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// A varint written before bytes that are appended after it, without a temporary string:
// ReserveVarint leaves `guess` bytes for it and returns where the bytes start; PatchVarint then
// writes the value there (canonical, so the bytes move when it needs another size than guessed).
inline size_t ReserveVarint(int guess, std::string* out) {
  out->append(guess, '\0');
  return out->size();
}
inline void PatchVarint(size_t start, int guess, uint64_t v, std::string* out) {
  char buf[10];
  int n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out->replace(start - guess, guess, buf, n);
}

// u32 length + bytes.
inline void PutString(const std::string& s, std::string* out) {
  PutRaw<uint32_t>(static_cast<uint32_t>(s.size()), out);
  out->append(s);
}

// Reads fields front to back. A read past the end (or a varint longer than 64 bits) returns a
// zero value and leaves ok() false for good, so a decoder reads every field and checks once.
class ByteReader {
 public:
  explicit ByteReader(absl::string_view in) : in_(in) {}
  template <typename T>
  T Raw() {
    T v{};
    if (in_.size() < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return v;
  }
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && !in_.empty(); shift += 7) {
      const uint8_t b = static_cast<uint8_t>(in_.front());
      in_.remove_prefix(1);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    ok_ = false;
    return 0;
  }
  std::string String() {
    const uint32_t n = Raw<uint32_t>();
    if (!ok_ || in_.size() < n) {
      ok_ = false;
      return "";
    }
    std::string s(in_.substr(0, n));
    in_.remove_prefix(n);
    return s;
  }
  void Skip(size_t n) {
    if (n > in_.size()) ok_ = false;
    in_.remove_prefix(std::min(n, in_.size()));
  }
  absl::string_view rest() const { return in_; }
  bool ok() const { return ok_; }

 private:
  absl::string_view in_;
  bool ok_ = true;
};

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_BYTE_IO_H_
