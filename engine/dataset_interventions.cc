// DatasetModels' queries that change a forward pass: steering, attribution, ablation, and the
// inputs they run through (dataset_models_internal.h).
#include <torch/script.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/dataset_models.h"
#include "engine/dataset_models_internal.h"
#include "engine/hook_name.h"
#include "engine/sae_config.h"
#include "engine/torch_status.h"

namespace latentd::engine {

using dataset_models_internal::AsRun;
using dataset_models_internal::AttributionInputs;
using dataset_models_internal::CheckPromptFits;
using dataset_models_internal::CheckPromptLength;
using dataset_models_internal::CrosscoderSourceInputs;
using dataset_models_internal::DatasetInputs;
using dataset_models_internal::InterventionInputs;
using dataset_models_internal::OverSeveralModels;
using dataset_models_internal::Running;
using dataset_models_internal::SameForward;

absl::StatusOr<InterventionInputs> DatasetModels::Impl::InterventionInputsFor(
    const DatasetSource& dataset, const std::vector<int64_t>& token_ids, const std::string& what,
    std::optional<int> crosscoder_source) {
  RETURN_IF_ERROR(CheckPromptLength(token_ids));
  ASSIGN_OR_RETURN(DatasetInputs inputs, InputsOf(dataset));
  // A crosscoder over hooks of one model runs as that model with all of them. One over several
  // models (model diffing) would need every forward, each changed by the others' latents: it
  // runs one of them, its source crosscoder_source, whose latents are then added alone.
  DatasetSource of_model = dataset;
  std::vector<HookName> sources;
  int diffed_source = -1;
  DatasetInputs crosscoder;  // a crosscoder over models: its dataset's inputs
  if (!inputs.crosscoder_reads.empty()) {
    const std::vector<DatasetInputs::SourceModel>& models = inputs.crosscoder_models;
    for (const DatasetInputs::SourceModel& source : models) {
      RETURN_IF_ERROR(CrosscoderSourceInputs(dataset, inputs, source).status());
    }
    const bool one_model = !OverSeveralModels(inputs);
    const std::string reads =
        absl::StrCat("dataset ", dataset.dataset_id, "'s SAE is a crosscoder over ",
                     one_model ? "hooks of one model" : "several models' activations",
                     " (it reads ", inputs.crosscoder_reads, ")");
    if (one_model && crosscoder_source) {
      return absl::InvalidArgumentError(
          absl::StrCat("crosscoder_source: ", reads, ": ", what,
                       " runs that model with all of them; leave it unset"));
    }
    if (!one_model && !crosscoder_source) {
      return absl::FailedPreconditionError(absl::StrCat(
          reads, ": its latents need every forward pass and write each; ", what, " runs one model",
          what == "steering" || absl::StartsWith(what, "attribution")
              ? ", named by crosscoder_source (SteerPrompt, AttributePrompt, AttributionGraph; "
                "the others run beside it)"
              : " (a crosscoder over hooks of one model works)"));
    }
    const int runs = one_model ? 0 : *crosscoder_source;
    if (runs < 0 || runs >= static_cast<int>(models.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("crosscoder_source: ", runs, " outside [0, ", models.size(), "): ", reads));
    }
    if (one_model) {
      for (const DatasetInputs::SourceModel& source : models) {
        ASSIGN_OR_RETURN(sources.emplace_back(), ParseHookName(source.spec.hook_name()));
      }
    } else {
      diffed_source = runs;
      crosscoder = inputs;
    }
    // The running model's inputs; over one model they hold every source's hook.
    ASSIGN_OR_RETURN(auto of_source, CrosscoderSourceInputs(dataset, inputs, models[runs]));
    ASSIGN_OR_RETURN(of_source.second.hook, ParseHookName(models[runs].spec.hook_name()));
    of_source.second.sae_dir = inputs.sae_dir;
    of_model = std::move(of_source.first);
    inputs = std::move(of_source.second);
  } else if (crosscoder_source) {
    return absl::InvalidArgumentError(
        absl::StrCat("crosscoder_source: dataset ", dataset.dataset_id,
                     "'s SAE is not a crosscoder over several models' activations"));
  }
  if (inputs.spec.model().has_torchscript()) {  // known before loading it
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset ", dataset.dataset_id,
        "'s model is a TorchScript module: it gives its hidden states, not its logits, which ",
        what, " needs (a model run natively, reference or huggingface, has them)"));
  }
  InterventionInputs out;
  out.model_spec = inputs.spec.model();
  out.model_weight_hash = of_model.model_weight_hash;
  ASSIGN_OR_RETURN(out.sae, PromptSaeFor(dataset, inputs.sae_dir));
  const SaeConfig& cfg = out.sae->sae.config();
  ASSIGN_OR_RETURN(out.model, ModelFor(of_model, inputs));
  out.tokens = AsRun(token_ids, inputs.spec.tokens());
  out.bos_prepended = out.tokens.size() > token_ids.size();
  RETURN_IF_ERROR(CheckPromptFits(token_ids, out.tokens, *out.model->model));
  out.steering = {nullptr, &out.sae->sae, inputs.hook, std::nullopt, "", sources, diffed_source};
  if (cfg.circuit_tracer && cfg.circuit_tracer->cross_layer) {
    // Its latents write the output of every later layer of the release, which must be the
    // model's.
    const int blocks = out.model->model->num_blocks();
    if (cfg.circuit_tracer->n_layers > blocks) {
      return absl::FailedPreconditionError(absl::StrCat(
          "dataset ", dataset.dataset_id, "'s SAE is layer ", cfg.circuit_tracer->layer,
          " of a cross-layer transcoder of ", cfg.circuit_tracer->n_layers,
          " layers, whose latents write every layer from it on; the model has ", blocks,
          " blocks"));
    }
    out.steering.cross_layer_dir = inputs.sae_dir;
  }
  if (diffed_source >= 0) {
    if (absl::Status beside = ModelsBeside(dataset, crosscoder, diffed_source, token_ids, &out);
        !beside.ok()) {
      out.beside.clear();
      out.steering.diffed_models.clear();
      out.steering.diffed_alone = std::string(beside.message());
    }
  }
  if (cfg.transcoder) {
    // As EXTRACT found it (datasets record it; the SAE's config says it for older ones).
    ASSIGN_OR_RETURN(const std::string hook_out, TranscoderOutputHook(cfg, inputs.hook));
    ASSIGN_OR_RETURN(
        out.steering.hook_out,
        ParseHookName(dataset.hook_name_out.empty() ? hook_out : dataset.hook_name_out));
  }
  return out;
}

