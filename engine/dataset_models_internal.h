// Private to //engine:dataset_models: what its two implementation files share.
// dataset_models.cc loads, prepares and caches what a dataset was made with (DatasetModels::Impl)
// and answers the queries that only read it (weights, latent scaling, SAE comparison, prompt
// encoding); dataset_interventions.cc answers those that change a forward pass (steering,
// attribution, ablation).
#ifndef LATENTD_ENGINE_DATASET_MODELS_INTERNAL_H_
#define LATENTD_ENGINE_DATASET_MODELS_INTERNAL_H_

#include <torch/script.h>

#include <algorithm>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "engine/activation_model.h"
#include "engine/dataset_models.h"
#include "engine/hook_name.h"
#include "engine/sae.h"
#include "engine/sae_config.h"

namespace latentd::engine {
namespace dataset_models_internal {

inline int64_t TensorBytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * t.element_size() : 0;
}

// An SAE's decoder prepared for cosine queries: one matrix-vector product answers a latent.
struct PreparedSae {
  at::Tensor unit_dec;     // [d_sae, d_in] float32, W_dec rows scaled to norm 1 (0 rows stay 0)
  at::Tensor dec_norm;     // [d_sae]
  at::Tensor enc_norm;     // [d_sae], of W_enc's columns
  at::Tensor enc_dec_cos;  // [d_sae]
  std::optional<CircuitTracerLayer> circuit_tracer;  // the SAE's config says
  // A crosscoder's sources (0 for an SAE): each decoder row is their n blocks side by side.
  int crosscoder_sources = 0;
  std::vector<std::string> crosscoder_hooks;
  std::vector<double> crosscoder_scales;
  int64_t bytes() const {
    return TensorBytes(unit_dec) + TensorBytes(dec_norm) + TensorBytes(enc_norm) +
           TensorBytes(enc_dec_cos);
  }
};

// The map from the hooked activation space to the logits.
struct PreparedUnembedding {
  at::Tensor W_U;  // [vocab, d_resid] float32, contiguous
  // What the hook's width takes to the residual stream: [d_mlp, d_resid] (the MLP's W_out) for
  // mlp.hook_post, [heads * d_head, d_resid] (W_O) for attn.hook_z; undefined otherwise.
  at::Tensor W_out;
  std::string source;
  int64_t bytes() const { return TensorBytes(W_U) + TensorBytes(W_out); }
};

// What a dataset was made from, as its EXTRACT job's spec says.
struct DatasetInputs {
  latentd::v1::ExtractSpec spec;  // the dataset's output of the job
  std::string sae_dir;
  HookName hook;
  // Where the SAE's decoder writes: `hook`, or a transcoder's output hook (the space its
  // decoder directions live in, which the logit tables unembed from).
  HookName decoder_hook;
  // Every hook of the job's outputs, each once, in output order: the model for prompts is built
  // with all of them, since the job's other datasets are likely asked next (--all_hooks).
  std::vector<std::string> job_hooks;
  // A crosscoder's dataset: what it reads together ("blocks.0.hook_resid_post and ...", "stored
  // datasets 7, 8"), which no prompt through one model at one hook gives; "" for an SAE. The
  // hook fields above are then unset (its directions span several hooks)...
  std::string crosscoder_reads;
  // ... and each source's model and hook are here, in source order, for its logits.
  struct SourceModel {
    latentd::v1::ExtractSpec spec;  // the model; hook_name the source's hook
    std::string model_weight_hash;  // as recorded where the source's rows were made
    std::string unknown;            // why the model is not known; "" when it is
  };
  std::vector<SourceModel> crosscoder_models;
};

// A model on the CPU for prompts, built with the hooks of every dataset asked so far whose job
// ran these weights, so that all their prompts (an SAE suite: one per layer, from one job or a
// job per layer) share one copy of the weights; a model per hook would keep n copies, or, past
// the cache budget, reload the model for every dataset of the suite in turn. Forward runs one
// prompt at a time (a TorchScript module is not promised to be reentrant).
struct PromptModel {
  PromptModel(std::unique_ptr<ActivationModel> m, std::vector<std::string> hook_names)
      : model(std::move(m)), hooks(std::move(hook_names)) {}

  // Where `hook` is among the model's hooks; hooks.size() when it is not.
  size_t IndexOf(const std::string& hook) const {
    return std::find(hooks.begin(), hooks.end(), hook) - hooks.begin();
  }

