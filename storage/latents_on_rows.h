// Which latents fire on a set of rows: the rows where one latent fires ("what fires with latent
// j": feature splitting and absorption show up as latents that always co-fire) or the rows that
// hold one token id ("what does the SAE see in this token"), or rows the user names (row spans:
// documents they labelled, alone or against others). Users answer these today by loading every
// row. Here the selection comes from the latent's latent-major run (one small read per chunk),
// from the token-id parts (8 KiB per 4096 rows) or from the spans themselves; then only chunks
// holding selected rows are read, whole (a row's latents lie in every slice of its chunk), in an
// order spread over the dataset, until `max_rows` selected rows have been counted. A selection
// larger than that is thus sampled by chunks: the cost follows max_rows, not the dataset, for
// common latents and tokens, while a rare one is counted exactly from the few chunks it touches.
//
// Two questions about one latent's rows sit here too, answered from its latent-major runs and
// the token parts only: the tokens it fires on (TokensLatentFiresOn) and where in its sequences
// (PositionsLatentFiresAt).
#ifndef LATENTD_STORAGE_LATENTS_ON_ROWS_H_
#define LATENTD_STORAGE_LATENTS_ON_ROWS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/chunk_store.h"

namespace latentd::storage {

// Bounds of LatentsOnRowsOptions.
inline constexpr int32_t kMaxLatentsOnRows = 65536;
inline constexpr int64_t kMaxRowsOnRows = int64_t{1} << 20;

enum class LatentsOnRowsOrder {
  kByCount,  // firings on the rows read, descending (ties by latent index)
  kByLift,   // fraction of the rows read / the latent's density over the dataset, descending
  // Fraction of the rows read minus fraction of the versus rows read, descending (ties by
  // count): ContrastRowSpans only.
  kByDifference,
  // The latent as a detector of the selected rows: the harmonic mean of its recall (the fraction
  // of the rows read where it fires) and its precision (the share of all its firings that lie
  // on selected rows), descending. The latent that best marks a labelled row set ("k = 1 sparse
  // probing"), or, for the rows where latent j fires, the latent most nearly the same as j.
  kByF1,
};

struct LatentsOnRowsOptions {
  LatentsOnRowsOrder order = LatentsOnRowsOrder::kByCount;
  // Latents returned, in [1, kMaxLatentsOnRows]. Default 20.
  int32_t limit = 20;
  // Selected rows counted at most, in [1, kMaxRowsOnRows]: chunks are read in bit-reversed
  // order (every prefix spread over the dataset; deterministic) until this many are counted, the
  // last chunk's first ones. Default 2048.
  int64_t max_rows = 2048;
  // Only latents firing at least this often on the rows read are ranked (>= 1; lift is noisy
  // for a latent seen once or twice). Default 1.
  int64_t min_count = 1;
  // Count the latents of this dataset on the selected rows (0, the default: the selecting
  // dataset's own). It must hold the same rows: the same token source, first row and context
  // length (another output of the same EXTRACT job, or a job over the same tokens with another
  // hook or SAE), else FAILED_PRECONDITION; selected rows past its committed prefix are left
  // out. "Which latents of layer 1 fire where latent j of layer 3 fires": lift is then against
  // the other dataset's densities, and no latent is left out.
  uint64_t in_dataset = 0;
  // Threads reading chunks: 0 (default) takes the machine's, at most 8; fewer when the SAE is so
  // wide that their per-latent tallies (16 B a latent each) would pass 64 MiB together. The
  // counts never depend on it; a mean may differ in its last bits (sums merged per thread).
  int32_t threads = 0;
};

struct LatentOnRows {
  int32_t latent = 0;
  int64_t count = 0;  // firings on the rows read
  double mean = 0;    // mean value of those firings
  double lift = 0;    // (count / rows_read) / (firing_count / rows) over the whole dataset
  // The share of the latent's firings over the whole dataset that lie on the selected rows:
  // count / firing_count when every selected row is read, else count scaled by rows_selected /
  // rows_read (an estimate, at most 1). For the rows where latent j fires, P(j fires | this one
  // fires) beside fraction's P(this one fires | j fires).
  double precision = 0;
  double f1 = 0;  // 2 precision fraction / (precision + fraction), fraction = count / rows_read
  // ContrastRowSpans: firings on the versus rows read, and their mean value (0 without any).
  int64_t versus_count = 0;
  double versus_mean = 0;
};

struct LatentsOnRows {
  int64_t rows_selected = 0;  // rows the selection matched (committed ones, at its snapshot)
  int64_t rows_read = 0;      // of them, counted: all, or max_rows from chunks spread over it
  std::vector<LatentOnRows> latents;  // the `limit` first in the order asked
  // ContrastRowSpans: the same for the versus rows (at most max_rows of them read, alike).
  int64_t versus_selected = 0;
  int64_t versus_read = 0;
};

// The latents firing on the rows where `latent` fires, `latent` itself left out (unless they are
// counted in another dataset). INVALID_ARGUMENT naming the field for bad options or a latent
// outside [0, width); NOT_FOUND; FAILED_PRECONDITION for a DENSE dataset or an in_dataset with
// other rows; DATA_LOSS naming what is damaged.
absl::StatusOr<LatentsOnRows> LatentsFiringWith(const ChunkStore& store, uint64_t id,
                                                int32_t latent,
                                                const LatentsOnRowsOptions& options);

// The latents firing on the rows whose token id is `token_id` (a negative id selects nothing).
// Errors as LatentsFiringWith.
absl::StatusOr<LatentsOnRows> LatentsFiringOnToken(const ChunkStore& store, uint64_t id,
                                                   int32_t token_id,
                                                   const LatentsOnRowsOptions& options);

// Rows [start, start + count) of a dataset.
struct RowSpan {
  int64_t start = 0;
  int64_t count = 0;
};

// Spans LatentsInRowSpans takes at most.
inline constexpr int64_t kMaxRowSpans = int64_t{1} << 20;

// The rules LatentsInRowSpans applies to its spans, against the record of the dataset they
// select in: at most kMaxRowSpans, each count >= 1 and start >= 0, ascending without
// overlapping (touching is fine), within the committed rows. INVALID_ARGUMENT / OUT_OF_RANGE
// naming `field`[i] (row_ranges or versus_row_ranges).
absl::Status CheckRowSpans(const std::vector<RowSpan>& spans, const DatasetRecord& rec,
                           absl::string_view field);

// The latents firing on the rows of `spans`: the rows a user picked (the documents labelled
// positive, a range of the token stream), "what does the SAE see there, and what is enriched
// there" (order by lift: against each latent's density over the whole dataset). The spans must
// ascend without overlapping, each count >= 1, within the committed rows of the dataset counted
// (options.in_dataset's when set: the rows are positions in the token stream both datasets
// share). INVALID_ARGUMENT naming row_ranges[i] for an empty, negative, out-of-order or
// overlapping span or for more than kMaxRowSpans of them, OUT_OF_RANGE naming it for one past the
// committed rows; otherwise errors as LatentsFiringWith.
absl::StatusOr<LatentsOnRows> LatentsInRowSpans(const ChunkStore& store, uint64_t id,
                                                const std::vector<RowSpan>& spans,
                                                const LatentsOnRowsOptions& options);

// The latents that tell the rows of `spans` from the rows of `versus` ("fires on 80% of my
// positive rows and 3% of the negatives": a sparse probe read off the store): both selections
// counted as LatentsInRowSpans counts one, each latent of `spans` with its count and mean on
// either, ranked as options.order says (kByDifference: by how much more often it fires on
// `spans`). Only latents found on `spans` are ranked, not those of `versus` alone: swap the two
// for that side.
// Errors as LatentsInRowSpans, `versus` named versus_row_ranges[i]; INVALID_ARGUMENT for an
// empty `versus`. kByDifference is refused by the other functions (they have no versus rows).
absl::StatusOr<LatentsOnRows> ContrastRowSpans(const ChunkStore& store, uint64_t id,
                                               const std::vector<RowSpan>& spans,
                                               const std::vector<RowSpan>& versus,
                                               const LatentsOnRowsOptions& options);

// The tokens a latent fires on most: at most this many asked for.
inline constexpr int32_t kMaxTokensOfLatent = 1000;

struct TokenOfLatent {
  int32_t token_id = 0;
  int64_t count = 0;  // firings of the latent on rows holding this token
  double mean = 0;    // their mean value
};

struct TokensOfLatent {
  int64_t firings = 0;                // the latent's committed firings, all counted
  std::vector<TokenOfLatent> tokens;  // count descending, ties by token id; the first `limit`
};

// Which tokens the latent fires on, over every firing: its rows from its latent-major runs, their
// token ids from the token parts of the chunks they lie in (2 B a row, never the values).
// INVALID_ARGUMENT for limit outside [1, kMaxTokensOfLatent] or a latent outside [0, width);
// otherwise errors as LatentsFiringWith.
absl::StatusOr<TokensOfLatent> TokensLatentFiresOn(const ChunkStore& store, uint64_t id,
                                                   int32_t latent, int32_t limit);

// Where in its sequences a latent fires: firings per position (the row's index within its
// sequence of context_length rows), in at most kMaxPositionBins bins of equal width. A latent
// that fires mostly at position 0 is a position (or attention-sink) latent, whatever its
// examples look like.
inline constexpr int32_t kMaxPositionBins = 128;

struct LatentPositions {
  int64_t firings = 0;          // the latent's committed firings, all counted
  int32_t context_length = 0;   // positions 0 .. context_length - 1
  int32_t bin_width = 1;        // positions per bin: ceil(context_length / kMaxPositionBins)
  std::vector<int64_t> counts;  // bin b: positions [b * bin_width, (b + 1) * bin_width)
};

// From the latent's latent-major runs alone. FAILED_PRECONDITION for a dataset without
// sequences (context_length 0); otherwise errors as LatentsFiringWith.
absl::StatusOr<LatentPositions> PositionsLatentFiresAt(const ChunkStore& store, uint64_t id,
                                                       int32_t latent);

// The token id of each of `rows` (ascending, committed: INVALID_ARGUMENT / OUT_OF_RANGE
// otherwise), reading each chunk's token ids from its first to its last listed row once: cheap
// for the firing rows of a latent, however rare or common.
absl::Status TokensOfRows(const ChunkStore& store, uint64_t id, const std::vector<int64_t>& rows,
                          std::vector<int32_t>* tokens);

// Both of the above from one read of the latent's firings (GetLatent asking for both, as every
// dashboard page does): tokens when token_limit > 0 (else absent; INVALID_ARGUMENT outside
// [0, kMaxTokensOfLatent]), positions when asked. Errors as the two.
struct LatentProfile {
  std::optional<TokensOfLatent> tokens;
  std::optional<LatentPositions> positions;
};
absl::StatusOr<LatentProfile> ProfileLatent(const ChunkStore& store, uint64_t id, int32_t latent,
                                            int32_t token_limit, bool positions);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_LATENTS_ON_ROWS_H_
