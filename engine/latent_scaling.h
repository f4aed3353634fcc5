// Latent scaling (Minder et al. 2025, "Overcoming sparsity artifacts in crosscoders to interpret
// chat-tuning"): is a latent a model-diffing crosscoder gives one model alone ("chat-only": its
// decoder nearly all in that model's block) really absent from the other model, or did the
// crosscoder's sparsity penalty push the other block to 0 while the other model still carries
// the direction (in its reconstruction error: complete shrinkage; or in other latents'
// reconstruction: latent decoupling)?
//
// For latent j with d = W_dec_source[j] (the block of the model it is said to be specific to),
// over rows i where it fires with value f_i, the least-squares scale of f_i d that best explains
// a target y_i in each model m (source and baseline):
//
//   beta = sum_i f_i (d . y_i) / (|d|^2 sum_i f_i^2)
//   error target:          y_i = x_m,i - (x_hat_m,i - f_i W_dec_m[j])   (the error with j's own
//                                                                         part put back)
//   reconstruction target: y_i = x_hat_m,i - f_i W_dec_m[j]             (every other latent's)
//
// and the ratios nu = beta(baseline) / beta(source). A latent truly specific to the source model
// has both ratios near 0; near 1, the baseline model explains the direction as well (an
// artifact). x_m are the stored DENSE rows, x_hat_m the crosscoder's decoding of the stored
// codes, both in the hook's own units (the saved crosscoder's).
//
// Torch-free header (the Datasets service includes it through dataset_models.h).
#ifndef LATENTD_ENGINE_LATENT_SCALING_H_
#define LATENTD_ENGINE_LATENT_SCALING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/stored_dense.h"
#include "storage/chunk_store.h"

namespace latentd::engine {

class Sae;

inline constexpr int64_t kMaxScalingLatents = 4096;
inline constexpr int64_t kDefaultScalingRows = 16384;
inline constexpr int64_t kMaxScalingRows = int64_t{1} << 20;
inline constexpr int64_t kDefaultScalingLimit = 100;
// A latent is a source's own when its block holds at least this share of the decoder norm (at
// the training scale), as TrainResult.crosscoder counts them.
inline constexpr double kOwnLatentShare = 0.9;
inline constexpr int64_t kDefaultProjectionBytes = int64_t{256} << 20;
// The work one call may do, so that a unary call answers in seconds: (latent, row) pairs fitted
// (at most about 2 us each, everything included, on this project's 2-core machines: 2^22 in
// under 10 s) and multiply-adds of the projections (latents x d_sae x d x 2, a matrix product:
// 2^36 in a few seconds).
inline constexpr int64_t kDefaultMaxScalingPairs = int64_t{1} << 22;
inline constexpr int64_t kDefaultMaxProjectionMacs = int64_t{1} << 36;

struct LatentScalingQuery {
  // Latents to fit, each once, at most kMaxScalingLatents. Empty: the latents whose source block
  // holds at least `min_share` of the decoder norm and that fired, largest share first (ties by
  // latent), at most `limit`.
  std::vector<int64_t> latents;
  // The model the latents are said to be specific to, as the crosscoder's source index; its
  // block of the decoder is the direction fitted. Unset: the last source (the chat model of a
  // base / chat pair, trained in that order).
  std::optional<int> source;
  // The model compared with it. Unset: source 0, or 1 when source is 0.
  std::optional<int> baseline;
  // Firing rows fitted per latent, evenly spread over all of them (deterministic); 0:
  // kDefaultScalingRows. At most kMaxScalingRows.
  int64_t max_rows = 0;
  // With no latents: how many; 0: kDefaultScalingLimit. At most kMaxScalingLatents.
  int64_t limit = 0;
  // With no latents: the least share of the source's block, in [0, 1]. Unset: kOwnLatentShare
  // (the source's own). A lower one reaches latents that lean to the source where a crosscoder
  // has few of its own.
  std::optional<double> min_share;
  // Memory the projections of every decoder row onto the fitted directions may take (4 bytes a
  // latent, a fitted latent and a model): more latents than fit are fitted in groups, each
  // reading its own rows. 0: kDefaultProjectionBytes.
  int64_t projection_bytes = 0;
  // The work bounds above; 0: the defaults. (The daemon keeps the defaults; tests lower them.)
  int64_t max_pairs = 0;
  int64_t max_projection_macs = 0;
};

struct LatentScale {
  int64_t latent = 0;
  int64_t rows = 0;          // firing rows fitted (0: it never fired; betas 0, ratios NaN)
  int64_t firing_count = 0;  // its firing rows in the dataset
  double share = 0;          // the source block's share of its decoder norm (training scale)
  // beta of each target in each model, as the header's comment defines them.
  double beta_error_source = 0, beta_error_baseline = 0;
  double beta_reconstruction_source = 0, beta_reconstruction_baseline = 0;
  // beta(baseline) / beta(source): nu_epsilon and nu_r. NaN where beta(source) is 0.
  double error_ratio = 0, reconstruction_ratio = 0;
};

struct LatentScalingResult {
  int source = 0, baseline = 0;
  int64_t rows_read = 0;             // distinct rows whose activations were read
  std::vector<LatentScale> latents;  // in the order asked (own latents: share descending)
};

// What the fit reads: the crosscoder's SPARSE dataset and every source's DENSE rows, row for row
// (row i of each is the same token).
struct CrosscoderDatasetRows {
  // Every committed row where `latent` fires, ascending, with its value (ChunkStore's
  // LatentPostings).
  std::function<absl::Status(int32_t latent, std::vector<int64_t>* rows,
                             std::vector<float>* values)>
      postings;
  // The codes of rows [row_start, row_start + row_count); those whose bit is set in `keep` must
  // come whole (ChunkStore's ReadRowSet).
  std::function<absl::StatusOr<storage::CsrRows>(int64_t row_start, int64_t row_count,
                                                 const std::vector<uint64_t>& keep)>
      codes;
  // Per source, in the crosscoder's order; only source's and baseline's are read (others may be
  // null).
  std::vector<std::shared_ptr<const StoredDenseRows>> sources;
};

// The fit over `rows` with `crosscoder` (the dataset's, as saved: in the hooks' own units).
// INVALID_ARGUMENT naming the field for a source or baseline outside the crosscoder's sources
// or equal, a latent outside [0, d_sae) or named twice, too many latents, max_rows or limit
// out of range; FAILED_PRECONDITION when a source's rows are not as wide as its block or fewer
// than the codes'; RESOURCE_EXHAUSTED with the numbers past max_pairs or max_projection_macs;
// CANCELLED when `cancelled` (may be null) says so between reads; the readers' errors as they
// come (DATA_LOSS naming a chunk).
absl::StatusOr<LatentScalingResult> FitLatentScaling(const Sae& crosscoder,
                                                     const LatentScalingQuery& query,
                                                     const CrosscoderDatasetRows& rows,
                                                     const std::function<bool()>& cancelled);

// The readers of `rows` bound to the chunk store's SPARSE dataset `dataset_id` (codes and
// postings); `sources` as given.
CrosscoderDatasetRows ChunkStoreCrosscoderRows(
    const storage::ChunkStore* store, uint64_t dataset_id,
    std::vector<std::shared_ptr<const StoredDenseRows>> sources);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_LATENT_SCALING_H_
