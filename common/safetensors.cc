#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd {
namespace {

using nlohmann::json;

constexpr int64_t kMaxHeaderBytes = 100 << 20;

struct DtypeEntry {
  StDtype dtype;
  const char* name;
  int size;
};
constexpr DtypeEntry kDtypes[] = {
    {StDtype::kF64, "F64", 8},   {StDtype::kF32, "F32", 4}, {StDtype::kF16, "F16", 2},
    {StDtype::kBF16, "BF16", 2}, {StDtype::kI64, "I64", 8}, {StDtype::kI32, "I32", 4},
    {StDtype::kI16, "I16", 2},   {StDtype::kI8, "I8", 1},   {StDtype::kU64, "U64", 8},
    {StDtype::kU32, "U32", 4},   {StDtype::kU16, "U16", 2}, {StDtype::kU8, "U8", 1},
    {StDtype::kBool, "BOOL", 1},
};

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
}

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  int e = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == EACCES) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

uint64_t LoadLe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

absl::StatusOr<StDtype> ParseStDtype(const std::string& name) {
  for (const auto& e : kDtypes) {
    if (name == e.name) return e.dtype;
  }
  return Bad(absl::StrCat("unknown dtype \"", name, "\""));
}

const char* StDtypeName(StDtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

int StDtypeSize(StDtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

int64_t StTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const StTensorInfo* StHeader::Find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<StHeader> ParseStHeader(const std::string& header_json, int64_t header_len,
                                       int64_t file_size) {
  if (header_len <= 0) return Bad("header length is 0");
  if (header_len > kMaxHeaderBytes)
    return Bad(absl::StrCat("header length ", header_len, " > 100 MB"));
  if (header_len > file_size - 8) {
    return Bad(absl::StrCat("header length ", header_len, " exceeds the file size ", file_size));
  }
  json j = json::parse(header_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("header is not valid JSON");
  if (!j.is_object()) return Bad("header is not a JSON object");
  StHeader header;
  header.data_start = 8 + header_len;
  const int64_t data_size = file_size - header.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return Bad(absl::StrCat("__metadata__.", m.key(), " is not a string"));
        }
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor \"", name, "\": ");
    if (!v.is_object()) return Bad(where + "entry is not an object");
    for (auto f = v.begin(); f != v.end(); ++f) {
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets") {
        return Bad(absl::StrCat(where, "unknown field \"", f.key(), "\""));
      }
    }
    if (!v.contains("dtype") || !v["dtype"].is_string()) return Bad(where + "dtype missing");
    if (!v.contains("shape") || !v["shape"].is_array()) return Bad(where + "shape missing");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      return Bad(where + "data_offsets must be [begin, end]");
    }
    StTensorInfo info;
    info.name = name;
    auto dtype = ParseStDtype(v["dtype"].get<std::string>());
    if (!dtype.ok()) return Bad(where + std::string(dtype.status().message()));
    info.dtype = *dtype;
    // numel * size must not overflow: bound each step by the data size.
    int64_t bytes = StDtypeSize(info.dtype);
    for (const json& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return Bad(where + "shape entries must be non-negative integers");
      }
      const int64_t dim = d.get<int64_t>();
      info.shape.push_back(dim);
      if (dim != 0 && bytes > data_size / dim + 1)
        bytes = data_size + 1;  // saturate
      else
        bytes *= dim;
    }
    for (const json& o : v["data_offsets"]) {
      if (!o.is_number_integer() || o.get<int64_t>() < 0) {
        return Bad(where + "data_offsets must be non-negative integers");
      }
    }
    info.begin = v["data_offsets"][0].get<int64_t>();
    info.end = v["data_offsets"][1].get<int64_t>();
    if (info.end < info.begin) return Bad(where + "data_offsets end < begin");
    if (info.end > data_size) {
      return Bad(absl::StrCat(where, "data_offsets end ", info.end, " beyond the data section (",
                              data_size, " bytes)"));
    }
    if (info.end - info.begin != bytes) {
      return Bad(absl::StrCat(where, "byte size ", info.end - info.begin,
                              " != product(shape) * dtype size = ", bytes));
    }
    header.tensors.push_back(std::move(info));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const StTensorInfo& a, const StTensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  int64_t expected = 0;
  for (const auto& t : header.tensors) {
    if (t.begin < expected)
      return Bad(absl::StrCat("tensor \"", t.name, "\" overlaps the previous one"));
    if (t.begin > expected) {
      return Bad(absl::StrCat("gap in the data section before tensor \"", t.name, "\""));
    }
    expected = t.end;
  }
  if (expected != data_size) {
    return Bad(absl::StrCat("tensors cover ", expected, " of the ", data_size,
                            " data bytes (trailing bytes or truncated file)"));
  }
  return header;
}

