// Reading NumPy .npz archives (what numpy.savez and savez_compressed write: a zip of .npy
// files, stored or deflated, with zip64 fields as numpy always writes them) without loading
// the whole file: the central directory and each array's .npy header are read on Open, the
// data of one array on ReadData. Torch-free, for submit-time checks of Gemma Scope's
// params.npz SAEs.
//
// Everything in the file is validated; a violation is INVALID_ARGUMENT naming the file (and the
// array): a missing end-of-central-directory record, a compression method other than stored or
// deflate, a corrupt deflate stream, an .npy header that is not a dict with descr,
// fortran_order and a shape of non-negative integers, a data size other than shape x item
// size.
#ifndef LATENTD_ENGINE_NPZ_H_
#define LATENTD_ENGINE_NPZ_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/npy_header.h"
#include "engine/zip_archive.h"

namespace latentd::engine {

class NpzReader {
 public:
  // NOT_FOUND for a missing file.
  static absl::StatusOr<NpzReader> Open(const std::string& path);

  const std::vector<NpyArrayInfo>& arrays() const { return arrays_; }
  const NpyArrayInfo* Find(const std::string& name) const;  // nullptr when absent
  // The array's data bytes (little-endian as its descr says, in the array's order).
  absl::StatusOr<std::string> ReadData(const std::string& name) const;

 private:
  explicit NpzReader(ZipArchive zip) : zip_(std::move(zip)) {}

  struct ArrayEntry {
    const ZipArchive::Entry* entry;  // in zip_
    uint64_t npy_header_bytes = 0;   // of the .npy preamble inside the entry
  };

  ZipArchive zip_;
  std::vector<NpyArrayInfo> arrays_;
  std::vector<ArrayEntry> entries_;  // parallel to arrays_
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_NPZ_H_
