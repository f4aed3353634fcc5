#include "engine/attribution.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/activation_model.h"
#include "engine/decoder_writes.h"
#include "engine/hook_collector.h"
#include "engine/intervener.h"
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
  if (query.ablate < 0 || query.ablate > kMaxAblatedEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("ablate: ", query.ablate, " outside [0, ", kMaxAblatedEntries, "]"));
  }
  return absl::OkStatus();
}

// A target SAE's query (no token metric beside it) and its hook against the hooks the
// attributed SAE writes (the forward must pass them before it reads the target).
absl::Status CheckTargetSae(const AttributionQuery& query, const TargetSae& target,
                            const std::vector<HookName>& written) {
  if (target.sae == nullptr) {
    return absl::InternalError("target_latent: no SAE was given to read it");
  }
  if (target.diffed_source >= 0 &&
      (static_cast<int>(target.diffed_models.size()) != target.sae->config().crosscoder_sources ||
       target.diffed_source >= static_cast<int>(target.diffed_models.size()))) {
    return absl::InternalError("target_latent: a crosscoder over models without its models");
  }
  for (const auto& [id, name] : {std::pair{query.target_token_id, "target_token_id"},
                                 std::pair{query.contrast_token_id, "contrast_token_id"}}) {
    if (id) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": not with target_latent (the metric is the target latent's value)"));
    }
  }
  // (A crosscoder target is moved through its last source at least.)
  HookName last = target.hook;
  for (const HookName& source : target.crosscoder_sources) {
    if (ComputedBefore(last, source)) last = source;
  }
  if (ComputedBefore(last, written.front())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_latent.dataset_id: its ",
        target.crosscoder_sources.empty() ? "SAE reads " : "crosscoder reads nothing later than ",
        HookNameString(last), ", which the forward computes before ",
        HookNameString(written.front()),
        ", where this dataset's SAE writes: these latents cannot drive it"));
  }
  return absl::OkStatus();
}

// Where a forward that reads `target` (and the attributed SAE's input, a crosscoder's sources)
// must run to: the hooks to ask ForwardSpliced for, the target's first.
std::vector<HookName> TargetStops(const SteeringModel& steering, const TargetSae& target) {
  std::vector<HookName> stops = {target.hook};
  stops.insert(stops.end(), target.crosscoder_sources.begin(), target.crosscoder_sources.end());
  stops.insert(stops.end(), steering.crosscoder_sources.begin(), steering.crosscoder_sources.end());
  return stops;
}

// The target SAE's input from those hooks' activations (TargetStops' order) over `tokens` (the
// forward's [batch, positions]): its hook's, a crosscoder's sources side by side, or for a
// crosscoder over models the forward's model's activation beside the other models' (run here,
// without gradient), [batch, positions, d_in].
at::Tensor TargetInput(const TargetSae& target, const std::vector<at::Tensor>& read,
                       const at::Tensor& tokens) {
  if (target.diffed_source >= 0) {
    SteeringModel models;
    models.diffed_source = target.diffed_source;
    models.diffed_models = target.diffed_models;
    std::vector<at::Tensor> beside;
    {
      at::NoGradGuard no_grad;
      beside = ActivationsBeside(models, tokens);
    }
    return CrosscoderInputBeside(models, beside, read[0]);
  }
  if (target.crosscoder_sources.empty()) return read[0];
  return at::cat(std::vector<at::Tensor>(read.begin() + 1,
                                         read.begin() + 1 + target.crosscoder_sources.size()),
                 2);
}

// A target latent against its SAE's width and the prompt.
absl::Status CheckTargetLatent(const TargetLatent& t, const TargetSae& target,
                               int64_t prompt_tokens) {
  const int64_t d_sae = target.sae->config().d_sae;
  if (t.latent < 0 || t.latent >= d_sae) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_latent.latent: ", t.latent, " outside [0, ", d_sae, ")"));
  }
  if (t.position < 0 || t.position >= prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("target_latent.position: ", t.position,
                                                   " outside the prompt's positions [0, ",
                                                   prompt_tokens, ") (a prepended BOS is 0)"));
  }
  return absl::OkStatus();
}

// What one forward pass keeps: the SAE's input (a crosscoder's: its sources' activations,
// which are `outputs`) and, at each hook its decoder writes, the activation there and a zero
// added to it whose gradient is dm/d(activation).
struct Pass {
  at::Tensor input;
  std::vector<at::Tensor> outputs, zeros;
  // A crosscoder over models: the other models' activations at their hooks (ActivationsBeside).
  std::vector<at::Tensor> beside;
};

