// Token ids from a file, cut into sequences of context_length tokens (one row per token).
//
// Formats: .npy (little-endian uint16, int32 or int64, C order, 1-D or 2-D; a 2-D array is read
// row-major as one stream), raw little-endian uint16 / uint32 binaries (nanoGPT's train.bin), and
// columnar files: Parquet (a pretokenized dataset from the Hugging Face Hub) or Arrow IPC (what
// `datasets` writes: save_to_disk, its cache), one file, a directory of shards or DIR/PATTERN;
// the lists of the token column in row order, file after file, are the stream
// (common/parquet_column, common/arrow_column).
// Sequence i covers source tokens [i*L, (i+1)*L) with L = context_length, or, with prepend_bos,
// is bos_token_id followed by source tokens [i*(L-1), (i+1)*(L-1)). A trailing partial sequence
// is dropped. The shard [sequence_start, sequence_start + sequence_count) selects a row range of
// the source (count 0: to the end). Reads use pread, so one source serves several threads.
#ifndef LATENTD_ENGINE_TOKEN_SOURCE_H_
#define LATENTD_ENGINE_TOKEN_SOURCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/latentd/v1/extract.pb.h"

namespace latentd::engine {

class TokenColumn;  // one Parquet or Arrow file of a columnar source (token_source.cc)

// Whether `path`'s last component is a pattern ("train-*.parquet": *, ? or [...]).
bool IsTokenPathPattern(const std::string& path);

// The columnar files a token path names, in read order: the file itself; a directory's *.parquet
// files (else its *.arrow files); or DIR/PATTERN's matches among DIR's file names; sorted by
// name. Hugging Face's shard names (train-00003-of-00010.parquet, data-00000-of-00002.arrow)
// are checked: a missing shard (an interrupted download) or a directory holding several splits
// is INVALID_ARGUMENT naming `field` and what to do. NOT_FOUND when nothing matches.
absl::StatusOr<std::vector<std::string>> ColumnShards(const std::string& path,
                                                      const std::string& field);

// A token path resolved for a daemon that reads only under its data roots: `resolve` maps one
// path to its resolved form under a root (or the caller's NOT_FOUND / PERMISSION_DENIED). A
// pattern resolves its directory and keeps the pattern; every shard a directory or
// pattern names must resolve under a root too (Hugging Face's cache links shards into blobs/).
absl::StatusOr<std::string> ResolveTokenPath(
    const std::string& path, const std::string& field,
    const std::function<absl::StatusOr<std::string>(const std::string&)>& resolve);

class TokenSource {
 public:
  // INVALID_ARGUMENT naming "extract.tokens.<field>" for bad options or a malformed file;
  // NOT_FOUND when the file is missing.
  static absl::StatusOr<std::unique_ptr<TokenSource>> Open(const latentd::v1::TokenSource& spec);
  // Sequences that `read` fills in (sequences [first, first + count) of the shard into `out`,
  // count * context_length ids; called from several threads at once): the tokens that come with
  // stored activations. first_sequence() and Describe() return `first_sequence` and `described`.
  using SequenceReader = std::function<absl::Status(int64_t first, int64_t count, int64_t* out)>;
  static std::unique_ptr<TokenSource> FromReader(int32_t context_length, int64_t first_sequence,
                                                 int64_t num_sequences, std::string described,
                                                 SequenceReader read);
  ~TokenSource();

  int32_t context_length() const { return context_length_; }
  int64_t num_sequences() const { return num_sequences_; }  // in the shard
  int64_t num_rows() const { return num_sequences_ * context_length_; }
  int64_t source_tokens() const { return source_tokens_; }
  // Global index of the shard's first sequence (token_order_start of the dataset, in sequences).
  int64_t first_sequence() const { return first_sequence_; }

  // Sequences [first, first + count) of the shard as int64 ids, count * context_length of them.
  // INVALID_ARGUMENT for a negative id (signed formats).
  absl::Status Read(int64_t first, int64_t count, int64_t* out) const;

  // "npy:<path>[shard a..b]" etc., for the dataset metadata.
  std::string Describe() const;

 private:
  TokenSource() = default;
  absl::Status OpenColumns(const latentd::v1::TokenSource& spec);
  // Sets the shard of sequences from source_tokens_ and the spec.
  absl::Status CutIntoSequences(const latentd::v1::TokenSource& spec);
  absl::Status ReadTokens(int64_t first_token, int64_t count, int64_t* out) const;
  absl::Status ReadColumnTokens(int64_t first_token, int64_t count, int64_t* out) const;

  std::string path_;
  SequenceReader reader_;  // FromReader's; then none of the file fields below is used
  std::string described_;
  int fd_ = -1;
  // Parquet / Arrow: the shards in order and where each one's ids start in the stream.
  std::vector<std::unique_ptr<TokenColumn>> columns_;
  std::vector<int64_t> column_starts_;
  int64_t data_offset_ = 0;
  int element_size_ = 2;
  bool is_signed_ = false;
  std::string format_name_;
  int32_t context_length_ = 0;
  bool prepend_bos_ = false;
  int64_t bos_token_id_ = 0;
  int64_t source_tokens_ = 0;
  int64_t first_sequence_ = 0;
  int64_t num_sequences_ = 0;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TOKEN_SOURCE_H_
