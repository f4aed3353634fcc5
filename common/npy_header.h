// The header of a .npy file: magic, version, header length and the dictionary {'descr',
// 'fortran_order', 'shape'}. NpyHeader writes one (format version 1.0, space-padded so that the
// data starts at a multiple of 64 bytes, as numpy writes it); ParseNpyHeader reads any version.
#ifndef LATENTD_COMMON_NPY_HEADER_H_
#define LATENTD_COMMON_NPY_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace latentd {

// `descr` is numpy's type string ("<u2", "<i4", "<f4"); C order. The result is at least
// `min_bytes` long (still a multiple of 64), so that a writer that learns the shape only at the
// end can reserve room and rewrite the header in place.
inline std::string NpyHeader(absl::string_view descr, const std::vector<int64_t>& shape,
                             size_t min_bytes = 0) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StrAppend(&dims, shape[i], shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  }
  std::string dict =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  constexpr size_t kPreamble = 10;  // magic (6), version (2), header length (2)
  size_t total = kPreamble + dict.size() + 1;
  if (total < min_bytes) total = min_bytes;
  total += (64 - total % 64) % 64;
  dict.append(total - kPreamble - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string header("\x93NUMPY\x01\x00", 8);
  header.push_back(static_cast<char>(dict.size() & 0xff));
  header.push_back(static_cast<char>(dict.size() >> 8));
  return header + dict;
}

struct NpyArrayInfo {
  std::string name;   // the caller's (e.g. an .npz entry name without ".npy"); not parsed
  std::string descr;  // e.g. "<f4"
  std::vector<int64_t> shape;
  int64_t item_size = 0;
  bool fortran_order = false;  // the data is column-major (numpy writes a transposed view so)
};

// Parses the .npy preamble at the start of `bytes` (magic, version 1-3, header dict) into
// `info` (its name left as is); *header_bytes is where the data starts. INVALID_ARGUMENT
// "<what>: ..." when it is not one. The data size is not checked here.
absl::Status ParseNpyHeader(const std::string& bytes, const std::string& what, NpyArrayInfo* info,
                            uint64_t* header_bytes);

}  // namespace latentd

#endif  // LATENTD_COMMON_NPY_HEADER_H_