HookSplices PassSplices(const SteeringModel& steering, const std::vector<HookName>& written,
                        Pass* pass) {
  pass->outputs.resize(written.size());
  pass->zeros.resize(written.size());
  HookSplices splices;
  if (steering.crosscoder_sources.empty()) {
    splices.push_back({steering.hook, [pass](const at::Tensor& x) {
                         pass->input = x.detach();
                         return x;
                       }});
  }
  for (size_t h = 0; h < written.size(); ++h) {
    splices.push_back(
        {written[h], [pass, h](const at::Tensor& x) {
           pass->outputs[h] = x.detach();
           pass->zeros[h] =
               at::zeros(x.sizes(), x.options().dtype(at::kFloat)).requires_grad_(true);
           return x + pass->zeros[h].to(x.scalar_type());
         }});
  }
  return splices;
}

// The gradients the last backward pass left at the pass's zeros ([n, width] each; zeros where
// it did not reach, a written hook after a target latent's), taken out so that the next
// backward pass starts from none.
std::vector<at::Tensor> TakeGradients(Pass& pass) {
  std::vector<at::Tensor> gradients;
  for (at::Tensor& zero : pass.zeros) {
    gradients.push_back(zero.grad().defined() ? zero.grad()[0].clone() : at::zeros_like(zero[0]));
    zero.mutable_grad().reset();
  }
  return gradients;
}

// Orders by |attribution| descending, then position, then latent.
bool Larger(const LatentAttribution& a, const LatentAttribution& b) {
  const double x = std::abs(a.attribution), y = std::abs(b.attribution);
  if (x != y) return x > y;
  return a.position != b.position ? a.position < b.position : a.latent < b.latent;
}

}  // namespace

