// UTF-8 and GPT-2's byte-level alphabet, shared by the two directions of a tokenizer: token ids
// -> text (Vocabulary) and text -> token ids (Tokenizer).
//
// Byte-level BPE (GPT-2, Llama 3, Qwen2, cl100k) spells every byte as one printable code point so
// that merges never see a space or a control byte: the 188 printable bytes ('!'..'~', 0xA1..0xAC,
// 0xAE..0xFF) stand for themselves, the other 68 for U+0100, U+0101, ... in byte order ("Ġ",
// U+0120, is the space).
#ifndef LATENTD_CLIENT_BYTE_LEVEL_H_
#define LATENTD_CLIENT_BYTE_LEVEL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace latentd::client {

// The code point of the UTF-8 sequence at s[i] and its length in bytes; length 0 where the bytes
// there are not well-formed UTF-8 (overlong, surrogate, truncated, beyond U+10FFFF).
std::pair<uint32_t, size_t> DecodeUtf8(absl::string_view s, size_t i);

// Where the code point that ends at byte `end` of `s` (valid UTF-8, end > 0) starts.
size_t PreviousCodePointStart(absl::string_view s, size_t end);

// Appends code point `cp` (at most U+10FFFF, not a surrogate) as UTF-8.
void AppendUtf8(uint32_t cp, std::string* out);

// The byte offset of the first byte of `s` that is not well-formed UTF-8; nullopt when all are.
std::optional<size_t> FirstInvalidUtf8(absl::string_view s);

// `bytes` spelled in the byte-level alphabet (UTF-8 of one code point per byte).
std::string ByteLevelEncode(absl::string_view bytes);

// The bytes a byte-level token spells; nullopt when it holds a code point outside the alphabet.
std::optional<std::string> ByteLevelDecode(absl::string_view token);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_BYTE_LEVEL_H_
