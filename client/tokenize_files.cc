#include "client/tokenize_files.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/text_input.h"
#include "common/arrow_column.h"
#include "common/npy_header.h"
#include "common/parquet_column.h"
#include "common/status_macros.h"

namespace latentd::client {
namespace {

// Room for any 1-D shape: the header is rewritten in place once the length is known.
constexpr size_t kHeaderBytes = 128;
// A batch is tokenized once it holds this much text or this many documents.
constexpr size_t kBatchBytes = 8 << 20;
constexpr size_t kBatchDocuments = 4096;

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

// A file that is one document (decompressed when it is .gz or .zst).
template <typename Document>
absl::Status ReadWhole(const std::string& path, TokenizeProgress* progress, Document& document) {
  ASSIGN_OR_RETURN(std::unique_ptr<TextInput> input, TextInput::Open(path));
  ASSIGN_OR_RETURN(std::string contents, input->ReadAll());
  progress->bytes_read += input->stored_bytes_read();
  return document(std::move(contents), path);
}

// A .jsonl file, read a line at a time (it may be larger than memory): each non-blank line is
// a JSON object whose string `field` is a document.
template <typename Document>
absl::Status ReadJsonl(const std::string& path, const std::string& field,
                       TokenizeProgress* progress, Document& document) {
  ASSIGN_OR_RETURN(std::unique_ptr<TextInput> input, TextInput::Open(path));
  const int64_t bytes_before = progress->bytes_read;
  std::string text;
  for (int line = 1;; ++line) {
    ASSIGN_OR_RETURN(bool more, input->ReadLine(&text));
    progress->bytes_read = bytes_before + input->stored_bytes_read();
    if (!more) break;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", line);
    const nlohmann::json object = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    const auto value = object.is_object() ? object.find(field) : object.end();
    if (!object.is_object() || value == object.end() || !value->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": not a JSON object with a string field \"", field, "\""));
    }
    RETURN_IF_ERROR(document(value->get<std::string>(), where));
  }
  return absl::OkStatus();
}

// A columnar file's string column (Parquet or Arrow, by `Reader`), a few hundred rows at a time:
// each row is a document.
template <typename Reader, typename Document>
absl::Status ReadTextColumn(const std::string& path, const std::string& column,
                            TokenizeProgress* progress, Document& document) {
  ASSIGN_OR_RETURN(std::unique_ptr<Reader> texts, Reader::Open(path, column, Reader::Kind::kText));
  // Progress counts the file's bytes (compressed), in proportion to the documents read.
  std::error_code ec;
  const int64_t file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  const int64_t bytes_before = progress->bytes_read;
  constexpr int64_t kRowsAtATime = 256;
  std::vector<std::string> batch;
  const int64_t rows = texts->num_values();
  for (int64_t first = 0; first < rows; first += kRowsAtATime) {
    RETURN_IF_ERROR(texts->ReadText(first, std::min(kRowsAtATime, rows - first), &batch));
    for (size_t i = 0; i < batch.size(); ++i) {
      RETURN_IF_ERROR(
          document(std::move(batch[i]), absl::StrCat(path, ", document ", first + i + 1)));
    }
    progress->bytes_read =
        bytes_before + (ec ? 0 : file_bytes * (first + static_cast<int64_t>(batch.size())) / rows);
  }
  if (!ec) progress->bytes_read = bytes_before + file_bytes;
  return absl::OkStatus();
}

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
  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  // Documents waiting in order, with where each came from (for errors).
  std::vector<std::pair<std::string, std::string>> batch;
  size_t batch_bytes = 0;
  // Tokenizes the batch on `threads` threads, then appends each document's ids in order.
  const auto flush = [&]() -> absl::Status {
    std::vector<absl::StatusOr<std::vector<int32_t>>> ids(batch.size());
    std::atomic<size_t> next{0};
    const auto work = [&] {
      for (size_t i = next++; i < batch.size(); i = next++) {
        ids[i] = tokenizer.Encode(batch[i].first, options.add_special_tokens);
      }
    };
    std::vector<std::thread> helpers;
    for (int t = 1; t < std::min<int>(threads, static_cast<int>(batch.size())); ++t) {
      helpers.emplace_back(work);
    }
    work();
    for (std::thread& helper : helpers) helper.join();
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!ids[i].ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(batch[i].second, ": ", ids[i].status().message()));
      }
      if (options.separator) ids[i]->push_back(*options.separator);
      progress.text_bytes += static_cast<int64_t>(batch[i].first.size());
      RETURN_IF_ERROR(out->Append(*ids[i]));
      ++progress.documents;
      progress.tokens += static_cast<int64_t>(ids[i]->size());
    }
    batch.clear();
    batch_bytes = 0;
    if (options.progress &&
        std::chrono::steady_clock::now() - last_report > std::chrono::seconds(1)) {
      last_report = std::chrono::steady_clock::now();
      progress.seconds = elapsed();
      options.progress(progress);
    }
    return absl::OkStatus();
  };
  const auto document = [&](std::string text, std::string where) -> absl::Status {
    batch_bytes += text.size();
    batch.emplace_back(std::move(text), std::move(where));
    return batch_bytes >= kBatchBytes || batch.size() >= kBatchDocuments ? flush()
                                                                         : absl::OkStatus();
  };

  absl::Status status;
  for (const std::string& input : inputs) {
    // JSON lines: .jsonl, compressed or not, and the .json.gz / .json.zst files of C4 and Dolma.
    const std::string stored_name = TextInput::StoredName(input);
    if (absl::EndsWith(stored_name, ".jsonl") ||
        (stored_name != input && absl::EndsWith(stored_name, ".json"))) {
      status = ReadJsonl(input, options.text_field, &progress, document);
    } else if (absl::EndsWith(input, ".parquet")) {
      status = ReadTextColumn<ParquetColumn>(input, options.text_field, &progress, document);
    } else if (absl::EndsWith(input, ".arrow") || absl::EndsWith(input, ".feather")) {
      status = ReadTextColumn<ArrowColumn>(input, options.text_field, &progress, document);
    } else {
      status = ReadWhole(input, &progress, document);
    }
    if (!status.ok()) break;
    ++progress.files_done;
  }
  if (status.ok()) status = flush();
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
