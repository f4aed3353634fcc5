// A text file read a line (or all of it) at a time, decompressed on the fly when its name ends in
// .gz (gzip, several members too) or .zst / .zstd (Zstandard, several frames too): the Pile
// (.jsonl.zst), C4 and Dolma (.json.gz) are read as downloaded, never inflated onto disk.
//
// The stored bytes are checked against the name (gzip's and zstd's magic numbers); a stream that
// ends mid-member or mid-frame is DATA_LOSS naming the file, as is one that does not decompress.
#ifndef LATENTD_CLIENT_TEXT_INPUT_H_
#define LATENTD_CLIENT_TEXT_INPUT_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace latentd::client {

class TextInput {
 public:
  // NOT_FOUND for a missing file; INVALID_ARGUMENT when a .gz / .zst file is not one.
  static absl::StatusOr<std::unique_ptr<TextInput>> Open(const std::string& path);
  ~TextInput();

  // The name without its compression suffix ("c4-train.00000-of-01024.json.gz" ->
  // "...json"), which says what the text is.
  static std::string StoredName(const std::string& path);

  // The next line, without its '\n' (a last line without one counts); false at the end.
  absl::StatusOr<bool> ReadLine(std::string* line);
  // Everything not read yet.
  absl::StatusOr<std::string> ReadAll();

  const std::string& path() const { return path_; }
  // Bytes of the file (as stored, compressed) read so far.
  int64_t stored_bytes_read() const { return stored_bytes_read_; }

 private:
  enum class Codec { kPlain, kGzip, kZstd };
  struct Decoder;
  TextInput() = default;
  // Appends the next piece of decompressed text to text_; sets at_end_ when there is no more.
  absl::Status Fill();

  std::string path_;
  Codec codec_ = Codec::kPlain;
  std::FILE* file_ = nullptr;
  std::unique_ptr<Decoder> decoder_;
  std::string stored_;  // read from the file, not yet decompressed
  size_t stored_at_ = 0;
  std::string text_;  // decompressed, not yet returned
  size_t text_at_ = 0;
  bool at_end_ = false;
  int64_t stored_bytes_read_ = 0;
};

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_TEXT_INPUT_H_
