// Text -> token ids with a Hugging Face tokenizer.json, as `tokenizer(text)["input_ids"]` gives
// them in Python, for latentctl (tokenize, prompt --text). The daemon stores and serves token ids
// only; text is the client's business.
//
// Supported: BPE models (GPT-2, GPT-NeoX/Pythia, Llama 2/3, Mistral, Gemma 1/2, Qwen2, cl100k and
// the like: model.type "BPE" with merges in either of the two formats, byte_fallback, unk_token,
// fuse_unk, ignore_merges, continuing_subword_prefix, end_of_word_suffix), with
//   - added tokens (special or not; lstrip, rstrip, single_word, normalized) split out first, so
//     "<|endoftext|>" in the text is that token, as Hugging Face does by default;
//   - normalizers NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace (string or regex), Strip and
//     Sequence;
//   - pre-tokenizers ByteLevel (GPT-2's split regex), Split (string or regex pattern; every
//     behavior; invert), Metaspace (prepend_scheme always / first / never, split), Digits,
//     WhitespaceSplit and Sequence;
//   - post-processors TemplateProcessing (Llama's and Gemma's BOS), RobertaProcessing,
//     BertProcessing, ByteLevel and Sequence.
// Regex patterns (Oniguruma syntax in the file) run on ICU's regex engine, which reads the ones
// tokenizers ship the same way (`\s` is the Unicode White_Space property in both).
// tests/tokenizer/ compares the ids with a reference implementation on eleven real tokenizers.
#ifndef LATENTD_CLIENT_TOKENIZER_H_
#define LATENTD_CLIENT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace latentd::client {

class Tokenizer {
 public:
  // Reads a tokenizer.json. NOT_FOUND for a missing file; INVALID_ARGUMENT naming the field for
  // a malformed one or a component this encoder does not implement (a Unigram or WordPiece model,
  // say), so it never silently tokenizes differently from the original.
  static absl::StatusOr<Tokenizer> Load(const std::string& path);
  // The same from the file's contents.
  static absl::StatusOr<Tokenizer> Parse(absl::string_view json);

  // The ids of `text` (UTF-8; INVALID_ARGUMENT with the byte offset otherwise). With
  // `add_special_tokens` the post-processor adds what the model expects around a sequence (the
  // BOS of Llama and Gemma; nothing for GPT-2), as Hugging Face does by default. Thread-safe:
  // threads may encode at once (they share a sharded cache of pre-tokens' ids).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens = true) const;

  // The id of a token written as the vocabulary spells it ("<|endoftext|>", "<eos>", "Ġthe");
  // added tokens first. nullopt when there is none.
  std::optional<int32_t> TokenId(absl::string_view token) const;

  // One more than the largest id the tokenizer can produce.
  int32_t vocab_size() const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_TOKENIZER_H_
