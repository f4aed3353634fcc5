#include "client/tokenize_files.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/npy_header.h"
#include "common/read_file.h"
#include "common/status_macros.h"

namespace latentd::client {
namespace {

// Room for any 1-D shape: the header is rewritten in place once the length is known.
constexpr size_t kHeaderBytes = 128;

// Appends ids to a .npy file whose length is filled in by Finish.
class NpyStream {
 public:
  static absl::StatusOr<std::unique_ptr<NpyStream>> Create(const std::string& path, bool wide) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
    }
    auto stream = std::unique_ptr<NpyStream>(new NpyStream(f, path, wide));
    RETURN_IF_ERROR(stream->Write(stream->Header(0)));
    return stream;
  }
  ~NpyStream() {
    if (file_ != nullptr) std::fclose(file_);
  }

  absl::Status Append(const std::vector<int32_t>& ids) {
    count_ += static_cast<int64_t>(ids.size());
    if (wide_) {
      return Write(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
    }
    std::string narrow(ids.size() * 2, '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint16_t v = static_cast<uint16_t>(ids[i]);
      std::memcpy(&narrow[2 * i], &v, 2);
    }
    return Write(narrow);
  }

  absl::Status Finish() {
    if (std::fseek(file_, 0, SEEK_SET) != 0) return WriteError();
    RETURN_IF_ERROR(Write(Header(count_)));
    const bool ok = std::fflush(file_) == 0 && fsync(fileno(file_)) == 0;
    const int closed = std::fclose(file_);
    file_ = nullptr;
    if (!ok || closed != 0) return WriteError();
    return absl::OkStatus();
  }

 private:
  NpyStream(std::FILE* f, std::string path, bool wide)
      : file_(f), path_(std::move(path)), wide_(wide) {}
  std::string Header(int64_t n) const {
    return NpyHeader(wide_ ? "<i4" : "<u2", {n}, kHeaderBytes);
  }
  absl::Status Write(const std::string& bytes) {
    if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) return WriteError();
    return absl::OkStatus();
  }
  absl::Status WriteError() const {
    return absl::ResourceExhaustedError(
        absl::StrCat("writing ", path_, ": ", std::strerror(errno)));
  }

  std::FILE* file_;
  std::string path_;
  bool wide_;
  int64_t count_ = 0;
};

}  // namespace

absl::StatusOr<TokenizeProgress> TokenizeFiles(const Tokenizer& tokenizer,
                                               const std::vector<std::string>& inputs,
                                               const TokenizeOptions& options) {
  if (inputs.empty()) return absl::InvalidArgumentError("no input files");
  if (options.out_path.empty()) return absl::InvalidArgumentError("no output path");
  if (options.separator &&
      (*options.separator < 0 || *options.separator >= tokenizer.vocab_size())) {
    return absl::InvalidArgumentError(absl::StrCat("separator id ", *options.separator,
                                                   " outside the vocabulary [0, ",
                                                   tokenizer.vocab_size(), ")"));
  }
  TokenizeProgress progress;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(input, ec);
    if (ec) {
      return ec == std::errc::no_such_file_or_directory
                 ? absl::NotFoundError(absl::StrCat(input, ": no such file"))
                 : absl::InvalidArgumentError(absl::StrCat(input, ": ", ec.message()));
    }
    progress.bytes_total += static_cast<int64_t>(size);
  }
  const bool wide = tokenizer.vocab_size() > (1 << 16);
  progress.dtype = wide ? "int32" : "uint16";
  const std::string partial = options.out_path + ".partial";
  ASSIGN_OR_RETURN(std::unique_ptr<NpyStream> out, NpyStream::Create(partial, wide));

  const auto start = std::chrono::steady_clock::now();
  auto last_report = start;
  const auto elapsed = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const auto document = [&](absl::string_view text, const std::string& where) -> absl::Status {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, options.add_special_tokens);
    if (!ids.ok())
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", ids.status().message()));
    if (options.separator) ids->push_back(*options.separator);
    RETURN_IF_ERROR(out->Append(*ids));
    ++progress.documents;
    progress.tokens += static_cast<int64_t>(ids->size());
    if (options.progress &&
        std::chrono::steady_clock::now() - last_report > std::chrono::seconds(1)) {
      last_report = std::chrono::steady_clock::now();
      progress.seconds = elapsed();
      options.progress(progress);
    }
    return absl::OkStatus();
  };

  absl::Status status;
  for (const std::string& input : inputs) {
    absl::StatusOr<std::string> contents = ReadFileToString(input);
    if (!contents.ok()) {
      status = contents.status();
      break;
    }
    if (absl::EndsWith(input, ".jsonl")) {
      size_t line_start = 0;
      for (int line = 1; line_start < contents->size() && status.ok(); ++line) {
        size_t line_end = contents->find('\n', line_start);
        if (line_end == std::string::npos) line_end = contents->size();
        const absl::string_view text(contents->data() + line_start, line_end - line_start);
        progress.bytes_read += static_cast<int64_t>(line_end + 1 - line_start);
        line_start = line_end + 1;
        if (text.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
        const std::string where = absl::StrCat(input, ":", line);
        const nlohmann::json object =
            nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
        const auto field = object.is_object() ? object.find(options.jsonl_field) : object.end();
        if (!object.is_object() || field == object.end() || !field->is_string()) {
          status = absl::InvalidArgumentError(absl::StrCat(
              where, ": not a JSON object with a string field \"", options.jsonl_field, "\""));
          break;
        }
        status = document(field->get_ref<const std::string&>(), where);
      }
      progress.bytes_read = std::min(progress.bytes_read, progress.bytes_total);
    } else {
      status = document(*contents, input);
      progress.bytes_read += static_cast<int64_t>(contents->size());
    }
    if (!status.ok()) break;
    ++progress.files_done;
  }
  if (status.ok()) status = out->Finish();
  out.reset();
  if (status.ok()) {
    std::error_code ec;
    std::filesystem::rename(partial, options.out_path, ec);
    if (ec) {
      status = absl::PermissionDeniedError(
          absl::StrCat("renaming ", partial, " to ", options.out_path, ": ", ec.message()));
    }
  }
  if (!status.ok()) {
    std::filesystem::remove(partial);
    return status;
  }
  progress.seconds = elapsed();
  if (options.progress) options.progress(progress);
  return progress;
}

}  // namespace latentd::client
