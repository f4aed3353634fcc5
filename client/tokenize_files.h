// latentctl tokenize: text files -> one .npy stream of token ids, the input an EXTRACT job reads
// (ExtractSpec.tokens). .jsonl files are read a line at a time, .parquet files a few hundred rows
// at a time (common/parquet_column); documents are gathered into
// batches of a few MB, tokenized on several threads and appended in their order, so memory
// holds a batch (or one whole-file document), not the corpus.
#ifndef LATENTD_CLIENT_TOKENIZE_FILES_H_
#define LATENTD_CLIENT_TOKENIZE_FILES_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/tokenizer.h"

namespace latentd::client {

struct TokenizeProgress {
  int64_t files_done = 0;
  int64_t documents = 0;
  int64_t bytes_read = 0;   // of the inputs (a compressed .parquet in proportion to its rows)
  int64_t bytes_total = 0;  // the inputs' sizes
  int64_t text_bytes = 0;   // of the documents tokenized so far
  int64_t tokens = 0;
  double seconds = 0;
  std::string dtype;  // of the output: "uint16" when every id fits, else "int32"
};

struct TokenizeOptions {
  // Where the .npy goes. Written as PATH.partial and renamed at the end, so a failed run leaves
  // no half-written stream under PATH. Required.
  std::string out_path;
  // The tokenizer's special tokens around each document (the BOS of Llama and Gemma, nothing
  // for GPT-2), as `tokenizer(text)` adds them. Default: true.
  bool add_special_tokens = true;
  // A token id appended after each document (GPT-2's <|endoftext|>, say). Default: none.
  std::optional<int32_t> separator;
  // The field of each .jsonl line's object, and the column of a .parquet file, that holds the
  // documents. Default "text".
  std::string text_field = "text";
  // Threads that tokenize; 0: one per core. The output does not depend on it. Default: 0.
  int threads = 0;
  // Called about once a second while it runs, and once at the end. Default: none.
  std::function<void(const TokenizeProgress&)> progress;
};

// Tokenizes `inputs` in order: a .jsonl file is one document per non-empty line (an object with
// a string `text_field`), and so are .jsonl.gz, .jsonl.zst, .json.gz and .json.zst files (the
// Pile, C4, Dolma), decompressed as they are read (client/text_input); a .parquet file one per
// row of its string column `text_field` (a null row is none; FineWeb's, RedPajama's and the
// Hub's other text datasets are such files), and so is an .arrow file (Hugging Face datasets'
// save_to_disk and cache); any other file (decompressed if .gz / .zst) is one document. DATA_LOSS for a truncated or corrupt compressed file. NOT_FOUND for a missing input;
// INVALID_ARGUMENT naming the file (and line) for text that is not UTF-8 or a line that is not
// such an object; INVALID_ARGUMENT for no inputs or a separator outside the vocabulary;
// PERMISSION_DENIED / RESOURCE_EXHAUSTED when the output cannot be created / written.
absl::StatusOr<TokenizeProgress> TokenizeFiles(const Tokenizer& tokenizer,
                                               const std::vector<std::string>& inputs,
                                               const TokenizeOptions& options);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_TOKENIZE_FILES_H_
