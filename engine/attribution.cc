#include "engine/attribution.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/activation_model.h"
#include "engine/hook_collector.h"
#include "engine/sae.h"

namespace latentd::engine {
namespace {

absl::Status CheckQuery(const AttributionQuery& query, int64_t vocab) {
  for (const auto& [id, name] : {std::pair{query.target_token_id, "target_token_id"},
                                 std::pair{query.contrast_token_id, "contrast_token_id"}}) {
    if (id && (*id < 0 || (vocab > 0 && *id >= vocab))) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", *id, " outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (query.contrast_token_id && !query.target_token_id) {
    return absl::InvalidArgumentError("contrast_token_id: needs a target_token_id to contrast");
  }
  if (query.contrast_token_id && *query.contrast_token_id == *query.target_token_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("contrast_token_id: ", *query.contrast_token_id,
                     " is the target: their logit difference is 0 whatever the latents"));
  }
  if (query.top < 0 || query.top > kMaxAttributionTop) {
    return absl::InvalidArgumentError(
        absl::StrCat("top: ", query.top, " outside [0, ", kMaxAttributionTop, "]"));
  }
  return absl::OkStatus();
}

// Orders by |attribution| descending, then position, then latent.
bool Larger(const LatentAttribution& a, const LatentAttribution& b) {
  const double x = std::abs(a.attribution), y = std::abs(b.attribution);
  if (x != y) return x > y;
  return a.position != b.position ? a.position < b.position : a.latent < b.latent;
}

}  // namespace

absl::StatusOr<AttributionResult> AttributePrompt(const SteeringModel& steering,
                                                  const std::vector<int64_t>& prompt,
                                                  bool bos_prepended,
                                                  const AttributionQuery& query) {
  ActivationModel& model = *steering.model;
  const Sae& sae = *steering.sae;
  RETURN_IF_ERROR(CheckQuery(query, model.vocab_size()));
  if (const std::string why = model.next_token_loss_unsupported(); !why.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("attribution runs the model to its logits: ", why));
  }
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n < 1) return absl::InvalidArgumentError("token_ids: empty");
  const int64_t top = query.top > 0 ? query.top : 20;

  // The forward pass keeps the SAE's input and the activation its decoder writes, and adds a
  // zero there whose gradient is dm/dx.
  at::Tensor input, output, zero;
  auto write = [&](const at::Tensor& x) {
    output = x.detach();
    zero = at::zeros(x.sizes(), x.options().dtype(at::kFloat)).requires_grad_(true);
    return x + zero.to(x.scalar_type());
  };
  HookSplices splices;
  if (steering.writes_elsewhere()) {
    splices.push_back({steering.hook, [&](const at::Tensor& x) {
                         input = x.detach();
                         return x;
                       }});
    splices.push_back({*steering.hook_out, write});
  } else {
    splices.push_back({steering.hook, [&](const at::Tensor& x) {
                         input = x.detach();
                         return write(x);
                       }});
  }
  AttributionResult out;
  out.bos_prepended = bos_prepended;
  out.prompt = prompt;
  at::Tensor gradient;
  {
    at::AutoGradMode grad_mode(true);  // queries run under NoGradGuard
    const NextTokenPredictions p = model.PredictNextTokens(
        at::tensor(prompt, at::TensorOptions().dtype(at::kLong)).view({1, n}), splices,
        /*losses=*/false);
    const at::Tensor logits = p.last_logits[0];
    out.target_token_id =
        query.target_token_id ? *query.target_token_id : logits.argmax().item<int64_t>();
    out.contrast_token_id = query.contrast_token_id;
    const at::Tensor metric =
        out.contrast_token_id ? logits[out.target_token_id] - logits[*out.contrast_token_id]
                              : at::log_softmax(logits.to(at::kDouble), -1)[out.target_token_id];
    out.metric = metric.item<double>();
    metric.backward();
    gradient = zero.grad()[0];  // [n, width of the hook the decoder writes]
  }

  at::NoGradGuard no_grad;
  const at::Tensor x = input[0].to(at::kFloat);
  const SparseCodes codes = sae.EncodeSparse(x);
  const at::Tensor error = output[0].to(at::kFloat) - sae.Predict(x, codes);
  const at::Tensor error_by_position = (error * gradient).sum(1).to(at::kDouble).contiguous();
  out.error_attribution_by_position.assign(
      error_by_position.data_ptr<double>(),
      error_by_position.data_ptr<double>() + error_by_position.numel());
  out.error_attribution = error_by_position.sum().item<double>();

  // Every firing entry (row, latent, z): z * scale[row] * (W_dec[latent] . g[row]), gathered a
  // slice of entries at a time so that a long prompt of a wide SAE stays within 16 MiB a slice.
  const at::Tensor latents = codes.indices.reshape({-1}).to(at::kLong);
  const at::Tensor values = codes.values.reshape({-1});
  const at::Tensor rows =
      codes.fixed_k() ? at::arange(n, latents.options()).repeat_interleave(codes.indices.size(1))
                      : at::repeat_interleave(at::arange(n, latents.options()), codes.row_counts);
  const at::Tensor firing = values.ne(0);
  const at::Tensor entry_latents = latents.masked_select(firing);
  const at::Tensor entry_rows = rows.masked_select(firing);
  const at::Tensor entry_values = values.masked_select(firing);
  const at::Tensor scale = sae.DecoderOutputScale(x).view({-1});
  const at::Tensor& W_dec = sae.weights().W_dec;
  const int64_t entries = entry_latents.numel();
  const int64_t slice = std::max<int64_t>(1, (int64_t{1} << 22) / W_dec.size(1));
  std::vector<at::Tensor> pieces;
  for (int64_t e = 0; e < entries; e += slice) {
    const int64_t m = std::min(slice, entries - e);
    const at::Tensor r = entry_rows.narrow(0, e, m);
    const at::Tensor dots =
        (W_dec.index_select(0, entry_latents.narrow(0, e, m)) * gradient.index_select(0, r)).sum(1);
    pieces.push_back(
        (dots * entry_values.narrow(0, e, m) * scale.index_select(0, r)).to(at::kDouble));
  }
  const at::Tensor attribution =
      pieces.empty() ? at::zeros({0}, at::kDouble) : at::cat(pieces).contiguous();
  const at::Tensor by_position =
      at::zeros({n}, at::kDouble).index_add_(0, entry_rows, attribution).contiguous();
  out.latent_attribution_by_position.assign(by_position.data_ptr<double>(),
                                            by_position.data_ptr<double>() + n);
  out.latent_attribution = attribution.sum().item<double>();

  const at::Tensor lat = entry_latents.contiguous(), row = entry_rows.contiguous();
  const at::Tensor val = entry_values.contiguous();
  const int64_t* l = lat.data_ptr<int64_t>();
  const int64_t* r = row.data_ptr<int64_t>();
  const float* v = val.data_ptr<float>();
  const double* a = attribution.data_ptr<double>();
  std::vector<LatentAttribution> all(entries);
  // Per latent: its sum, reported at its entry of largest |attribution| (first by position).
  std::map<int64_t, std::pair<double, LatentAttribution>> by_latent;
  for (int64_t e = 0; e < entries; ++e) {
    all[e] = {l[e], r[e], v[e], a[e]};
    auto [it, fresh] = by_latent.try_emplace(l[e], 0.0, all[e]);
    it->second.first += a[e];
    if (!fresh && Larger(all[e], it->second.second)) it->second.second = all[e];
  }
  auto take = [top](std::vector<LatentAttribution> list) {
    const size_t keep = std::min<size_t>(top, list.size());
    std::partial_sort(list.begin(), list.begin() + keep, list.end(), Larger);
    list.resize(keep);
    return list;
  };
  out.top_entries = take(all);
  std::vector<LatentAttribution> sums;
  for (const auto& [latent, sum_at] : by_latent) {
    LatentAttribution sum = sum_at.second;
    sum.attribution = sum_at.first;
    sums.push_back(sum);
  }
  out.top_latents = take(std::move(sums));
  return out;
}

}  // namespace latentd::engine
