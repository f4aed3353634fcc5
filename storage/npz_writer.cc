#include "storage/npz_writer.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/npy_header.h"
#include "common/status_macros.h"
#include "storage/byte_io.h"

namespace latentd::storage {
namespace {

// The streamed-first member's .npy header is reserved at this size and rewritten once its shape
// is known: room for two 20-digit dimensions.
constexpr size_t kReservedNpyHeader = 128;
// Local header: 30 fixed bytes, the name, then one 20-byte extra field (ZIP64 sizes, or padding
// of the same size), so that the reserved header can be rewritten in place either way.
constexpr size_t kLocalFixed = 30;
constexpr uint16_t kZip64Id = 0x0001;
// An extra field readers skip (Android's zipalign uses this id for alignment padding).
constexpr uint16_t kPaddingId = 0xd935;
constexpr uint16_t kLocalExtraBytes = 20;
constexpr uint32_t kMax32 = 0xffffffffu;
constexpr size_t kCopyBuffer = size_t{4} << 20;

uint32_t Crc(uint32_t crc, const void* data, size_t size) {
  const auto* bytes = static_cast<const Bytef*>(data);
  // zlib takes uInt lengths: feed large buffers in pieces.
  for (size_t at = 0; at < size; at += (1u << 30)) {
    const size_t n = std::min<size_t>(size - at, 1u << 30);
    crc = static_cast<uint32_t>(crc32(crc, bytes + at, static_cast<uInt>(n)));
  }
  return crc;
}

absl::Status WriteError(const std::string& path) {
  return absl::ResourceExhaustedError(absl::StrCat("writing ", path, ": ", std::strerror(errno)));
}

}  // namespace

struct NpzWriter::Member {
  std::string name;  // with ".npy"
  std::string descr;
  int item_bytes = 0;
  std::vector<int64_t> inner_shape;
  int64_t inner_elements = 1;
  int64_t length = 0;  // the first dimension, as appended so far

  bool whole = false;  // AddWhole: `shape` and `bytes` given
  std::vector<int64_t> shape;
  std::string bytes;

  bool direct = false;        // streamed straight into the file (the first streamed array)
  std::FILE* side = nullptr;  // otherwise its side file while appending
  std::string side_path;

  uint32_t content_crc = 0;  // of the bytes after the .npy header
  uint64_t content_bytes = 0;
  uint64_t header_offset = 0;  // of its local header in the file
  std::string npy_header;      // as finally written
  uint32_t crc = 0;            // of the member (.npy header + content)

  std::vector<int64_t> Shape() const {
    if (whole) return shape;
    std::vector<int64_t> s = {length};
    s.insert(s.end(), inner_shape.begin(), inner_shape.end());
    return s;
  }
  uint64_t Size() const { return npy_header.size() + content_bytes; }
};

NpzWriter::NpzWriter(std::string path, std::FILE* file, const NpzWriterOptions& options)
    : path_(std::move(path)), file_(file), options_(options) {}

NpzWriter::~NpzWriter() {
  if (file_ != nullptr) std::fclose(file_);
  RemoveSideFiles();
}

absl::StatusOr<std::unique_ptr<NpzWriter>> NpzWriter::Create(const std::string& path,
                                                             const NpzWriterOptions& options) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<NpzWriter>(new NpzWriter(path, f, options));
}

void NpzWriter::RemoveSideFiles() {
  for (auto& m : members_) {
    if (m->side != nullptr) std::fclose(m->side);
    m->side = nullptr;
    if (!m->side_path.empty()) std::remove(m->side_path.c_str());
    m->side_path.clear();
  }
}

absl::Status NpzWriter::Write(const void* data, size_t size) {
  if (size > 0 && std::fwrite(data, 1, size, file_) != size) return WriteError(path_);
  offset_ += size;
  return absl::OkStatus();
}

