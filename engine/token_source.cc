#include "engine/token_source.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/arrow_column.h"
#include "common/npy_header.h"
#include "common/parquet_column.h"
#include "common/status_macros.h"
#include "engine/npz.h"

namespace latentd::engine {
namespace {

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("extract.tokens.", field, ": ", what));
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Splits "DIR/NAME" (a bare NAME lies in ".").
std::pair<std::string, std::string> SplitLast(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

bool IsArrowFile(const std::string& path) {
  return absl::EndsWith(path, ".arrow") || absl::EndsWith(path, ".feather");
}

// Hugging Face's shard names: PREFIX-NNNNN-of-MMMMM.parquet (the Hub) or .arrow (save_to_disk).
// False for any other name.
bool ParseShardName(const std::string& name, std::string* prefix, int64_t* index, int64_t* total,
                    std::string* suffix) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  const std::string stem = name.substr(0, dot);
  const size_t of = stem.rfind("-of-");
  if (of == std::string::npos) return false;
  const size_t dash = stem.rfind('-', of - 1);
  if (dash == std::string::npos || of == 0) return false;
  const std::string i = stem.substr(dash + 1, of - dash - 1), n = stem.substr(of + 4);
  if (i.empty() || n.empty() || i.find_first_not_of("0123456789") != std::string::npos ||
      n.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  *prefix = stem.substr(0, dash);
  *suffix = name.substr(dot);
  return absl::SimpleAtoi(i, index) && absl::SimpleAtoi(n, total);
}

}  // namespace

// One file of a columnar token source: Parquet or Arrow IPC, read alike.
class TokenColumn {
 public:
  virtual ~TokenColumn() = default;
  virtual const std::string& path() const = 0;
  virtual const std::string& column() const = 0;
  virtual int64_t num_values() const = 0;
  virtual absl::Status Read(int64_t first, int64_t count, int64_t* out) const = 0;
};

namespace {

template <typename Reader>
class TokenColumnOf final : public TokenColumn {
 public:
  explicit TokenColumnOf(std::unique_ptr<Reader> reader) : reader_(std::move(reader)) {}
  const std::string& path() const override { return reader_->path(); }
  const std::string& column() const override { return reader_->column(); }
  int64_t num_values() const override { return reader_->num_values(); }
  absl::Status Read(int64_t first, int64_t count, int64_t* out) const override {
    return reader_->Read(first, count, out);
  }

 private:
  std::unique_ptr<Reader> reader_;
};

template <typename Reader>
absl::StatusOr<std::unique_ptr<TokenColumn>> OpenColumn(const std::string& path,
                                                        const std::string& column) {
  ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, Reader::Open(path, column));
  return std::unique_ptr<TokenColumn>(new TokenColumnOf<Reader>(std::move(reader)));
}

}  // namespace

bool IsTokenPathPattern(const std::string& path) {
  return SplitLast(path).second.find_first_of("*?[") != std::string::npos;
}

