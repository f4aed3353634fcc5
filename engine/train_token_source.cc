#include "engine/train_token_source.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

constexpr int64_t kSequencesPerChunk = 64;
constexpr int64_t kMaxExactId = int64_t{1} << 24;

// TokenSource speaks of extract.tokens.*; here the same field is train.tokens.*.
absl::Status Rename(const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrReplaceAll(status.message(), {{"extract.tokens", "train.tokens"}}));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenRowSource>> TokenRowSource::Open(
    const latentd::v1::TokenSource& spec) {
  auto tokens = TokenSource::Open(spec);
  if (!tokens.ok()) return Rename(tokens.status());
  if ((*tokens)->num_sequences() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.tokens.path: ", spec.path(),
                                                   " holds no complete sequence of ",
                                                   spec.context_length(), " tokens"));
  }
  return std::unique_ptr<TokenRowSource>(new TokenRowSource(std::move(*tokens)));
}

std::vector<int64_t> TokenRowSource::chunk_starts() const {
  return EvenChunkStarts(num_rows(), kSequencesPerChunk);
}

absl::Status TokenRowSource::Read(int64_t row_start, int64_t row_count, float* out) {
  if (row_start < 0 || row_count < 0 || row_start + row_count > num_rows()) {
    return absl::OutOfRangeError(absl::StrCat("sequences [", row_start, ", ", row_start + row_count,
                                              ") past the end (", num_rows(), ")"));
  }
  buffer_.resize(row_count * width());
  absl::Status status = tokens_->Read(row_start, row_count, buffer_.data());
  if (!status.ok()) return Rename(status);
  for (size_t i = 0; i < buffer_.size(); ++i) {
    if (buffer_[i] >= kMaxExactId) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.tokens: token id ", buffer_[i], " >= 2^24 is not supported"));
    }
    out[i] = static_cast<float>(buffer_[i]);
  }
  return absl::OkStatus();
}

}  // namespace latentd::engine