namespace {

// Credits the SAE's firing entries on the pass's input for each metric's gradients (per
// written hook, [n, width]), filling each result's latent and error fields. Every firing entry
// (row, latent, z) is credited z * scale[row] * sum over written hooks h of rows_h[latent] .
// g_h[row]: the dot products of the distinct firing latents with every position's gradients
// are products of matrices, a slice of latents at a time (its decoder rows read once for every
// metric) so that a long prompt of a wide SAE, or a cross-layer transcoder writing many
// layers, stays within about 16 MiB of decoder rows a slice.
absl::Status Credit(const SteeringModel& steering, const Pass& pass, int64_t n, int64_t top,
                    const std::vector<std::vector<at::Tensor>>& gradients,
                    const std::vector<AttributionResult*>& outs) {
  const Sae& sae = *steering.sae;
  // The SAE's error where its decoder writes, per written hook: a crosscoder's at each source;
  // any other's at the first (a cross-layer transcoder's own layer), the rest left out.
  const std::vector<int64_t> blocks = WrittenBlocks(steering);
  std::vector<at::Tensor> by_block(blocks.size());
  for (size_t h = 0; h < blocks.size(); ++h) by_block[blocks[h]] = pass.outputs[h][0];
  const bool diffed = steering.diffed_source >= 0;
  const at::Tensor x = (diffed ? CrosscoderInputBeside(steering, pass.beside, pass.input)[0]
                               : (blocks.empty() ? pass.input[0] : at::cat(by_block, 1)))
                           .to(at::kFloat);
  const SparseCodes codes = sae.EncodeSparse(x);
  const at::Tensor prediction = sae.Predict(x, codes);
  std::vector<at::Tensor> errors;
  if (blocks.empty()) {  // a crosscoder over models: the running model's block
    const int64_t width = pass.outputs[0].size(2);
    errors.push_back(
        pass.outputs[0][0].to(at::kFloat) -
        (diffed ? prediction.narrow(1, steering.diffed_source * width, width) : prediction));
  }
  for (size_t h = 0; h < blocks.size(); ++h) {
    const int64_t width = prediction.size(1) / static_cast<int64_t>(blocks.size());
    errors.push_back(pass.outputs[h][0].to(at::kFloat) -
                     prediction.narrow(1, blocks[h] * width, width));
  }
  const at::Tensor latents = codes.indices.reshape({-1}).to(at::kLong);
  const at::Tensor values = codes.values.reshape({-1});
  const at::Tensor rows =
      codes.fixed_k() ? at::arange(n, latents.options()).repeat_interleave(codes.indices.size(1))
                      : at::repeat_interleave(at::arange(n, latents.options()), codes.row_counts);
  const at::Tensor firing = values.ne(0);
  const at::Tensor entry_latents = latents.masked_select(firing);
  const at::Tensor entry_rows = rows.masked_select(firing);
  const at::Tensor entry_values = values.masked_select(firing);
  const int64_t entries = entry_latents.numel();
  const auto [distinct, entry_column] =
      at::_unique(entry_latents, /*sorted=*/true, /*return_inverse=*/true);
  int64_t written_width = 0;
  for (const at::Tensor& g : gradients.front()) written_width += g.size(1);
  const int64_t slice = std::max<int64_t>(1, (int64_t{1} << 22) / written_width);
  std::vector<std::vector<at::Tensor>> dots(gradients.size());  // per metric, per slice
  for (int64_t d = 0; d < distinct.numel(); d += slice) {
    ASSIGN_OR_RETURN(
        const std::vector<at::Tensor> written_rows,
        WrittenRows(steering, distinct.narrow(0, d, std::min(slice, distinct.numel() - d))));
    for (size_t m = 0; m < gradients.size(); ++m) {
      at::Tensor sum;  // [latents of the slice, n]
      for (size_t h = 0; h < gradients[m].size(); ++h) {
        const at::Tensor here = written_rows[h].mm(gradients[m][h].to(at::kFloat).t());
        sum = sum.defined() ? sum + here : here;
      }
      dots[m].push_back(sum);
    }
  }
  const at::Tensor scale = sae.DecoderOutputScale(x).view({-1});
  const at::Tensor lat = entry_latents.contiguous(), row = entry_rows.contiguous();
  const at::Tensor val = entry_values.contiguous();
  for (size_t m = 0; m < gradients.size(); ++m) {
    AttributionResult& out = *outs[m];
    at::Tensor error_by_position = at::zeros({n}, at::kDouble);
    for (size_t h = 0; h < errors.size(); ++h) {
      error_by_position += (errors[h] * gradients[m][h]).sum(1).to(at::kDouble);
    }
    error_by_position = error_by_position.contiguous();
    out.error_attribution_by_position.assign(
        error_by_position.data_ptr<double>(),
        error_by_position.data_ptr<double>() + error_by_position.numel());
    out.error_attribution = error_by_position.sum().item<double>();
    const at::Tensor attribution =
        entries == 0 ? at::zeros({0}, at::kDouble)
                     : (at::cat(dots[m]).view({-1}).index_select(0, entry_column * n + entry_rows) *
                        entry_values * scale.index_select(0, entry_rows))
                           .to(at::kDouble)
                           .contiguous();
    const at::Tensor by_position =
        at::zeros({n}, at::kDouble).index_add_(0, entry_rows, attribution).contiguous();
    out.latent_attribution_by_position.assign(by_position.data_ptr<double>(),
                                              by_position.data_ptr<double>() + n);
    out.latent_attribution = attribution.sum().item<double>();

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
  }
  return absl::OkStatus();
}

// A token metric of logits [..., vocab] (one row, or a run per row): logit(target) -
// logit(contrast) with a contrast, else log p(target) (in float64).
at::Tensor TokenMetric(const at::Tensor& logits, int64_t target,
                       const std::optional<int64_t>& contrast) {
  return contrast ? logits.select(-1, target) - logits.select(-1, *contrast)
                  : at::log_softmax(logits.to(at::kDouble), -1).select(-1, target);
}

// The ablation check (AttributionQuery.ablate) of one or more answers of one pass (a token
// metric's, or several target latents' of `target`): the prompt once clean and once per checked
// top entry of each with that entry alone taken out (its value scaled to 0 at its position by
// an Intervener: where the SAE writes, its part of the reconstruction goes), all one batch; each
// run's metric (its answer's) less the clean run's, in its answer's ablated_changes. The runs
// agree before the earliest checked position (the model is causal): that prefix runs once, its
// keys and values are copied to every run, and the batch runs from there (entries late in a
// prompt, the usual case, cost a few positions each, not the prompt); with latent targets the
// forward stops at the target's hooks.
absl::Status Ablate(const SteeringModel& steering, const std::vector<int64_t>& prompt, int ablate,
                    const TargetSae* target, const std::vector<AttributionResult*>& outs) {
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::vector<int64_t> checked, row;  // per answer: its entries checked, its first run's row
  int64_t runs = 0, first = n - 1;
  for (const AttributionResult* out : outs) {
    checked.push_back(std::min<int64_t>(ablate, out->top_entries.size()));
    row.push_back(1 + runs);
    runs += checked.back();
    if (out->target_latent && checked.back() > 0) {
      first = std::min(first, out->target_latent->position);
    }
    for (int64_t i = 0; i < checked.back(); ++i) {
      first = std::min(first, out->top_entries[i].position);
    }
  }
  if (runs == 0) return absl::OkStatus();
  // The models beside a crosscoder over models run the whole prompt (they hold no prefix).
  if (steering.diffed_source >= 0 || (target != nullptr && target->diffed_source >= 0)) first = 0;
  std::vector<LatentIntervention> removals;
  std::vector<std::vector<float>> values;  // per removal, per run: 0 in its own run, else 1
  for (size_t o = 0; o < outs.size(); ++o) {
    for (int64_t i = 0; i < checked[o]; ++i) {
      const LatentAttribution& e = outs[o]->top_entries[i];
      removals.push_back({e.latent, InterventionMode::kScale, 0.0f, {e.position}});
      values.emplace_back(runs, 1.0f)[row[o] - 1 + i] = 0.0f;
    }
  }
  Intervener intervener(steering, removals, values);
  RETURN_IF_ERROR(intervener.Init());
  const HookSplices splices = intervener.Splices();
  ActivationModel& model = *steering.model;
  const bool to_latents = outs.front()->target_latent.has_value();
  const at::Tensor ids = at::tensor(prompt, at::TensorOptions().dtype(at::kLong)).view({1, n});
  KeyValueCache cache;
  if (first > 0) {
    const at::Tensor prefix = ids.narrow(1, 0, first);
    if (to_latents) {
      model.ForwardSpliced(prefix, TargetStops(steering, *target), {}, &cache);
    } else {
      model.PredictNextTokens(prefix, {}, /*losses=*/false, &cache);
    }
    // Every run reads the same prefix: a view of it per run, not a copy (each layer's pass
    // concatenates its new positions onto it, and nothing writes it in place).
    for (std::vector<at::Tensor>* held : {&cache.keys, &cache.values}) {
      for (at::Tensor& t : *held) {
        if (t.defined()) t = t.expand({1 + runs, -1, -1, -1});
      }
    }
  }
  const at::Tensor tokens = ids.narrow(1, first, n - first).repeat({1 + runs, 1});
  intervener.set_first_position(first);
  intervener.BeforePass(model, tokens, cache);
  if (to_latents) {
    const at::Tensor read = TargetInput(
        *target, model.ForwardSpliced(tokens, TargetStops(steering, *target), splices, &cache),
        tokens);
    for (size_t o = 0; o < outs.size(); ++o) {
      if (checked[o] == 0) continue;
      const TargetLatent& t = *outs[o]->target_latent;
      // The clean run and this answer's runs, at its position.
      const at::Tensor rows = at::cat({read.narrow(0, 0, 1), read.narrow(0, row[o], checked[o])})
                                  .select(1, t.position - first)
                                  .to(at::kFloat);
      const at::Tensor metric = target->sae->LatentValue(rows, t.latent).to(at::kDouble);
      const at::Tensor changes = (metric.narrow(0, 1, checked[o]) - metric[0]).contiguous();
      outs[o]->ablated_changes.assign(changes.data_ptr<double>(),
                                      changes.data_ptr<double>() + checked[o]);
    }
    return absl::OkStatus();
  }
  AttributionResult& out = *outs.front();
  const at::Tensor logits = model.PredictNextTokens(tokens, splices, /*losses=*/false, &cache)
                                .last_logits.to(at::kDouble);
  const at::Tensor metric = TokenMetric(logits, out.target_token_id, out.contrast_token_id);
  const at::Tensor changes = (metric.narrow(0, 1, runs) - metric[0]).contiguous();
  out.ablated_changes.assign(changes.data_ptr<double>(), changes.data_ptr<double>() + runs);
  return absl::OkStatus();
}

// A crosscoder over several models' activations credits each latent with its value, which
// needs every model's: FAILED_PRECONDITION (saying why) where the others cannot run beside the
// credited one.
absl::Status CheckModelsBeside(const SteeringModel& steering) {
  if (steering.diffed_source >= 0 && steering.diffed_models.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "attribution credits each latent with its value, which for a crosscoder over several "
        "models' activations needs every model's, and its other models cannot run beside the "
        "credited one: ",
        steering.diffed_alone));
  }
  return absl::OkStatus();
}

