// A regular file read at offsets (pread), for readers that go straight to the parts of a large
// file they need (common/parquet_column, common/arrow_column). Safe to read from several threads.
#ifndef LATENTD_COMMON_RANDOM_ACCESS_FILE_H_
#define LATENTD_COMMON_RANDOM_ACCESS_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace latentd {

class RandomAccessFile {
 public:
  // NOT_FOUND "<path> not found"; PERMISSION_DENIED when it cannot be opened; INVALID_ARGUMENT
  // when it is not a regular file.
  static absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(const std::string& path);
  ~RandomAccessFile();
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }

  // Bytes [offset, offset + size). DATA_LOSS naming the file when the range leaves it (checked
  // before anything is allocated) or the read fails.
  absl::StatusOr<std::string> Read(int64_t offset, int64_t size) const;

 private:
  RandomAccessFile() = default;
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

}  // namespace latentd

#endif  // LATENTD_COMMON_RANDOM_ACCESS_FILE_H_
