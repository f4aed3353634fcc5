// Throughput of the chunk store's hot codecs, each on data that stays in cache, so that a change
// to one of them shows without the noise of a whole commit or read:
//   - CRC32C (every chunk part carries one) on a 12 KiB latent slice and on 3 MiB, hardware
//     path against the portable table path;
//   - a latent slice (4096 Elias-Fano keys over 128 latents x 4096 rows, fp16 values): encode,
//     whole decode, and a one-row masked decode;
//   - rounding float values to fp16 as the writer does on append.
//
//   bazel build -c opt //bench:codec_bench && bazel-bin/bench/codec_bench
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "storage/crc32c.h"
#include "storage/posting_codec.h"
#include "storage/value_codec.h"

namespace {

using latentd::storage::ChunkDtype;
using Clock = std::chrono::steady_clock;

// Seconds per call of f, over enough calls to fill about half a second.
template <typename F>
double SecondsPerCall(F f) {
  f();  // warm
  int64_t calls = 1;
  while (true) {
    const auto a = Clock::now();
    for (int64_t i = 0; i < calls; ++i) f();
    const double s = std::chrono::duration<double>(Clock::now() - a).count();
    if (s > 0.5) return s / calls;
    calls *= 2;
  }
}

void Check(bool ok) {
  if (!ok) {
    std::fprintf(stderr, "codec_bench: a codec call failed\n");
    std::exit(1);
  }
}

}  // namespace

int main() {
  std::mt19937_64 rng(1);
  for (size_t size : {size_t{12} << 10, size_t{3} << 20}) {
    std::string data(size, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    uint32_t sink = 0;
    const double hw = SecondsPerCall([&] { sink ^= latentd::storage::Crc32c(data.data(), size); });
    const double portable = SecondsPerCall(
        [&] { sink ^= latentd::storage::Crc32cExtendPortable(0, data.data(), size); });
    std::printf("crc32c %7zu B: %.1f GB/s (portable tables %.1f GB/s) [%u]\n", size,
                size / hw / 1e9, size / portable / 1e9, sink & 1);
  }

  // A slice as format 3 stores it: keys (latent_offset << 12) | row, values fp16-exact.
  constexpr int kRowBits = 12;
  std::set<int64_t> picked;
  while (picked.size() < 4096) picked.insert(static_cast<int64_t>(rng() % (128 << kRowBits)));
  const std::vector<int64_t> keys(picked.begin(), picked.end());
  std::vector<float> values;
  std::exponential_distribution<float> value(4.0f);
  for (size_t i = 0; i < keys.size(); ++i) {
    values.push_back(
        latentd::storage::HalfToFloat(latentd::storage::FloatToHalf(0.05f + value(rng))));
  }
  const size_t n = keys.size();
  std::string enc;
  const double encode = SecondsPerCall([&] {
    latentd::storage::EncodePosting(0, keys.data(), values.data(), n, ChunkDtype::kFloat16, &enc);
  });
  std::vector<int64_t> out_keys;
  std::vector<float> out_values;
  const double decode = SecondsPerCall([&] {
    out_keys.clear();
    out_values.clear();
    Check(
        latentd::storage::DecodePosting(enc, 0, ChunkDtype::kFloat16, &out_keys, &out_values).ok());
  });
  Check(out_keys == keys && out_values == values);
  const double one_row = SecondsPerCall([&] {
    out_keys.clear();
    out_values.clear();
    Check(latentd::storage::DecodePostingMasked(enc, ChunkDtype::kFloat16,
                                                (uint64_t{1} << kRowBits) - 1, 1000, 1001,
                                                &out_keys, &out_values, nullptr)
              .ok());
  });
  std::printf(
      "slice of %zu entries (%zu B, %.2f B/entry): encode %.2f ns/entry, decode %.2f "
      "ns/entry, one-row masked decode %.2f us\n",
      n, enc.size(), static_cast<double>(enc.size()) / n, encode / n * 1e9, decode / n * 1e9,
      one_row * 1e6);

  // Rounding appended values to the stored dtype, per value through the half bits against the
  // writer's branch-free array loop (64K values, in L2).
  std::vector<float> raw(1 << 16), rounded(raw.size());
  std::exponential_distribution<float> exponential(1.0f);
  for (float& v : raw) v = 0.05f + exponential(rng);
  const double per_value = SecondsPerCall([&] {
    for (size_t i = 0; i < raw.size(); ++i) {
      rounded[i] = latentd::storage::HalfToFloat(latentd::storage::FloatToHalf(raw[i]));
    }
  });
  std::vector<float> array = raw;
  const double array_loop = SecondsPerCall([&] {
    std::copy(raw.begin(), raw.end(), array.begin());
    latentd::storage::RoundArrayToHalf(array.data(), static_cast<int64_t>(array.size()));
  });
  Check(array == rounded);
  std::printf("round to fp16: per value %.2f ns/value, array loop %.2f ns/value (copy included)\n",
              per_value / raw.size() * 1e9, array_loop / raw.size() * 1e9);
  return 0;
}