// For a crosscoder over several models, the other models' activations on `tokens` (no
// gradient: nothing the credited model does moves them); otherwise none.
std::vector<at::Tensor> ModelsBesideRun(const SteeringModel& steering, const at::Tensor& tokens) {
  if (steering.diffed_source < 0) return {};
  at::NoGradGuard no_grad;
  return ActivationsBeside(steering, tokens);
}

// The checks every attribution makes of the query and the model.
absl::Status CheckAttribution(const ActivationModel& model, const AttributionQuery& query,
                              int64_t prompt_tokens) {
  RETURN_IF_ERROR(CheckQuery(query, model.vocab_size()));
  if (const std::string why = model.next_token_loss_unsupported(); !why.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("attribution runs the model to its logits: ", why));
  }
  if (prompt_tokens < 1) return absl::InvalidArgumentError("token_ids: empty");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttributionResult> AttributePrompt(const SteeringModel& steering,
                                                  const std::vector<int64_t>& prompt,
                                                  bool bos_prepended, const AttributionQuery& query,
                                                  const TargetSae* target) {
  if (query.target_latent) {
    if (target == nullptr) return absl::InternalError("target_latent: no SAE was given to read it");
    ASSIGN_OR_RETURN(std::vector<absl::StatusOr<AttributionResult>> answers,
                     AttributeToLatents(steering, prompt, bos_prepended, query, *target,
                                        {*query.target_latent}));
    return std::move(answers.front());
  }
  ActivationModel& model = *steering.model;
  const int64_t n = static_cast<int64_t>(prompt.size());
  RETURN_IF_ERROR(CheckAttribution(model, query, n));
  RETURN_IF_ERROR(CheckModelsBeside(steering));
  AttributionResult out;
  out.bos_prepended = bos_prepended;
  out.prompt = prompt;
  Pass pass;
  const HookSplices splices = PassSplices(steering, WrittenHooks(steering), &pass);
  std::vector<at::Tensor> gradients;
  {
    at::AutoGradMode grad_mode(true);  // queries run under NoGradGuard
    const at::Tensor tokens = at::tensor(prompt, at::TensorOptions().dtype(at::kLong)).view({1, n});
    pass.beside = ModelsBesideRun(steering, tokens);
    const at::Tensor logits =
        model.PredictNextTokens(tokens, splices, /*losses=*/false).last_logits[0];
    out.target_token_id =
        query.target_token_id ? *query.target_token_id : logits.argmax().item<int64_t>();
    out.contrast_token_id = query.contrast_token_id;
    const at::Tensor metric = TokenMetric(logits, out.target_token_id, out.contrast_token_id);
    out.metric = metric.item<double>();
    metric.backward();
    gradients = TakeGradients(pass);
  }
  at::NoGradGuard no_grad;
  RETURN_IF_ERROR(Credit(steering, pass, n, query.top > 0 ? query.top : 20, {gradients}, {&out}));
  RETURN_IF_ERROR(Ablate(steering, prompt, query.ablate, nullptr, {&out}));
  return out;
}

