#include "client/direction_file.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/npy_header.h"
#include "common/read_file.h"
#include "common/status_macros.h"

namespace latentd::client {
namespace {

absl::StatusOr<std::vector<float>> FromNpy(const std::string& bytes, const std::string& path) {
  NpyArrayInfo info;
  uint64_t data_at = 0;
  RETURN_IF_ERROR(ParseNpyHeader(bytes, path, &info, &data_at));
  if (info.descr != "<f4" && info.descr != "<f8") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": dtype ", info.descr, "; save the direction as float32 or float64"));
  }
  const bool vector = info.shape.size() == 1 || (info.shape.size() == 2 && info.shape[0] == 1);
  if (!vector) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": an array of ", info.shape.size(),
                                                   " dimensions; a direction is one vector"));
  }
  const int64_t n = info.shape.back();
  if (bytes.size() - data_at != static_cast<uint64_t>(n * info.item_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", bytes.size() - data_at, " data bytes; its shape needs ", n * info.item_size));
  }
  std::vector<float> out(n);
  const char* data = bytes.data() + data_at;
  for (int64_t i = 0; i < n; ++i) {
    if (info.item_size == 4) {
      std::memcpy(&out[i], data + 4 * i, 4);
    } else {
      double v;
      std::memcpy(&v, data + 8 * i, 8);
      out[i] = static_cast<float>(v);
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> FromText(const std::string& text, const std::string& path) {
  std::vector<float> out;
  for (absl::string_view item :
       absl::StrSplit(text, absl::ByAnyChar(" \t\r\n,"), absl::SkipEmpty())) {
    float v;
    if (!absl::SimpleAtof(item, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": value ", out.size(), " (\"", item, "\") is not a number"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<float>> ReadDirection(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadFileToString(path));
  ASSIGN_OR_RETURN(std::vector<float> out, bytes.compare(0, 6, "\x93NUMPY") == 0
                                               ? FromNpy(bytes, path)
                                               : FromText(bytes, path));
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no values"));
  return out;
}

}  // namespace latentd::client