namespace {

// Opens `path` for reading and gives its size in `size`; the caller closes the descriptor.
absl::StatusOr<int> OpenForReading(const std::string& path, int64_t* size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status error = ErrnoStatus("stat", path);
    close(fd);
    return error;
  }
  *size = st.st_size;
  return fd;
}

absl::StatusOr<StHeader> ReadHeaderFromFd(int fd, const std::string& path, int64_t file_size) {
  if (file_size < 8) return Bad(absl::StrCat(path, ": file shorter than 8 bytes"));
  unsigned char len_bytes[8];
  if (pread(fd, len_bytes, 8, 0) != 8) return ErrnoStatus("read", path);
  const uint64_t n = LoadLe64(len_bytes);
  if (n == 0 || n > static_cast<uint64_t>(kMaxHeaderBytes) ||
      static_cast<int64_t>(n) > file_size - 8) {
    return Bad(absl::StrCat(path, ": header length ", n, " out of bounds for a file of ", file_size,
                            " bytes"));
  }
  std::string json_text(n, '\0');
  if (pread(fd, json_text.data(), n, 8) != static_cast<ssize_t>(n)) {
    return ErrnoStatus("read", path);
  }
  auto header = ParseStHeader(json_text, static_cast<int64_t>(n), file_size);
  if (!header.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", header.status().message()));
  }
  return header;
}

}  // namespace

absl::StatusOr<StHeader> ReadStHeader(const std::string& path) {
  int64_t size = 0;
  ASSIGN_OR_RETURN(const int fd, OpenForReading(path, &size));
  auto header = ReadHeaderFromFd(fd, path, size);
  close(fd);
  return header;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  int64_t size = 0;
  ASSIGN_OR_RETURN(const int fd, OpenForReading(path, &size));
  SafetensorsFile file;
  auto header = ReadHeaderFromFd(fd, path, size);
  if (!header.ok()) {
    close(fd);
    return header.status();
  }
  file.header_ = std::move(*header);
  file.bytes_.resize(size);
  int64_t done = 0;
  while (done < size) {
    ssize_t r = pread(fd, file.bytes_.data() + done, size - done, done);
    if (r <= 0) {
      close(fd);
      return r == 0 ? Bad(path + ": file shrank while reading") : ErrnoStatus("read", path);
    }
    done += r;
  }
  close(fd);
  return file;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<StTensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  json j = json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || t.name.empty())
      return Bad("bad tensor name \"" + t.name + "\"");
    if (j.contains(t.name)) return Bad("duplicate tensor name \"" + t.name + "\"");
    int64_t bytes = StDtypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) return Bad("negative dimension in tensor \"" + t.name + "\"");
      bytes *= d;
    }
    j[t.name] = {{"dtype", StDtypeName(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header = j.dump();
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');
  const std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("create", tmp);
  auto write_all = [&](const void* data, size_t n) -> bool {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = write(fd, p, n);
      if (w <= 0) return false;
      p += w;
      n -= w;
    }
    return true;
  };
  unsigned char len_bytes[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(n >> (8 * i));
  bool ok = write_all(len_bytes, 8) && write_all(header.data(), header.size());
  for (const auto& t : tensors) {
    if (!ok) break;
    int64_t bytes = StDtypeSize(t.dtype);
    for (int64_t d : t.shape) bytes *= d;
    if (bytes > 0 && t.data == nullptr) {
      close(fd);
      return Bad("tensor \"" + t.name + "\" has no data");
    }
    ok = write_all(t.data, bytes);
  }
  if (!ok || fsync(fd) != 0) {
    absl::Status s = ErrnoStatus("write", tmp);
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus("rename", path);
  return absl::OkStatus();
}

}  // namespace latentd