absl::Status NpzWriter::WriteAt(uint64_t offset, const std::string& bytes) {
  if (std::fflush(file_) != 0 || fseeko(file_, static_cast<off_t>(offset), SEEK_SET) != 0 ||
      std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size() ||
      fseeko(file_, 0, SEEK_END) != 0) {
    return WriteError(path_);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> NpzWriter::AddStreamed(const std::string& name, const std::string& descr,
                                           int item_bytes, std::vector<int64_t> inner_shape) {
  if (appending_ || finished_) {
    return absl::FailedPreconditionError("NpzWriter: AddStreamed after the first Append");
  }
  auto m = std::make_unique<Member>();
  m->name = name + ".npy";
  m->descr = descr;
  m->item_bytes = item_bytes;
  for (int64_t d : inner_shape) m->inner_elements *= d;
  m->inner_shape = std::move(inner_shape);
  const bool first = std::none_of(members_.begin(), members_.end(),
                                  [](const std::unique_ptr<Member>& o) { return !o->whole; });
  if (first) {
    // Its headers are placeholders of their final size, rewritten by Finish.
    m->direct = true;
    m->header_offset = offset_;
    m->npy_header = NpyHeader(m->descr, m->Shape(), kReservedNpyHeader);
    RETURN_IF_ERROR(WriteMemberHeaders(m.get()));
  } else {
    m->side_path = absl::StrCat(path_, ".", name, ".part");
    m->side = std::fopen(m->side_path.c_str(), "wb+");
    if (m->side == nullptr) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", m->side_path, ": ", std::strerror(errno)));
    }
  }
  members_.push_back(std::move(m));
  return static_cast<int>(members_.size()) - 1;
}

void NpzWriter::AddWhole(const std::string& name, const std::string& descr,
                         std::vector<int64_t> shape, std::string bytes) {
  auto m = std::make_unique<Member>();
  m->name = name + ".npy";
  m->descr = descr;
  m->whole = true;
  m->shape = std::move(shape);
  m->content_crc = Crc(0, bytes.data(), bytes.size());
  m->content_bytes = bytes.size();
  m->bytes = std::move(bytes);
  members_.push_back(std::move(m));
}

absl::Status NpzWriter::Append(int array, const void* data, int64_t count) {
  if (array < 0 || array >= static_cast<int>(members_.size()) || members_[array]->whole) {
    return absl::InvalidArgumentError(absl::StrCat("NpzWriter: no streamed array ", array));
  }
  appending_ = true;
  Member& m = *members_[array];
  const size_t size = static_cast<size_t>(count * m.inner_elements * m.item_bytes);
  m.content_crc = Crc(m.content_crc, data, size);
  m.content_bytes += size;
  m.length += count;
  if (m.direct) return Write(data, size);
  if (size > 0 && std::fwrite(data, 1, size, m.side) != size) return WriteError(m.side_path);
  return absl::OkStatus();
}

// The local header and .npy header of `member` at its header_offset (appended when that is the
// end of the file, rewritten in place otherwise).
absl::Status NpzWriter::WriteMemberHeaders(Member* member) {
  const uint64_t size = member->Size();
  const bool zip64 = size >= options_.zip64_from;
  std::string local;
  PutRaw<uint32_t>(0x04034b50, &local);
  PutRaw<uint16_t>(zip64 ? 45 : 20, &local);  // version needed
  PutRaw<uint16_t>(0, &local);                // flags
  PutRaw<uint16_t>(0, &local);                // stored
  PutRaw<uint16_t>(0, &local);                // time
  PutRaw<uint16_t>(0x21, &local);             // date 1980-01-01
  PutRaw<uint32_t>(member->crc, &local);
  PutRaw<uint32_t>(zip64 ? kMax32 : static_cast<uint32_t>(size), &local);
  PutRaw<uint32_t>(zip64 ? kMax32 : static_cast<uint32_t>(size), &local);
  PutRaw<uint16_t>(static_cast<uint16_t>(member->name.size()), &local);
  PutRaw<uint16_t>(kLocalExtraBytes, &local);
  local += member->name;
  PutRaw<uint16_t>(zip64 ? kZip64Id : kPaddingId, &local);
  PutRaw<uint16_t>(16, &local);
  PutRaw<uint64_t>(zip64 ? size : 0, &local);
  PutRaw<uint64_t>(zip64 ? size : 0, &local);
  local += member->npy_header;
  if (member->header_offset == offset_) return Write(local.data(), local.size());
  return WriteAt(member->header_offset, local);
}

absl::Status NpzWriter::CopySideFile(Member* member) {
  if (std::fflush(member->side) != 0 || fseeko(member->side, 0, SEEK_SET) != 0) {
    return WriteError(member->side_path);
  }
  std::string buffer(kCopyBuffer, '\0');
  uint64_t left = member->content_bytes;
  while (left > 0) {
    const size_t n =
        std::fread(buffer.data(), 1, std::min<uint64_t>(left, buffer.size()), member->side);
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat("reading back ", member->side_path, ": ",
                       std::feof(member->side) ? "short file" : std::strerror(errno)));
    }
    RETURN_IF_ERROR(Write(buffer.data(), n));
    left -= n;
  }
  std::fclose(member->side);
  member->side = nullptr;
  std::remove(member->side_path.c_str());
  member->side_path.clear();
  return absl::OkStatus();
}

