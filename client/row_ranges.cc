#include "client/row_ranges.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace latentd::client {

absl::StatusOr<std::vector<RowRange>> ParseRowRanges(absl::string_view text) {
  std::vector<RowRange> ranges;
  for (absl::string_view item :
       absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"), absl::SkipWhitespace())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(item, absl::MaxSplits(':', 1));
    RowRange range{0, 1};
    if (!absl::SimpleAtoi(parts[0], &range.start) ||
        (parts.size() == 2 && !absl::SimpleAtoi(parts[1], &range.count))) {
      return absl::InvalidArgumentError(absl::StrCat("'", item, "' is not a row or START:COUNT"));
    }
    if (range.start < 0 || range.count < 1 ||
        range.count > std::numeric_limits<int64_t>::max() - range.start) {
      return absl::InvalidArgumentError(absl::StrCat("'", item, "': ",
                                                     range.start < 0 ? "a row is never negative"
                                                     : range.count < 1
                                                         ? "the count must be at least 1"
                                                         : "the range passes the largest row"));
    }
    ranges.push_back(range);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const RowRange& a, const RowRange& b) { return a.start < b.start; });
  std::vector<RowRange> merged;
  for (const RowRange& range : ranges) {
    if (!merged.empty() && range.start <= merged.back().start + merged.back().count) {
      RowRange& last = merged.back();
      last.count = std::max(last.count, range.start + range.count - last.start);
    } else {
      merged.push_back(range);
    }
  }
  return merged;
}

absl::StatusOr<std::vector<RowRange>> RowsOfSequences(const std::vector<RowRange>& sequences,
                                                      int64_t context_length) {
  if (context_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("context_length ", context_length, ": the dataset has no sequences"));
  }
  constexpr int64_t kLargest = std::numeric_limits<int64_t>::max();
  std::vector<RowRange> rows;
  for (const RowRange& range : sequences) {
    // The end (start + count) * context_length must fit, so every product below it does.
    if (range.start + range.count > kLargest / context_length) {
      return absl::InvalidArgumentError(absl::StrCat("sequences ", range.start, ":", range.count,
                                                     " of ", context_length,
                                                     " rows each pass the largest row"));
    }
    rows.push_back({range.start * context_length, range.count * context_length});
  }
  return rows;
}

}  // namespace latentd::client
