// Writing a whole file so that readers see the old contents or the new, never a part.
#ifndef LATENTD_COMMON_WRITE_FILE_H_
#define LATENTD_COMMON_WRITE_FILE_H_

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace latentd {

// Writes `contents` to `path` + ".tmp", then renames it over `path`. INTERNAL naming the file
// and the reason when either step fails (the temporary is then removed).
inline absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    if (!out.flush()) {
      const std::string reason = std::strerror(errno);
      std::remove(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", reason));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", reason));
  }
  return absl::OkStatus();
}

}  // namespace latentd

#endif  // LATENTD_COMMON_WRITE_FILE_H_
