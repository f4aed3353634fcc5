#include "engine/npz.h"

#include <algorithm>
#include <fstream>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engine/zip_archive.h"

namespace latentd::engine {
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
  const uint64_t len = LittleEndian(bytes, 8, static_cast<int>(len_bytes));
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

absl::StatusOr<NpzReader> NpzReader::Open(const std::string& path) {
  ASSIGN_OR_RETURN(ZipArchive zip, ZipArchive::Open(path));
  NpzReader r(std::move(zip));
  for (const ZipArchive::Entry& e : r.zip_.entries()) {
    if (!absl::EndsWith(e.name, ".npy")) continue;
    NpyArrayInfo info;
    info.name = e.name.substr(0, e.name.size() - 4);
    ASSIGN_OR_RETURN(std::string head, r.zip_.Read(e, 65536));
    uint64_t header_bytes = 0;
    RETURN_IF_ERROR(ParseNpyHeader(head, absl::StrCat(path, ": ", e.name), &info, &header_bytes));
    uint64_t want = static_cast<uint64_t>(info.item_size);
    for (int64_t dim : info.shape) want *= static_cast<uint64_t>(dim);
    if (header_bytes + want != e.uncompressed) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", e.name, ": ", e.uncompressed - header_bytes,
                       " data bytes, its shape and dtype imply ", want));
    }
    r.arrays_.push_back(std::move(info));
    r.entries_.push_back({&e, header_bytes});
  }
  return r;
}

const NpyArrayInfo* NpzReader::Find(const std::string& name) const {
  for (const NpyArrayInfo& a : arrays_) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

absl::StatusOr<std::string> NpzReader::ReadData(const std::string& name) const {
  for (size_t i = 0; i < arrays_.size(); ++i) {
    if (arrays_[i].name != name) continue;
    const ArrayEntry& a = entries_[i];
    ASSIGN_OR_RETURN(std::string bytes, zip_.Read(*a.entry));
    if (bytes.size() != a.entry->uncompressed) {
      return absl::InvalidArgumentError(absl::StrCat(zip_.path(), ": ", name, ".npy is short"));
    }
    bytes.erase(0, a.npy_header_bytes);
    return bytes;
  }
  return absl::NotFoundError(absl::StrCat(zip_.path(), " has no array ", name));
}

}  // namespace latentd::engine