absl::StatusOr<std::vector<std::string>> ColumnShards(const std::string& path,
                                                      const std::string& field) {
  const bool pattern = IsTokenPathPattern(path);
  if (!pattern && !IsDirectory(path)) return std::vector<std::string>{path};
  const auto [dir, name_pattern] = pattern ? SplitLast(path) : std::make_pair(path, "");
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(field, ": cannot list ", dir, ": ", std::strerror(errno)));
  }
  // A pattern's matches; a directory's .parquet files (the Hub), else its .arrow files
  // (save_to_disk).
  std::vector<std::string> names, parquet, arrow;
  while (const dirent* entry = readdir(listing)) {
    const std::string name = entry->d_name;
    if (name == "." || name == ".." || IsDirectory(dir + "/" + name)) continue;
    if (pattern) {
      if (fnmatch(name_pattern.c_str(), name.c_str(), 0) == 0) names.push_back(name);
    } else if (absl::EndsWith(name, ".parquet")) {
      parquet.push_back(name);
    } else if (IsArrowFile(name)) {
      arrow.push_back(name);
    }
  }
  closedir(listing);
  if (!pattern) names = !parquet.empty() ? parquet : arrow;
  if (names.empty()) {
    return absl::NotFoundError(
        absl::StrCat(field, ": ",
                     pattern ? absl::StrCat("no file matches ", name_pattern, " in ", dir)
                             : absl::StrCat("no .parquet or .arrow file in ", dir)));
  }
  std::sort(names.begin(), names.end());
  // Hugging Face shards: every one of a split present, and one split at a time.
  std::map<std::string, std::pair<int64_t, std::set<int64_t>>> splits;
  std::string suffix;
  for (const std::string& name : names) {
    std::string prefix;
    int64_t index = 0, total = 0;
    if (!ParseShardName(name, &prefix, &index, &total, &suffix)) continue;
    auto& [expected, seen] = splits[prefix];
    if (index >= total) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", dir, "/", name, " is shard ", index, " of ", total));
    }
    if (!seen.empty() && expected != total) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", dir, " holds ", prefix,
                                                     " shards of two sets (", expected, " and ",
                                                     total, " files)"));
    }
    expected = total;
    seen.insert(index);
  }
  if (splits.size() > 1) {
    std::vector<std::string> prefixes;
    for (const auto& [prefix, unused] : splits) prefixes.push_back(prefix);
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, " holds the shards of ", absl::StrJoin(prefixes, ", "),
                     "; name one: ", dir, "/", prefixes[0], "-*", suffix));
  }
  for (const auto& [prefix, shards] : splits) {
    for (int64_t i = 0; i < shards.first; ++i) {
      if (shards.second.count(i) == 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: %s/%s-%05d-of-%05d%s is missing (%d of %d shards present: an "
            "interrupted download?)",
            field, dir, prefix, i, shards.first, suffix, shards.second.size(), shards.first));
      }
    }
  }
  std::vector<std::string> files;
  for (const std::string& name : names) files.push_back(dir + "/" + name);
  return files;
}

absl::StatusOr<std::string> ResolveTokenPath(
    const std::string& path, const std::string& field,
    const std::function<absl::StatusOr<std::string>(const std::string&)>& resolve) {
  std::string resolved;
  if (IsTokenPathPattern(path)) {
    const auto [dir, name_pattern] = SplitLast(path);
    ASSIGN_OR_RETURN(std::string resolved_dir, resolve(dir));
    resolved = absl::StrCat(resolved_dir, "/", name_pattern);
  } else {
    ASSIGN_OR_RETURN(resolved, resolve(path));
    if (!IsDirectory(resolved)) return resolved;
  }
  ASSIGN_OR_RETURN(std::vector<std::string> shards, ColumnShards(resolved, field));
  for (const std::string& shard : shards) RETURN_IF_ERROR(resolve(shard).status());
  return resolved;
}

std::unique_ptr<TokenSource> TokenSource::FromReader(int32_t context_length, int64_t first_sequence,
                                                     int64_t num_sequences, std::string described,
                                                     SequenceReader read) {
  std::unique_ptr<TokenSource> src(new TokenSource());
  src->context_length_ = context_length;
  src->first_sequence_ = first_sequence;
  src->num_sequences_ = num_sequences;
  src->source_tokens_ = num_sequences * context_length;
  src->described_ = std::move(described);
  src->reader_ = std::move(read);
  return src;
}

