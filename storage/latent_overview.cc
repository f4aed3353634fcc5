#include "storage/latent_overview.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::storage {
namespace {

absl::Status CheckOptions(const LatentOverviewOptions& o) {
  if (o.limit < 1 || o.limit > kMaxLatentPage) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: ", o.limit, " is outside [1, ", kMaxLatentPage, "]"));
  }
  if (o.offset < 0) return absl::InvalidArgumentError(absl::StrCat("offset: ", o.offset, " < 0"));
  if (o.order != LatentOrder::kByLatent && o.offset > kMaxLatentRank - o.limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset: ", o.offset, " + limit ", o.limit, " ranks more than ",
                     kMaxLatentRank, " latents; page in latent order (or filter by firing count)"));
  }
  if (o.min_firing_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_firing_count: ", o.min_firing_count, " < 0"));
  }
  if (o.max_firing_count < o.min_firing_count) {
    return absl::InvalidArgumentError(absl::StrCat("max_firing_count: ", o.max_firing_count,
                                                   " < min_firing_count ", o.min_firing_count));
  }
  if (o.density_bins < 1 || o.density_bins > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("density_bins: ", o.density_bins, " is outside [1, 1000]"));
  }
  switch (o.order) {
    case LatentOrder::kByLatent:
    case LatentOrder::kMostFrequent:
    case LatentOrder::kLeastFrequent:
    case LatentOrder::kHighestMax:
    case LatentOrder::kHighestMean:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("order: unknown");
}

// Whether `a` comes before `b` in `order`: a strict weak order, ties broken by latent index so
// that pages never overlap or skip a latent.
bool Before(LatentOrder order, const LatentSummary& a, const LatentSummary& b) {
  auto by = [&](double ka, double kb) { return ka != kb ? ka > kb : a.latent < b.latent; };
  // A latent that never fired has no max or mean: it ranks below every latent that did.
  constexpr double kNone = -std::numeric_limits<double>::infinity();
  switch (order) {
    case LatentOrder::kByLatent:
      break;
    case LatentOrder::kMostFrequent:
      return by(static_cast<double>(a.firing_count), static_cast<double>(b.firing_count));
    case LatentOrder::kLeastFrequent:
      return by(-static_cast<double>(a.firing_count), -static_cast<double>(b.firing_count));
    case LatentOrder::kHighestMax:
      return by(a.firing_count > 0 ? a.max : kNone, b.firing_count > 0 ? b.max : kNone);
    case LatentOrder::kHighestMean:
      return by(a.firing_count > 0 ? a.mean : kNone, b.firing_count > 0 ? b.mean : kNone);
  }
  return a.latent < b.latent;
}

// The histogram spans [log10(1 / rows), 0]; out->rows must be set (ForEachLatentStats sets it
// before its first visit). Nothing to bin without rows.
void StartDensityHistogram(int32_t bins, LatentOverview* out) {
  if (out->rows == 0) return;
  out->log10_density_min = -std::log10(static_cast<double>(out->rows));
  out->log10_density_histogram.assign(bins, 0);
}

// log10(count / rows) - log10(1 / rows) = log10(count): a latent's bin is log10(count) over the
// span log10(rows), so a latent firing once lands in bin 0 exactly and one firing on every row in
// the last (one row: a span of 0, every latent in the last bin).
void AddDensity(int64_t firing_count, LatentOverview* out) {
  std::vector<int64_t>& histogram = out->log10_density_histogram;
  if (histogram.empty()) return;
  const int64_t bins = static_cast<int64_t>(histogram.size());
  const double span = -out->log10_density_min;
  const int64_t bin = span > 0 ? static_cast<int64_t>(std::floor(
                                     std::log10(static_cast<double>(firing_count)) / span * bins))
                               : bins - 1;
  ++histogram[std::clamp<int64_t>(bin, 0, bins - 1)];
}

}  // namespace

absl::StatusOr<LatentOverview> SummarizeLatents(const ChunkStore& store, uint64_t dataset_id,
                                                const LatentOverviewOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  LatentOverview out;
  const bool ranked = options.order != LatentOrder::kByLatent;
  // Ranked: the best offset + limit candidates so far, as a heap whose front is the worst of
  // them. In latent order the page is simply the matching latents at positions [offset, end).
  const size_t keep = static_cast<size_t>(options.offset) + static_cast<size_t>(options.limit);
  auto ranks_before = [&](const LatentSummary& a, const LatentSummary& b) {
    return Before(options.order, a, b);
  };
  std::vector<LatentSummary> candidates;
  RETURN_IF_ERROR(store.ForEachLatentStats(
      dataset_id, &out.rows, [&](int32_t latent, const LatentStats& stats) {
        if (out.width++ == 0) StartDensityHistogram(options.density_bins, &out);
        if (stats.firing_count == 0) {
          ++out.dead;
        } else {
          AddDensity(stats.firing_count, &out);
        }
        if (stats.firing_count < options.min_firing_count ||
            stats.firing_count > options.max_firing_count) {
          return;
        }
        const int64_t position = out.matching++;
        LatentSummary s;
        s.latent = latent;
        s.firing_count = stats.firing_count;
        if (stats.firing_count > 0) {
          s.mean = stats.mean();
          s.max = stats.max;
        }
        if (!ranked) {
          if (position >= options.offset &&
              out.latents.size() < static_cast<size_t>(options.limit)) {
            out.latents.push_back(s);
          }
          return;
        }
        if (candidates.size() < keep) {
          candidates.push_back(s);
          std::push_heap(candidates.begin(), candidates.end(), ranks_before);
        } else if (Before(options.order, s, candidates.front())) {
          std::pop_heap(candidates.begin(), candidates.end(), ranks_before);
          candidates.back() = s;
          std::push_heap(candidates.begin(), candidates.end(), ranks_before);
        }
      }));
  if (ranked) {
    std::sort_heap(candidates.begin(), candidates.end(), ranks_before);
    if (candidates.size() > static_cast<size_t>(options.offset)) {
      out.latents.assign(candidates.begin() + options.offset, candidates.end());
    }
  }
  return out;
}

}  // namespace latentd::storage
