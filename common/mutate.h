// Test-only: random damage to encoded bytes, for the corruption fuzz tests of the decoders
// (storage/corruption_fuzz_test, engine/safetensors_test).
#ifndef LATENTD_COMMON_MUTATE_H_
#define LATENTD_COMMON_MUTATE_H_

#include <algorithm>
#include <cstddef>
#include <random>
#include <string>

namespace latentd {

// One random change of `in`, never `in` itself (for non-empty `in`): one to three flipped bits,
// a byte overwritten with any value (lengths and counts become huge or zero), a run of 0x00 or
// 0xff, a truncation, random bytes appended, or a run dropped from the middle. `alphabet`, when
// not empty, is where overwriting and appended bytes come from instead (say, the characters that
// matter to a JSON parser).
inline std::string MutateBytes(const std::string& in, std::mt19937* rng,
                               const std::string& alphabet = "") {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>((*rng)() % n); };
  auto any_byte = [&]() {
    return alphabet.empty() ? static_cast<char>((*rng)()) : alphabet[pick(alphabet.size())];
  };
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string out = in;
    switch ((*rng)() % 7) {
      case 0:
      case 1:
        for (int i = 0, n = 1 + static_cast<int>((*rng)() % 3); i < n && !out.empty(); ++i) {
          out[pick(out.size())] ^= static_cast<char>(1u << ((*rng)() % 8));
        }
        break;
      case 2:
        if (!out.empty()) out[pick(out.size())] = any_byte();
        break;
      case 3: {
        const size_t at = pick(out.size()), len = 1 + pick(16);
        const char fill = ((*rng)() & 1) ? '\xff' : '\0';
        for (size_t i = at; i < std::min(out.size(), at + len); ++i) out[i] = fill;
        break;
      }
      case 4:
        out.resize(pick(out.size()));
        break;
      case 5:
        for (size_t i = 0, n = 1 + pick(12); i < n; ++i)
          out.insert(out.begin() + pick(out.size() + 1), any_byte());
        break;
      case 6:
        out.erase(pick(out.size()), 1 + pick(8));
        break;
    }
    if (out != in) return out;
  }
  return in + "x";
}

}  // namespace latentd

#endif  // LATENTD_COMMON_MUTATE_H_
