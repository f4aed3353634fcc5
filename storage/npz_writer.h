// A .npz writer (what numpy.savez and scipy.sparse.save_npz write: an uncompressed ZIP of .npy
// members) whose arrays arrive in pieces, so that an export of any size runs in the memory of
// one piece.
//
// A ZIP member needs its size and CRC in its header and its .npy header needs its shape, and
// neither is known before the last piece. So the first streamed array goes straight into the
// file behind a header reserved at a fixed size and rewritten at Finish; every other streamed
// array goes into a side file beside `path` (`<path>.<name>.part`) that Finish copies in and
// deletes. Put the largest array first: only the others cost a second write.
//
// Sizes and offsets from `zip64_from` bytes on are recorded in ZIP64 fields (numpy, which reads
// through Python's zipfile, and every current unzip read them); below it the file is a classic
// ZIP, so older readers see no difference.
//
// Not thread-safe. A writer destroyed before Finish succeeds removes its side files but leaves
// `path` (the caller writes to a temporary name and renames).
#ifndef LATENTD_STORAGE_NPZ_WRITER_H_
#define LATENTD_STORAGE_NPZ_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latentd::storage {

struct NpzWriterOptions {
  // Sizes and offsets at or above this go in ZIP64 fields. Default: the classic format's limit;
  // tests lower it to read the ZIP64 form back without writing 4 GiB.
  uint64_t zip64_from = 0xffffffffull;
};

class NpzWriter {
 public:
  // Creates (truncates) `path`. PERMISSION_DENIED when it cannot.
  static absl::StatusOr<std::unique_ptr<NpzWriter>> Create(
      const std::string& path, const NpzWriterOptions& options = NpzWriterOptions());
  ~NpzWriter();
  NpzWriter(const NpzWriter&) = delete;
  NpzWriter& operator=(const NpzWriter&) = delete;

  // Declares an array whose elements come by Append: numpy type `descr` ("<f2", "<i4", "<i8"),
  // `item_bytes` per element, and the shape after the first dimension (empty for 1-D), the first
  // growing with each Append. Returns its handle. Every AddStreamed precedes the first Append.
  absl::StatusOr<int> AddStreamed(const std::string& name, const std::string& descr, int item_bytes,
                                  std::vector<int64_t> inner_shape = {});
  // Appends `count` entries along the first dimension (count x the inner shape's elements).
  absl::Status Append(int array, const void* data, int64_t count);
  // An array known whole (a scalar: empty shape), written at Finish.
  void AddWhole(const std::string& name, const std::string& descr, std::vector<int64_t> shape,
                std::string bytes);
  // Writes every header, the side files and the central directory, and closes `path`.
  // RESOURCE_EXHAUSTED when a write fails (a full disk).
  absl::Status Finish();

 private:
  struct Member;
  NpzWriter(std::string path, std::FILE* file, const NpzWriterOptions& options);
  absl::Status WriteMemberHeaders(Member* member);
  absl::Status WriteAt(uint64_t offset, const std::string& bytes);
  absl::Status Write(const void* data, size_t size);
  absl::Status CopySideFile(Member* member);
  absl::Status WriteCentralDirectory();
  void RemoveSideFiles();

  std::string path_;
  std::FILE* file_;
  NpzWriterOptions options_;
  std::vector<std::unique_ptr<Member>> members_;
  uint64_t offset_ = 0;  // bytes written to path_ so far
  bool appending_ = false;
  bool finished_ = false;
};

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_NPZ_WRITER_H_