absl::Status DatasetModels::Impl::ModelsBeside(const DatasetSource& dataset,
                                               const DatasetInputs& crosscoder, int steered,
                                               const std::vector<int64_t>& token_ids,
                                               InterventionInputs* out) {
  const std::vector<DatasetInputs::SourceModel>& models = crosscoder.crosscoder_models;
  for (size_t s = 0; s < models.size(); ++s) {
    ASSIGN_OR_RETURN(HookName hook, ParseHookName(models[s].spec.hook_name()));
    std::shared_ptr<const PromptModel> model = out->model;
    if (static_cast<int>(s) != steered) {
      ASSIGN_OR_RETURN(auto of_source, CrosscoderSourceInputs(dataset, crosscoder, models[s]));
      absl::StatusOr<std::shared_ptr<const PromptModel>> loaded =
          ModelFor(of_source.first, of_source.second);
      if (!loaded.ok()) {
        return absl::Status(loaded.status().code(),
                            absl::StrCat("source ", s, "'s model: ", loaded.status().message()));
      }
      model = *std::move(loaded);
      if (const std::string why = model->model->next_token_loss_unsupported(); !why.empty()) {
        return absl::FailedPreconditionError(absl::StrCat("source ", s, "'s model: ", why));
      }
      if (AsRun(token_ids, models[s].spec.tokens()) != out->tokens) {
        return absl::FailedPreconditionError(absl::StrCat(
            "source ", s, "'s model runs the prompt with another BOS than the steered one's"));
      }
      if (absl::Status fits = CheckPromptFits(token_ids, out->tokens, *model->model); !fits.ok()) {
        return absl::Status(fits.code(), absl::StrCat("source ", s, "'s model: ", fits.message()));
      }
    }
    out->beside.push_back(std::move(model));
    out->steering.diffed_models.push_back({nullptr, hook});
  }
  return absl::OkStatus();
}

