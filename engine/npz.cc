#include "engine/npz.h"

#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

uint64_t Le(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

absl::StatusOr<std::string> ReadAt(std::ifstream& in, const std::string& path, uint64_t offset,
                                   uint64_t size) {
  std::string out(size, '\0');
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  if (!in.read(out.data(), static_cast<std::streamsize>(size))) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated zip (", size, " bytes at offset ", offset, ")"));
  }
  return out;
}

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

// Inflates a raw deflate stream, stopping after `max_out` bytes.
absl::StatusOr<std::string> Inflate(const std::string& in, uint64_t max_out,
                                    const std::string& what) {
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return absl::InternalError("zlib inflateInit2");
  std::string out(max_out, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(std::min<uint64_t>(in.size(), std::numeric_limits<uInt>::max()));
  uint64_t produced = 0;
  int rc = Z_OK;
  while (produced < max_out && rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    z.avail_out = static_cast<uInt>(std::min<uint64_t>(max_out - produced, 1u << 30));
    rc = inflate(&z, Z_NO_FLUSH);
    produced = z.total_out;
    if (rc == Z_BUF_ERROR && z.avail_in == 0) break;  // the input we read ends here
  }
  inflateEnd(&z);
  if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": corrupt deflate stream"));
  }
  out.resize(produced);
  return out;
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
  const uint64_t len = Le(bytes, 8, static_cast<int>(len_bytes));
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
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat(path, " not found"));
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
  };
  // The end-of-central-directory record: 22 bytes plus a comment of up to 64 KiB.
  const uint64_t tail_size = std::min<uint64_t>(size, 22 + 65535);
  ASSIGN_OR_RETURN(std::string tail, ReadAt(in, path, size - tail_size, tail_size));
  const size_t eocd = tail.rfind(std::string("PK\x05\x06", 4));
  if (eocd == std::string::npos || eocd + 22 > tail.size()) {
    return bad("not a zip file (no end of central directory)");
  }
  uint64_t count = Le(tail, eocd + 10, 2), cd_size = Le(tail, eocd + 12, 4),
           cd_offset = Le(tail, eocd + 16, 4);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    // zip64: the locator just before the record points at the zip64 record.
    if (eocd < 20 || tail.compare(eocd - 20, 4, std::string("PK\x06\x07", 4)) != 0) {
      return bad("zip64 fields without a zip64 locator");
    }
    ASSIGN_OR_RETURN(std::string z64, ReadAt(in, path, Le(tail, eocd - 20 + 8, 8), 56));
    if (z64.compare(0, 4, std::string("PK\x06\x06", 4)) != 0) return bad("bad zip64 record");
    count = Le(z64, 32, 8), cd_size = Le(z64, 40, 8), cd_offset = Le(z64, 48, 8);
  }
  if (cd_offset + cd_size > size) return bad("central directory beyond the end of the file");
  ASSIGN_OR_RETURN(std::string cd, ReadAt(in, path, cd_offset, cd_size));
  NpzReader r;
  r.path_ = path;
  size_t at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (at + 46 > cd.size() || cd.compare(at, 4, std::string("PK\x01\x02", 4)) != 0) {
      return bad("corrupt central directory");
    }
    Entry e;
    e.method = static_cast<uint16_t>(Le(cd, at + 10, 2));
    e.compressed = Le(cd, at + 20, 4);
    e.uncompressed = Le(cd, at + 24, 4);
    const size_t name_len = Le(cd, at + 28, 2), extra_len = Le(cd, at + 30, 2),
                 comment_len = Le(cd, at + 32, 2);
    e.local_offset = Le(cd, at + 42, 4);
    if (at + 46 + name_len + extra_len + comment_len > cd.size()) {
      return bad("corrupt central directory");
    }
    const std::string name = cd.substr(at + 46, name_len);
    // zip64 extra field: the 0xFFFFFFFF values, in order.
    for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint64_t id = Le(cd, x, 2), len = Le(cd, x + 2, 2);
      size_t v = x + 4;
      if (id == 1) {
        for (uint64_t* field : {&e.uncompressed, &e.compressed, &e.local_offset}) {
          if (*field == 0xFFFFFFFF && v + 8 <= x + 4 + len) {
            *field = Le(cd, v, 8);
            v += 8;
          }
        }
      }
      x += 4 + len;
    }
    at += 46 + name_len + extra_len + comment_len;
    if (!absl::EndsWith(name, ".npy")) continue;
    if (e.method != 0 && e.method != 8) {
      return bad(absl::StrCat(name, " uses zip compression method ", e.method,
                              " (stored and deflate are read)"));
    }
    ASSIGN_OR_RETURN(std::string local, ReadAt(in, path, e.local_offset, 30));
    if (local.compare(0, 4, std::string("PK\x03\x04", 4)) != 0) {
      return bad(absl::StrCat(name, ": bad local header"));
    }
    e.data_offset = e.local_offset + 30 + Le(local, 26, 2) + Le(local, 28, 2);
    if (e.data_offset + e.compressed > size) return bad(absl::StrCat(name, " runs past the end"));
    NpyArrayInfo info;
    info.name = name.substr(0, name.size() - 4);
    ASSIGN_OR_RETURN(std::string head, r.EntryBytes(e, std::min<uint64_t>(e.uncompressed, 65536)));
    RETURN_IF_ERROR(
        ParseNpyHeader(head, absl::StrCat(path, ": ", name), &info, &e.npy_header_bytes));
    uint64_t want = static_cast<uint64_t>(info.item_size);
    for (int64_t dim : info.shape) want *= static_cast<uint64_t>(dim);
    if (e.npy_header_bytes + want != e.uncompressed) {
      return bad(absl::StrCat(name, ": ", e.uncompressed - e.npy_header_bytes,
                              " data bytes, its shape and dtype imply ", want));
    }
    r.arrays_.push_back(std::move(info));
    r.entries_.push_back(e);
  }
  return r;
}

const NpyArrayInfo* NpzReader::Find(const std::string& name) const {
  for (const NpyArrayInfo& a : arrays_) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

absl::StatusOr<std::string> NpzReader::EntryBytes(const Entry& e, uint64_t max_bytes) const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path_, " not found"));
  if (e.method == 0) return ReadAt(in, path_, e.data_offset, std::min(max_bytes, e.compressed));
  // Deflate expands incompressible data by well under 1/64 plus a few bytes a block, so a prefix
  // of that size holds the first max_bytes (an .npy header needs 64 KiB, not the whole entry).
  const uint64_t prefix = max_bytes >= e.uncompressed
                              ? e.compressed
                              : std::min(e.compressed, max_bytes + max_bytes / 64 + 1024);
  ASSIGN_OR_RETURN(std::string compressed, ReadAt(in, path_, e.data_offset, prefix));
  return Inflate(compressed, max_bytes, path_);
}

absl::StatusOr<std::string> NpzReader::ReadData(const std::string& name) const {
  for (size_t i = 0; i < arrays_.size(); ++i) {
    if (arrays_[i].name != name) continue;
    const Entry& e = entries_[i];
    ASSIGN_OR_RETURN(std::string bytes, EntryBytes(e, e.uncompressed));
    if (bytes.size() != e.uncompressed) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": ", name, ".npy is short"));
    }
    bytes.erase(0, e.npy_header_bytes);
    return bytes;
  }
  return absl::NotFoundError(absl::StrCat(path_, " has no array ", name));
}

}  // namespace latentd::engine
