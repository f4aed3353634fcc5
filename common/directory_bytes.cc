#include "common/directory_bytes.h"

#include <system_error>

namespace latentd {

int64_t DirectoryBytes(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(dir, ec), end;
  if (ec) return -1;
  int64_t bytes = 0;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code size_error;
    // is_regular_file follows a link: a link to a file elsewhere would count that file.
    if (it->is_symlink(size_error) || !it->is_regular_file(size_error)) continue;
    const auto size = it->file_size(size_error);
    if (!size_error) bytes += static_cast<int64_t>(size);
  }
  return bytes;
}

}  // namespace latentd
