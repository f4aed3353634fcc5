#include "client/text_input.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::client {
namespace {

constexpr size_t kChunk = 1 << 20;

bool EndsWithAny(const std::string& s, std::initializer_list<const char*> suffixes) {
  for (const char* suffix : suffixes) {
    if (absl::EndsWith(s, suffix)) return true;
  }
  return false;
}

}  // namespace

// The decompressor's state: zlib's for gzip, a zstd stream for Zstandard.
struct TextInput::Decoder {
  z_stream gzip{};
  bool gzip_ready = false;
  bool gzip_in_member = false;  // inside a member: ending here would cut it
  ZSTD_DStream* zstd = nullptr;
  bool zstd_in_frame = false;

  ~Decoder() {
    if (gzip_ready) inflateEnd(&gzip);
    if (zstd != nullptr) ZSTD_freeDStream(zstd);
  }
};

std::string TextInput::StoredName(const std::string& path) {
  for (const char* suffix : {".gz", ".zst", ".zstd"}) {
    if (absl::EndsWith(path, suffix)) return path.substr(0, path.size() - std::strlen(suffix));
  }
  return path;
}

absl::StatusOr<std::unique_ptr<TextInput>> TextInput::Open(const std::string& path) {
  std::unique_ptr<TextInput> input(new TextInput());
  input->path_ = path;
  input->file_ = std::fopen(path.c_str(), "rb");
  if (input->file_ == nullptr) {
    return errno == ENOENT
               ? absl::NotFoundError(absl::StrCat(path, ": no such file"))
               : absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  if (absl::EndsWith(path, ".gz")) input->codec_ = Codec::kGzip;
  if (EndsWithAny(path, {".zst", ".zstd"})) input->codec_ = Codec::kZstd;
  if (input->codec_ == Codec::kPlain) return input;

  unsigned char magic[4] = {};
  const size_t got = std::fread(magic, 1, 4, input->file_);
  std::rewind(input->file_);
  const bool is_gzip = got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  const bool is_zstd =
      got == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd;
  input->decoder_ = std::make_unique<Decoder>();
  if (input->codec_ == Codec::kGzip) {
    if (!is_gzip && got > 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": named .gz but not gzip"));
    }
    if (inflateInit2(&input->decoder_->gzip, 15 + 16) != Z_OK) {
      return absl::ResourceExhaustedError(absl::StrCat(path, ": cannot start zlib"));
    }
    input->decoder_->gzip_ready = true;
  } else {
    if (!is_zstd && got > 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": named .zst but not Zstandard"));
    }
    input->decoder_->zstd = ZSTD_createDStream();
    if (input->decoder_->zstd == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(path, ": cannot start zstd"));
    }
  }
  return input;
}

TextInput::~TextInput() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status TextInput::Fill() {
  // Drop what was returned, so the buffer holds at most a line and a chunk.
  if (text_at_ > 0) {
    text_.erase(0, text_at_);
    text_at_ = 0;
  }
  while (true) {
    // Decode what is stored first (even nothing: a decoder may hold output back when the last
    // call filled the buffer), and read from the file only when that yields no text.
    if (codec_ != Codec::kPlain) {
      const char* in = stored_.data() + stored_at_;
      const size_t in_size = stored_.size() - stored_at_;
      const size_t before = text_.size();
      text_.resize(before + kChunk);
      size_t produced = 0, consumed = 0;
      if (codec_ == Codec::kGzip) {
        z_stream& z = decoder_->gzip;
        z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in));
        z.avail_in = static_cast<uInt>(in_size);
        z.next_out = reinterpret_cast<Bytef*>(text_.data() + before);
        z.avail_out = static_cast<uInt>(kChunk);
        const int rc = inflate(&z, Z_NO_FLUSH);
        consumed = in_size - z.avail_in;
        produced = kChunk - z.avail_out;
        if (rc == Z_STREAM_END) {
          decoder_->gzip_in_member = false;
          inflateReset(&z);  // another member may follow (concatenated .gz files)
        } else if (rc == Z_OK || rc == Z_BUF_ERROR) {
          if (consumed > 0) decoder_->gzip_in_member = true;
        } else {
          return absl::DataLossError(absl::StrCat(path_, ": corrupt gzip data near byte ",
                                                  stored_bytes_read_ - in_size + consumed, ": ",
                                                  z.msg != nullptr ? z.msg : "inflate failed"));
        }
      } else {
        ZSTD_inBuffer zin{in, in_size, 0};
        ZSTD_outBuffer zout{text_.data() + before, kChunk, 0};
        const size_t rc = ZSTD_decompressStream(decoder_->zstd, &zout, &zin);
        if (ZSTD_isError(rc)) {
          return absl::DataLossError(
              absl::StrCat(path_, ": corrupt zstd data: ", ZSTD_getErrorName(rc)));
        }
        if (zin.pos > 0 || zout.pos > 0) decoder_->zstd_in_frame = rc != 0;
        consumed = zin.pos;
        produced = zout.pos;
      }
      stored_at_ += consumed;
      text_.resize(before + produced);
      if (produced > 0) return absl::OkStatus();
      if (stored_at_ < stored_.size()) continue;  // a header consumed, no text yet
    }
    stored_.resize(kChunk);
    const size_t got = std::fread(stored_.data(), 1, kChunk, file_);
    if (std::ferror(file_)) {
      return absl::DataLossError(absl::StrCat(path_, ": ", std::strerror(errno)));
    }
    stored_.resize(got);
    stored_at_ = 0;
    stored_bytes_read_ += static_cast<int64_t>(got);
    if (got == 0) {
      if (decoder_ && (decoder_->gzip_in_member || decoder_->zstd_in_frame)) {
        return absl::DataLossError(absl::StrCat(
            path_, ": ends inside a compressed ",
            codec_ == Codec::kGzip ? "gzip member" : "zstd frame", " (a truncated download?)"));
      }
      at_end_ = true;
      return absl::OkStatus();
    }
    if (codec_ == Codec::kPlain) {
      text_.append(stored_);
      stored_at_ = stored_.size();
      return absl::OkStatus();
    }
  }
}

absl::StatusOr<bool> TextInput::ReadLine(std::string* line) {
  size_t searched = text_at_;
  while (true) {
    const size_t newline = text_.find('\n', searched);
    if (newline != std::string::npos) {
      line->assign(text_, text_at_, newline - text_at_);
      text_at_ = newline + 1;
      return true;
    }
    if (at_end_) {
      if (text_at_ == text_.size()) return false;
      line->assign(text_, text_at_, std::string::npos);
      text_at_ = text_.size();
      return true;
    }
    const size_t pending = text_.size() - text_at_;
    RETURN_IF_ERROR(Fill());
    searched = pending;  // Fill moved the unread text to the front
  }
}

absl::StatusOr<std::string> TextInput::ReadAll() {
  while (!at_end_) RETURN_IF_ERROR(Fill());
  std::string rest = text_.substr(text_at_);
  text_.clear();
  text_at_ = 0;
  return rest;
}

}  // namespace latentd::client
