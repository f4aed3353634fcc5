#include "client/byte_level.h"

#include <array>

namespace latentd::client {
namespace {

bool PrintableByte(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
}

// byte -> code point, and code point (< 512) -> byte or -1.
struct ByteLevelTables {
  std::array<uint32_t, 256> encode;
  std::array<int, 512> decode;
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    t.decode.fill(-1);
    uint32_t next = 256;
    for (int byte = 0; byte < 256; ++byte) {
      t.encode[byte] = PrintableByte(byte) ? byte : next++;
      t.decode[t.encode[byte]] = byte;
    }
    return t;
  }();
  return tables;
}

}  // namespace

std::pair<uint32_t, size_t> DecodeUtf8(absl::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t lead = b(0);
  if (lead < 0x80) return {lead, 1};
  size_t n;
  uint32_t cp, min;
  if ((lead & 0xE0) == 0xC0) {
    n = 2, cp = lead & 0x1F, min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    n = 3, cp = lead & 0x0F, min = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    n = 4, cp = lead & 0x07, min = 0x10000;
  } else {
    return {0, 0};
  }
  if (i + n > s.size()) return {0, 0};
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, n};
}

size_t PreviousCodePointStart(absl::string_view s, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  return start;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::optional<size_t> FirstInvalidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = DecodeUtf8(s, i).second;
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

std::string ByteLevelEncode(absl::string_view bytes) {
  const ByteLevelTables& t = Tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) AppendUtf8(t.encode[static_cast<uint8_t>(c)], &out);
  return out;
}

std::optional<std::string> ByteLevelDecode(absl::string_view token) {
  const ByteLevelTables& t = Tables();
  std::string out;
  for (size_t i = 0; i < token.size();) {
    const auto [cp, n] = DecodeUtf8(token, i);
    if (n == 0 || cp >= t.decode.size() || t.decode[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.decode[cp]));
    i += n;
  }
  return out;
}

}  // namespace latentd::client
