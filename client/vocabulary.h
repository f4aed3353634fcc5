// Token ids -> text, for showing a latent's examples as words rather than ids (latentctl latent
// --vocab, --html). The store keeps token ids only: the tokenizer is the user's, so decoding
// happens in the client, from the files tokenizers ship.
#ifndef LATENTD_CLIENT_VOCABULARY_H_
#define LATENTD_CLIENT_VOCABULARY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace latentd::client {

class Vocabulary {
 public:
  // Reads `path`, one of:
  //  - a Hugging Face tokenizer.json (model.vocab as {token: id} for BPE/WordPiece or as
  //    [[token, score], ...] for Unigram, plus added_tokens);
  //  - a vocab.json: {token: id} (GPT-2's);
  //  - a JSON list of token strings (index = id);
  //  - any other file: one token per line, line i (from 0) is token i, taken literally.
  // Byte-level BPE tokens (GPT-2's "Ġ" for a space; chosen when tokenizer.json's decoder says
  // ByteLevel, or when a vocab.json has "Ġ" tokens) are mapped back to their bytes;
  // SentencePiece's "▁" becomes a space and its byte tokens "<0x0A>" their byte. Added tokens
  // are taken literally. NOT_FOUND for a missing file; INVALID_ARGUMENT naming what is wrong
  // for a malformed one or an id outside [0, 2^24).
  static absl::StatusOr<Vocabulary> Load(const std::string& path);
  // The same from the file's bytes.
  static absl::StatusOr<Vocabulary> Parse(absl::string_view contents);

  // The bytes token `id` stands for (may be part of a UTF-8 character: byte-level BPE splits
  // them); nullopt for an id the vocabulary does not have.
  std::optional<std::string> Bytes(int32_t id) const;
  // Bytes(id) made fit for one line of a terminal (Printable), or "<id N>" for an unknown id.
  std::string Display(int32_t id) const;
  // The ids whose bytes are exactly `bytes`, ascending (a vocabulary may repeat a token).
  std::vector<int32_t> Find(absl::string_view bytes) const;
  // Ids 0 .. size() - 1 may be known (some may be gaps).
  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }

 private:
  std::vector<std::optional<std::string>> bytes_;
};

// `bytes` as valid UTF-8 on one line: a newline becomes "↵", a tab "⇥", a carriage return
// "␍", other control characters and bytes that are not UTF-8 "\xNN"; the rest is unchanged.
std::string Printable(absl::string_view bytes);

// A token for a terminal table: its text in quotes (Display) with a vocabulary, else its id.
std::string TokenCell(int32_t id, const std::optional<Vocabulary>& vocab);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_VOCABULARY_H_