TokenSource::~TokenSource() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::unique_ptr<TokenSource>> TokenSource::Open(
    const latentd::v1::TokenSource& spec) {
  if (spec.context_length() < 1) return Bad("context_length", "must be >= 1");
  if (spec.prepend_bos() && spec.context_length() < 2) {
    return Bad("context_length", "must be >= 2 with prepend_bos");
  }
  if (spec.bos_token_id() < 0) return Bad("bos_token_id", "must be >= 0");
  if (spec.sequence_start() < 0) return Bad("sequence_start", "must be >= 0");
  if (spec.sequence_count() < 0) return Bad("sequence_count", "must be >= 0");
  std::unique_ptr<TokenSource> src(new TokenSource());
  src->path_ = spec.path();
  src->context_length_ = spec.context_length();
  src->prepend_bos_ = spec.prepend_bos();
  src->bos_token_id_ = spec.bos_token_id();
  latentd::v1::TokenFormat format = spec.format();
  // Columnar files: named so, or a directory or pattern of them (each read by its extension).
  const bool columnar = format == latentd::v1::PARQUET || format == latentd::v1::ARROW ||
                        (format == latentd::v1::TOKEN_FORMAT_UNSPECIFIED &&
                         (absl::EndsWith(spec.path(), ".parquet") || IsArrowFile(spec.path()) ||
                          IsTokenPathPattern(spec.path()) || IsDirectory(spec.path())));
  if (!spec.column().empty() && !columnar) {
    return Bad("column", "only Parquet and Arrow token files have columns");
  }
  if (columnar) {
    RETURN_IF_ERROR(src->OpenColumns(spec));
    RETURN_IF_ERROR(src->CutIntoSequences(spec));
    return src;
  }
  src->fd_ = open(spec.path().c_str(), O_RDONLY | O_CLOEXEC);
  if (src->fd_ < 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat("extract.tokens.path: ", spec.path(), " not found"));
    return absl::PermissionDeniedError(
        absl::StrCat("extract.tokens.path: cannot open ", spec.path(), ": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(src->fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return Bad("path", absl::StrCat(spec.path(), " is not a regular file"));
  }
  const int64_t file_size = st.st_size;
  if (format == latentd::v1::TOKEN_FORMAT_UNSPECIFIED) {
    if (absl::EndsWith(spec.path(), ".npy")) {
      format = latentd::v1::NPY;
    } else if (absl::EndsWith(spec.path(), ".bin") || absl::EndsWith(spec.path(), ".u16")) {
      format = latentd::v1::RAW_U16;
    } else if (absl::EndsWith(spec.path(), ".u32")) {
      format = latentd::v1::RAW_U32;
    } else {
      return Bad("format", absl::StrCat("cannot infer the format of ", spec.path(),
                                        " (.npy, .bin, .u32, .parquet, .arrow); set it"));
    }
  }
  switch (format) {
    case latentd::v1::RAW_U16:
    case latentd::v1::RAW_U32:
      src->element_size_ = format == latentd::v1::RAW_U16 ? 2 : 4;
      src->format_name_ = format == latentd::v1::RAW_U16 ? "u16" : "u32";
      if (file_size % src->element_size_ != 0) {
        return Bad("path", absl::StrCat(spec.path(), ": size ", file_size, " is not a multiple of ",
                                        src->element_size_));
      }
      src->source_tokens_ = file_size / src->element_size_;
      break;
    case latentd::v1::NPY: {
      src->format_name_ = "npy";
      // The preamble is at most a few KiB; read enough for any header numpy writes.
      std::string head(static_cast<size_t>(std::min<int64_t>(file_size, 1 << 16)), '\0');
      if (pread(src->fd_, head.data(), head.size(), 0) != static_cast<ssize_t>(head.size())) {
        return Bad("path", absl::StrCat(spec.path(), ": cannot read the .npy header"));
      }
      NpyArrayInfo info;
      uint64_t header_bytes = 0;
      absl::Status parsed = ParseNpyHeader(head, spec.path(), &info, &header_bytes);
      if (!parsed.ok()) return Bad("path", std::string(parsed.message()));
      if (info.descr == "<u2" || info.descr == "|u2") {
        src->element_size_ = 2;
      } else if (info.descr == "<i4") {
        src->element_size_ = 4;
        src->is_signed_ = true;
      } else if (info.descr == "<i8") {
        src->element_size_ = 8;
        src->is_signed_ = true;
      } else {
        return Bad("path", absl::StrCat(spec.path(), ": dtype ", info.descr,
                                        " not supported (uint16, int32, int64 little-endian)"));
      }
      if (info.shape.empty() || info.shape.size() > 2) {
        return Bad("path", absl::StrCat(spec.path(), ": .npy must be 1-D or 2-D, it has ",
                                        info.shape.size(), " dimensions"));
      }
      // A Fortran-order 1-D array is the same stream; 2-D would be transposed.
      if (info.fortran_order && info.shape.size() == 2) {
        return Bad("path", absl::StrCat(spec.path(), ": fortran_order arrays are not supported"));
      }
      int64_t count = 1;
      for (int64_t v : info.shape) count *= v;
      const std::string shape = absl::StrCat("(", absl::StrJoin(info.shape, ", "), ")");
      src->data_offset_ = static_cast<int64_t>(header_bytes);
      if (src->data_offset_ + count * src->element_size_ != file_size) {
        return Bad("path", absl::StrCat(spec.path(), ": .npy holds ", file_size - src->data_offset_,
                                        " data bytes, its shape ", shape, " implies ",
                                        count * src->element_size_));
      }
      src->source_tokens_ = count;
      break;
    }
    default:
      return Bad("format", "unknown token format");
  }
  RETURN_IF_ERROR(src->CutIntoSequences(spec));
  return src;
}

absl::Status TokenSource::OpenColumns(const latentd::v1::TokenSource& spec) {
  ASSIGN_OR_RETURN(std::vector<std::string> shards,
                   ColumnShards(spec.path(), "extract.tokens.path"));
  for (const std::string& shard : shards) {
    const bool arrow = spec.format() == latentd::v1::ARROW ||
                       (spec.format() != latentd::v1::PARQUET && IsArrowFile(shard));
    absl::StatusOr<std::unique_ptr<TokenColumn>> column =
        arrow ? OpenColumn<ArrowColumn>(shard, spec.column())
              : OpenColumn<ParquetColumn>(shard, spec.column());
    if (absl::IsNotFound(column.status())) {
      return absl::NotFoundError(absl::StrCat("extract.tokens.path: ", column.status().message()));
    }
    if (!column.ok()) {
      return Bad(spec.column().empty() ? "path" : "column", std::string(column.status().message()));
    }
    if (!columns_.empty() && (*column)->column() != columns_.front()->column()) {
      return Bad("column", absl::StrCat(shard, " has its ids in ", (*column)->column(), ", ",
                                        columns_.front()->path(), " in ",
                                        columns_.front()->column(), "; name the column"));
    }
    if (columns_.empty()) format_name_ = arrow ? "arrow" : "parquet";
    column_starts_.push_back(source_tokens_);
    source_tokens_ += (*column)->num_values();
    columns_.push_back(*std::move(column));
  }
  return absl::OkStatus();
}

absl::Status TokenSource::CutIntoSequences(const latentd::v1::TokenSource& spec) {
  const int64_t per_seq = context_length_ - (prepend_bos_ ? 1 : 0);
  const int64_t total = source_tokens_ / per_seq;
  if (spec.sequence_start() > total) {
    return Bad("sequence_start", absl::StrCat(spec.sequence_start(), " beyond the ", total,
                                              " sequences of ", spec.path()));
  }
  first_sequence_ = spec.sequence_start();
  num_sequences_ = total - spec.sequence_start();
  if (spec.sequence_count() > 0) {
    if (spec.sequence_count() > num_sequences_) {
      return Bad("sequence_count",
                 absl::StrCat(spec.sequence_count(), " sequences from ", spec.sequence_start(),
                              " exceed the ", total, " sequences of ", spec.path()));
    }
    num_sequences_ = spec.sequence_count();
  }
  if (num_sequences_ == 0) {
    return Bad("path", absl::StrCat(spec.path(), " holds no complete sequence of ", context_length_,
                                    " tokens in the shard"));
  }
  return absl::OkStatus();
}

absl::Status TokenSource::ReadTokens(int64_t first_token, int64_t count, int64_t* out) const {
  if (!columns_.empty()) return ReadColumnTokens(first_token, count, out);
  std::vector<char> buf(count * element_size_);
  int64_t done = 0, bytes = count * element_size_;
  while (done < bytes) {
    ssize_t r = pread(fd_, buf.data() + done, bytes - done,
                      data_offset_ + first_token * element_size_ + done);
    if (r <= 0) {
      return absl::DataLossError(absl::StrCat("token file ", path_, " shorter than expected"));
    }
    done += r;
  }
  const unsigned char* p = reinterpret_cast<const unsigned char*>(buf.data());
  for (int64_t i = 0; i < count; ++i, p += element_size_) {
    uint64_t v = 0;
    for (int b = element_size_ - 1; b >= 0; --b) v = (v << 8) | p[b];
    int64_t id;
    if (is_signed_ && element_size_ == 4) {
      id = static_cast<int32_t>(static_cast<uint32_t>(v));
    } else {
      id = static_cast<int64_t>(v);
    }
    if (id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("extract.tokens.path: negative token id ", id,
                                                     " at token ", first_token + i, " of ", path_));
    }
    out[i] = id;
  }
  return absl::OkStatus();
}

