// Reading and writing the safetensors format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}}
// with an optional "__metadata__" string map, then the raw little-endian tensor bytes.
//
// The reader trusts nothing in the file: every header field is validated and a violation is
// INVALID_ARGUMENT naming the file and the offending tensor (DATA_LOSS would suggest our own store
// lost data; these are user files). Torch-free, so submit-time validation can read headers cheaply.
#ifndef LATENTD_COMMON_SAFETENSORS_H_
#define LATENTD_COMMON_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latentd {

enum class StDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU64, kU32, kU16, kU8, kBool };

// "F32" -> kF32 ...; INVALID_ARGUMENT for an unknown name.
absl::StatusOr<StDtype> ParseStDtype(const std::string& name);
const char* StDtypeName(StDtype dtype);
int StDtypeSize(StDtype dtype);
// F32, F16, BF16 or F64: the dtypes weights are read from (as float32).
inline bool IsStFloat(StDtype d) {
  return d == StDtype::kF32 || d == StDtype::kF16 || d == StDtype::kBF16 || d == StDtype::kF64;
}

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // byte offsets into the data section (after the header)
  int64_t end = 0;
  int64_t numel() const;
};

struct StHeader {
  std::vector<StTensorInfo> tensors;  // in data-offset order
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // file offset of the data section: 8 + N
  const StTensorInfo* Find(const std::string& name) const;  // nullptr when absent
};

// Parses and validates a header given the file size: N bound by the file size (and by a 100 MB
// sanity limit), a JSON object, known dtypes, non-negative shapes, data_offsets [begin, end] with
// end - begin == numel * dtype size, tensors covering the data section contiguously without gaps
// or overlap, and the data section ending exactly at the end of the file.
absl::StatusOr<StHeader> ParseStHeader(const std::string& header_json, int64_t header_len,
                                       int64_t file_size);

// Reads only the header of `path` (cheap: two small reads). NOT_FOUND when the file is missing.
absl::StatusOr<StHeader> ReadStHeader(const std::string& path);

// A whole file in memory.
class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);

  const StHeader& header() const { return header_; }
  // The whole file as read.
  const std::string& bytes() const { return bytes_; }
  // The bytes of `info` (one of header().tensors).
  const char* data(const StTensorInfo& info) const {
    return bytes_.data() + header_.data_start + info.begin;
  }

 private:
  StHeader header_;
  std::string bytes_;
};

struct StTensorToWrite {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel * dtype size bytes, little-endian
};

// Writes a safetensors file atomically (temporary file, fsync, rename). Tensors are laid out in the
// order given; the header is padded with spaces to a multiple of 8 bytes as the reference writer
// does.
absl::Status WriteSafetensors(const std::string& path, const std::vector<StTensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace latentd

#endif  // LATENTD_COMMON_SAFETENSORS_H_
