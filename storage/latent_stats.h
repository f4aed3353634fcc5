// Per-latent statistics, maintained at commit time so queries never rescan: firing count, sum,
// sum of squares, max/min, a 50-bin histogram of the stored values and the top-N rows by value.
//
// The histogram has bins of width 2^e over [lo * 2^e, (lo + 50) * 2^e) with lo <= 0 <= lo + 50:
// when a value falls outside, the width doubles and pairs of bins merge exactly, so the result
// depends only on the values (and the first one), never on commit boundaries.
#ifndef LATENTD_STORAGE_LATENT_STATS_H_
#define LATENTD_STORAGE_LATENT_STATS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace latentd::storage {

inline constexpr int kHistogramBins = 50;

struct LatentStats {
  int64_t firing_count = 0;
  double sum = 0;
  double sum_squares = 0;
  float max = 0;  // meaningful when firing_count > 0
  float min = 0;
  int32_t bin_exponent = 0;
  int64_t bin_low = 0;  // lower edge in bins
  std::array<int64_t, kHistogramBins> histogram{};

  void Add(float value);
  double bin_width() const;
  double histogram_min() const { return bin_low * bin_width(); }
  double histogram_max() const { return (bin_low + kHistogramBins) * bin_width(); }
  double mean() const { return firing_count ? sum / firing_count : 0; }
  double stddev() const;

  std::string Encode() const;
  static absl::Status Decode(absl::string_view data, LatentStats* out);
};

struct TopEntry {
  int64_t row;
  float value;
};

// The N largest values seen, ordered by value descending then row ascending (deterministic).
class TopRows {
 public:
  // Returns true when the list changed.
  bool Offer(int64_t row, float value, int capacity);
  // False when Offer(row, value, capacity) would certainly leave the list unchanged (it is full
  // and the entry ranks below its last): the inline check that spares most calls.
  bool MayAccept(int64_t row, float value, int capacity) const {
    if (capacity <= 0) return false;
    if (static_cast<int>(entries_.size()) < capacity) return true;
    const TopEntry& last = entries_.back();
    return value != last.value ? value > last.value : row < last.row;
  }
  const std::vector<TopEntry>& entries() const { return entries_; }

  std::string Encode() const;
  // Encode() appended to *out without a temporary, and its length.
  void AppendEncoded(std::string* out) const;
  size_t EncodedSize() const;
  static absl::Status Decode(absl::string_view data, TopRows* out);

 private:
  std::vector<TopEntry> entries_;
  int64_t max_row_ = -1;  // the largest row ever inserted (replay check)
};

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_LATENT_STATS_H_