absl::Status NpzWriter::WriteCentralDirectory() {
  std::string central;
  for (const auto& m : members_) {
    const uint64_t size = m->Size();
    const bool big_size = size >= options_.zip64_from;
    const bool big_offset = m->header_offset >= options_.zip64_from;
    std::string extra;
    if (big_size || big_offset) {
      std::string values;
      if (big_size) {
        PutRaw<uint64_t>(size, &values);  // uncompressed
        PutRaw<uint64_t>(size, &values);  // compressed
      }
      if (big_offset) PutRaw<uint64_t>(m->header_offset, &values);
      PutRaw<uint16_t>(kZip64Id, &extra);
      PutRaw<uint16_t>(static_cast<uint16_t>(values.size()), &extra);
      extra += values;
    }
    const uint16_t version = extra.empty() ? 20 : 45;
    PutRaw<uint32_t>(0x02014b50, &central);
    PutRaw<uint16_t>(version, &central);  // made by
    PutRaw<uint16_t>(version, &central);  // needed
    PutRaw<uint16_t>(0, &central);        // flags
    PutRaw<uint16_t>(0, &central);        // stored
    PutRaw<uint16_t>(0, &central);        // time
    PutRaw<uint16_t>(0x21, &central);     // date
    PutRaw<uint32_t>(m->crc, &central);
    PutRaw<uint32_t>(big_size ? kMax32 : static_cast<uint32_t>(size), &central);
    PutRaw<uint32_t>(big_size ? kMax32 : static_cast<uint32_t>(size), &central);
    PutRaw<uint16_t>(static_cast<uint16_t>(m->name.size()), &central);
    PutRaw<uint16_t>(static_cast<uint16_t>(extra.size()), &central);
    PutRaw<uint16_t>(0, &central);  // comment
    PutRaw<uint16_t>(0, &central);  // disk
    PutRaw<uint16_t>(0, &central);  // internal attributes
    PutRaw<uint32_t>(0, &central);  // external attributes
    PutRaw<uint32_t>(big_offset ? kMax32 : static_cast<uint32_t>(m->header_offset), &central);
    central += m->name;
    central += extra;
  }
  const uint64_t central_offset = offset_;
  const uint64_t entries = members_.size();
  RETURN_IF_ERROR(Write(central.data(), central.size()));
  const bool zip64 = central_offset >= options_.zip64_from ||
                     central.size() >= options_.zip64_from || entries >= 0xffff;
  std::string end;
  if (zip64) {
    const uint64_t record_offset = offset_;
    PutRaw<uint32_t>(0x06064b50, &end);  // ZIP64 end of central directory record
    PutRaw<uint64_t>(44, &end);          // its size after this field
    PutRaw<uint16_t>(45, &end);
    PutRaw<uint16_t>(45, &end);
    PutRaw<uint32_t>(0, &end);
    PutRaw<uint32_t>(0, &end);
    PutRaw<uint64_t>(entries, &end);
    PutRaw<uint64_t>(entries, &end);
    PutRaw<uint64_t>(central.size(), &end);
    PutRaw<uint64_t>(central_offset, &end);
    PutRaw<uint32_t>(0x07064b50, &end);  // its locator
    PutRaw<uint32_t>(0, &end);
    PutRaw<uint64_t>(record_offset, &end);
    PutRaw<uint32_t>(1, &end);
  }
  PutRaw<uint32_t>(0x06054b50, &end);
  PutRaw<uint16_t>(0, &end);
  PutRaw<uint16_t>(0, &end);
  PutRaw<uint16_t>(static_cast<uint16_t>(std::min<uint64_t>(entries, 0xffff)), &end);
  PutRaw<uint16_t>(static_cast<uint16_t>(std::min<uint64_t>(entries, 0xffff)), &end);
  PutRaw<uint32_t>(zip64 ? kMax32 : static_cast<uint32_t>(central.size()), &end);
  PutRaw<uint32_t>(zip64 ? kMax32 : static_cast<uint32_t>(central_offset), &end);
  PutRaw<uint16_t>(0, &end);
  return Write(end.data(), end.size());
}

absl::Status NpzWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError("NpzWriter: Finish called twice");
  finished_ = true;
  for (auto& m : members_) {
    if (m->direct) {
      // The reserved headers, now with the shape, size and CRC.
      m->npy_header = NpyHeader(m->descr, m->Shape(), kReservedNpyHeader);
      if (m->npy_header.size() != kReservedNpyHeader) {
        return absl::InternalError(absl::StrCat("npy header of ", m->name, " outgrew its room"));
      }
      m->crc = static_cast<uint32_t>(
          crc32_combine(Crc(0, m->npy_header.data(), m->npy_header.size()), m->content_crc,
                        static_cast<z_off_t>(m->content_bytes)));
      RETURN_IF_ERROR(WriteMemberHeaders(m.get()));
    }
  }
  for (auto& m : members_) {
    if (m->direct) continue;
    m->npy_header = NpyHeader(m->descr, m->Shape());
    m->crc = static_cast<uint32_t>(crc32_combine(Crc(0, m->npy_header.data(), m->npy_header.size()),
                                                 m->content_crc,
                                                 static_cast<z_off_t>(m->content_bytes)));
    m->header_offset = offset_;
    RETURN_IF_ERROR(WriteMemberHeaders(m.get()));
    if (m->whole) {
      RETURN_IF_ERROR(Write(m->bytes.data(), m->bytes.size()));
    } else {
      RETURN_IF_ERROR(CopySideFile(m.get()));
    }
  }
  RETURN_IF_ERROR(WriteCentralDirectory());
  std::FILE* f = file_;
  file_ = nullptr;
  if (std::fclose(f) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("closing ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace latentd::storage
