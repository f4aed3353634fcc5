#include "common/npy_header.h"

#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace latentd {
namespace {

// The value of `key` in a .npy header dict ("{'descr': '<f4', 'fortran_order': False, ...}").
std::string DictValue(const std::string& dict, const std::string& key) {
  const size_t at = dict.find("'" + key + "'");
  if (at == std::string::npos) return "";
  size_t start = dict.find(':', at);
  if (start == std::string::npos) return "";
  ++start;
  while (start < dict.size() && dict[start] == ' ') ++start;
  size_t end = start;
  if (start < dict.size() && dict[start] == '(') {
    end = dict.find(')', start);
    return end == std::string::npos ? "" : dict.substr(start, end - start + 1);
  }
  while (end < dict.size() && dict[end] != ',' && dict[end] != '}') ++end;
  return std::string(absl::StripAsciiWhitespace(dict.substr(start, end - start)));
}

}  // namespace

absl::Status ParseNpyHeader(const std::string& bytes, const std::string& what, NpyArrayInfo* info,
                            uint64_t* header_bytes) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
  };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return bad("not an .npy array");
  const int major = static_cast<unsigned char>(bytes[6]);
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (major < 1 || major > 3 || bytes.size() < 8 + len_bytes) return bad("unknown .npy version");
  uint64_t len = 0;
  for (size_t i = 0; i < len_bytes; ++i) {
    len |= uint64_t{static_cast<unsigned char>(bytes[8 + i])} << (8 * i);
  }
  *header_bytes = 8 + len_bytes + len;
  if (bytes.size() < *header_bytes) return bad(".npy header longer than the entry");
  const std::string dict = bytes.substr(8 + len_bytes, len);
  info->descr = DictValue(dict, "descr");
  if (info->descr.size() < 4 || info->descr.front() != '\'' || info->descr.back() != '\'') {
    return bad(absl::StrCat("no descr in the .npy header ", dict));
  }
  info->descr = info->descr.substr(1, info->descr.size() - 2);
  const std::string order = DictValue(dict, "fortran_order");
  if (order != "False" && order != "True") return bad("no fortran_order in the .npy header");
  info->fortran_order = order == "True";
  const std::string shape = DictValue(dict, "shape");
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') {
    return bad(absl::StrCat("cannot parse the .npy shape in ", dict));
  }
  info->shape.clear();
  for (absl::string_view dim :
       absl::StrSplit(shape.substr(1, shape.size() - 2), ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(dim, &v) || v < 0) return bad(absl::StrCat("bad .npy shape ", shape));
    info->shape.push_back(v);
  }
  if (!absl::SimpleAtoi(info->descr.substr(2), &info->item_size) || info->item_size <= 0) {
    return bad(absl::StrCat("unknown dtype ", info->descr));
  }
  return absl::OkStatus();
}

}  // namespace latentd
