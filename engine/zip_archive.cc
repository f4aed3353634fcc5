#include "engine/zip_archive.h"

#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

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

uint64_t LittleEndian(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

absl::StatusOr<ZipArchive> ZipArchive::Open(const std::string& path) {
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
  uint64_t count = LittleEndian(tail, eocd + 10, 2), cd_size = LittleEndian(tail, eocd + 12, 4),
           cd_offset = LittleEndian(tail, eocd + 16, 4);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    // zip64: the locator just before the record points at the zip64 record.
    if (eocd < 20 || tail.compare(eocd - 20, 4, std::string("PK\x06\x07", 4)) != 0) {
      return bad("zip64 fields without a zip64 locator");
    }
    ASSIGN_OR_RETURN(std::string z64, ReadAt(in, path, LittleEndian(tail, eocd - 20 + 8, 8), 56));
    if (z64.compare(0, 4, std::string("PK\x06\x06", 4)) != 0) return bad("bad zip64 record");
    count = LittleEndian(z64, 32, 8), cd_size = LittleEndian(z64, 40, 8),
    cd_offset = LittleEndian(z64, 48, 8);
  }
  // Sums of values read from the file are compared by difference: they may be near 2^64.
  if (cd_size > size || cd_offset > size - cd_size) {
    return bad("central directory beyond the end of the file");
  }
  ASSIGN_OR_RETURN(std::string cd, ReadAt(in, path, cd_offset, cd_size));
  ZipArchive zip;
  zip.path_ = path;
  size_t at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (at + 46 > cd.size() || cd.compare(at, 4, std::string("PK\x01\x02", 4)) != 0) {
      return bad("corrupt central directory");
    }
    Entry e;
    e.method = static_cast<uint16_t>(LittleEndian(cd, at + 10, 2));
    e.compressed = LittleEndian(cd, at + 20, 4);
    e.uncompressed = LittleEndian(cd, at + 24, 4);
    const size_t name_len = LittleEndian(cd, at + 28, 2), extra_len = LittleEndian(cd, at + 30, 2),
                 comment_len = LittleEndian(cd, at + 32, 2);
    uint64_t local_offset = LittleEndian(cd, at + 42, 4);
    if (at + 46 + name_len + extra_len + comment_len > cd.size()) {
      return bad("corrupt central directory");
    }
    e.name = cd.substr(at + 46, name_len);
    // zip64 extra field: the 0xFFFFFFFF values, in order.
    for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint64_t id = LittleEndian(cd, x, 2), len = LittleEndian(cd, x + 2, 2);
      size_t v = x + 4;
      if (id == 1) {
        for (uint64_t* field : {&e.uncompressed, &e.compressed, &local_offset}) {
          if (*field == 0xFFFFFFFF && v + 8 <= x + 4 + len) {
            *field = LittleEndian(cd, v, 8);
            v += 8;
          }
        }
      }
      x += 4 + len;
    }
    at += 46 + name_len + extra_len + comment_len;
    ASSIGN_OR_RETURN(std::string local, ReadAt(in, path, local_offset, 30));
    if (local.compare(0, 4, std::string("PK\x03\x04", 4)) != 0) {
      return bad(absl::StrCat(e.name, ": bad local header"));
    }
    e.data_offset = local_offset + 30 + LittleEndian(local, 26, 2) + LittleEndian(local, 28, 2);
    if (e.compressed > size || e.data_offset > size - e.compressed) {
      return bad(absl::StrCat(e.name, " runs past the end"));
    }
    // What an entry claims to hold is allocated when it is read: a stored one holds what it
    // occupies, and deflate expands by at most 1032:1.
    if ((e.method == 0 && e.uncompressed != e.compressed) ||
        (e.method == 8 && e.uncompressed / 1032 > e.compressed + 1)) {
      return bad(absl::StrCat(e.name, " claims ", e.uncompressed, " bytes from ", e.compressed));
    }
    zip.entries_.push_back(std::move(e));
  }
  return zip;
}

const ZipArchive::Entry* ZipArchive::Find(const std::string& name) const {
  for (const Entry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::StatusOr<std::string> ZipArchive::Read(const Entry& e, uint64_t max_bytes) const {
  if (e.method != 0 && e.method != 8) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", e.name,
                                                   " uses zip compression method ", e.method,
                                                   " (stored and deflate are read)"));
  }
  max_bytes = std::min(max_bytes, e.uncompressed);
  std::ifstream in(path_, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path_, " not found"));
  if (e.method == 0) return ReadAt(in, path_, e.data_offset, std::min(max_bytes, e.compressed));
  // Deflate expands incompressible data by well under 1/64 plus a few bytes a block, so a prefix
  // of that size holds the first max_bytes (an .npy header needs 64 KiB, not the whole entry).
  const uint64_t prefix = max_bytes >= e.uncompressed
                              ? e.compressed
                              : std::min(e.compressed, max_bytes + max_bytes / 64 + 1024);
  ASSIGN_OR_RETURN(std::string compressed, ReadAt(in, path_, e.data_offset, prefix));
  return Inflate(compressed, max_bytes, absl::StrCat(path_, ": ", e.name));
}

}  // namespace latentd::engine
