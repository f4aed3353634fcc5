#include "storage/latents_on_rows.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "storage/latent_stats.h"

namespace latentd::storage {
namespace {

// `versus`: whether there are versus rows, which kByDifference needs.
absl::Status CheckOptions(const LatentsOnRowsOptions& o, bool versus = false) {
  if (o.order == LatentsOnRowsOrder::kByDifference && !versus) {
    return absl::InvalidArgumentError(
        "order: by difference needs rows to contrast with (versus_row_ranges)");
  }
  if (o.limit < 1 || o.limit > kMaxLatentsOnRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: ", o.limit, " outside [1, ", kMaxLatentsOnRows, "]"));
  }
  if (o.max_rows < 1 || o.max_rows > kMaxRowsOnRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_rows: ", o.max_rows, " outside [1, ", kMaxRowsOnRows, "]"));
  }
  if (o.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads: ", o.threads, " is negative"));
  }
  if (o.min_count < 1) {
    return absl::InvalidArgumentError(absl::StrCat("min_count: ", o.min_count, " is below 1"));
  }
  return absl::OkStatus();
}

// The selection within one committed chunk [start, end): how many rows it holds, the first and
// the last of them (only [first, last] is read: a chunk's slices are (latent, row)-ordered, so
// every key is scanned, but values are decoded and rows assembled for that range alone).
struct ChunkPick {
  int64_t start = 0;
  int64_t end = 0;
  int64_t selected = 0;
  int64_t first = 0;
  int64_t last = -1;
  void Add(int64_t row) {
    if (selected++ == 0) first = row;
    last = row;
  }
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

// One chunk to read, and how many of its selected rows (its first ones) count.
struct ChunkRead {
  size_t chunk = 0;
  int64_t take = 0;
};

// Per-latent firing counts and value sums over the rows counted, and which latents were seen.
// The arrays come from calloc: the pages of a wide SAE's arrays that no firing touches are never
// written, and merging and ranking walk the latents seen, not the width.
class LatentTally {
 public:
  explicit LatentTally(int32_t width)
      : counts_(static_cast<int64_t*>(std::calloc(width, sizeof(int64_t)))),
        sums_(static_cast<double*>(std::calloc(width, sizeof(double)))) {}
  bool ok() const { return counts_ != nullptr && sums_ != nullptr; }
  void Add(int32_t latent, double value) {
    if (counts_.get()[latent]++ == 0) seen_.push_back(latent);
    sums_.get()[latent] += value;
  }
  void Merge(const LatentTally& other) {
    for (int32_t latent : other.seen_) {
      if (counts_.get()[latent] == 0) seen_.push_back(latent);
      counts_.get()[latent] += other.counts_.get()[latent];
      sums_.get()[latent] += other.sums_.get()[latent];
    }
  }
  const std::vector<int32_t>& seen() const { return seen_; }
  int64_t count(int32_t latent) const { return counts_.get()[latent]; }
  double sum(int32_t latent) const { return sums_.get()[latent]; }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<int64_t, Free> counts_;
  std::unique_ptr<double, Free> sums_;
  std::vector<int32_t> seen_;
};

// The latents of one selection's rows read, counted.
struct Counted {
  LatentTally tally;
  int64_t rows_selected = 0;  // rows the selection matched
  int64_t rows_read = 0;      // of them, counted
};

// Counts the latents of the selected rows: chunks in SpreadOrder until max_rows rows are counted
// (the last chunk's first ones), `rows_of(chunk, &rows)` giving a chunk's selected rows,
// ascending. Each chunk is read as a row set (ReadRowSet: values are decoded and rows assembled
// for the selected rows alone), on up to `threads` threads, each tallying its own share (chunk i
// of the plan on thread i % threads), merged in thread order.
template <typename RowsOf>
absl::StatusOr<Counted> Count(const ChunkStore& store, const DatasetRecord& rec,
                              const std::vector<ChunkPick>& chunks, const LatentsOnRowsOptions& o,
                              RowsOf rows_of) {
  const uint64_t id = rec.id;
  const int32_t width = rec.meta.width;
  int64_t rows_selected = 0, rows_read = 0;
  for (const ChunkPick& c : chunks) rows_selected += c.selected;
  std::vector<ChunkRead> plan;
  for (size_t c : SpreadOrder(chunks.size())) {
    if (rows_read >= o.max_rows) break;
    if (chunks[c].selected == 0) continue;
    plan.push_back({c, std::min(chunks[c].selected, o.max_rows - rows_read)});
    rows_read += plan.back().take;
  }
  // Each thread holds a tally as wide as the SAE (only its touched pages resident): at most
  // 64 MiB of them together.
  const int64_t tally_bytes = int64_t{16} * width;
  int threads = o.threads > 0 ? o.threads
                              : static_cast<int>(std::min(8u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(
      std::min<int64_t>({int64_t{std::max(threads, 1)}, static_cast<int64_t>(plan.size()),
                         std::max<int64_t>(1, (int64_t{64} << 20) / tally_bytes)}));
  threads = std::max(threads, 1);
  std::vector<LatentTally> tallies;
  for (int t = 0; t < threads; ++t) {
    tallies.emplace_back(width);
    if (!tallies.back().ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no memory for a tally of ", width, " latents (", tally_bytes, " bytes)"));
    }
  }
  std::vector<std::pair<size_t, absl::Status>> errors(threads, {plan.size(), absl::OkStatus()});
  auto work = [&](int t) {
    std::vector<int64_t> rows;
    std::vector<uint64_t> keep;
    for (size_t i = t; i < plan.size(); i += threads) {
      absl::Status s = rows_of(chunks[plan[i].chunk], &rows);
      if (s.ok() && static_cast<int64_t>(rows.size()) < plan[i].take) {
        s = absl::DataLossError(absl::StrCat("dataset ", id, ": the rows of chunk ",
                                             chunks[plan[i].chunk].start, " changed"));
      }
      if (!s.ok()) {
        errors[t] = {i, s};
        return;
      }
      rows.resize(plan[i].take);
      const int64_t first = rows.front(), span = rows.back() - first + 1;
      keep.assign((span + 63) / 64, 0);
      for (int64_t row : rows) keep[(row - first) >> 6] |= uint64_t{1} << ((row - first) & 63);
      absl::StatusOr<CsrRows> csr = store.ReadRowSet(id, first, span, keep);
      if (!csr.ok()) {
        errors[t] = {i, csr.status()};
        return;
      }
      for (int64_t row : rows) {
        const int64_t r = row - first;
        for (int64_t e = csr->indptr[r]; e < csr->indptr[r + 1]; ++e) {
          tallies[t].Add(csr->indices[e], csr->values[e]);
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& thread : pool) thread.join();
  // The error of the earliest chunk in the plan, whichever thread met it.
  const auto first_error = std::min_element(
      errors.begin(), errors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (!first_error->second.ok()) return first_error->second;
  for (int t = 1; t < threads; ++t) tallies[0].Merge(tallies[t]);
  return Counted{std::move(tallies[0]), rows_selected, rows_read};
}

// Ranks the latents counted (`exclude` left out, and those below min_count) in the order asked,
// the first `limit` of them, each with its lift, precision and F1; with `versus` (another
// selection's counts) each also with its count and mean there, and kByDifference ranking by the
// difference of the two firing fractions.
absl::StatusOr<LatentsOnRows> Rank(const ChunkStore& store, const DatasetRecord& rec,
                                   const Counted& counted, int32_t exclude,
                                   const LatentsOnRowsOptions& o, const Counted* versus) {
  const uint64_t id = rec.id;
  const int32_t width = rec.meta.width;
  const LatentTally& tally = counted.tally;
  LatentsOnRows out;
  out.rows_selected = counted.rows_selected;
  out.rows_read = counted.rows_read;
  if (versus != nullptr) {
    out.versus_selected = versus->rows_selected;
    out.versus_read = versus->rows_read;
  }
  std::vector<LatentOnRows> ranked;
  for (int32_t l : tally.seen()) {
    if (l == exclude || tally.count(l) < o.min_count) continue;
    LatentOnRows entry;
    entry.latent = l;
    entry.count = tally.count(l);
    entry.mean = tally.sum(l) / tally.count(l);
    if (versus != nullptr && versus->tally.count(l) > 0) {
      entry.versus_count = versus->tally.count(l);
      entry.versus_mean = versus->tally.sum(l) / entry.versus_count;
    }
    ranked.push_back(entry);
  }
  // Lift, precision and F1 need each latent's firing count over the whole dataset, from the
  // statistics the store keeps (never the rows). Ranked by count or difference, only the latents
  // returned need it: a point read each when they are fewer than the 64-latent statistics
  // blocks, else one scan of them all (ranked by lift or F1, always the scan).
  auto by_count = [](const LatentOnRows& a, const LatentOnRows& b) {
    return a.count != b.count ? a.count > b.count : a.latent < b.latent;
  };
  auto by_lift = [&](const LatentOnRows& a, const LatentOnRows& b) {
    return a.lift != b.lift ? a.lift > b.lift : by_count(a, b);
  };
  auto by_f1 = [&](const LatentOnRows& a, const LatentOnRows& b) {
    return a.f1 != b.f1 ? a.f1 > b.f1 : by_count(a, b);
  };
  auto difference = [&](const LatentOnRows& e) {
    return static_cast<double>(e.count) / out.rows_read -
           static_cast<double>(e.versus_count) / out.versus_read;
  };
  auto by_difference = [&](const LatentOnRows& a, const LatentOnRows& b) {
    const double da = difference(a), db = difference(b);
    return da != db ? da > db : by_count(a, b);
  };
  auto rank_first = [&](size_t n) {
    switch (o.order) {
      case LatentsOnRowsOrder::kByLift:
        std::partial_sort(ranked.begin(), ranked.begin() + n, ranked.end(), by_lift);
        break;
      case LatentsOnRowsOrder::kByDifference:
        std::partial_sort(ranked.begin(), ranked.begin() + n, ranked.end(), by_difference);
        break;
      case LatentsOnRowsOrder::kByF1:
        std::partial_sort(ranked.begin(), ranked.begin() + n, ranked.end(), by_f1);
        break;
      case LatentsOnRowsOrder::kByCount:
        std::partial_sort(ranked.begin(), ranked.begin() + n, ranked.end(), by_count);
        break;
    }
    ranked.resize(n);
  };
  const size_t n = std::min(ranked.size(), static_cast<size_t>(o.limit));
  auto set_density_figures = [&](LatentOnRows* entry, int64_t firing_count,
                                 int64_t rows_committed) {
    // The statistics are at a later snapshot than the rows read, so they count those rows.
    if (firing_count <= 0) return;
    const double fraction = static_cast<double>(entry->count) / out.rows_read;
    entry->lift = fraction / (static_cast<double>(firing_count) / rows_committed);
    entry->precision =
        std::min(1.0, fraction * static_cast<double>(out.rows_selected) / firing_count);
    entry->f1 = 2 * entry->precision * fraction / (entry->precision + fraction);
  };
  const bool needs_every_density =
      o.order == LatentsOnRowsOrder::kByLift || o.order == LatentsOnRowsOrder::kByF1;
  if (!needs_every_density && static_cast<int64_t>(n) * kLatentsPerBlock < width) {
    rank_first(n);
    std::vector<int64_t> firing_counts;
    for (const LatentOnRows& entry : ranked) {
      ASSIGN_OR_RETURN(const LatentStats stats, store.GetLatentStats(id, entry.latent));
      firing_counts.push_back(stats.firing_count);
    }
    // The rows committed when the last statistics were read, or later (a writer may be
    // appending): lift rounds down, never up, while the dataset grows (precision too: the
    // firing counts can only have grown since the rows were read).
    ASSIGN_OR_RETURN(const DatasetRecord now, store.GetRecord(id));
    for (size_t i = 0; i < ranked.size(); ++i) {
      set_density_figures(&ranked[i], firing_counts[i], now.rows_committed);
    }
  } else {
    std::vector<int64_t> firing_counts(width, 0);
    int64_t rows_committed = 0;
    RETURN_IF_ERROR(store.ForEachLatentStats(id, &rows_committed,
                                             [&](int32_t latent, const LatentStats& stats) {
                                               firing_counts[latent] = stats.firing_count;
                                             }));
    for (LatentOnRows& entry : ranked) {
      set_density_figures(&entry, firing_counts[entry.latent], rows_committed);
    }
    rank_first(n);
  }
  out.latents = std::move(ranked);
  return out;
}

// Counts and ranks the latents of one selection (Count, then Rank without versus rows).
template <typename RowsOf>
absl::StatusOr<LatentsOnRows> Tally(const ChunkStore& store, const DatasetRecord& rec,
                                    const std::vector<ChunkPick>& chunks, int32_t exclude,
                                    const LatentsOnRowsOptions& o, RowsOf rows_of) {
  ASSIGN_OR_RETURN(const Counted counted, Count(store, rec, chunks, o, rows_of));
  return Rank(store, rec, counted, exclude, o, /*versus=*/nullptr);
}

// The record of the dataset whose latents are counted: options.in_dataset's when it names
// another one that holds the same rows as `selecting`, else `selecting` itself.
absl::StatusOr<DatasetRecord> CountedRecord(const ChunkStore& store, const DatasetRecord& selecting,
                                            const LatentsOnRowsOptions& options) {
  if (options.in_dataset == 0 || options.in_dataset == selecting.id) return selecting;
  ASSIGN_OR_RETURN(DatasetRecord other, store.GetSparseRecord(options.in_dataset));
  const DatasetMeta &a = selecting.meta, &b = other.meta;
  if (a.token_source != b.token_source || a.token_order_start != b.token_order_start ||
      a.context_length != b.context_length) {
    return absl::FailedPreconditionError(
        absl::StrCat("in_dataset: dataset ", other.id, " holds other rows than dataset ",
                     selecting.id, " (tokens ", b.token_source, " from row ", b.token_order_start,
                     ", not ", a.token_source, " from row ", a.token_order_start, ")"));
  }
  return other;
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

// What the per-latent questions start from: the dataset's record and every firing of the latent
// committed by it, rows ascending. Firings committed after the record was read (the postings are
// read at a later snapshot) are left out, so every answer is about one prefix of the rows.
struct LatentRows {
  DatasetRecord rec;
  std::vector<int64_t> rows;
  std::vector<float> values;
};

absl::StatusOr<LatentRows> ReadLatentRows(const ChunkStore& store, uint64_t id, int32_t latent) {
  LatentRows out;
  ASSIGN_OR_RETURN(out.rec, store.GetSparseRecord(id));
  RETURN_IF_ERROR(store.LatentPostings(id, latent, &out.rows, &out.values));
  const size_t committed =
      std::lower_bound(out.rows.begin(), out.rows.end(), out.rec.rows_committed) - out.rows.begin();
  out.rows.resize(committed);
  out.values.resize(committed);
  return out;
}

// Adds each of `rows` (ascending, committed) to the chunk holding it.
void AddRows(const std::vector<int64_t>& rows, std::vector<ChunkPick>* chunks) {
  size_t chunk = 0;
  for (int64_t row : rows) {
    while ((*chunks)[chunk].end <= row) ++chunk;  // rows ascend; the chunks tile them
    (*chunks)[chunk].Add(row);
  }
}

}  // namespace

absl::StatusOr<LatentsOnRows> LatentsFiringWith(const ChunkStore& store, uint64_t id,
                                                int32_t latent,
                                                const LatentsOnRowsOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(LatentRows firings, ReadLatentRows(store, id, latent));
  ASSIGN_OR_RETURN(const DatasetRecord counted, CountedRecord(store, firings.rec, options));
  std::vector<int64_t>& rows = firings.rows;
  rows.resize(std::lower_bound(rows.begin(), rows.end(), counted.rows_committed) - rows.begin());
  ASSIGN_OR_RETURN(std::vector<ChunkPick> chunks, Chunks(store, counted));
  AddRows(rows, &chunks);
  const int32_t exclude = counted.id == id ? latent : -1;
  return Tally(store, counted, chunks, exclude, options,
               [&](const ChunkPick& c, std::vector<int64_t>* selected) {
                 selected->assign(std::lower_bound(rows.begin(), rows.end(), c.start),
                                  std::lower_bound(rows.begin(), rows.end(), c.end));
                 return absl::OkStatus();
               });
}

absl::StatusOr<LatentsOnRows> LatentsFiringOnToken(const ChunkStore& store, uint64_t id,
                                                   int32_t token_id,
                                                   const LatentsOnRowsOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(const DatasetRecord selecting, store.GetSparseRecord(id));
  // The rows holding the token are the same in a dataset of the same rows: select and count
  // there.
  ASSIGN_OR_RETURN(const DatasetRecord rec, CountedRecord(store, selecting, options));
  id = rec.id;
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
      chunks[chunk].Add(start + r);
    }
  }
  // A chunk's rows of the token, from its token ids again (cheap) rather than kept for every
  // chunk while scanning.
  return Tally(store, rec, chunks, /*exclude=*/-1, options,
               [&](const ChunkPick& c, std::vector<int64_t>* selected) -> absl::Status {
                 std::vector<int32_t> ids;
                 RETURN_IF_ERROR(store.ReadTokens(id, c.first, c.last - c.first + 1, &ids));
                 selected->clear();
                 for (size_t r = 0; r < ids.size(); ++r) {
                   if (ids[r] == token_id) selected->push_back(c.first + static_cast<int64_t>(r));
                 }
                 return absl::OkStatus();
               });
}

namespace {

// Calls fn(lo, hi) for each part [lo, hi) of `spans` (ascending, not overlapping) within chunk
// c's rows, ascending.
template <typename Fn>
void ForSpansIn(const std::vector<RowSpan>& spans, const ChunkPick& c, Fn fn) {
  const auto ends_after_start = [](int64_t row, const RowSpan& s) {
    return row < s.start + s.count;
  };
  for (auto s = std::upper_bound(spans.begin(), spans.end(), c.start, ends_after_start);
       s != spans.end() && s->start < c.end; ++s) {
    fn(std::max(s->start, c.start), std::min(s->start + s->count, c.end));
  }
}

// The record of the dataset row spans select in: options.in_dataset's when set (the spans are
// positions in the token stream both datasets share), else id's.
absl::StatusOr<DatasetRecord> SpansRecord(const ChunkStore& store, uint64_t id,
                                          const LatentsOnRowsOptions& options) {
  ASSIGN_OR_RETURN(const DatasetRecord selecting, store.GetSparseRecord(id));
  return CountedRecord(store, selecting, options);
}

// The latents of the rows of `spans` (checked), counted; `chunks` are the dataset's committed
// chunks with nothing selected (Chunks), read once for every set counted.
absl::StatusOr<Counted> CountSpans(const ChunkStore& store, const DatasetRecord& rec,
                                   std::vector<ChunkPick> chunks, const std::vector<RowSpan>& spans,
                                   const LatentsOnRowsOptions& options) {
  for (ChunkPick& c : chunks) {
    ForSpansIn(spans, c, [&c](int64_t lo, int64_t hi) {
      if (c.selected == 0) c.first = lo;
      c.selected += hi - lo;
      c.last = hi - 1;
    });
  }
  return Count(store, rec, chunks, options,
               [&](const ChunkPick& c, std::vector<int64_t>* selected) {
                 selected->clear();
                 ForSpansIn(spans, c, [selected](int64_t lo, int64_t hi) {
                   for (int64_t row = lo; row < hi; ++row) selected->push_back(row);
                 });
                 return absl::OkStatus();
               });
}

}  // namespace

absl::Status CheckRowSpans(const std::vector<RowSpan>& spans, const DatasetRecord& rec,
                           absl::string_view field) {
  if (static_cast<int64_t>(spans.size()) > kMaxRowSpans) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", spans.size(), " ranges, more than ", kMaxRowSpans));
  }
  int64_t previous_end = 0;  // every span before is within the committed rows, so no overflow
  for (size_t i = 0; i < spans.size(); ++i) {
    const RowSpan& s = spans[i];
    if (s.count < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: count ", s.count, " is below 1"));
    }
    if (s.start < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: start ", s.start, " is negative"));
    }
    if (i > 0 && s.start < previous_end) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: starts at row ", s.start, ", before ", field, "[", i - 1,
                       "] ends (row ", previous_end, "): ranges must ascend without overlapping"));
    }
    if (s.count > rec.rows_committed - s.start) {
      return absl::OutOfRangeError(absl::StrCat(field, "[", i, "]: rows [", s.start, ", ", s.start,
                                                " + ", s.count, ") pass the ", rec.rows_committed,
                                                " committed rows of dataset ", rec.id));
    }
    previous_end = s.start + s.count;
  }
  return absl::OkStatus();
}

absl::StatusOr<LatentsOnRows> LatentsInRowSpans(const ChunkStore& store, uint64_t id,
                                                const std::vector<RowSpan>& spans,
                                                const LatentsOnRowsOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(const DatasetRecord rec, SpansRecord(store, id, options));
  RETURN_IF_ERROR(CheckRowSpans(spans, rec, "row_ranges"));
  ASSIGN_OR_RETURN(std::vector<ChunkPick> chunks, Chunks(store, rec));
  ASSIGN_OR_RETURN(const Counted counted,
                   CountSpans(store, rec, std::move(chunks), spans, options));
  return Rank(store, rec, counted, /*exclude=*/-1, options, /*versus=*/nullptr);
}

absl::StatusOr<LatentsOnRows> ContrastRowSpans(const ChunkStore& store, uint64_t id,
                                               const std::vector<RowSpan>& spans,
                                               const std::vector<RowSpan>& versus,
                                               const LatentsOnRowsOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options, /*versus=*/true));
  ASSIGN_OR_RETURN(const DatasetRecord rec, SpansRecord(store, id, options));
  RETURN_IF_ERROR(CheckRowSpans(spans, rec, "row_ranges"));
  RETURN_IF_ERROR(CheckRowSpans(versus, rec, "versus_row_ranges"));
  if (versus.empty()) {
    return absl::InvalidArgumentError("versus_row_ranges: no rows to contrast with");
  }
  ASSIGN_OR_RETURN(const std::vector<ChunkPick> chunks, Chunks(store, rec));
  ASSIGN_OR_RETURN(const Counted counted, CountSpans(store, rec, chunks, spans, options));
  ASSIGN_OR_RETURN(const Counted against, CountSpans(store, rec, chunks, versus, options));
  return Rank(store, rec, counted, /*exclude=*/-1, options, &against);
}

namespace {

absl::Status CheckTokenLimit(int32_t limit) {
  if (limit < 1 || limit > kMaxTokensOfLatent) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_tokens: ", limit, " outside [1, ", kMaxTokensOfLatent, "]"));
  }
  return absl::OkStatus();
}

// TokensOfRows of a record already read.
absl::Status TokensOfRowsIn(const ChunkStore& store, const DatasetRecord& rec,
                            const std::vector<int64_t>& rows, std::vector<int32_t>* tokens) {
  ASSIGN_OR_RETURN(std::vector<ChunkPick> chunks, Chunks(store, rec));
  AddRows(rows, &chunks);
  // Each chunk's span from its first to its last listed row, read once; the chunks' rows are
  // consecutive in `rows`.
  tokens->resize(rows.size());
  std::vector<int32_t> span;
  size_t i = 0;
  for (const ChunkPick& c : chunks) {
    if (c.selected == 0) continue;
    RETURN_IF_ERROR(store.ReadTokens(rec.id, c.first, c.last - c.first + 1, &span));
    for (const size_t end = i + c.selected; i < end; ++i) (*tokens)[i] = span[rows[i] - c.first];
  }
  return absl::OkStatus();
}

// TokensLatentFiresOn over firings already read.
absl::StatusOr<TokensOfLatent> TokensOf(const ChunkStore& store, const LatentRows& firings,
                                        int32_t limit) {
  const std::vector<int64_t>& rows = firings.rows;
  std::vector<int32_t> tokens;
  RETURN_IF_ERROR(TokensOfRowsIn(store, firings.rec, rows, &tokens));
  // Per token: firings and value sum.
  std::map<int32_t, std::pair<int64_t, double>> by_token;
  for (size_t i = 0; i < rows.size(); ++i) {
    auto& [count, sum] = by_token[tokens[i]];
    ++count;
    sum += firings.values[i];
  }
  TokensOfLatent out;
  out.firings = static_cast<int64_t>(rows.size());
  for (const auto& [token, tally] : by_token) {
    out.tokens.push_back({token, tally.first, tally.second / tally.first});
  }
  const size_t n = std::min(out.tokens.size(), static_cast<size_t>(limit));
  std::partial_sort(out.tokens.begin(), out.tokens.begin() + n, out.tokens.end(),
                    [](const TokenOfLatent& a, const TokenOfLatent& b) {
                      return a.count != b.count ? a.count > b.count : a.token_id < b.token_id;
                    });
  out.tokens.resize(n);
  return out;
}

// PositionsLatentFiresAt over firings already read.
absl::StatusOr<LatentPositions> PositionsOf(uint64_t id, const LatentRows& firings) {
  if (firings.rec.meta.context_length <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", id, " has no sequences (context_length 0): no positions"));
  }
  LatentPositions out;
  out.context_length = firings.rec.meta.context_length;
  out.bin_width = (out.context_length + kMaxPositionBins - 1) / kMaxPositionBins;
  out.counts.assign((out.context_length + out.bin_width - 1) / out.bin_width, 0);
  for (int64_t row : firings.rows) {
    ++out.counts[row % out.context_length / out.bin_width];
  }
  out.firings = static_cast<int64_t>(firings.rows.size());
  return out;
}

}  // namespace

absl::StatusOr<TokensOfLatent> TokensLatentFiresOn(const ChunkStore& store, uint64_t id,
                                                   int32_t latent, int32_t limit) {
  RETURN_IF_ERROR(CheckTokenLimit(limit));
  ASSIGN_OR_RETURN(const LatentRows firings, ReadLatentRows(store, id, latent));
  return TokensOf(store, firings, limit);
}

absl::StatusOr<LatentPositions> PositionsLatentFiresAt(const ChunkStore& store, uint64_t id,
                                                       int32_t latent) {
  ASSIGN_OR_RETURN(const LatentRows firings, ReadLatentRows(store, id, latent));
  return PositionsOf(id, firings);
}

absl::Status TokensOfRows(const ChunkStore& store, uint64_t id, const std::vector<int64_t>& rows,
                          std::vector<int32_t>* tokens) {
  ASSIGN_OR_RETURN(const DatasetRecord rec, store.GetSparseRecord(id));
  if (!std::is_sorted(rows.begin(), rows.end())) {
    return absl::InvalidArgumentError("rows: not ascending");
  }
  if (!rows.empty() && (rows.front() < 0 || rows.back() >= rec.rows_committed)) {
    return absl::OutOfRangeError(
        absl::StrCat("rows: ", rows.front() < 0 ? rows.front() : rows.back(), " is outside the ",
                     rec.rows_committed, " committed rows of dataset ", id));
  }
  return TokensOfRowsIn(store, rec, rows, tokens);
}

absl::StatusOr<LatentProfile> ProfileLatent(const ChunkStore& store, uint64_t id, int32_t latent,
                                            int32_t token_limit, bool positions) {
  if (token_limit != 0) RETURN_IF_ERROR(CheckTokenLimit(token_limit));
  LatentProfile out;
  if (token_limit == 0 && !positions) return out;
  ASSIGN_OR_RETURN(const LatentRows firings, ReadLatentRows(store, id, latent));
  if (positions) {
    ASSIGN_OR_RETURN(out.positions, PositionsOf(id, firings));
  }
  if (token_limit != 0) {
    ASSIGN_OR_RETURN(out.tokens, TokensOf(store, firings, token_limit));
  }
  return out;
}

}  // namespace latentd::storage