absl::Status DatasetModels::Impl::DiffedTarget(const DatasetSource& dataset,
                                               const DatasetSource& target_dataset,
                                               const DatasetInputs& of_target,
                                               const std::vector<int64_t>& token_ids,
                                               AttributionInputs* out) {
  const std::vector<DatasetInputs::SourceModel>& models = of_target.crosscoder_models;
  const std::string what =
      absl::StrCat("target_latent.dataset_id: dataset ", target_dataset.dataset_id,
                   "'s SAE is a crosscoder over several models' activations (it reads ",
                   of_target.crosscoder_reads, ")");
  int running = -1;
  for (size_t s = 0; s < models.size(); ++s) {
    DatasetSource as_source = target_dataset;
    as_source.model_weight_hash = models[s].model_weight_hash;
    if (!models[s].unknown.empty() ||
        !SameForward(dataset, out->in.model_spec, as_source, models[s].spec.model())) {
      continue;
    }
    if (running >= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": its sources ", running, " and ", s, " are both dataset ",
                       dataset.dataset_id, "'s model, which a target reads at one source"));
    }
    running = static_cast<int>(s);
  }
  if (running < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ", none of them dataset ", dataset.dataset_id,
        "'s model (or its weights): the forward runs that model, one of the crosscoder's"));
  }
  ASSIGN_OR_RETURN(out->target_sae, PromptSaeFor(target_dataset, of_target.sae_dir));
  InterventionInputs beside;
  beside.model = out->in.model;
  beside.tokens = out->in.tokens;
  if (absl::Status ran = ModelsBeside(target_dataset, of_target, running, token_ids, &beside);
      !ran.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": its other models cannot run beside dataset ", dataset.dataset_id,
                     "'s (", ran.message(), ")"));
  }
  ASSIGN_OR_RETURN(const HookName hook, ParseHookName(models[running].spec.hook_name()));
  TargetSae target{&out->target_sae->sae, hook};
  target.diffed_source = running;
  target.diffed_models = beside.Bound().diffed_models;
  out->target = std::move(target);
  out->in.held_too = std::move(beside.beside);
  return absl::OkStatus();
}

absl::StatusOr<SteeringResult> DatasetModels::SteerPrompt(
    const DatasetSource& dataset, const SteeringQuery& query,
    const std::function<bool()>& cancelled,
    const std::vector<std::pair<DatasetSource, std::vector<LatentIntervention>>>& more) {
  try {
    ASSIGN_OR_RETURN(InterventionInputs in,
                     impl_->InterventionInputsFor(dataset, query.token_ids, "steering",
                                                  query.crosscoder_source));
    std::vector<DatasetSource> more_datasets;
    for (const auto& [other, interventions] : more) more_datasets.push_back(other);
    ASSIGN_OR_RETURN(
        std::vector<InterventionInputs> others,
        impl_->InputsOnOneForward(
            dataset, in, more_datasets, {}, query.token_ids, "steering",
            [](size_t k) { return absl::StrCat("more_interventions[", k, "]: "); }, "steer both"));
    return in.Run([&](const SteeringModel& steering) {
      std::vector<MoreInterventions> also;
      for (size_t k = 0; k < others.size(); ++k) {
        also.push_back({others[k].steering, more[k].second});
        also.back().sae.model = steering.model;
      }
      return engine::SteerPrompt(steering, in.tokens, in.bos_prepended, query, cancelled, also);
    });
  } catch (const c10::Error& e) {
    return TorchErrorStatus(
        e, absl::StrCat("steering a prompt with dataset ", dataset.dataset_id, "'s model and SAE"));
  }
}

absl::StatusOr<std::vector<InterventionInputs>> DatasetModels::Impl::InputsOnOneForward(
    const DatasetSource& first, const InterventionInputs& first_in,
    const std::vector<DatasetSource>& others,
    const std::vector<std::optional<int>>& crosscoder_sources,
    const std::vector<int64_t>& token_ids, const std::string& what,
    const std::function<std::string(size_t)>& label, const std::string& cannot) {
  std::vector<InterventionInputs> out;
  for (size_t k = 0; k < others.size(); ++k) {
    absl::StatusOr<InterventionInputs> in =
        InterventionInputsFor(others[k], token_ids, what,
                              k < crosscoder_sources.size() ? crosscoder_sources[k] : std::nullopt);
    if (!in.ok()) {
      return absl::Status(in.status().code(), absl::StrCat(label(k), in.status().message()));
    }
    if (!SameForward(Running(others[k], *in), in->model_spec, Running(first, first_in),
                     first_in.model_spec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          label(k), "dataset ", others[k].dataset_id, " was made with another model than dataset ",
          first.dataset_id, " (or other weights): one run cannot ", cannot));
    }
    out.push_back(*std::move(in));
  }
  return out;
}

