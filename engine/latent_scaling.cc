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
#include "engine/sparse_codes.h"
#include "engine/torch_status.h"

namespace latentd::engine {
namespace {

// Rows a read spans at most: the sampled rows of a latent lie scattered over the dataset, and one
// read per row would decode a chunk per row.
constexpr int64_t kWindowRows = 4096;
// (row, latent) pairs whose dot products one pass forms (each gathers four [pairs, d] matrices).
constexpr int64_t kPairsPerPass = 8192;

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
    std::sort(pairs_.begin(), pairs_.end(),
              [](const Pair& a, const Pair& b) { return a.row < b.row; });
    RETURN_IF_ERROR(CheckSourceRows());
    sums_.assign(result_.latents.size(), Sums());
    for (size_t begin = 0; begin < pairs_.size();) {
      if (cancelled && cancelled()) return absl::CancelledError("latent scaling cancelled");
      size_t end = begin;
      while (end < pairs_.size() && pairs_[end].row < pairs_[begin].row + kWindowRows) ++end;
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
    const int source = query.source < 0 ? n - 1 : query.source;
    if (source >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("source: ", source, " outside [0, ", n, ") (the crosscoder's sources)"));
    }
    const int baseline = query.baseline < 0 ? (source == 0 ? 1 : 0) : query.baseline;
    if (baseline >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("baseline: ", baseline, " outside [0, ", n, ") (the crosscoder's sources)"));
    }
    if (baseline == source) {
      return absl::InvalidArgumentError(absl::StrCat(
          "baseline: ", baseline, " is the source; the fit compares the source with another"));
    }
    RETURN_IF_ERROR(CheckRange("max_rows", query.max_rows, kMaxScalingRows));
    RETURN_IF_ERROR(CheckRange("limit", query.limit, kMaxScalingLatents));
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

