#include "engine/latent_scaling.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/sae.h"
#include "engine/torch_status.h"

namespace latentd::engine {
namespace {

// Rows a read spans at most: the sampled rows of a latent lie scattered over the dataset, and one
// read per row would decode a chunk per row.
constexpr int64_t kWindowRows = 4096;

struct Pair {
  int64_t row = 0;
  int32_t slot = 0;  // the latent's place in the answer
  float value = 0;
};

// The sums beta is a ratio of, per latent: sum f^2 and sum f (d . y) for the four targets.
struct Sums {
  double f2 = 0;
  double error_source = 0, error_baseline = 0;
  double reconstruction_source = 0, reconstruction_baseline = 0;
};

absl::Status CheckRange(const char* field, int64_t value, int64_t max) {
  if (value < 0 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value, " outside [0, ", max, "] (0: the default)"));
  }
  return absl::OkStatus();
}

double Ratio(double baseline, double source) {
  return source == 0 ? std::numeric_limits<double>::quiet_NaN() : baseline / source;
}

// `count` indices evenly spread over [0, total): every one when count >= total.
std::vector<int64_t> Spread(int64_t total, int64_t count) {
  std::vector<int64_t> out;
  if (count >= total) {
    out.resize(total);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  out.reserve(count);
  for (int64_t i = 0; i < count; ++i) out.push_back(i * total / count);
  return out;
}

class Fit {
 public:
  Fit(const Sae& crosscoder, const CrosscoderDatasetRows& rows) : sae_(crosscoder), rows_(rows) {}

  absl::StatusOr<LatentScalingResult> Run(const LatentScalingQuery& query,
                                          const std::function<bool()>& cancelled) {
    RETURN_IF_ERROR(Resolve(query));
    RETURN_IF_ERROR(ChooseLatents(query));
    RETURN_IF_ERROR(CheckWork(query));
    // Slots go in groups whose projections fit the budget, each group's pairs in row order: a
    // group's windows read its rows once.
    const int64_t budget =
        query.projection_bytes > 0 ? query.projection_bytes : kDefaultProjectionBytes;
    const size_t group =
        static_cast<size_t>(std::max<int64_t>(1, budget / (8 * sae_.config().d_sae)));
    std::sort(pairs_.begin(), pairs_.end(), [&](const Pair& a, const Pair& b) {
      const size_t ga = a.slot / group, gb = b.slot / group;
      return ga != gb ? ga < gb : a.row < b.row;
    });
    RETURN_IF_ERROR(CheckSourceRows());
    sums_.assign(result_.latents.size(), Sums());
    for (size_t begin = 0; begin < pairs_.size();) {
      if (cancelled && cancelled()) return absl::CancelledError("latent scaling cancelled");
      const size_t g = pairs_[begin].slot / group;
      if (begin == 0 || pairs_[begin - 1].slot / group != g) {
        Project(g * group, std::min(result_.latents.size(), (g + 1) * group));
      }
      size_t end = begin;
      while (end < pairs_.size() && pairs_[end].slot / group == g &&
             pairs_[end].row < pairs_[begin].row + kWindowRows) {
        ++end;
      }
      RETURN_IF_ERROR(Window(begin, end));
      begin = end;
    }
    for (size_t i = 0; i < result_.latents.size(); ++i) {
      LatentScale& out = result_.latents[i];
      const Sums& s = sums_[i];
      const double scale = dd_[i] * s.f2;
      if (scale > 0) {
        out.beta_error_source = s.error_source / scale;
        out.beta_error_baseline = s.error_baseline / scale;
        out.beta_reconstruction_source = s.reconstruction_source / scale;
        out.beta_reconstruction_baseline = s.reconstruction_baseline / scale;
      }
      out.error_ratio = Ratio(out.beta_error_baseline, out.beta_error_source);
      out.reconstruction_ratio =
          Ratio(out.beta_reconstruction_baseline, out.beta_reconstruction_source);
    }
    return std::move(result_);
  }

 private:
  absl::Status Resolve(const LatentScalingQuery& query) {
    const SaeConfig& cfg = sae_.config();
    const int n = cfg.crosscoder_sources;
    if (n < 2) {
      return absl::FailedPreconditionError(
          "latent scaling compares a crosscoder's sources; this SAE is not a crosscoder");
    }
    const int source = query.source.value_or(n - 1);
    if (source < 0 || source >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("source: ", source, " outside [0, ", n, ") (the crosscoder's sources)"));
    }
    const int baseline = query.baseline.value_or(source == 0 ? 1 : 0);
    if (baseline < 0 || baseline >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("baseline: ", baseline, " outside [0, ", n, ") (the crosscoder's sources)"));
    }
    if (baseline == source) {
      return absl::InvalidArgumentError(absl::StrCat(
          "baseline: ", baseline, " is the source; the fit compares the source with another"));
    }
    RETURN_IF_ERROR(CheckRange("max_rows", query.max_rows, kMaxScalingRows));
    RETURN_IF_ERROR(CheckRange("limit", query.limit, kMaxScalingLatents));
    if (query.min_share && !(*query.min_share >= 0 && *query.min_share <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("min_share: ", *query.min_share, " outside [0, 1]"));
    }
    if (static_cast<int64_t>(query.latents.size()) > kMaxScalingLatents) {
      return absl::InvalidArgumentError(
          absl::StrCat("latents: ", query.latents.size(), " named, at most ", kMaxScalingLatents));
    }
    for (int s : {source, baseline}) {
      if (static_cast<int>(rows_.sources.size()) <= s || rows_.sources[s] == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("the rows of the crosscoder's source ", s, " are not known"));
      }
    }
    result_.source = source;
    result_.baseline = baseline;
    d_ = cfg.d_in / n;
    const at::Tensor& W_dec = sae_.weights().W_dec;
    const at::Tensor& b_dec = sae_.weights().b_dec;
    auto block = [&](const at::Tensor& t, int s) {
      return t.slice(-1, s * d_, (s + 1) * d_).contiguous();
    };
    W_source_ = block(W_dec, source);
    W_baseline_ = block(W_dec, baseline);
    if (b_dec.defined()) {
      b_source_ = block(b_dec, source);
      b_baseline_ = block(b_dec, baseline);
    }
    at::Tensor norms = W_dec.view({cfg.d_sae, n, d_}).norm(2, 2);  // [d_sae, n]
    if (static_cast<int>(cfg.crosscoder_scales.size()) == n) {
      norms = norms * at::tensor(cfg.crosscoder_scales, at::kDouble).to(at::kFloat);
    }
    const at::Tensor total = norms.sum(1);
    shares_ = at::where(total > 0, norms.select(1, source) / total.clamp_min(1e-30),
                        at::zeros_like(total))
                  .to(at::kDouble)
                  .contiguous();
    max_rows_ = query.max_rows == 0 ? kDefaultScalingRows : query.max_rows;
    return absl::OkStatus();
  }

  // Adds latent j to the answer with its sampled rows; nothing when it never fired and
  // `skip_silent`.
  absl::Status AddLatent(int64_t j, bool skip_silent) {
    std::vector<int64_t> rows;
    std::vector<float> values;
    RETURN_IF_ERROR(rows_.postings(static_cast<int32_t>(j), &rows, &values));
    if (rows.empty() && skip_silent) return absl::OkStatus();
    const int32_t slot = static_cast<int32_t>(result_.latents.size());
    LatentScale& out = result_.latents.emplace_back();
    out.latent = j;
    out.firing_count = static_cast<int64_t>(rows.size());
    out.share = shares_.data_ptr<double>()[j];
    for (int64_t i : Spread(out.firing_count, max_rows_))
      pairs_.push_back({rows[i], slot, values[i]});
    out.rows = std::min(out.firing_count, max_rows_);
    return absl::OkStatus();
  }

  absl::Status ChooseLatents(const LatentScalingQuery& query) {
    const int64_t d_sae = sae_.config().d_sae;
    if (!query.latents.empty()) {
      std::unordered_set<int64_t> seen;
      for (size_t i = 0; i < query.latents.size(); ++i) {
        const int64_t j = query.latents[i];
        if (j < 0 || j >= d_sae) {
          return absl::InvalidArgumentError(
              absl::StrCat("latents[", i, "]: ", j, " outside [0, ", d_sae, ")"));
        }
        if (!seen.insert(j).second) {
          return absl::InvalidArgumentError(absl::StrCat("latents[", i, "]: ", j, " named twice"));
        }
      }
      for (int64_t j : query.latents) RETURN_IF_ERROR(AddLatent(j, false));
    } else {
      // The default limit stays within the projections' bound (a wide crosscoder of wide models
      // fits fewer than 100); a limit asked is checked against it (CheckWork).
      const int64_t limit =
          query.limit != 0
              ? query.limit
              : std::max<int64_t>(1, std::min(kDefaultScalingLimit, MaxProjectedLatents(query)));
      const double min_share = query.min_share.value_or(kOwnLatentShare);
      const double* share = shares_.data_ptr<double>();
      std::vector<int64_t> own;
      for (int64_t j = 0; j < d_sae; ++j) {
        if (share[j] >= min_share) own.push_back(j);
      }
      std::stable_sort(own.begin(), own.end(),
                       [&](int64_t a, int64_t b) { return share[a] > share[b]; });
      for (size_t i = 0; i < own.size() && static_cast<int64_t>(result_.latents.size()) < limit;
           ++i) {
        RETURN_IF_ERROR(AddLatent(own[i], true));
      }
    }
    dd_.resize(result_.latents.size());
    dd_baseline_.resize(result_.latents.size());
    for (size_t i = 0; i < result_.latents.size(); ++i) {
      const at::Tensor d = W_source_[result_.latents[i].latent].to(at::kDouble);
      dd_[i] = d.dot(d).item<double>();
      dd_baseline_[i] =
          W_baseline_[result_.latents[i].latent].to(at::kDouble).dot(d).item<double>();
    }
    return absl::OkStatus();
  }

  int64_t MaxProjectionMacs(const LatentScalingQuery& query) const {
    return query.max_projection_macs > 0 ? query.max_projection_macs : kDefaultMaxProjectionMacs;
  }
  // Multiply-adds of one latent's projections: onto every decoder row of both models.
  int64_t ProjectionMacsPerLatent() const { return 2 * sae_.config().d_sae * d_; }
  int64_t MaxProjectedLatents(const LatentScalingQuery& query) const {
    return MaxProjectionMacs(query) / ProjectionMacsPerLatent();
  }

  // The call's work against its bounds: RESOURCE_EXHAUSTED with the numbers and what fits.
  absl::Status CheckWork(const LatentScalingQuery& query) const {
    const int64_t latents = static_cast<int64_t>(result_.latents.size());
    const int64_t max_pairs = query.max_pairs > 0 ? query.max_pairs : kDefaultMaxScalingPairs;
    if (static_cast<int64_t>(pairs_.size()) > max_pairs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "max_rows: the ", latents, " latents fire on ", pairs_.size(), " rows to fit, past the ",
          max_pairs, " one call fits: ask a max_rows of at most ",
          std::max<int64_t>(1, max_pairs / std::max<int64_t>(latents, 1)), " or fewer latents"));
    }
    if (latents > MaxProjectedLatents(query)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("latents: projecting ", latents, " latents onto the crosscoder's ",
                       sae_.config().d_sae, " decoder rows of width ", d_, " in both models takes ",
                       latents * ProjectionMacsPerLatent(), " multiply-adds, past the ",
                       MaxProjectionMacs(query), " one call does: ask at most ",
                       MaxProjectedLatents(query), " latents"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckSourceRows() const {
    const int64_t last =
        pairs_.empty()
            ? -1
            : std::max_element(pairs_.begin(), pairs_.end(), [](const Pair& a, const Pair& b) {
                return a.row < b.row;
              })->row;
    for (int s : {result_.source, result_.baseline}) {
      const StoredDenseInfo& info = rows_.sources[s]->info();
      if (info.width != d_) {
        return absl::FailedPreconditionError(
            absl::StrCat("the crosscoder's source ", s, " reads dataset ", info.id,
                         ", whose rows are ", info.width, " wide, not the crosscoder's ", d_));
      }
      if (last >= info.rows) {
        return absl::FailedPreconditionError(
            absl::StrCat("the crosscoder's source ", s, " reads dataset ", info.id, ", which has ",
                         info.rows, " committed rows; the crosscoder's codes reach row ", last));
      }
    }
    return absl::OkStatus();
  }

  // The projections of every decoder row of each model onto the directions of the answer's
  // slots [first, last): d_l . W_dec_m[k] for every latent k, so that a row's reconstruction
  // along d_l is a sum over its firing latents (k multiply-adds) instead of a decode (k x d).
  void Project(size_t first, size_t last) {
    std::vector<int64_t> latents;
    for (size_t i = first; i < last; ++i) latents.push_back(result_.latents[i].latent);
    directions_ = W_source_.index_select(0, at::tensor(latents, at::kLong)).contiguous();
    projected_source_ = directions_.mm(W_source_.t()).contiguous();  // [slots, d_sae]
    projected_baseline_ = directions_.mm(W_baseline_.t()).contiguous();
    bias_source_.assign(last - first, 0);
    bias_baseline_.assign(last - first, 0);
    if (b_source_.defined()) {
      const at::Tensor bs = directions_.mv(b_source_), bb = directions_.mv(b_baseline_);
      for (size_t i = 0; i < last - first; ++i) {
        bias_source_[i] = bs[i].item<float>();
        bias_baseline_[i] = bb[i].item<float>();
      }
    }
    first_slot_ = first;
  }

  // The pairs [begin, end), of the slots Project prepared, whose rows lie within kWindowRows of
  // the first: one read of the codes and of each model's rows.
  absl::Status Window(size_t begin, size_t end) {
    const int64_t first = pairs_[begin].row;
    const int64_t span = pairs_[end - 1].row - first + 1;
    std::vector<uint64_t> keep((span + 63) / 64, 0);
    int64_t distinct = 0;
    for (size_t p = begin; p < end; ++p) {
      const int64_t offset = pairs_[p].row - first;
      uint64_t& word = keep[offset / 64];
      const uint64_t bit = uint64_t{1} << (offset % 64);
      distinct += (word & bit) == 0;
      word |= bit;
    }
    result_.rows_read += distinct;
    ASSIGN_OR_RETURN(const storage::CsrRows codes, rows_.codes(first, span, keep));
    std::vector<float> x_source, x_baseline;
    RETURN_IF_ERROR(rows_.sources[result_.source]->ReadValues(first, span, &x_source));
    RETURN_IF_ERROR(rows_.sources[result_.baseline]->ReadValues(first, span, &x_baseline));
    const int64_t d_sae = sae_.config().d_sae;
    // Once a window, not for each pair reading a row: a code outside the crosscoder would read
    // past the projections.
    for (int64_t row = 0; row < span; ++row) {
      for (int64_t e = codes.indptr[row]; e < codes.indptr[row + 1]; ++e) {
        if (codes.indices[e] < 0 || codes.indices[e] >= d_sae) {
          return absl::DataLossError(absl::StrCat("row ", first + row,
                                                  " of the crosscoder's codes has latent ",
                                                  codes.indices[e], ", outside its ", d_sae));
        }
      }
    }
    const float* directions = directions_.data_ptr<float>();
    const float* projected_source = projected_source_.data_ptr<float>();
    const float* projected_baseline = projected_baseline_.data_ptr<float>();
    for (size_t p = begin; p < end; ++p) {
      const Pair& pair = pairs_[p];
      const int64_t offset = pair.row - first;
      const size_t l = pair.slot - first_slot_;
      const float* d = directions + l * d_;
      const float* xs = x_source.data() + offset * d_;
      const float* xb = x_baseline.data() + offset * d_;
      double x_along_source = 0, x_along_baseline = 0;
      for (int64_t i = 0; i < d_; ++i) {
        x_along_source += static_cast<double>(xs[i]) * d[i];
        x_along_baseline += static_cast<double>(xb[i]) * d[i];
      }
      // d . x_hat_m: b_dec_m's part and each firing latent's.
      double recon_source = bias_source_[l], recon_baseline = bias_baseline_[l];
      for (int64_t e = codes.indptr[offset]; e < codes.indptr[offset + 1]; ++e) {
        const double v = codes.values[e];
        recon_source += v * projected_source[l * d_sae + codes.indices[e]];
        recon_baseline += v * projected_baseline[l * d_sae + codes.indices[e]];
      }
      // d . (x_hat - f W_dec_m[j]): every other latent's reconstruction along d.
      const double z = pair.value;
      const double others_source = recon_source - z * dd_[pair.slot];
      const double others_baseline = recon_baseline - z * dd_baseline_[pair.slot];
      Sums& s = sums_[pair.slot];
      s.f2 += z * z;
      s.reconstruction_source += z * others_source;
      s.reconstruction_baseline += z * others_baseline;
      s.error_source += z * (x_along_source - others_source);
      s.error_baseline += z * (x_along_baseline - others_baseline);
    }
    return absl::OkStatus();
  }

  const Sae& sae_;
  const CrosscoderDatasetRows& rows_;
  int64_t d_ = 0;
  int64_t max_rows_ = 0;
  at::Tensor W_source_, W_baseline_, b_source_, b_baseline_;
  // Project's: the slots' directions [slots, d] and their projections [slots, d_sae].
  at::Tensor directions_, projected_source_, projected_baseline_;
  std::vector<double> bias_source_, bias_baseline_;  // d_l . b_dec_m
  size_t first_slot_ = 0;
  at::Tensor shares_;                // [d_sae] double
  std::vector<double> dd_;           // |d_j|^2 per answer slot
  std::vector<double> dd_baseline_;  // W_dec_baseline[j] . d_j
  std::vector<Pair> pairs_;
  std::vector<Sums> sums_;
  LatentScalingResult result_;
};

}  // namespace

absl::StatusOr<LatentScalingResult> FitLatentScaling(const Sae& crosscoder,
                                                     const LatentScalingQuery& query,
                                                     const CrosscoderDatasetRows& rows,
                                                     const std::function<bool()>& cancelled) {
  try {
    at::NoGradGuard no_grad;
    Fit fit(crosscoder, rows);
    return fit.Run(query, cancelled);
  } catch (const std::exception& e) {
    return TorchErrorStatus(e, "latent scaling");
  }
}

CrosscoderDatasetRows ChunkStoreCrosscoderRows(
    const storage::ChunkStore* store, uint64_t dataset_id,
    std::vector<std::shared_ptr<const StoredDenseRows>> sources) {
  CrosscoderDatasetRows rows;
  rows.postings = [store, dataset_id](int32_t latent, std::vector<int64_t>* at,
                                      std::vector<float>* values) {
    return store->LatentPostings(dataset_id, latent, at, values);
  };
  rows.codes = [store, dataset_id](int64_t row_start, int64_t row_count,
                                   const std::vector<uint64_t>& keep) {
    return store->ReadRowSet(dataset_id, row_start, row_count, keep);
  };
  rows.sources = std::move(sources);
  return rows;
}

}  // namespace latentd::engine
