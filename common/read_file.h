// Reading a whole file, with the error a user can act on.
#ifndef LATENTD_COMMON_READ_FILE_H_
#define LATENTD_COMMON_READ_FILE_H_

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace latentd {

// The contents of `path`. NOT_FOUND "<path>: no such file" when it does not exist;
// INVALID_ARGUMENT "<path>: <reason>" when it cannot be read (permissions, a directory).
inline absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return errno == ENOENT
               ? absl::NotFoundError(absl::StrCat(path, ": no such file"))
               : absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  return contents.str();
}

}  // namespace latentd

#endif  // LATENTD_COMMON_READ_FILE_H_