  // Adds latent j to the answer with its sampled rows; false (nothing added) when it never fired
  // and `skip_silent`.
  absl::StatusOr<bool> AddLatent(int64_t j, bool skip_silent) {
    std::vector<int64_t> rows;
    std::vector<float> values;
    RETURN_IF_ERROR(rows_.postings(static_cast<int32_t>(j), &rows, &values));
    if (rows.empty() && skip_silent) return false;
    const int32_t slot = static_cast<int32_t>(result_.latents.size());
    LatentScale& out = result_.latents.emplace_back();
    out.latent = j;
    out.firing_count = static_cast<int64_t>(rows.size());
    out.share = shares_.data_ptr<double>()[j];
    for (int64_t i : Spread(out.firing_count, max_rows_))
      pairs_.push_back({rows[i], slot, values[i]});
    out.rows = std::min(out.firing_count, max_rows_);
    return true;
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
      for (int64_t j : query.latents) RETURN_IF_ERROR(AddLatent(j, false).status());
    } else {
      const int64_t limit = query.limit == 0 ? kDefaultScalingLimit : query.limit;
      const double* share = shares_.data_ptr<double>();
      std::vector<int64_t> own;
      for (int64_t j = 0; j < d_sae; ++j) {
        if (share[j] >= kOwnLatentShare) own.push_back(j);
      }
      std::stable_sort(own.begin(), own.end(),
                       [&](int64_t a, int64_t b) { return share[a] > share[b]; });
      for (size_t i = 0; i < own.size() && static_cast<int64_t>(result_.latents.size()) < limit;
           ++i) {
        RETURN_IF_ERROR(AddLatent(own[i], true).status());
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

  absl::Status CheckSourceRows() const {
    for (int s : {result_.source, result_.baseline}) {
      const StoredDenseInfo& info = rows_.sources[s]->info();
      if (info.width != d_) {
        return absl::FailedPreconditionError(
            absl::StrCat("the crosscoder's source ", s, " reads dataset ", info.id,
                         ", whose rows are ", info.width, " wide, not the crosscoder's ", d_));
      }
      if (!pairs_.empty() && pairs_.back().row >= info.rows) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the crosscoder's source ", s, " reads dataset ", info.id, ", which has ", info.rows,
            " committed rows; the crosscoder's codes reach row ", pairs_.back().row));
      }
    }
    return absl::OkStatus();
  }

  // The pairs [begin, end), whose rows lie within kWindowRows of the first: one read of each.
  absl::Status Window(size_t begin, size_t end) {
    const int64_t first = pairs_[begin].row;
    const int64_t span = pairs_[end - 1].row - first + 1;
    std::vector<int64_t> local(end - begin);  // each pair's row among the window's distinct rows
    std::vector<int64_t> distinct;
    std::vector<uint64_t> keep((span + 63) / 64, 0);
    for (size_t p = begin; p < end; ++p) {
      const int64_t offset = pairs_[p].row - first;
      if (distinct.empty() || distinct.back() != offset) {
        distinct.push_back(offset);
        keep[offset / 64] |= uint64_t{1} << (offset % 64);
      }
      local[p - begin] = static_cast<int64_t>(distinct.size()) - 1;
    }
    const int64_t n_rows = static_cast<int64_t>(distinct.size());
    result_.rows_read += n_rows;

    ASSIGN_OR_RETURN(const storage::CsrRows codes, rows_.codes(first, span, keep));
    std::vector<int32_t> indices;
    std::vector<float> values;
    std::vector<int64_t> counts;
    for (int64_t offset : distinct) {
      const int64_t from = codes.indptr[offset], to = codes.indptr[offset + 1];
      indices.insert(indices.end(), codes.indices.begin() + from, codes.indices.begin() + to);
      values.insert(values.end(), codes.values.begin() + from, codes.values.begin() + to);
      counts.push_back(to - from);
    }
    SparseCodes sparse;
    sparse.indices = at::tensor(indices, at::kInt);
    sparse.values = at::tensor(values, at::kFloat);
    sparse.row_counts = at::tensor(counts, at::kLong);
    const at::Tensor recon_source = DecodeSparseCodes(W_source_, b_source_, sparse, n_rows);
    const at::Tensor recon_baseline = DecodeSparseCodes(W_baseline_, b_baseline_, sparse, n_rows);
    const at::Tensor at_rows = at::tensor(distinct, at::kLong);
    ASSIGN_OR_RETURN(const at::Tensor x_source, ReadSource(result_.source, first, span, at_rows));
    ASSIGN_OR_RETURN(const at::Tensor x_baseline,
                     ReadSource(result_.baseline, first, span, at_rows));

    for (size_t from = begin; from < end; from += kPairsPerPass) {
      const size_t to = std::min(end, from + kPairsPerPass);
      std::vector<int64_t> row_index(local.begin() + (from - begin), local.begin() + (to - begin));
      std::vector<int64_t> latent_index;
      std::vector<float> f;
      for (size_t p = from; p < to; ++p) {
        latent_index.push_back(result_.latents[pairs_[p].slot].latent);
        f.push_back(pairs_[p].value);
      }
      const at::Tensor r = at::tensor(row_index, at::kLong);
      const at::Tensor d = W_source_.index_select(0, at::tensor(latent_index, at::kLong));
      auto along = [&](const at::Tensor& m) {
        return (m.index_select(0, r) * d).sum(1).to(at::kDouble).contiguous();
      };
      const at::Tensor xs = along(x_source), xb = along(x_baseline);
      const at::Tensor rs = along(recon_source), rb = along(recon_baseline);
      const double* xs_p = xs.data_ptr<double>();
      const double* xb_p = xb.data_ptr<double>();
      const double* rs_p = rs.data_ptr<double>();
      const double* rb_p = rb.data_ptr<double>();
      for (size_t p = from; p < to; ++p) {
        const size_t q = p - from;
        const int32_t slot = pairs_[p].slot;
        const double z = f[q];
        // d . (x_hat - f W_dec_m[j]): every other latent's reconstruction along d.
        const double others_source = rs_p[q] - z * dd_[slot];
        const double others_baseline = rb_p[q] - z * dd_baseline_[slot];
        Sums& s = sums_[slot];
        s.f2 += z * z;
        s.reconstruction_source += z * others_source;
        s.reconstruction_baseline += z * others_baseline;
        s.error_source += z * (xs_p[q] - others_source);
        s.error_baseline += z * (xb_p[q] - others_baseline);
      }
    }
    return absl::OkStatus();
  }

  // Source s's rows at `at_rows` of [first, first + span): [rows, d] float32.
  absl::StatusOr<at::Tensor> ReadSource(int s, int64_t first, int64_t span,
                                        const at::Tensor& at_rows) const {
    std::vector<float> values;
    RETURN_IF_ERROR(rows_.sources[s]->ReadValues(first, span, &values));
    return at::from_blob(values.data(), {span, d_}, at::kFloat).index_select(0, at_rows).clone();
  }

  const Sae& sae_;
  const CrosscoderDatasetRows& rows_;
  int64_t d_ = 0;
  int64_t max_rows_ = 0;
  at::Tensor W_source_, W_baseline_, b_source_, b_baseline_;
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
