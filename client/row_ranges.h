// Rows named on latentctl's command line for LatentsOnRows (`latentctl onrows`): items "ROW" or
// "START:COUNT", in any order, separated by commas or whitespace, overlapping or repeated as they
// come (rows picked by hand, or written by numpy.savetxt); with --sequences the same items name
// whole sequences (the documents a user labelled), each context_length rows.
#ifndef LATENTD_CLIENT_ROW_RANGES_H_
#define LATENTD_CLIENT_ROW_RANGES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace latentd::client {

// Rows [start, start + count).
struct RowRange {
  int64_t start = 0;
  int64_t count = 0;
};

// The rows of `text` as ascending ranges that neither overlap nor touch (the form LatentsOnRows
// takes). INVALID_ARGUMENT quoting the item for one that is neither form, a negative row or
// start, a count below 1, or a range past the largest row (2^63 - 1). Empty text: no ranges.
absl::StatusOr<std::vector<RowRange>> ParseRowRanges(absl::string_view text);

// The rows of the sequences in `sequences` (ranges of sequence indices, as ParseRowRanges gives
// them), sequence s being rows [s * context_length, (s + 1) * context_length). Ascending,
// non-touching ranges stay so. INVALID_ARGUMENT for context_length below 1 (a dataset without
// sequences) or for a sequence whose rows would pass the largest row (2^63 - 1).
absl::StatusOr<std::vector<RowRange>> RowsOfSequences(const std::vector<RowRange>& sequences,
                                                      int64_t context_length);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_ROW_RANGES_H_
