// A whole SAE at a glance, from the statistics the chunk store keeps per latent (never the rows):
// its latents ranked by firing count, max or mean and filtered by firing count, a page at a
// time; how many never fired; and the log10 feature-density histogram that SAE evaluations plot
// (SAELens logs it while training, SAEDashboard shows it above the latents).
//
// One call reads the dataset's statistics blocks once at one snapshot: 64 latents a read, so a
// 4096-latent SAE is 64 point reads and a 1M-latent one 16k, whatever the number of rows.
#ifndef LATENTD_STORAGE_LATENT_OVERVIEW_H_
#define LATENTD_STORAGE_LATENT_OVERVIEW_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/chunk_store.h"

namespace latentd::storage {

enum class LatentOrder {
  kByLatent,       // latent index ascending
  kMostFrequent,   // firing count descending
  kLeastFrequent,  // firing count ascending (dead latents first)
  kHighestMax,     // largest value descending; latents that never fired last
  kHighestMean,    // mean over firing rows descending; latents that never fired last
};

// At most this many latents in one page (about 2 MB on the wire).
inline constexpr int32_t kMaxLatentPage = 65536;
// For every order but kByLatent, offset + limit is at most this: the ranking holds that many
// candidates (24 MB), whatever the SAE's width.
inline constexpr int64_t kMaxLatentRank = int64_t{1} << 20;

struct LatentOverviewOptions {
  LatentOrder order = LatentOrder::kByLatent;
  // Only latents whose firing count lies in [min_firing_count, max_firing_count] are listed and
  // counted in `matching`; the dead count and the histogram cover every latent. Defaults: all.
  int64_t min_firing_count = 0;
  int64_t max_firing_count = std::numeric_limits<int64_t>::max();
  // The page: matching latents [offset, offset + limit) of the order. Defaults 0 and 100; limit
  // in [1, kMaxLatentPage].
  int64_t offset = 0;
  int32_t limit = 100;
  // Bins of the log10 density histogram, in [1, 1000]. Default 50.
  int32_t density_bins = 50;
};

struct LatentSummary {
  int32_t latent = 0;
  int64_t firing_count = 0;
  double mean = 0;  // over firing rows; 0 for a latent that never fired
  float max = 0;    // 0 for a latent that never fired
};

struct LatentOverview {
  int64_t rows = 0;                    // committed rows the counts are over (one snapshot)
  int32_t width = 0;                   // latents in the SAE
  int64_t dead = 0;                    // latents that never fired
  int64_t matching = 0;                // latents inside the firing-count filter
  std::vector<LatentSummary> latents;  // the page, in the order asked
  // log10(firing_count / rows) of every latent that fired, counted in density_bins equal bins
  // over [log10_density_min, 0] where log10_density_min = log10(1 / rows) (the rarest possible
  // firing); each bin holds [low, high), the last one also 0. Empty when no row is committed.
  double log10_density_min = 0;
  std::vector<int64_t> log10_density_histogram;
};

// INVALID_ARGUMENT naming the option for a bad one; otherwise as ChunkStore::ForEachLatentStats
// (NOT_FOUND, FAILED_PRECONDITION for a DENSE dataset, DATA_LOSS naming a damaged block).
absl::StatusOr<LatentOverview> SummarizeLatents(const ChunkStore& store, uint64_t dataset_id,
                                                const LatentOverviewOptions& options);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_LATENT_OVERVIEW_H_
