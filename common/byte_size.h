// A byte count as people read it in plans and messages: decimal units, three or four significant
// digits ("512 B", "196.6 kB", "17.0 MB", "1.52 GB", "2100.00 GB"), so a small file does not read
// "0.0 MB" and a large one does not read "2100000.0 MB".
#ifndef LATENTD_COMMON_BYTE_SIZE_H_
#define LATENTD_COMMON_BYTE_SIZE_H_

#include <string>

#include "absl/strings/str_format.h"

namespace latentd {

inline std::string ByteSize(double bytes) {
  if (bytes < 1e3) return absl::StrFormat("%.0f B", bytes);
  if (bytes < 1e6) return absl::StrFormat("%.1f kB", bytes / 1e3);
  if (bytes < 1e9) return absl::StrFormat("%.1f MB", bytes / 1e6);
  return absl::StrFormat("%.2f GB", bytes / 1e9);
}

}  // namespace latentd

#endif  // LATENTD_COMMON_BYTE_SIZE_H_
