#include "engine/token_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("extract.tokens.", field, ": ", what));
}

// The value text of 'key' in a numpy header dict, e.g. "'<u2'" or "(100, 128)".
std::string DictValue(const std::string& header, const std::string& key) {
  size_t p = header.find("'" + key + "'");
  if (p == std::string::npos) return "";
  p = header.find(':', p);
  if (p == std::string::npos) return "";
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  size_t end = p;
  if (p < header.size() && header[p] == '(') {
    end = header.find(')', p);
    return end == std::string::npos ? "" : header.substr(p, end - p + 1);
  }
  while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  return std::string(absl::StripAsciiWhitespace(header.substr(p, end - p)));
}

}  // namespace

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
  latentd::v1::TokenFormat format = spec.format();
  if (format == latentd::v1::TOKEN_FORMAT_UNSPECIFIED) {
    if (absl::EndsWith(spec.path(), ".npy")) {
      format = latentd::v1::NPY;
    } else if (absl::EndsWith(spec.path(), ".bin") || absl::EndsWith(spec.path(), ".u16")) {
      format = latentd::v1::RAW_U16;
    } else if (absl::EndsWith(spec.path(), ".u32")) {
      format = latentd::v1::RAW_U32;
    } else {
      return Bad("format",
                 absl::StrCat("cannot infer the format of ", spec.path(), " (.npy, .bin); set it"));
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
      char pre[12];
      if (file_size < 10 || pread(src->fd_, pre, 10, 0) != 10 ||
          std::memcmp(pre, "\x93NUMPY", 6) != 0) {
        return Bad("path", absl::StrCat(spec.path(), ": not a .npy file (bad magic)"));
      }
      const int major = static_cast<unsigned char>(pre[6]);
      int64_t header_len = 0, header_start = 0;
      if (major == 1) {
        header_len = static_cast<unsigned char>(pre[8]) | (static_cast<unsigned char>(pre[9]) << 8);
        header_start = 10;
      } else if (major == 2 || major == 3) {
        if (file_size < 12 || pread(src->fd_, pre, 12, 0) != 12) return Bad("path", "short .npy");
        header_len = 0;
        for (int i = 3; i >= 0; --i)
          header_len = (header_len << 8) | static_cast<unsigned char>(pre[8 + i]);
        header_start = 12;
      } else {
        return Bad("path", absl::StrCat(spec.path(), ": unsupported .npy version ", major));
      }
      if (header_start + header_len > file_size) {
        return Bad("path",
                   absl::StrCat(spec.path(), ": .npy header runs past the end of the file"));
      }
      std::string header(header_len, '\0');
      if (pread(src->fd_, header.data(), header_len, header_start) != header_len) {
        return Bad("path", "short .npy header");
      }
      const std::string descr = DictValue(header, "descr");
      if (descr == "'<u2'" || descr == "'|u2'") {
        src->element_size_ = 2;
      } else if (descr == "'<i4'") {
        src->element_size_ = 4;
        src->is_signed_ = true;
      } else if (descr == "'<i8'") {
        src->element_size_ = 8;
        src->is_signed_ = true;
      } else {
        return Bad("path", absl::StrCat(spec.path(), ": dtype ", descr,
                                        " not supported (uint16, int32, int64 little-endian)"));
      }
      const std::string shape = DictValue(header, "shape");
      if (DictValue(header, "fortran_order") != "False") {
        // A Fortran-order 1-D array is the same stream; 2-D would be transposed.
        if (!(shape.size() > 2 && shape.find(',') == shape.rfind(',') &&
              absl::EndsWith(shape, ",)"))) {
          return Bad("path", absl::StrCat(spec.path(), ": fortran_order arrays are not supported"));
        }
      }
      if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') {
        return Bad("path", absl::StrCat(spec.path(), ": cannot parse the .npy shape"));
      }
      std::vector<std::string> dims =
          absl::StrSplit(shape.substr(1, shape.size() - 2), ',', absl::SkipWhitespace());
      if (dims.empty() || dims.size() > 2) {
        return Bad("path", absl::StrCat(spec.path(), ": .npy must be 1-D or 2-D, shape ", shape));
      }
      int64_t count = 1;
      for (const auto& d : dims) {
        int64_t v;
        if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &v) || v < 0) {
          return Bad("path", absl::StrCat(spec.path(), ": bad .npy shape ", shape));
        }
        count *= v;
      }
      src->data_offset_ = header_start + header_len;
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
  const int64_t per_seq = src->context_length_ - (src->prepend_bos_ ? 1 : 0);
  const int64_t total = src->source_tokens_ / per_seq;
  if (spec.sequence_start() > total) {
    return Bad("sequence_start", absl::StrCat(spec.sequence_start(), " beyond the ", total,
                                              " sequences of ", spec.path()));
  }
  src->first_sequence_ = spec.sequence_start();
  src->num_sequences_ = total - spec.sequence_start();
  if (spec.sequence_count() > 0) {
    if (spec.sequence_count() > src->num_sequences_) {
      return Bad("sequence_count",
                 absl::StrCat(spec.sequence_count(), " sequences from ", spec.sequence_start(),
                              " exceed the ", total, " sequences of ", spec.path()));
    }
    src->num_sequences_ = spec.sequence_count();
  }
  if (src->num_sequences_ == 0) {
    return Bad("path", absl::StrCat(spec.path(), " holds no complete sequence of ",
                                    src->context_length_, " tokens in the shard"));
  }
  return src;
}

absl::Status TokenSource::ReadTokens(int64_t first_token, int64_t count, int64_t* out) const {
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

absl::Status TokenSource::Read(int64_t first, int64_t count, int64_t* out) const {
  if (first < 0 || count < 0 || first + count > num_sequences_) {
    return absl::OutOfRangeError(absl::StrCat("sequences [", first, ", ", first + count,
                                              ") outside the shard of ", num_sequences_));
  }
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
  return absl::StrCat(format_name_, ":", path_, "[sequences ", first_sequence_, "..",
                      first_sequence_ + num_sequences_, ", L=", context_length_,
                      prepend_bos_ ? absl::StrCat(", bos=", bos_token_id_) : "", "]");
}

}  // namespace latentd::engine