absl::StatusOr<std::vector<absl::StatusOr<AttributionResult>>> AttributeToLatents(
    const SteeringModel& steering, const std::vector<int64_t>& prompt, bool bos_prepended,
    const AttributionQuery& query, const TargetSae& target,
    const std::vector<TargetLatent>& targets) {
  ActivationModel& model = *steering.model;
  const int64_t n = static_cast<int64_t>(prompt.size());
  RETURN_IF_ERROR(CheckAttribution(model, query, n));
  RETURN_IF_ERROR(CheckModelsBeside(steering));
  const std::vector<HookName> written = WrittenHooks(steering);
  RETURN_IF_ERROR(CheckTargetSae(query, target, written));
  std::vector<absl::StatusOr<AttributionResult>> answers(targets.size());
  std::vector<std::vector<at::Tensor>> gradients;
  std::vector<AttributionResult*> credited;
  Pass pass;
  const HookSplices splices = PassSplices(steering, written, &pass);
  {
    at::AutoGradMode grad_mode(true);  // queries run under NoGradGuard
    const at::Tensor tokens = at::tensor(prompt, at::TensorOptions().dtype(at::kLong)).view({1, n});
    pass.beside = ModelsBesideRun(steering, tokens);
    // Only as far as the target's hooks (the rest of the model does not move it) and a
    // crosscoder's sources (its input), once: each target's backward pass keeps the graph for
    // the next.
    const at::Tensor target_input = TargetInput(
        target, model.ForwardSpliced(tokens, TargetStops(steering, target), splices), tokens);
    for (size_t i = 0; i < targets.size(); ++i) {
      const TargetLatent& t = targets[i];
      if (absl::Status checked = CheckTargetLatent(t, target, n); !checked.ok()) {
        answers[i] = checked;
        continue;
      }
      const at::Tensor metric = target.sae->LatentValue(
          target_input[0].narrow(0, t.position, 1).to(at::kFloat), t.latent)[0];
      if (metric.item<double>() == 0) {
        answers[i] = absl::FailedPreconditionError(
            absl::StrCat("target_latent: latent ", t.latent, " is 0 at position ", t.position,
                         ": nothing moves it to first order (ask at a position where it fires)"));
        continue;
      }
      AttributionResult out;
      out.bos_prepended = bos_prepended;
      out.prompt = prompt;
      out.target_latent = t;
      out.metric = metric.item<double>();
      metric.backward({}, /*retain_graph=*/true);
      gradients.push_back(TakeGradients(pass));
      answers[i] = std::move(out);
      credited.push_back(&*answers[i]);
    }
  }
  at::NoGradGuard no_grad;
  if (!credited.empty()) {
    RETURN_IF_ERROR(Credit(steering, pass, n, query.top > 0 ? query.top : 20, gradients, credited));
  }
  if (!credited.empty()) RETURN_IF_ERROR(Ablate(steering, prompt, query.ablate, &target, credited));
  return answers;
}

