#include "storage/latents_on_rows.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::storage {
namespace {

absl::Status CheckOptions(const LatentsOnRowsOptions& o) {
  if (o.limit < 1 || o.limit > kMaxLatentsOnRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: ", o.limit, " outside [1, ", kMaxLatentsOnRows, "]"));
  }
  if (o.max_rows < 1 || o.max_rows > kMaxRowsOnRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_rows: ", o.max_rows, " outside [1, ", kMaxRowsOnRows, "]"));
  }
  if (o.min_count < 1) {
    return absl::InvalidArgumentError(absl::StrCat("min_count: ", o.min_count, " is below 1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DatasetRecord> SparseRecord(const ChunkStore& store, uint64_t id) {
  ASSIGN_OR_RETURN(DatasetRecord rec, store.GetRecord(id));
  if (rec.meta.kind != DatasetKind::kSparse) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", id, " is DENSE: it has no latents"));
  }
  return rec;
}

// The selection within one committed chunk [start, end): how many rows it holds, and which.
struct ChunkPick {
  int64_t start = 0;
  int64_t end = 0;
  int64_t selected = 0;
};

// 0 .. n - 1 in an order whose every prefix is spread over the whole range (bit-reversed
// indices), so that the chunks read before the row budget runs out sample the whole dataset.
std::vector<size_t> SpreadOrder(size_t n) {
  int bits = 0;
  while ((size_t{1} << bits) < n) ++bits;
  std::vector<size_t> order;
  order.reserve(n);
  for (size_t i = 0; i < (size_t{1} << bits); ++i) {
    size_t r = 0;
    for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
    if (r < n) order.push_back(r);
  }
  return order;
}

// Counts and ranks the latents of the selected rows: chunks in SpreadOrder until max_rows rows
// are read (the last chunk's first ones), `is_selected(row, token)` telling which rows of a chunk
// count; `exclude` is left out.
template <typename IsSelected>
absl::StatusOr<LatentsOnRows> Tally(const ChunkStore& store, const DatasetRecord& rec,
                                    const std::vector<ChunkPick>& chunks, int32_t exclude,
                                    const LatentsOnRowsOptions& o, IsSelected is_selected) {
  const uint64_t id = rec.id;
  const int32_t width = rec.meta.width;
  LatentsOnRows out;
  for (const ChunkPick& c : chunks) out.rows_selected += c.selected;
  std::vector<int64_t> counts(width, 0);
  std::vector<double> sums(width, 0.0);
  for (size_t c : SpreadOrder(chunks.size())) {
    if (out.rows_read >= o.max_rows) break;
    if (chunks[c].selected == 0) continue;
    ASSIGN_OR_RETURN(const CsrRows csr,
                     store.ReadRows(id, chunks[c].start, chunks[c].end - chunks[c].start));
    for (int64_t r = 0; r < csr.num_rows && out.rows_read < o.max_rows; ++r) {
      if (!is_selected(csr.row_start + r, csr.token_ids[r])) continue;
      ++out.rows_read;
      for (int64_t e = csr.indptr[r]; e < csr.indptr[r + 1]; ++e) {
        ++counts[csr.indices[e]];
        sums[csr.indices[e]] += csr.values[e];
      }
    }
  }
  // Densities over the whole dataset, from the statistics it keeps (never the rows).
  std::vector<int64_t> firing_counts(width, 0);
  int64_t rows_committed = 0;
  RETURN_IF_ERROR(
      store.ForEachLatentStats(id, &rows_committed, [&](int32_t latent, const LatentStats& stats) {
        firing_counts[latent] = stats.firing_count;
      }));
  std::vector<LatentOnRows> ranked;
  for (int32_t l = 0; l < width; ++l) {
    if (l == exclude || counts[l] < o.min_count) continue;
    LatentOnRows entry;
    entry.latent = l;
    entry.count = counts[l];
    entry.mean = sums[l] / counts[l];
    // The statistics are at a later snapshot than the rows read, so they count those rows.
    if (firing_counts[l] > 0) {
      entry.lift = (static_cast<double>(counts[l]) / out.rows_read) /
                   (static_cast<double>(firing_counts[l]) / rows_committed);
    }
    ranked.push_back(entry);
  }
  auto by_count = [](const LatentOnRows& a, const LatentOnRows& b) {
    return a.count != b.count ? a.count > b.count : a.latent < b.latent;
  };
  auto by_lift = [&](const LatentOnRows& a, const LatentOnRows& b) {
    return a.lift != b.lift ? a.lift > b.lift : by_count(a, b);
  };
  const size_t n = std::min(ranked.size(), static_cast<size_t>(o.limit));
  if (o.order == LatentsOnRowsOrder::kByLift) {
    std::partial_sort(ranked.begin(), ranked.begin() + n, ranked.end(), by_lift);
  } else {
    std::partial_sort(ranked.begin(), ranked.begin() + n, ranked.end(), by_count);
  }
  ranked.resize(n);
  out.latents = std::move(ranked);
  return out;
}

// The committed chunks of the dataset, as picks with nothing selected yet.
absl::StatusOr<std::vector<ChunkPick>> Chunks(const ChunkStore& store, const DatasetRecord& rec) {
  ASSIGN_OR_RETURN(const std::vector<int64_t> starts, store.ChunkRowStarts(rec.id));
  std::vector<ChunkPick> chunks(starts.size());
  for (size_t i = 0; i < starts.size(); ++i) {
    chunks[i].start = starts[i];
    chunks[i].end = i + 1 < starts.size() ? starts[i + 1] : rec.rows_committed;
  }
  return chunks;
}

}  // namespace

absl::StatusOr<LatentsOnRows> LatentsFiringWith(const ChunkStore& store, uint64_t id,
                                                int32_t latent,
                                                const LatentsOnRowsOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(const DatasetRecord rec, SparseRecord(store, id));
  std::vector<int64_t> rows;
  std::vector<float> values;
  RETURN_IF_ERROR(store.LatentPostings(id, latent, &rows, &values));
  // Rows past the record's watermark (committed since it was read) are left out.
  rows.erase(std::lower_bound(rows.begin(), rows.end(), rec.rows_committed), rows.end());
  ASSIGN_OR_RETURN(std::vector<ChunkPick> chunks, Chunks(store, rec));
  for (ChunkPick& c : chunks) {
    c.selected = std::lower_bound(rows.begin(), rows.end(), c.end) -
                 std::lower_bound(rows.begin(), rows.end(), c.start);
  }
  return Tally(store, rec, chunks, latent, options, [&](int64_t row, int32_t) {
    return std::binary_search(rows.begin(), rows.end(), row);
  });
}

absl::StatusOr<LatentsOnRows> LatentsFiringOnToken(const ChunkStore& store, uint64_t id,
                                                   int32_t token_id,
                                                   const LatentsOnRowsOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(const DatasetRecord rec, SparseRecord(store, id));
  ASSIGN_OR_RETURN(std::vector<ChunkPick> chunks, Chunks(store, rec));
  // How many rows of each chunk hold the token, from the token-id parts alone; the chunks read
  // afterwards carry their token ids again, so no row list is kept.
  constexpr int64_t kBlockRows = 65536;
  std::vector<int32_t> tokens;
  size_t chunk = 0;
  for (int64_t start = 0; start < rec.rows_committed; start += kBlockRows) {
    const int64_t count = std::min(kBlockRows, rec.rows_committed - start);
    RETURN_IF_ERROR(store.ReadTokens(id, start, count, &tokens));
    for (int64_t r = 0; r < count; ++r) {
      if (tokens[r] != token_id) continue;
      while (chunks[chunk].end <= start + r) ++chunk;  // rows ascend; the chunks tile them
      ++chunks[chunk].selected;
    }
  }
  return Tally(store, rec, chunks, /*exclude=*/-1, options,
               [&](int64_t, int32_t token) { return token == token_id; });
}

}  // namespace latentd::storage