absl::StatusOr<AttributionInputs> DatasetModels::Impl::AttributionInputsFor(
    const DatasetSource& dataset, const std::vector<int64_t>& token_ids,
    const DatasetSource* target_dataset, int ablate, std::optional<int> crosscoder_source) {
  AttributionInputs out;
  ASSIGN_OR_RETURN(
      out.in,
      InterventionInputsFor(dataset, token_ids,
                            target_dataset != nullptr ? "attribution to a latent" : "attribution",
                            crosscoder_source));
  // A target latent's dataset: its SAE, reading its hook of the same model (for a crosscoder
  // over models, of the source that runs).
  const DatasetSource running = Running(dataset, out.in);
  if (target_dataset != nullptr) {
    absl::StatusOr<DatasetInputs> inputs_of_target = InputsOf(*target_dataset);
    if (!inputs_of_target.ok()) {
      return absl::Status(
          inputs_of_target.status().code(),
          absl::StrCat("target_latent.dataset_id: ", inputs_of_target.status().message()));
    }
    const DatasetInputs& of_target = *inputs_of_target;
    const uint64_t id = target_dataset->dataset_id;
    // A crosscoder over hooks of this model reads them side by side; one over several models
    // (model diffing) reads this forward's model at one source, the others beside it.
    if (OverSeveralModels(of_target)) {
      RETURN_IF_ERROR(DiffedTarget(running, *target_dataset, of_target, token_ids, &out));
    } else {
      std::vector<HookName> sources;
      for (const DatasetInputs::SourceModel& source : of_target.crosscoder_models) {
        ASSIGN_OR_RETURN(const HookName hook, ParseHookName(source.spec.hook_name()));
        sources.push_back(hook);
      }
      const latentd::v1::ModelSpec& target_model =
          of_target.crosscoder_models.empty() ? of_target.spec.model()
                                              : of_target.crosscoder_models[0].spec.model();
      if (!SameForward(running, out.in.model_spec, *target_dataset, target_model)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "target_latent.dataset_id: dataset ", id, " was made with another model than dataset ",
            dataset.dataset_id, " (or other weights): the target must read the same forward pass"));
      }
      ASSIGN_OR_RETURN(out.target_sae, PromptSaeFor(*target_dataset, of_target.sae_dir));
      out.target =
          TargetSae{&out.target_sae->sae, sources.empty() ? of_target.hook : sources[0], sources};
    }
  }
  // The backward pass keeps every block's activations of the whole prompt, the ablation check a
  // block's of 1 + ablate runs: refused with the numbers rather than an allocation that could
  // take the daemon down.
  const ActivationModel& model = *out.in.model->model;
  const int64_t n = static_cast<int64_t>(out.in.tokens.size());
  // (An ablate out of range is the engine's INVALID_ARGUMENT, not a memory refusal.)
  ablate = std::clamp(ablate, 0, kMaxAblatedEntries);
  const int64_t need = std::max<int64_t>({model.num_blocks(), 1, 1 + int64_t{ablate}}) *
                       model.activation_bytes_per_token(n) * n;
  const int64_t limit = MemoryLimitBytes();
  if (limit > 0 && need > limit) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "token_ids: attributing a prompt of %d tokens keeps about %.3g GB of activations for "
        "the backward pass (%d blocks)%s; %.3g GB are available: send a shorter prompt",
        n, need / 1e9, model.num_blocks(),
        1 + ablate > model.num_blocks() ? absl::StrCat(" or the ablation check (", 1 + ablate,
                                                       " runs: ask for fewer with ablate)")
                                        : "",
        limit / 1e9));
  }
  return out;
}