absl::StatusOr<double> AblateTogether(const std::vector<SteeringModel>& saes,
                                      const std::vector<std::vector<TargetLatent>>& removed,
                                      const std::vector<int64_t>& prompt,
                                      const AttributionQuery& metric, int64_t target_token,
                                      const TargetSae* target) {
  if (saes.empty() || saes.size() != removed.size()) {
    return absl::InternalError("AblateTogether: one list of removals per SAE");
  }
  for (const SteeringModel& sae : saes) RETURN_IF_ERROR(CheckModelsBeside(sae));
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::vector<std::vector<LatentIntervention>> removals(saes.size());
  for (size_t i = 0; i < saes.size(); ++i) {
    const int64_t d_sae = saes[i].sae->config().d_sae;
    for (const TargetLatent& r : removed[i]) {
      if (r.latent < 0 || r.latent >= d_sae || r.position < 0 || r.position >= n) {
        return absl::InvalidArgumentError(absl::StrCat("removed[", i, "]: latent ", r.latent,
                                                       " at ", r.position, " outside [0, ", d_sae,
                                                       ") x [0, ", n, ")"));
      }
      removals[i].push_back({r.latent, InterventionMode::kScale, 0.0f, {r.position}});
    }
  }
  // One Intervener a SAE, one changed row: each removal scaled by 0 there.
  std::vector<std::unique_ptr<Intervener>> interveners;
  HookSplices splices;
  for (size_t i = 0; i < saes.size(); ++i) {
    ASSIGN_OR_RETURN(
        interveners.emplace_back(),
        Intervener::Joining(saes[i], removals[i],
                            std::vector<std::vector<float>>(removals[i].size(), {0.0f}), &splices));
  }
  ActivationModel& model = *saes.front().model;
  const at::Tensor tokens =
      at::tensor(prompt, at::TensorOptions().dtype(at::kLong)).view({1, n}).repeat({2, 1});
  for (auto& intervener : interveners) intervener->BeforePass(model, tokens, KeyValueCache());
  at::Tensor value;  // the metric per run, the clean one first
  if (metric.target_latent) {
    const at::Tensor read = TargetInput(
        *target, model.ForwardSpliced(tokens, TargetStops(saes.front(), *target), splices), tokens);
    value = target->sae
                ->LatentValue(read.select(1, metric.target_latent->position).to(at::kFloat),
                              metric.target_latent->latent)
                .to(at::kDouble);
  } else {
    const at::Tensor logits =
        model.PredictNextTokens(tokens, splices, /*losses=*/false).last_logits.to(at::kDouble);
    value = TokenMetric(logits, target_token, metric.contrast_token_id);
  }
  return (value[1] - value[0]).item<double>();
}

}  // namespace latentd::engine