absl::Status TokenSource::ReadColumnTokens(int64_t first_token, int64_t count, int64_t* out) const {
  int64_t done = 0;
  while (done < count) {
    const int64_t at = first_token + done;
    const size_t shard = std::upper_bound(column_starts_.begin(), column_starts_.end(), at) -
                         column_starts_.begin() - 1;
    const TokenColumn& column = *columns_[shard];
    const int64_t offset = at - column_starts_[shard];
    const int64_t take = std::min(count - done, column.num_values() - offset);
    RETURN_IF_ERROR(column.Read(offset, take, out + done));
    for (int64_t i = 0; i < take; ++i) {
      if (out[done + i] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("extract.tokens.path: negative token id ", out[done + i], " at token ",
                         offset + i, " of ", column.path(), " (column ", column.column(), ")"));
      }
    }
    done += take;
  }
  return absl::OkStatus();
}

absl::Status TokenSource::Read(int64_t first, int64_t count, int64_t* out) const {
  if (first < 0 || count < 0 || first + count > num_sequences_) {
    return absl::OutOfRangeError(absl::StrCat("sequences [", first, ", ", first + count,
                                              ") outside the shard of ", num_sequences_));
  }
  if (reader_) return reader_(first, count, out);
  const int64_t L = context_length_;
  if (!prepend_bos_) return ReadTokens((first_sequence_ + first) * L, count * L, out);
  const int64_t per_seq = L - 1;
  std::vector<int64_t> tmp(count * per_seq);
  RETURN_IF_ERROR(ReadTokens((first_sequence_ + first) * per_seq, count * per_seq, tmp.data()));
  for (int64_t s = 0; s < count; ++s) {
    out[s * L] = bos_token_id_;
    std::memcpy(out + s * L + 1, tmp.data() + s * per_seq, per_seq * sizeof(int64_t));
  }
  return absl::OkStatus();
}

std::string TokenSource::Describe() const {
  if (reader_) return described_;
  const std::string column =
      columns_.empty()
          ? ""
          : absl::StrCat("[", columns_.front()->column(),
                         columns_.size() > 1 ? absl::StrCat(", ", columns_.size(), " files") : "",
                         "]");
  return absl::StrCat(format_name_, ":", path_, column, "[sequences ", first_sequence_, "..",
                      first_sequence_ + num_sequences_, ", L=", context_length_,
                      prepend_bos_ ? absl::StrCat(", bos=", bos_token_id_) : "", "]");
}

}  // namespace latentd::engine
