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
#include <limits>
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
  // Add() of values[0..n) in order, with the same result bit for bit (sums accumulate in the
  // same order; the histogram depends only on the values and the first one ever added), at a
  // fraction of the cost: the window is fitted once to the batch's extremes.
  void AddBatch(const float* values, size_t n);
  // Folds in `later`, the statistics of values added after these: counts, extremes and the
  // histogram come out as adding those values here one by one would give them (the window
  // depends only on the values and the first one; bins of the narrower window nest in the
  // wider one); the sums are this sum plus later's, which may differ from adding one by one in
  // the last bits. Deterministic: the writer folds its commits' deltas with it, as RocksDB does
  // with the stored operands, so both hold the same bits.
  void Merge(const LatentStats& later);
  double bin_width() const;
  double histogram_min() const { return bin_low * bin_width(); }
  double histogram_max() const { return (bin_low + kHistogramBins) * bin_width(); }
  double mean() const { return firing_count ? sum / firing_count : 0; }
  double stddev() const;

  std::string Encode() const;
  // Encode() appended to *out.
  void AppendEncoded(std::string* out) const;
  static absl::Status Decode(absl::string_view data, LatentStats* out);

 private:
  // Slides or widens the window (merging bin pairs) so that it covers the occupied bins, 0 and
  // the bins of lo and hi (finite, lo <= hi), counting nothing.
  void FitWindow(double lo, double hi);
  // Doubles the bin width `doublings` times, merging runs of 2^doublings bins.
  void Widen(int doublings);
};

// Latents per statistics block and per top-N block (one key per block instead of one per
// latent: 64x fewer keys).
inline constexpr int32_t kLatentsPerBlock = 64;

// Statistics of a block of consecutive latents, one RocksDB value (keys::LatentStats): per
// latent a varint length and LatentStats::Encode() (length 0: never fired).
std::string EncodeStatsBlock(const LatentStats* stats, int32_t n);
// Decodes a block of exactly n records into out[0..n). DATA_LOSS when malformed.
absl::Status DecodeStatsBlock(absl::string_view in, LatentStats* out, int32_t n);
// Decodes only record `index` of such a block (the others are skipped by their lengths; the
// count is still checked): what a query of one latent needs.
absl::Status DecodeStatsBlockRecord(absl::string_view in, int32_t n, int32_t index,
                                    LatentStats* out);

// A commit's change to a statistics block, written as a merge operand instead of the whole
// block (on wide SAEs a commit touches most blocks, and rewriting them cost more than the rows):
//   varint n (latents in the block), varint entries, then per entry varint offset (< n),
//   varint c (values the commit added to that latent), then either, for c <= kRawStatsValues,
//   the c values (f32, in the order the writer added them: their delta is AddBatch of them), or
//   a varint length and the delta's LatentStats::Encode().
inline constexpr int kRawStatsValues = 8;
class StatsDeltaBuilder {
 public:
  explicit StatsDeltaBuilder(int32_t block_size);
  // `delta` holds the commit's values of latent first + offset; `values` are those values in
  // the order they were added when delta.firing_count <= kRawStatsValues (else unused).
  void Add(int32_t offset, const LatentStats& delta, const float* values);
  // The operand; the builder is empty again afterwards.
  std::string Finish();

 private:
  int32_t block_size_;
  uint64_t entries_ = 0;
  std::string body_;
};

// Folds `operands` (StatsDeltaBuilder values) in order into `base` (an EncodeStatsBlock value,
// or null when the key has none yet) with LatentStats::Merge, giving a block. Not associative
// in the sums' last bits, so operands are never folded among themselves. DATA_LOSS when any
// input is malformed or the block sizes disagree.
absl::Status MergeStatsBlocks(const absl::string_view* base,
                              const std::vector<absl::string_view>& operands, std::string* out);

struct TopEntry {
  int64_t row;
  float value;
};

// The N largest values seen, ordered by value descending then row ascending (deterministic).
class TopRows {
 public:
  // Returns true when the list changed.
  bool Offer(int64_t row, float value, int capacity);
  // Offer() of the entries (row_base + offsets[i], values[i]) for i in [0, n), in order; true
  // when the list changed. Entries below the list's last value, and values <= `floor` (a bound
  // the caller knows nothing at or below can enter), are skipped in a tight loop.
  bool OfferRun(int64_t row_base, const uint32_t* offsets, const float* values, size_t n,
                int capacity, float floor = -std::numeric_limits<float>::infinity());
  const std::vector<TopEntry>& entries() const { return entries_; }
  // Empties the list (keeping its buffer).
  void Clear() {
    entries_.clear();
    max_row_ = -1;
  }
  // The largest row ever inserted, -1 for none.
  int64_t max_row() const { return max_row_; }

  // Varint count, then per entry varint row and f32 value.
  std::string Encode() const;
  static absl::Status Decode(absl::string_view data, TopRows* out);

 private:
  std::vector<TopEntry> entries_;
  int64_t max_row_ = -1;  // the largest row ever inserted (replay check)
};

// Top-N lists of a block of consecutive latents, one RocksDB value (keys::LatentTop):
// per latent a varint length and the TopRows encoding (length 0: an empty list).
std::string EncodeTopBlock(const TopRows* lists, int32_t n);
// Decodes a block of exactly n lists into out[0..n). DATA_LOSS when malformed.
absl::Status DecodeTopBlock(absl::string_view in, TopRows* out, int32_t n);
// Decodes only list `index` of a block of n lists, skipping the others by their lengths.
absl::Status DecodeTopBlockList(absl::string_view in, int32_t n, int32_t index, TopRows* out);

// A commit does not rewrite a block: it adds a merge operand holding, per latent, only the
// entries its own rows [min_row, ...) placed in the list:
//   varint capacity (the dataset's top_n), then a block as above of those entries.
// Folding operands into the stored block in commit order (MergeTopBlocks) gives the block the
// writer holds in memory: the union of the lists, best `capacity` kept. Union-then-truncate is
// associative and ignores repeated rows, so operands may also be folded among themselves
// (compaction) and a replayed operand changes nothing.
std::string EncodeTopDelta(const TopRows* lists, int32_t n, int capacity, int64_t min_row);

// Folds `operands` (EncodeTopDelta values) into `base` (an EncodeTopBlock value, or null when
// the key has none yet). With as_operand the result is itself an operand (a partial merge),
// else a block. DATA_LOSS when any input is malformed or the latent counts disagree.
absl::Status MergeTopBlocks(const absl::string_view* base,
                            const std::vector<absl::string_view>& operands, bool as_operand,
                            std::string* out);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_LATENT_STATS_H_