absl::StatusOr<AttributionResult> DatasetModels::AttributePrompt(
    const DatasetSource& dataset, const AttributionQuery& query,
    const DatasetSource* target_dataset) {
  try {
    if (query.target_latent && target_dataset == nullptr) {
      return absl::InvalidArgumentError("target_latent.dataset_id: not given");
    }
    ASSIGN_OR_RETURN(AttributionInputs a,
                     impl_->AttributionInputsFor(dataset, query.token_ids,
                                                 query.target_latent ? target_dataset : nullptr,
                                                 query.ablate, query.crosscoder_source));
    return a.in.Run([&](const SteeringModel& steering) {
      return engine::AttributePrompt(steering, a.in.tokens, a.in.bos_prepended, query,
                                     a.target ? &*a.target : nullptr);
    });
  } catch (const c10::Error& e) {
    return TorchErrorStatus(e, absl::StrCat("attributing a prompt with dataset ",
                                            dataset.dataset_id, "'s model and SAE"));
  }
}

absl::StatusOr<std::vector<absl::StatusOr<AttributionResult>>> DatasetModels::AttributeToLatents(
    const DatasetSource& dataset, const AttributionQuery& query,
    const DatasetSource& target_dataset, const std::vector<TargetLatent>& targets) {
  try {
    ASSIGN_OR_RETURN(AttributionInputs a,
                     impl_->AttributionInputsFor(dataset, query.token_ids, &target_dataset,
                                                 query.ablate, query.crosscoder_source));
    return a.in.Run([&](const SteeringModel& steering) {
      return engine::AttributeToLatents(steering, a.in.tokens, a.in.bos_prepended, query, *a.target,
                                        targets);
    });
  } catch (const c10::Error& e) {
    return TorchErrorStatus(
        e, absl::StrCat("attributing latents of dataset ", target_dataset.dataset_id,
                        " to dataset ", dataset.dataset_id, "'s"));
  }
}

absl::StatusOr<bool> DatasetModels::ReadsSeveralModels(const DatasetSource& dataset) {
  ASSIGN_OR_RETURN(const DatasetInputs inputs, impl_->InputsOf(dataset));
  return OverSeveralModels(inputs);
}

absl::StatusOr<double> DatasetModels::AblateTogether(
    const std::vector<DatasetSource>& datasets,
    const std::vector<std::vector<TargetLatent>>& removed, const AttributionQuery& metric,
    int64_t target_token, const DatasetSource* target_dataset,
    const std::vector<std::optional<int>>& crosscoder_sources) {
  try {
    if (datasets.empty() || datasets.size() != removed.size()) {
      return absl::InvalidArgumentError("datasets: one list of removals per dataset");
    }
    if (crosscoder_sources.size() > datasets.size()) {
      return absl::InvalidArgumentError("crosscoder_sources: more than one per dataset");
    }
    std::vector<std::optional<int>> sources = crosscoder_sources;
    sources.resize(datasets.size());
    // The first dataset's inputs with the target's SAE; the others' SAEs on the same model.
    ASSIGN_OR_RETURN(AttributionInputs first,
                     impl_->AttributionInputsFor(datasets[0], metric.token_ids,
                                                 metric.target_latent ? target_dataset : nullptr, 0,
                                                 sources[0]));
    ASSIGN_OR_RETURN(
        std::vector<InterventionInputs> others,
        impl_->InputsOnOneForward(
            datasets[0], first.in, std::vector<DatasetSource>(datasets.begin() + 1, datasets.end()),
            std::vector<std::optional<int>>(sources.begin() + 1, sources.end()), metric.token_ids,
            "ablation", [](size_t) { return std::string(); }, "take their latents out"));
    // The models beside the others' crosscoders over models run under the same locks.
    for (const InterventionInputs& in : others) {
      first.in.held_too.insert(first.in.held_too.end(), in.beside.begin(), in.beside.end());
    }
    return first.in.Run([&](const SteeringModel& steering) -> absl::StatusOr<double> {
      std::vector<SteeringModel> saes = {steering};
      for (const InterventionInputs& in : others) {
        saes.push_back(in.Bound());
        saes.back().model = steering.model;
      }
      return engine::AblateTogether(saes, removed, first.in.tokens, metric, target_token,
                                    first.target ? &*first.target : nullptr);
    });
  } catch (const c10::Error& e) {
    return TorchErrorStatus(e, "taking latents of several datasets out of one run");
  }
}

}  // namespace latentd::engine
