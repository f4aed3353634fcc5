#include "engine/npz.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/zip_archive.h"

namespace latentd::engine {

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
