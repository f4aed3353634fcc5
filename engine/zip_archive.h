// Reading the entries of a zip archive (numpy's .npz, torch.save's files) without loading the
// whole file: the central directory and each entry's local header on Open, an entry's bytes
// (or a prefix of them) on Read. Stored and deflated entries, zip64 fields. Torch-free.
//
// Every offset is checked against the file: a violation is INVALID_ARGUMENT naming the file (and
// the entry): no end-of-central-directory record, a corrupt directory or local header, an entry
// running past the end, a compression method other than stored or deflate (on Read), a corrupt
// deflate stream.
#ifndef LATENTD_ENGINE_ZIP_ARCHIVE_H_
#define LATENTD_ENGINE_ZIP_ARCHIVE_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace latentd::engine {

// The unsigned little-endian integer of `bytes` bytes at b[at] (the caller checks the range).
uint64_t LittleEndian(const std::string& b, size_t at, int bytes);

class ZipArchive {
 public:
  struct Entry {
    std::string name;
    uint16_t method = 0;  // 0 stored, 8 deflate (others are refused on Read)
    uint64_t compressed = 0, uncompressed = 0;
    uint64_t data_offset = 0;  // of the entry's (compressed) bytes in the file
  };

  // NOT_FOUND for a missing file.
  static absl::StatusOr<ZipArchive> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* Find(const std::string& name) const;  // nullptr when absent

  // The first min(max_bytes, uncompressed) bytes of the entry, uncompressed.
  absl::StatusOr<std::string> Read(const Entry& entry,
                                   uint64_t max_bytes = std::numeric_limits<uint64_t>::max()) const;

 private:
  std::string path_;
  std::vector<Entry> entries_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_ZIP_ARCHIVE_H_