  // Every hook's activations on `tokens` ([1, n] int64): one forward pass, or none when the
  // last call had the same tokens (`latentctl prompt --all_hooks` sends one prompt to each
  // dataset of the job in turn: the suite costs one forward and an encode per SAE).
  std::vector<at::Tensor> HookActivations(const std::vector<int64_t>& tokens) const {
    std::lock_guard<std::mutex> lock(mu);
    if (tokens == last_tokens) return last_activations;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> activations =
        model->ForwardHooks(at::tensor(tokens, at::TensorOptions().dtype(at::kLong)).view({1, -1}));
    int64_t bytes = 0;
    for (const at::Tensor& a : activations) bytes += a.numel() * a.element_size();
    last_tokens = bytes <= kLastPromptActivationBytes ? tokens : std::vector<int64_t>();
    last_activations =
        bytes <= kLastPromptActivationBytes ? activations : std::vector<at::Tensor>();
    return activations;
  }

  // f(model) with the model to itself (a steered prompt runs many forward passes).
  template <typename F>
  auto Locked(F&& f) const {
    std::lock_guard<std::mutex> lock(mu);
    return f(*model);
  }

  // f() with each of `models` to itself: each locked once, all in one order (by address), so
  // that queries running several of the same models cannot deadlock.
  template <typename F>
  static auto LockedAll(std::vector<const PromptModel*> models, F&& f) {
    std::sort(models.begin(), models.end(), std::less<const PromptModel*>());
    models.erase(std::unique(models.begin(), models.end()), models.end());
    std::vector<std::unique_lock<std::mutex>> locks;
    for (const PromptModel* m : models) locks.emplace_back(m->mu);
    return f();
  }

  const std::unique_ptr<ActivationModel> model;
  const std::vector<std::string> hooks;  // what HookActivations returns, in order
  int64_t bytes() const { return model->parameter_bytes() + kLastPromptActivationBytes; }

 private:
  mutable std::mutex mu;  // guards the model's forward and the last prompt
  mutable std::vector<int64_t> last_tokens;
  mutable std::vector<at::Tensor> last_activations;
};

// A dataset's SAE on the CPU, for prompts (encoding is reentrant).
struct PromptSae {
  explicit PromptSae(Sae s) : sae(std::move(s)) {}
  const Sae sae;
  int64_t bytes() const { return sae.weight_bytes(); }
};

// What a steered or attributed prompt runs through: the dataset's model (to itself while
// `run` holds it) and SAE, where the SAE reads and its decoder writes, the prompt as run.
struct InterventionInputs {
  std::shared_ptr<const PromptModel> model;
  std::shared_ptr<const PromptSae> sae;
  SteeringModel steering;  // model unset: Run sets it
  std::vector<int64_t> tokens;
  bool bos_prepended = false;
  latentd::v1::ModelSpec model_spec;  // as the dataset's job ran it (a target must match it)
  // The running model's weight hash as its dataset recorded it ("": not checked); for a
  // crosscoder over models, the running source's.
  std::string model_weight_hash;
  // A crosscoder over models run beside the steered one: every source's model, in its blocks'
  // order (steering.diffed_models' hooks; `model` at the steered source).
  std::vector<std::shared_ptr<const PromptModel>> beside;
  // Other models the run reads (a target crosscoder's over models), locked with these.
  std::vector<std::shared_ptr<const PromptModel>> held_too;

  // `steering` with its models set (to be used under their locks: Run).
  SteeringModel Bound() const {
    SteeringModel out = steering;
    out.model = model->model.get();
    for (size_t s = 0; s < beside.size(); ++s) out.diffed_models[s].model = beside[s]->model.get();
    return out;
  }

  template <typename F>
  auto Run(F&& f) {
    std::vector<const PromptModel*> held = {model.get()};
    for (const auto& m : beside) held.push_back(m.get());
    for (const auto& m : held_too) held.push_back(m.get());
    return PromptModel::LockedAll(held, [&] {
      steering = Bound();
      return f(steering);
    });
  }
};

// An attribution's model and SAE (InterventionInputs) and, for latent targets, the target
// dataset's SAE and the hook it reads.
struct AttributionInputs {
  InterventionInputs in;
  std::shared_ptr<const PromptSae> target_sae;
  std::optional<TargetSae> target;
};

// `dataset` as the model its inputs run: for a crosscoder over several models, with the running
// source's weight hash (what a target or another SAE of the same forward must match).
inline DatasetSource Running(const DatasetSource& dataset, const InterventionInputs& in) {
  DatasetSource out = dataset;
  out.model_weight_hash = in.model_weight_hash;
  return out;
}

// INVALID_ARGUMENT naming token_ids for an empty prompt or one of more than kMaxPromptTokens.
absl::Status CheckPromptLength(const std::vector<int64_t>& ids);

// The prompt as the dataset's sequences ran: BOS first where its spec prepends one.
std::vector<int64_t> AsRun(const std::vector<int64_t>& ids,
                           const latentd::v1::TokenSource& token_spec);

// INVALID_ARGUMENT naming token_ids when the model cannot take the prompt as run (`tokens`).
absl::Status CheckPromptFits(const std::vector<int64_t>& ids, const std::vector<int64_t>& tokens,
                             const ActivationModel& model);

// Whether a dataset's crosscoder reads several models' activations (model diffing): its
// sources' models differ in spec or recorded weights, or one is not known.
bool OverSeveralModels(const DatasetInputs& inputs);

// Whether two datasets run one forward pass: the same model spec and, where both record one, the
// same weight hash (compared so, a model rebuilt with more hooks is still the same model).
bool SameForward(const DatasetSource& a, const latentd::v1::ModelSpec& a_model,
                 const DatasetSource& b, const latentd::v1::ModelSpec& b_model);

// A crosscoder's source `source` as a dataset of its own model: that model's weight hash, and
// inputs whose spec is the source's and whose hooks are every source of the same model (one
// forward pass gives them all). FAILED_PRECONDITION when the source's model is not known.
absl::StatusOr<std::pair<DatasetSource, DatasetInputs>> CrosscoderSourceInputs(
    const DatasetSource& dataset, const DatasetInputs& inputs,
    const DatasetInputs::SourceModel& source);

}  // namespace dataset_models_internal

