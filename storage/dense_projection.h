// Where a direction of a DENSE dataset's activation space shows: every row's hidden state
// projected on it (a steering vector, a probe's weights, an SAE latent's decoder or encoder
// row, a difference of means), the rows at either end with their contexts, and how the
// projection is spread over the rows. Without the store a user loads the activations into
// RAM and projects them in numpy; here one pass over the stored rows answers it, in memory
// bounded by the rows asked for (8 bytes a row), never by the activations.
#ifndef LATENTD_STORAGE_DENSE_PROJECTION_H_
#define LATENTD_STORAGE_DENSE_PROJECTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/chunk_store.h"

namespace latentd::storage {

inline constexpr int32_t kMaxProjectionTop = 1000;
inline constexpr int32_t kMaxProjectionBins = 1000;
inline constexpr int32_t kMaxProjectionContext = 1024;
// Rows one projection scans: it holds a float and a token id per row (64 MiB at most).
inline constexpr int64_t kMaxProjectionRows = int64_t{1} << 23;

enum class ProjectionMeasure {
  kDot,     // x . v
  kCosine,  // x . v / (|x| |v|), 0 for a zero row: rows of outsized norm (the first token's
            // residual stream often is) then rank no higher than any other
};

struct ProjectionOptions {
  ProjectionMeasure measure = ProjectionMeasure::kDot;
  // Rows listed at each end, in [1, kMaxProjectionTop]. Default 20.
  int32_t top_n = 20;
  // At most one row per sequence at each end (the sequence's largest, resp. smallest), as
  // delphi and SAEDashboard show examples, instead of neighbouring rows of one sequence.
  // Default false.
  bool distinct_sequences = false;
  // Each listed row's window, clipped to its sequence and the rows scanned, in
  // [0, kMaxProjectionContext]. Default 32 before, 8 after.
  int32_t context_before = 32;
  int32_t context_after = 8;
  // The rows scanned: [row_start, row_start + row_count), row_count 0 to the committed end, at
  // most kMaxProjectionRows of them.
  int64_t row_start = 0;
  int64_t row_count = 0;
  // Equal-width bins of the histogram over [min, max] of the projection, in
  // [1, kMaxProjectionBins]. Default 50.
  int32_t bins = 50;
};

struct Projection {
  int64_t rows = 0;  // scanned
  double mean = 0;
  double stddev = 0;  // population
  float min = 0;
  float max = 0;
  // Bin b counts the rows in [min + b * bin_width, min + (b + 1) * bin_width), the last bin
  // including max; bin_width 0 (every row in bin 0) when min == max.
  double bin_width = 0;
  std::vector<int64_t> histogram;
  // The largest projections, value descending (rows ascending among equal values), and the
  // smallest, value ascending; context_values hold the projection of each window row.
  std::vector<TopActivationContext> largest;
  std::vector<TopActivationContext> smallest;
};

// INVALID_ARGUMENT naming the first option out of its range (ProjectDenseRows checks them too;
// a caller that sizes the answer first checks them before).
absl::Status CheckProjectionOptions(const ProjectionOptions& options);

// Projects rows of DENSE dataset `id` on `direction` (the dataset's width values).
// INVALID_ARGUMENT naming the field: a direction of another length, with a value that is not
// finite, or all zeros; an option out of its range. FAILED_PRECONDITION for a SPARSE dataset;
// NOT_FOUND; OUT_OF_RANGE past the committed rows; RESOURCE_EXHAUSTED with both numbers for
// more than kMaxProjectionRows rows; DATA_LOSS naming the chunk for a corrupt one.
absl::StatusOr<Projection> ProjectDenseRows(const ChunkStore& store, uint64_t id,
                                            const std::vector<float>& direction,
                                            const ProjectionOptions& options);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_DENSE_PROJECTION_H_
