// How well an SAE reconstructs the activations it encoded, kept as sums over rows so that batches,
// commits and resumed runs add up exactly: explained variance around the mean of all the rows
// counted, MSE and mean cosine similarity, the figures SAELens' evals report. The chunk store
// keeps a dataset's totals next to its watermark, advanced by the commits that make rows durable.
// Torch-free.
#ifndef LATENTD_STORAGE_RECONSTRUCTION_FIT_H_
#define LATENTD_STORAGE_RECONSTRUCTION_FIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/latentd/v1/datasets.pb.h"

namespace latentd::storage {

// The most hook dimensions a fit holds (d_in of the widest models, with room).
inline constexpr int64_t kMaxFitDimensions = int64_t{1} << 16;

struct ReconstructionFit {
  int64_t rows = 0;
  double squared_error = 0;   // sum over rows of ||x - x_hat||^2
  double sum_squares = 0;     // sum over rows of ||x||^2
  double cosine_sum = 0;      // sum over rows of cos(x, x_hat)
  std::vector<double> sum_x;  // sum over rows of x, per dimension

  // The sums as one array: [squared_error, sum_squares, cosine_sum, rows, sum_x...] (what the
  // engine computes on the device). INVALID_ARGUMENT for n < 4, a negative or fractional row
  // count, or more than kMaxFitDimensions dimensions.
  static absl::StatusOr<ReconstructionFit> FromSums(const double* sums, int64_t n);
  // Adds `other`'s sums; INVALID_ARGUMENT when both have rows and their dimensions differ.
  absl::Status Add(const ReconstructionFit& other);

  // 1 - squared_error / (sum of squared deviations from the rows' mean); 0 without rows or
  // variance.
  double explained_variance() const;
  double mse() const;          // squared_error per element
  double mean_cosine() const;  // cosine_sum / rows

  std::string Encode() const;
  // DATA_LOSS for bytes Encode did not write.
  static absl::StatusOr<ReconstructionFit> Decode(absl::string_view bytes);
};

// The API's figures of `fit` (no rows: an empty message).
latentd::v1::SaeFit ToSaeFit(const ReconstructionFit& fit);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_RECONSTRUCTION_FIT_H_