// The cache of what queries load (models, SAEs, unembeddings: LRU within cache_bytes) and the
// steps the queries share. Its members are defined in dataset_models.cc, those that prepare a
// run that changes a forward pass in dataset_interventions.cc.
struct DatasetModels::Impl {
  using PreparedSae = dataset_models_internal::PreparedSae;
  using PreparedUnembedding = dataset_models_internal::PreparedUnembedding;
  using DatasetInputs = dataset_models_internal::DatasetInputs;
  using PromptModel = dataset_models_internal::PromptModel;
  using PromptSae = dataset_models_internal::PromptSae;
  using InterventionInputs = dataset_models_internal::InterventionInputs;
  using AttributionInputs = dataset_models_internal::AttributionInputs;

  ExtractEnv env;
  DatasetModelsOptions options;

  mutable std::mutex mu;
  struct Entry {
    std::string key;
    std::shared_ptr<const void> value;
    int64_t bytes = 0;
  };
  std::list<Entry> lru;  // most recently used first
  int64_t bytes = 0;

  template <typename T>
  std::shared_ptr<const T> Find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = lru.begin(); it != lru.end(); ++it) {
      if (it->key != key) continue;
      lru.splice(lru.begin(), lru, it);
      return std::static_pointer_cast<const T>(lru.front().value);
    }
    return nullptr;
  }

  template <typename T>
  void Insert(const std::string& key, std::shared_ptr<const T> value, int64_t value_bytes) {
    if (value_bytes > options.cache_bytes) return;
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = lru.begin(); it != lru.end(); ++it) {
      if (it->key == key) {  // a concurrent query prepared it too
        bytes -= it->bytes;
        lru.erase(it);
        break;
      }
    }
    lru.push_front({key, std::move(value), value_bytes});
    bytes += value_bytes;
    while (bytes > options.cache_bytes) {
      bytes -= lru.back().bytes;
      lru.pop_back();
    }
  }

  // The value cached under `key`, else what load() gives (StatusOr<shared_ptr<const T>>), kept
  // unless it is null (nothing to keep, e.g. no unembedding; the caller was told why).
  template <typename T, typename Load>
  absl::StatusOr<std::shared_ptr<const T>> Cached(const std::string& key, Load load) {
    if (auto hit = Find<T>(key)) return hit;
    ASSIGN_OR_RETURN(std::shared_ptr<const T> value, load());
    if (value != nullptr) Insert<T>(key, value, value->bytes());
    return value;
  }

  // The dataset's EXTRACT spec, SAE directory and hook, FAILED_PRECONDITION when the job
  // record or the SAE is gone.
  absl::StatusOr<DatasetInputs> InputsOf(const DatasetSource& dataset) const;
  // RESOURCE_EXHAUSTED when loading the SAE in `dir` would take more than the memory limit.
  absl::Status CheckSaeFits(const DatasetSource& dataset, const std::string& dir) const;
  // The SAE in `dir`, checked against the dataset (hash, d_sae) and the memory limit.
  absl::StatusOr<Sae> LoadSae(const DatasetSource& dataset, const std::string& dir) const;
  // The model (with every hook of the dataset's job, and those of earlier queries on the same
  // weights) and the dataset's SAE on the CPU, cached apart, for EncodePrompt.
  absl::StatusOr<std::shared_ptr<const PromptModel>> ModelFor(const DatasetSource& dataset,
                                                              const DatasetInputs& inputs);
  // A model of `model`'s weights with these hooks, checked against the dataset's model hash.
  absl::StatusOr<std::shared_ptr<const PromptModel>> BuildPromptModel(
      const DatasetSource& dataset, const latentd::v1::ModelSpec& model,
      const std::vector<std::string>& hook_names) const;
  // A dataset encoded from stored activations (ModelSpec.stored): `spec`, naming the first
  // stored dataset, gets the model, hook and BOS handling of the job that stored it, and
  // *model_weight_hash (when not null) the model hash that dataset recorded.
  absl::Status ModelOfStoredSource(const DatasetSource& dataset, latentd::v1::ExtractSpec* spec,
                                   std::string* model_weight_hash) const;
  // The logit tables of `direction` (a decoder direction in `hook`'s space, d values) through
  // the unembedding of `spec`'s model, top_n each way, into *positive / *negative and *source;
  // *unavailable says why there are none.
  absl::Status LogitsOf(const DatasetSource& dataset, const latentd::v1::ExtractSpec& spec,
                        const HookName& hook, at::Tensor direction, int64_t top_n,
                        const std::string& requested, std::vector<ScoredIndex>* positive,
                        std::vector<ScoredIndex>* negative, std::string* source,
                        std::string* unavailable);
  absl::StatusOr<std::shared_ptr<const PromptSae>> PromptSaeFor(const DatasetSource& dataset,
                                                                const std::string& dir);
  // What a steered or attributed prompt runs through: refuses what has no single hook to
  // change (crosscoders, cross-layer transcoders) or no logits (TorchScript), `what`
  // ("steering", "attribution") naming the query. A crosscoder over several models runs as
  // its source `crosscoder_source`'s model (SteeringModel::diffed_source), which must be given
  // for one and only for one.
  absl::StatusOr<InterventionInputs> InterventionInputsFor(
      const DatasetSource& dataset, const std::vector<int64_t>& token_ids, const std::string& what,
      std::optional<int> crosscoder_source = std::nullopt);
  // For a crosscoder over models (`crosscoder` its dataset's inputs) run as its source `steered`
  // (out->model): every source's model and hook into out->beside and
  // out->steering.diffed_models, to run beside it on out->tokens. An error says why they cannot
  // (steering then adds alone, attribution is refused).
  absl::Status ModelsBeside(const DatasetSource& dataset, const DatasetInputs& crosscoder,
                            int steered, const std::vector<int64_t>& token_ids,
                            InterventionInputs* out);
  // For a target latent of a crosscoder over several models (`of_target` its dataset's inputs):
  // the source that is `dataset`'s model, which the attribution's forward runs, and the other
  // models beside it, into out->target (their models held in out->in.held_too).
  // FAILED_PRECONDITION naming target_latent.dataset_id when no source, or several, are that
  // model, or the others cannot run beside it.
  absl::Status DiffedTarget(const DatasetSource& dataset, const DatasetSource& target_dataset,
                            const DatasetInputs& of_target, const std::vector<int64_t>& token_ids,
                            AttributionInputs* out);
  // Host memory a query may take: options.memory_limit_bytes, else what the host has now.
  int64_t MemoryLimitBytes() const {
    return options.memory_limit_bytes > 0 ? options.memory_limit_bytes : HostAvailableMemoryBytes();
  }
  // The intervention inputs of `others` for one run that changes all their SAEs' latents beside
  // `first`'s (`first_in` its inputs): each must run on that model and weights, a crosscoder
  // over several models as its source crosscoder_sources[k] (none past its end). An error of
  // one carries label(k) before it; FAILED_PRECONDITION for one of another model says the run
  // "cannot <cannot>".
  absl::StatusOr<std::vector<InterventionInputs>> InputsOnOneForward(
      const DatasetSource& first, const InterventionInputs& first_in,
      const std::vector<DatasetSource>& others,
      const std::vector<std::optional<int>>& crosscoder_sources,
      const std::vector<int64_t>& token_ids, const std::string& what,
      const std::function<std::string(size_t)>& label, const std::string& cannot);
  // InterventionInputsFor, the target's SAE when `target_dataset` is not null (same model
  // required) and the memory check of the backward pass. `ablate`: the runs of the ablation
  // check (AttributionQuery.ablate), for the memory check; `crosscoder_source` as
  // InterventionInputsFor's.
  absl::StatusOr<AttributionInputs> AttributionInputsFor(
      const DatasetSource& dataset, const std::vector<int64_t>& token_ids,
      const DatasetSource* target_dataset, int ablate,
      std::optional<int> crosscoder_source = std::nullopt);
  absl::StatusOr<std::shared_ptr<const PreparedSae>> SaeFor(const DatasetSource& dataset,
                                                            const std::string& dir);
  // The unembedding, or null with *unavailable saying why there is none.
  absl::StatusOr<std::shared_ptr<const PreparedUnembedding>> UnembeddingFor(
      const DatasetSource& dataset, const latentd::v1::ExtractSpec& spec, const HookName& hook,
      int64_t d_in, const std::string& requested, std::string* unavailable);
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_DATASET_MODELS_INTERNAL_H_
