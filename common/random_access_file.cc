#include "common/random_access_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace latentd {

absl::StatusOr<std::unique_ptr<RandomAccessFile>> RandomAccessFile::Open(const std::string& path) {
  std::unique_ptr<RandomAccessFile> file(new RandomAccessFile());
  file->path_ = path;
  file->fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file->fd_ < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " not found"));
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(file->fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  file->size_ = st.st_size;
  return file;
}

RandomAccessFile::~RandomAccessFile() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::string> RandomAccessFile::Read(int64_t offset, int64_t size) const {
  if (offset < 0 || size < 0 || offset > size_ - size) {
    return absl::DataLossError(absl::StrCat(path_, ": ", size, " bytes at offset ", offset,
                                            " run past the end of the file"));
  }
  std::string bytes(size, '\0');
  int64_t done = 0;
  while (done < size) {
    const ssize_t r = pread(fd_, bytes.data() + done, size - done, offset + done);
    if (r <= 0) {
      return absl::DataLossError(
          absl::StrCat(path_, ": cannot read ", size, " bytes at offset ", offset));
    }
    done += r;
  }
  return bytes;
}

}  // namespace latentd
