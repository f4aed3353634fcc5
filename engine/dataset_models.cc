#include "engine/dataset_models.h"

#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "engine/gpt2_model.h"
#include "engine/hf_model.h"
#include "engine/hook_name.h"
#include "engine/reference_model.h"
#include "engine/sae.h"
#include "engine/sae_config.h"
#include "engine/torch_status.h"
#include "engine/torchscript_model.h"

namespace latentd::engine {
namespace {

constexpr int kDefaultTopN = 10;

int64_t TensorBytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

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
DatasetSource Running(const DatasetSource& dataset, const InterventionInputs& in) {
  DatasetSource out = dataset;
  out.model_weight_hash = in.model_weight_hash;
  return out;
}

// num / den where den > 0, else 0 (a zero decoder row has no direction).
at::Tensor SafeDivide(const at::Tensor& num, const at::Tensor& den) {
  return at::where(den > 0, num / den.clamp_min(std::numeric_limits<float>::min()),
                   at::zeros_like(num));
}

// The hook a dataset's rows were read at, which picks the layer of a circuit-tracer release;
// nullopt when not recorded (or not a hook name), which every other layout does without.
std::optional<HookName> HookOf(const DatasetSource& dataset) {
  absl::StatusOr<HookName> hook = ParseHookName(dataset.hook_name);
  return hook.ok() ? std::optional<HookName>(*hook) : std::nullopt;
}

PreparedSae Prepare(const Sae& sae) {
  const SaeWeights& w = sae.weights();
  PreparedSae p;
  p.circuit_tracer = sae.config().circuit_tracer;
  p.crosscoder_sources = sae.config().crosscoder_sources;
  p.crosscoder_hooks = sae.config().crosscoder_hooks;
  p.crosscoder_scales = sae.config().crosscoder_scales;
  p.dec_norm = w.W_dec.norm(2, {1});
  p.unit_dec = SafeDivide(w.W_dec, p.dec_norm.unsqueeze(1)).contiguous();
  p.enc_norm = w.W_enc.norm(2, {0});
  if (sae.config().transcoder) {
    // Its encoder reads one hook and its decoder writes another: no angle between them means
    // anything, whatever the widths.
    p.enc_dec_cos = at::zeros_like(p.enc_norm);
  } else {
    const at::Tensor dot = (w.W_enc.t() * w.W_dec).sum({1});
    p.enc_dec_cos = SafeDivide(dot, p.enc_norm * p.dec_norm);
  }
  return p;
}

// A crosscoder latent's decoder split by source: `blocks` [n, d] is its decoder row as the n
// sources' blocks (the saved file's units); norms and shares at the training scale.
std::vector<SourceDecoder> DecoderBySource(const PreparedSae& sae, const at::Tensor& blocks) {
  const at::Tensor b = blocks.to(at::kDouble);
  const at::Tensor block_norms = b.norm(2, {1});  // [n], in the file's units
  at::Tensor norms = block_norms;
  if (static_cast<int64_t>(sae.crosscoder_scales.size()) == b.size(0)) {
    norms = norms * at::tensor(sae.crosscoder_scales, at::kDouble);
  }
  // cos(block s, block 0), 0 where either is 0.
  const at::Tensor cosines = SafeDivide(b.mv(b[0]), block_norms * block_norms[0]).contiguous();
  const double total = norms.sum().item<double>();
  std::vector<SourceDecoder> out(b.size(0));
  for (int64_t s = 0; s < b.size(0); ++s) {
    SourceDecoder& d = out[s];
    if (s < static_cast<int64_t>(sae.crosscoder_hooks.size()))
      d.hook_name = sae.crosscoder_hooks[s];
    d.norm = static_cast<float>(norms[s].item<double>());
    d.share = total > 0 ? static_cast<float>(norms[s].item<double>() / total) : 0.0f;
    d.cosine_with_first = static_cast<float>(cosines[s].item<double>());
  }
  return out;
}

// The `n` largest entries of scores (a float32 vector), score descending and index ascending
// among equal scores; `skip` (when >= 0) is left out.
std::vector<ScoredIndex> Largest(at::Tensor scores, int64_t n, int64_t skip, bool ascending) {
  if (ascending) scores = -scores;
  if (skip >= 0) {
    scores = scores.clone();
    scores[skip].fill_(-std::numeric_limits<float>::infinity());
  }
  n = std::min<int64_t>(n, scores.numel() - (skip >= 0 ? 1 : 0));
  std::vector<ScoredIndex> out;
  if (n <= 0) return out;
  auto [values, indices] = at::topk(scores, n);
  const float* v = values.data_ptr<float>();
  const int64_t* i = indices.data_ptr<int64_t>();
  out.reserve(n);
  for (int64_t r = 0; r < n; ++r) out.push_back({i[r], ascending ? -v[r] : v[r]});
  std::stable_sort(out.begin(), out.end(), [ascending](const ScoredIndex& a, const ScoredIndex& b) {
    if (a.score != b.score) return ascending ? a.score < b.score : a.score > b.score;
    return a.index < b.index;
  });
  return out;
}

// A parameter read as an unembedding [vocab, d]: [vocab, d] as stored, or transposed when only
// [d, vocab] fits; INVALID_ARGUMENT saying why when neither does.
absl::StatusOr<at::Tensor> AsUnembedding(const std::string& name, const at::Tensor& t, int64_t d) {
  if (t.dim() == 2 && t.size(1) == d) return t.to(at::kFloat).contiguous();
  if (t.dim() == 2 && t.size(0) == d) return t.to(at::kFloat).t().contiguous();
  return absl::InvalidArgumentError(absl::StrCat("unembedding: parameter ", name, " has shape ",
                                                 c10::str(t.sizes()), ", no dimension is ", d,
                                                 ", the width the SAE's directions live in"));
}

// How to load the Hugging Face model a dataset was made with, within `memory_limit_bytes` (0:
// what the host has); FAILED_PRECONDITION when its directory is no longer under a data root.
absl::StatusOr<HfModelOptions> HfOptions(const ExtractEnv& env, const DatasetSource& dataset,
                                         const latentd::v1::HuggingFaceModelSpec& spec,
                                         int64_t memory_limit_bytes) {
  auto dir = ResolveUnderRoots(spec.path(), env, "extract.model.huggingface.path");
  if (!dir.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset ", dataset.dataset_id, "'s model is not readable: ", dir.status().message()));
  }
  HfModelOptions options;
  options.dir = *dir;
  options.center_writing_weights = spec.center_writing_weights();
  options.bfloat16 = spec.dtype() == latentd::v1::BFLOAT16;
  options.host_memory_limit_bytes = memory_limit_bytes;
  return options;
}

// The hook of an unembedding's cache key (the decoder's hook: a transcoder's differs from the
// spec's hook_name).
std::string HookKey(const HookName& hook) {
  return absl::StrCat(hook.layer, ".", static_cast<int>(hook.point));
}

// The unembedding of a natively run model (the reference one or a Hugging Face checkpoint):
// unembed.W_U, or embed.W_E where it is tied, after the hooked block's W_out for mlp.hook_post
// (its W_O for attn.hook_z);
// null with *unavailable saying why when its weights are not those the dataset was made with.
absl::StatusOr<std::shared_ptr<const PreparedUnembedding>> NativeUnembedding(
    const DatasetSource& dataset, std::unique_ptr<ActivationModel> model, const HookName& hook,
    std::string* unavailable) {
  if (!dataset.model_weight_hash.empty() && model->weight_hash() != dataset.model_weight_hash) {
    *unavailable =
        absl::StrCat("the model's weights (", model->model_id(), ") hash to ", model->weight_hash(),
                     ", the dataset recorded ", dataset.model_weight_hash);
    return nullptr;
  }
  auto prepared = std::make_shared<PreparedUnembedding>();
  const std::string w_out =
      hook.point == HookPoint::kMlpPost ? absl::StrCat("blocks.", hook.layer, ".mlp.W_out")
      : hook.point == HookPoint::kAttnZ ? absl::StrCat("blocks.", hook.layer, ".attn.W_O")
                                        : "";
  std::string unembedding = "embed.W_E (tied)";
  for (const auto& [name, tensor] : model->NamedWeights()) {
    // float32 for the queries (a bfloat16 model's weights are widened here, only these).
    if (name == "embed.W_E" && !prepared->W_U.defined()) {
      prepared->W_U = tensor.to(at::kFloat).contiguous();
    }
    if (name == "unembed.W_U") {
      prepared->W_U = tensor.to(at::kFloat).contiguous();
      unembedding = name;
    }
    if (!w_out.empty() && name == w_out) prepared->W_out = tensor.to(at::kFloat).contiguous();
  }
  prepared->source = w_out.empty() ? unembedding : absl::StrCat(w_out, " then ", unembedding);
  return prepared;
}

// The unembedding parameter of the TorchScript module at `path`: `requested`, else the first of
// kUnembeddingCandidates it has; null with *unavailable saying why when there is none that fits
// (INVALID_ARGUMENT when the requested one is absent or does not fit).
absl::StatusOr<std::shared_ptr<const PreparedUnembedding>> TorchScriptUnembedding(
    const std::string& path, const std::string& requested, int64_t d_in, std::string* unavailable) {
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, at::Device(at::kCPU));
  } catch (const c10::Error& e) {
    *unavailable = absl::StrCat("the model ", path, " does not load: ", e.what_without_backtrace());
    return nullptr;
  }
  std::map<std::string, at::Tensor> parameters;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) parameters[p.name] = p.value;
  for (const auto& b : module.named_buffers(/*recurse=*/true)) parameters.emplace(b.name, b.value);
  std::string name = requested;
  if (name.empty()) {
    for (const char* candidate : kUnembeddingCandidates) {
      if (parameters.count(candidate) != 0) {
        name = candidate;
        break;
      }
    }
    if (name.empty()) {
      *unavailable =
          "the model has none of the usual unembedding parameters; name one with `unembedding`";
      return nullptr;
    }
  } else if (parameters.count(name) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unembedding: the model ", path, " has no parameter ", name));
  }
  auto W_U = AsUnembedding(name, parameters[name].detach(), d_in);
  if (!W_U.ok()) {
    if (!requested.empty()) return W_U.status();
    *unavailable = std::string(W_U.status().message());
    return nullptr;
  }
  auto prepared = std::make_shared<PreparedUnembedding>();
  prepared->W_U = *std::move(W_U);
  const bool tied = std::find(std::begin(kTiedEmbeddings), std::end(kTiedEmbeddings), name) !=
                    std::end(kTiedEmbeddings);
  prepared->source = tied ? absl::StrCat(name, " (tied)") : name;
  return prepared;
}

}  // namespace

struct DatasetModels::Impl {
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

absl::Status DatasetModels::Impl::ModelOfStoredSource(const DatasetSource& dataset,
                                                      latentd::v1::ExtractSpec* spec,
                                                      std::string* model_weight_hash) const {
  const auto& ids = spec->model().stored().dataset_ids();
  auto gone = [&](const absl::Status& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", dataset.dataset_id, " encodes the activations of dataset ", ids[0],
                     ", whose model is not known: ", why.message()));
  };
  if (!env.open_stored_dense) return gone(absl::FailedPreconditionError("no store"));
  auto source = env.open_stored_dense(ids[0], "extract.model.stored.dataset_ids[0]");
  if (!source.ok()) return gone(source.status());
  const StoredDenseInfo& info = (*source)->info();
  auto job = env.find_job(info.job_id);
  if (!job.ok()) return gone(job.status());
  // The job that stored the activations ran the model (a DENSE job never reads stored ones), on
  // sequences that began with BOS when its spec said so: a prompt gets what those rows got.
  const latentd::v1::ExtractSpec& stored_by = job->spec().extract();
  *spec->mutable_model() = stored_by.model();
  spec->set_hook_name(info.hook_name);
  spec->mutable_tokens()->set_prepend_bos(stored_by.tokens().prepend_bos());
  spec->mutable_tokens()->set_bos_token_id(stored_by.tokens().bos_token_id());
  if (model_weight_hash != nullptr) *model_weight_hash = info.model_weight_hash;
  return absl::OkStatus();
}

absl::StatusOr<DatasetInputs> DatasetModels::Impl::InputsOf(const DatasetSource& dataset) const {
  if (!env.find_job) return absl::FailedPreconditionError("the daemon keeps no job records");
  auto job = env.find_job(dataset.job_id);
  if (!job.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset ", dataset.dataset_id, ": the record of job ", dataset.job_id,
        " that wrote it, which names its SAE and model, is gone (", job.status().message(), ")"));
  }
  DatasetInputs inputs;
  const latentd::v1::ExtractSpec& job_spec = job->spec().extract();
  int output = 0;
  if (job_spec.more_outputs_size() > 0 && !dataset.name.empty()) {
    auto names = ExtractDatasetNamesFor(job_spec, env, dataset.job_id);
    if (!names.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("dataset ", dataset.dataset_id, ": cannot tell which output of job ",
                       dataset.job_id, " wrote it (", names.status().message(), ")"));
    }
    output =
        static_cast<int>(std::find(names->begin(), names->end(), dataset.name) - names->begin());
    if (output == static_cast<int>(names->size())) {
      return absl::FailedPreconditionError(absl::StrCat("dataset ", dataset.dataset_id, " (",
                                                        dataset.name, ") is none of job ",
                                                        dataset.job_id, "'s outputs"));
    }
  }
  inputs.spec = ExtractOutputSpec(job_spec, output);
  if (!job->spec().has_extract() || !inputs.spec.has_sae() ||
      inputs.spec.sae().source_case() == latentd::v1::SaeSource::SOURCE_NOT_SET) {
    return absl::FailedPreconditionError(absl::StrCat("dataset ", dataset.dataset_id, ": job ",
                                                      dataset.job_id,
                                                      " is not an EXTRACT job with an SAE"));
  }
  if (inputs.spec.crosscoder_hooks_size() > 0) {
    inputs.crosscoder_reads = absl::StrCat(inputs.spec.hook_name(), " and ",
                                           absl::StrJoin(inputs.spec.crosscoder_hooks(), ", "));
    std::vector<std::string> hooks = {inputs.spec.hook_name()};
    hooks.insert(hooks.end(), inputs.spec.crosscoder_hooks().begin(),
                 inputs.spec.crosscoder_hooks().end());
    for (const std::string& hook : hooks) {
      DatasetInputs::SourceModel& source = inputs.crosscoder_models.emplace_back();
      source.spec = inputs.spec;
      source.spec.set_hook_name(hook);
      source.model_weight_hash = dataset.model_weight_hash;
    }
  } else if (inputs.spec.model().stored().dataset_ids_size() > 1) {
    inputs.crosscoder_reads = absl::StrCat(
        "stored datasets ", absl::StrJoin(inputs.spec.model().stored().dataset_ids(), ", "));
    for (const uint64_t id : inputs.spec.model().stored().dataset_ids()) {
      DatasetInputs::SourceModel& source = inputs.crosscoder_models.emplace_back();
      source.spec.mutable_model()->mutable_stored()->add_dataset_ids(id);
      const absl::Status known =
          ModelOfStoredSource(dataset, &source.spec, &source.model_weight_hash);
      if (!known.ok()) source.unknown = std::string(known.message());
    }
  } else if (inputs.spec.model().has_stored()) {
    RETURN_IF_ERROR(ModelOfStoredSource(dataset, &inputs.spec, nullptr));
  }
  auto dir = ResolveSaeDir(inputs.spec, env);
  if (!dir.ok()) {
    // The dataset exists; its SAE file or artifact was deleted since: a state, not a bad name.
    const absl::StatusCode code = dir.status().code() == absl::StatusCode::kNotFound
                                      ? absl::StatusCode::kFailedPrecondition
                                      : dir.status().code();
    return absl::Status(code, absl::StrCat("dataset ", dataset.dataset_id,
                                           "'s SAE is not readable: ", dir.status().message()));
  }
  inputs.sae_dir = *std::move(dir);
  if (!inputs.crosscoder_reads.empty()) return inputs;
  ASSIGN_OR_RETURN(inputs.hook, ParseHookName(inputs.spec.hook_name()));
  inputs.decoder_hook = inputs.hook;
  if (!dataset.hook_name_out.empty()) {
    ASSIGN_OR_RETURN(inputs.decoder_hook, ParseHookName(dataset.hook_name_out));
  }
  for (int i = 0; i < ExtractOutputCount(job_spec); ++i) {
    const std::string hook =
        i == output ? inputs.spec.hook_name() : ExtractOutputSpec(job_spec, i).hook_name();
    // (Over stored activations the other outputs may leave the datasets' hook unnamed.)
    if (!hook.empty() && std::find(inputs.job_hooks.begin(), inputs.job_hooks.end(), hook) ==
                             inputs.job_hooks.end()) {
      inputs.job_hooks.push_back(hook);
    }
  }
  return inputs;
}

absl::StatusOr<std::shared_ptr<const PromptModel>> DatasetModels::Impl::ModelFor(
    const DatasetSource& dataset, const DatasetInputs& inputs) {
  const latentd::v1::ModelSpec& model = inputs.spec.model();
  const std::string key =
      absl::StrCat("model\n", model.SerializeAsString(), "\n", dataset.model_weight_hash);
  std::vector<std::string> hook_names;
  if (std::shared_ptr<const PromptModel> cached = Find<PromptModel>(key)) {
    hook_names = cached->hooks;
    for (const std::string& hook : inputs.job_hooks) {
      if (cached->IndexOf(hook) == hook_names.size()) hook_names.push_back(hook);
    }
    if (hook_names.size() == cached->hooks.size()) return cached;
    // A dataset of another job of the same weights, at a hook the model lacks: it is rebuilt with
    // the hooks of both, and replaces the cached one (queries holding the old one finish on it).
  } else {
    hook_names = inputs.job_hooks;
  }
  auto built = BuildPromptModel(dataset, model, hook_names);
  if (built.ok()) Insert<PromptModel>(key, *built, (*built)->bytes());
  return built;
}

absl::StatusOr<std::shared_ptr<const PromptModel>> DatasetModels::Impl::BuildPromptModel(
    const DatasetSource& dataset, const latentd::v1::ModelSpec& model,
    const std::vector<std::string>& hook_names) const {
  std::vector<HookName> hooks;
  for (const std::string& name : hook_names) {
    ASSIGN_OR_RETURN(HookName hook, ParseHookName(name));
    hooks.push_back(hook);
  }
  const at::Device cpu(at::kCPU);
  std::unique_ptr<ActivationModel> activations;
  if (model.has_reference()) {
    ASSIGN_OR_RETURN(activations, CreateReferenceModel(model.reference(), hooks, cpu));
  } else if (model.has_huggingface()) {
    ASSIGN_OR_RETURN(HfModelOptions hf,
                     HfOptions(env, dataset, model.huggingface(), options.memory_limit_bytes));
    ASSIGN_OR_RETURN(activations, LoadHfModel(hf, hooks, cpu));
  } else if (model.has_torchscript()) {
    auto path =
        ResolveUnderRoots(model.torchscript().path(), env, "extract.model.torchscript.path");
    if (!path.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "dataset ", dataset.dataset_id, "'s model is not readable: ", path.status().message()));
    }
    ASSIGN_OR_RETURN(activations,
                     LoadTorchScriptModel({*path, model.torchscript().vocab_size()}, hooks, cpu));
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", dataset.dataset_id, ": its job's spec names no model"));
  }
  if (!dataset.model_weight_hash.empty() &&
      activations->weight_hash() != dataset.model_weight_hash) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset ", dataset.dataset_id, ": the model changed since the dataset was made (",
        activations->weight_hash(), ", recorded ", dataset.model_weight_hash, ")"));
  }
  return std::make_shared<const PromptModel>(std::move(activations), hook_names);
}

absl::StatusOr<std::shared_ptr<const PromptSae>> DatasetModels::Impl::PromptSaeFor(
    const DatasetSource& dataset, const std::string& dir) {
  return Cached<PromptSae>(absl::StrCat("prompt sae\n", dir, "\n", dataset.sae_weight_hash),
                           [&]() -> absl::StatusOr<std::shared_ptr<const PromptSae>> {
                             ASSIGN_OR_RETURN(Sae sae, LoadSae(dataset, dir));
                             return std::make_shared<const PromptSae>(std::move(sae));
                           });
}

absl::Status DatasetModels::Impl::CheckSaeFits(const DatasetSource& dataset,
                                               const std::string& dir) const {
  const std::optional<HookName> hook = HookOf(dataset);
  ASSIGN_OR_RETURN(SaeConfig cfg, ReadAndCheckSae(dir, hook));
  ASSIGN_OR_RETURN(std::string file, FindSaeWeightsFile(dir, hook));
  std::error_code ec;
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(file, ec));
  if (ec) return absl::NotFoundError(absl::StrCat(file, ": ", ec.message()));
  // Sae::Load holds the file and float32 copies of W_enc and W_dec at once; Prepare adds the
  // unit rows (the biases are small next to these).
  const int64_t need = file_bytes + 3 * cfg.d_sae * cfg.d_in * int64_t{4};
  const int64_t limit = MemoryLimitBytes();
  if (limit > 0 && need > limit) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "dataset %d: reading its SAE (%s, d_sae %d x d_in %d) takes about %.2f GB (the file, "
        "W_enc and W_dec as float32, the unit decoder rows); %.2f GB are available",
        dataset.dataset_id, dir, cfg.d_sae, cfg.d_in, need / 1e9, limit / 1e9));
  }
  return absl::OkStatus();
}

absl::StatusOr<Sae> DatasetModels::Impl::LoadSae(const DatasetSource& dataset,
                                                 const std::string& dir) const {
  RETURN_IF_ERROR(CheckSaeFits(dataset, dir));
  ASSIGN_OR_RETURN(Sae sae, Sae::Load(dir, HookOf(dataset)));
  if (!dataset.sae_weight_hash.empty() && sae.weight_hash() != dataset.sae_weight_hash) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", dataset.dataset_id, ": the SAE in ", dir,
                     " changed since the dataset was made (", sae.weight_hash(), ", recorded ",
                     dataset.sae_weight_hash, ")"));
  }
  if (sae.config().d_sae != dataset.d_sae) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", dataset.dataset_id, ": the SAE in ", dir, " has d_sae ",
                     sae.config().d_sae, ", the dataset ", dataset.d_sae));
  }
  return sae;
}

absl::Status DatasetModels::Impl::LogitsOf(const DatasetSource& dataset,
                                           const latentd::v1::ExtractSpec& spec,
                                           const HookName& hook, at::Tensor direction,
                                           int64_t top_n, const std::string& requested,
                                           std::vector<ScoredIndex>* positive,
                                           std::vector<ScoredIndex>* negative, std::string* source,
                                           std::string* unavailable) {
  ASSIGN_OR_RETURN(std::shared_ptr<const PreparedUnembedding> unembedding,
                   UnembeddingFor(dataset, spec, hook, direction.size(0), requested, unavailable));
  if (unembedding == nullptr) return absl::OkStatus();
  if (unembedding->W_out.defined()) direction = direction.unsqueeze(0).mm(unembedding->W_out)[0];
  if (direction.size(0) != unembedding->W_U.size(1)) {
    *unavailable = absl::StrCat("the unembedding's width ", unembedding->W_U.size(1),
                                " is not the SAE's ", direction.size(0));
    return absl::OkStatus();
  }
  const at::Tensor logits = unembedding->W_U.mv(direction);
  *positive = Largest(logits, top_n, -1, /*ascending=*/false);
  *negative = Largest(logits, top_n, -1, /*ascending=*/true);
  *source = unembedding->source;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const PreparedSae>> DatasetModels::Impl::SaeFor(
    const DatasetSource& dataset, const std::string& dir) {
  return Cached<PreparedSae>(absl::StrCat("sae\n", dir, "\n", dataset.sae_weight_hash),
                             [&]() -> absl::StatusOr<std::shared_ptr<const PreparedSae>> {
                               ASSIGN_OR_RETURN(Sae sae, LoadSae(dataset, dir));
                               return std::make_shared<const PreparedSae>(Prepare(sae));
                             });
}

absl::StatusOr<std::shared_ptr<const PreparedUnembedding>> DatasetModels::Impl::UnembeddingFor(
    const DatasetSource& dataset, const latentd::v1::ExtractSpec& spec, const HookName& hook,
    int64_t d_in, const std::string& requested, std::string* unavailable) {
  if (spec.model().has_reference() || spec.model().has_huggingface()) {
    if (!requested.empty()) {
      return absl::InvalidArgumentError(
          "unembedding: only for TorchScript models (a natively run model's is its own: lm_head, "
          "or the tied embedding)");
    }
    if (spec.model().has_reference()) {
      ASSIGN_OR_RETURN(latentd::v1::ReferenceModelSpec resolved,
                       ResolveReferenceSpec(spec.model().reference()));
      return Cached<PreparedUnembedding>(
          absl::StrCat("reference\n", resolved.SerializeAsString(), "\n", HookKey(hook)),
          [&]() -> absl::StatusOr<std::shared_ptr<const PreparedUnembedding>> {
            ASSIGN_OR_RETURN(std::unique_ptr<Gpt2Model> model,
                             CreateReferenceModel(resolved, hook, at::Device(at::kCPU)));
            return NativeUnembedding(dataset, std::move(model), hook, unavailable);
          });
    }
    auto hf = HfOptions(env, dataset, spec.model().huggingface(), options.memory_limit_bytes);
    if (!hf.ok()) {
      *unavailable = std::string(hf.status().message());
      return nullptr;
    }
    return Cached<PreparedUnembedding>(
        absl::StrCat("huggingface\n", hf->dir, "\n", hf->center_writing_weights, "\n",
                     dataset.model_weight_hash, "\n", HookKey(hook)),
        [&]() -> absl::StatusOr<std::shared_ptr<const PreparedUnembedding>> {
          auto model = LoadHfModel(*hf, {hook}, at::Device(at::kCPU));
          if (!model.ok()) {
            *unavailable = std::string(model.status().message());
            return nullptr;
          }
          return NativeUnembedding(dataset, *std::move(model), hook, unavailable);
        });
  }
  if (!spec.model().has_torchscript()) {
    *unavailable = "the job's spec names no model";
    return nullptr;
  }
  auto path =
      ResolveUnderRoots(spec.model().torchscript().path(), env, "extract.model.torchscript.path");
  if (!path.ok()) {
    *unavailable = std::string(path.status().message());
    return nullptr;
  }
  return Cached<PreparedUnembedding>(
      absl::StrCat("torchscript\n", *path, "\n", dataset.model_weight_hash, "\n", requested),
      [&]() -> absl::StatusOr<std::shared_ptr<const PreparedUnembedding>> {
        if (!dataset.model_weight_hash.empty()) {
          ASSIGN_OR_RETURN(std::string hash, HashFile(*path));
          if (hash != dataset.model_weight_hash) {
            *unavailable =
                absl::StrCat("the model ", *path, " changed since the dataset was made (", hash,
                             ", recorded ", dataset.model_weight_hash, ")");
            return nullptr;
          }
        }
        return TorchScriptUnembedding(*path, requested, d_in, unavailable);
      });
}

DatasetModels::DatasetModels(ExtractEnv env, DatasetModelsOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->env = std::move(env);
  impl_->options = options;
}

DatasetModels::~DatasetModels() = default;

int64_t DatasetModels::cached_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->bytes;
}

absl::StatusOr<LatentWeights> DatasetModels::ReadLatentWeights(const DatasetSource& dataset,
                                                               const LatentWeightsQuery& query) {
  if (query.top_n < 0 || query.top_n > kMaxLatentWeightsTopN) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_n: must be in [0, ", kMaxLatentWeightsTopN, "] (0: 10)"));
  }
  if (query.latent < 0 || query.latent >= dataset.d_sae) {
    // As GetLatent and every other per-latent query: the field named, INVALID_ARGUMENT.
    return absl::InvalidArgumentError(absl::StrCat("latent: ", query.latent, " is outside [0, ",
                                                   dataset.d_sae, ") of dataset ",
                                                   dataset.dataset_id));
  }
  const int64_t top_n = query.top_n > 0 ? query.top_n : kDefaultTopN;
  ASSIGN_OR_RETURN(const DatasetInputs inputs, impl_->InputsOf(dataset));
  const latentd::v1::ExtractSpec& spec = inputs.spec;
  const HookName& hook = inputs.decoder_hook;
  try {
    ASSIGN_OR_RETURN(std::shared_ptr<const PreparedSae> sae,
                     impl_->SaeFor(dataset, inputs.sae_dir));
    const int64_t j = query.latent;
    LatentWeights out;
    out.decoder_norm = sae->dec_norm[j].item<float>();
    out.encoder_norm = sae->enc_norm[j].item<float>();
    out.encoder_decoder_cosine = sae->enc_dec_cos[j].item<float>();
    const at::Tensor unit = sae->unit_dec[j];
    out.neighbors = Largest(sae->unit_dec.mv(unit), top_n, j, /*ascending=*/false);
    if (sae->crosscoder_sources > 0) {
      const at::Tensor blocks = (unit * out.decoder_norm).view({sae->crosscoder_sources, -1});
      out.decoder_by_source = DecoderBySource(*sae, blocks);
      out.logits_unavailable =
          absl::StrCat("a crosscoder's latent writes to each of its ", sae->crosscoder_sources,
                       " sources: each has its logits (decoder_by_source)");
      for (size_t s = 0; s < out.decoder_by_source.size(); ++s) {
        SourceDecoder& d = out.decoder_by_source[s];
        if (s >= inputs.crosscoder_models.size() || !inputs.crosscoder_models[s].unknown.empty()) {
          d.logits_unavailable = s < inputs.crosscoder_models.size()
                                     ? inputs.crosscoder_models[s].unknown
                                     : "the source's model is not known";
          continue;
        }
        const DatasetInputs::SourceModel& model = inputs.crosscoder_models[s];
        auto source_hook = ParseHookName(model.spec.hook_name());
        if (!source_hook.ok()) {
          d.logits_unavailable = std::string(source_hook.status().message());
          continue;
        }
        if (d.norm == 0) {
          d.logits_unavailable = "its decoder into this source is 0";
          continue;
        }
        DatasetSource of_source = dataset;  // the source's model hash, for the check
        of_source.model_weight_hash = model.model_weight_hash;
        RETURN_IF_ERROR(impl_->LogitsOf(of_source, model.spec, *source_hook, blocks[s], top_n,
                                        query.unembedding, &d.positive_logits, &d.negative_logits,
                                        &d.logits_source, &d.logits_unavailable));
      }
      return out;
    }
    at::Tensor writes;  // a cross-layer transcoder's latent: the sum of its decoders
    if (sae->circuit_tracer && sae->circuit_tracer->cross_layer) {
      const int layer = sae->circuit_tracer->layer;
      ASSIGN_OR_RETURN(const at::Tensor written,
                       LoadCrossLayerDecoderRows(inputs.sae_dir, layer, {j}));
      const at::Tensor rows = written[0];
      const at::Tensor norms = rows.norm(2, {1}).contiguous();
      for (int64_t t = 0; t < norms.size(0); ++t) {
        out.decoder_norm_by_layer.emplace_back(layer + static_cast<int>(t), norms[t].item<float>());
      }
      writes = rows.sum(0);  // all of it lands in the residual stream
    }

    RETURN_IF_ERROR(impl_->LogitsOf(dataset, spec, hook,
                                    writes.defined() ? writes : unit * out.decoder_norm, top_n,
                                    query.unembedding, &out.positive_logits, &out.negative_logits,
                                    &out.logits_source, &out.logits_unavailable));
    return out;
  } catch (const c10::Error& e) {
    return TorchErrorStatus(e, absl::StrCat("reading the weights of dataset ", dataset.dataset_id));
  }
}

absl::StatusOr<LatentScalingResult> DatasetModels::LatentScaling(
    const DatasetSource& dataset, const LatentScalingQuery& query,
    const std::function<bool()>& cancelled) {
  ASSIGN_OR_RETURN(const DatasetInputs inputs, impl_->InputsOf(dataset));
  const auto& stored = inputs.spec.model().stored().dataset_ids();
  if (inputs.crosscoder_models.empty() || stored.size() < 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset ", dataset.dataset_id, "'s SAE is ",
        inputs.crosscoder_models.empty()
            ? "not a crosscoder"
            : absl::StrCat("a crosscoder over hooks of one model (", inputs.crosscoder_reads,
                           "), whose activations are not stored"),
        ": latent scaling fits a crosscoder's latents in each model's stored activations (a "
        "crosscoder over stored datasets, model diffing)"));
  }
  const ExtractEnv& env = impl_->env;
  // (The sources are named before the store's codes are needed, so a deleted one is named.)
  const absl::Status not_open =
      absl::FailedPreconditionError("latent scaling reads the store, which is not open");
  if (!env.open_stored_dense) return not_open;
  std::vector<std::shared_ptr<const StoredDenseRows>> sources;
  for (int s = 0; s < stored.size(); ++s) {
    auto rows =
        env.open_stored_dense(stored[s], absl::StrCat("extract.model.stored.dataset_ids[", s, "]"));
    if (!rows.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("dataset ", dataset.dataset_id, " encodes the activations of dataset ",
                       stored[s], " (its crosscoder's source ", s,
                       "), which latent scaling reads: ", rows.status().message()));
    }
    sources.push_back(*std::move(rows));
  }
  if (env.store == nullptr) return not_open;
  try {
    // The crosscoder EncodePrompt and steering keep loaded, so that a notebook's queries one
    // after another read its file once.
    ASSIGN_OR_RETURN(std::shared_ptr<const PromptSae> crosscoder,
                     impl_->PromptSaeFor(dataset, inputs.sae_dir));
    return FitLatentScaling(
        crosscoder->sae, query,
        ChunkStoreCrosscoderRows(env.store, dataset.dataset_id, std::move(sources)), cancelled);
  } catch (const std::exception& e) {
    return TorchErrorStatus(e, "latent scaling");
  }
}

absl::StatusOr<SaeComparison> DatasetModels::CompareSaes(const DatasetSource& dataset,
                                                         const DatasetSource& other,
                                                         const SaeComparisonQuery& query) {
  if (query.bins < 0 || query.bins > 1000) {
    return absl::InvalidArgumentError("bins: must be in [0, 1000] (0: 20)");
  }
  if (query.sample < 0) return absl::InvalidArgumentError("sample: negative");
  SaeComparison out;
  if (!query.latents.empty()) {
    out.latents = query.latents;
    std::sort(out.latents.begin(), out.latents.end());
    out.latents.erase(std::unique(out.latents.begin(), out.latents.end()), out.latents.end());
    if (out.latents.front() < 0 || out.latents.back() >= dataset.d_sae) {
      const int64_t bad = out.latents.front() < 0 ? out.latents.front() : out.latents.back();
      return absl::InvalidArgumentError(absl::StrCat("latents: ", bad, " is outside [0, ",
                                                     dataset.d_sae, ") of dataset ",
                                                     dataset.dataset_id));
    }
  } else {
    const int64_t n = query.sample > 0 ? std::min(query.sample, dataset.d_sae) : dataset.d_sae;
    for (int64_t i = 0; i < n; ++i) out.latents.push_back(i * dataset.d_sae / n);
  }
  ASSIGN_OR_RETURN(const DatasetInputs inputs, impl_->InputsOf(dataset));
  ASSIGN_OR_RETURN(const DatasetInputs other_inputs, impl_->InputsOf(other));
  try {
    ASSIGN_OR_RETURN(std::shared_ptr<const PreparedSae> a, impl_->SaeFor(dataset, inputs.sae_dir));
    ASSIGN_OR_RETURN(std::shared_ptr<const PreparedSae> b,
                     impl_->SaeFor(other, other_inputs.sae_dir));
    const int64_t d_in = a->unit_dec.size(1);
    if (b->unit_dec.size(1) != d_in) {
      return absl::FailedPreconditionError(
          absl::StrCat("dataset ", dataset.dataset_id, "'s SAE reads d_in ", d_in, ", dataset ",
                       other.dataset_id, "'s ", b->unit_dec.size(1),
                       ": their directions live in different spaces"));
    }
    const int64_t width = b->unit_dec.size(0);
    const int64_t n = static_cast<int64_t>(out.latents.size());
    const int64_t budget = impl_->options.max_compare_macs;
    if (n > budget / (width * d_in)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("comparing ", n, " latents with ", width, " of d_in ", d_in, " takes ",
                       n * width * d_in, " multiply-adds, above ", budget,
                       "; ask a sample of at most ", budget / (width * d_in), " latents"));
    }
    const at::Tensor picked =
        a->unit_dec.index_select(0, at::tensor(out.latents, at::TensorOptions().dtype(at::kLong)));
    out.best.resize(n);
    out.best_cosine.resize(n);
    // Blocks of compared latents, so the [block, width] cosines stay within 256 MiB.
    const int64_t block = std::max<int64_t>(1, (int64_t{64} << 20) / width);
    for (int64_t start = 0; start < n; start += block) {
      const int64_t stop = std::min(n, start + block);
      auto [values, indices] = picked.slice(0, start, stop).mm(b->unit_dec.t()).max(1);
      const float* v = values.data_ptr<float>();
      const int64_t* i = indices.data_ptr<int64_t>();
      for (int64_t r = start; r < stop; ++r) {
        out.best_cosine[r] = v[r - start];
        out.best[r] = i[r - start];
      }
    }
    const int bins = query.bins > 0 ? query.bins : 20;
    out.histogram.assign(bins, 0);
    double sum = 0;
    for (float c : out.best_cosine) {
      sum += c;
      const int bin = static_cast<int>((std::clamp(c, -1.0f, 1.0f) + 1.0) / 2.0 * bins);
      ++out.histogram[std::min(bin, bins - 1)];
    }
    out.mean_best_cosine = n > 0 ? sum / n : 0.0;
    return out;
  } catch (const c10::Error& e) {
    return TorchErrorStatus(e, absl::StrCat("comparing the SAEs of datasets ", dataset.dataset_id,
                                            " and ", other.dataset_id));
  }
}

namespace {

absl::Status CheckPromptLength(const std::vector<int64_t>& ids) {
  if (ids.empty()) return absl::InvalidArgumentError("token_ids: empty");
  if (static_cast<int64_t>(ids.size()) > kMaxPromptTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_ids: ", ids.size(), " tokens, at most ", kMaxPromptTokens));
  }
  return absl::OkStatus();
}

// The prompt as the dataset's sequences ran: BOS first where its spec prepends one.
std::vector<int64_t> AsRun(const std::vector<int64_t>& ids,
                           const latentd::v1::TokenSource& token_spec) {
  std::vector<int64_t> tokens;
  if (token_spec.prepend_bos()) tokens.push_back(token_spec.bos_token_id());
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  return tokens;
}

// INVALID_ARGUMENT naming token_ids when the model cannot take the prompt as run (`tokens`).
absl::Status CheckPromptFits(const std::vector<int64_t>& ids, const std::vector<int64_t>& tokens,
                             const ActivationModel& model) {
  const int64_t vocab = model.vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || (vocab > 0 && ids[i] >= vocab)) {
      return absl::InvalidArgumentError(absl::StrCat("token_ids[", i, "]: id ", ids[i],
                                                     " outside the vocabulary [0, ", vocab, ")"));
    }
  }
  const int64_t context = model.max_context();
  if (context > 0 && static_cast<int64_t>(tokens.size()) > context) {
    return absl::InvalidArgumentError(absl::StrCat("token_ids: ", tokens.size(), " tokens",
                                                   tokens.size() > ids.size() ? " with BOS" : "",
                                                   ", the model takes at most ", context));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Whether a dataset's crosscoder reads several models' activations (model diffing): its
// sources' models differ in spec or recorded weights, or one is not known.
bool OverSeveralModels(const DatasetInputs& inputs) {
  const std::vector<DatasetInputs::SourceModel>& models = inputs.crosscoder_models;
  for (const DatasetInputs::SourceModel& source : models) {
    if (!source.unknown.empty() ||
        source.spec.model().SerializeAsString() != models[0].spec.model().SerializeAsString() ||
        source.model_weight_hash != models[0].model_weight_hash) {
      return true;
    }
  }
  return false;
}

// Whether two datasets run one forward pass: the same model spec and, where both record one, the
// same weight hash (compared so, a model rebuilt with more hooks is still the same model).
bool SameForward(const DatasetSource& a, const latentd::v1::ModelSpec& a_model,
                 const DatasetSource& b, const latentd::v1::ModelSpec& b_model) {
  const bool hashes_differ = !a.model_weight_hash.empty() && !b.model_weight_hash.empty() &&
                             a.model_weight_hash != b.model_weight_hash;
  return !hashes_differ && a_model.SerializeAsString() == b_model.SerializeAsString();
}

// A crosscoder's source `source` as a dataset of its own model: that model's weight hash, and
// inputs whose spec is the source's and whose hooks are every source of the same model (one
// forward pass gives them all). FAILED_PRECONDITION when the source's model is not known.
absl::StatusOr<std::pair<DatasetSource, DatasetInputs>> CrosscoderSourceInputs(
    const DatasetSource& dataset, const DatasetInputs& inputs,
    const DatasetInputs::SourceModel& source) {
  if (!source.unknown.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the crosscoder's input for a prompt: ", source.unknown));
  }
  std::pair<DatasetSource, DatasetInputs> out{dataset, DatasetInputs()};
  auto& [of_source, part] = out;
  of_source.model_weight_hash = source.model_weight_hash;
  part.spec = source.spec;
  for (const DatasetInputs::SourceModel& other : inputs.crosscoder_models) {
    if (other.spec.model().SerializeAsString() != source.spec.model().SerializeAsString() ||
        std::find(part.job_hooks.begin(), part.job_hooks.end(), other.spec.hook_name()) !=
            part.job_hooks.end()) {
      continue;
    }
    part.job_hooks.push_back(other.spec.hook_name());
  }
  return out;
}

}  // namespace

absl::StatusOr<PromptLatents> DatasetModels::EncodePrompt(const DatasetSource& dataset,
                                                          const PromptQuery& query) {
  const std::vector<int64_t>& ids = query.token_ids;
  RETURN_IF_ERROR(CheckPromptLength(ids));
  for (const auto& [value, name] : {std::pair{query.latents_per_token, "latents_per_token"},
                                    std::pair{query.top_latents, "top_latents"}}) {
    if (value < 0 || value > kMaxLatentWeightsTopN) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": must be in [0, ", kMaxLatentWeightsTopN, "]"));
    }
  }
  const int64_t per_token = query.latents_per_token > 0 ? query.latents_per_token : 10;
  const int64_t top_latents = query.top_latents > 0 ? query.top_latents : 20;
  ASSIGN_OR_RETURN(const DatasetInputs inputs, impl_->InputsOf(dataset));
  // Where the SAE's input comes from: the dataset's hook; for a crosscoder each source's hook of
  // its model (a crosscoder over hooks: one model built with all of them), side by side.
  std::vector<std::pair<DatasetSource, DatasetInputs>> parts;
  if (inputs.crosscoder_reads.empty()) parts.emplace_back(dataset, inputs);
  for (const DatasetInputs::SourceModel& source : inputs.crosscoder_models) {
    ASSIGN_OR_RETURN(parts.emplace_back(), CrosscoderSourceInputs(dataset, inputs, source));
  }
  if (parts.empty()) {  // (InputsOf names a crosscoder's sources with what it reads)
    return absl::InternalError(
        absl::StrCat("dataset ", dataset.dataset_id, ": a crosscoder without sources"));
  }
  PromptLatents out;
  const std::vector<int64_t> tokens = AsRun(ids, parts[0].second.spec.tokens());
  out.bos_prepended = tokens.size() > ids.size();
  try {
    ASSIGN_OR_RETURN(std::shared_ptr<const PromptSae> sae,
                     impl_->PromptSaeFor(dataset, inputs.sae_dir));
    std::vector<at::Tensor> xs;
    for (const auto& [of_source, part] : parts) {
      ASSIGN_OR_RETURN(std::shared_ptr<const PromptModel> model, impl_->ModelFor(of_source, part));
      RETURN_IF_ERROR(CheckPromptFits(ids, tokens, *model->model));
      const size_t hook = model->IndexOf(part.spec.hook_name());
      if (hook == model->hooks.size()) {  // ModelFor builds the model with the part's hook
        return absl::InternalError(
            absl::StrCat("the model for prompts lacks hook ", part.spec.hook_name()));
      }
      xs.push_back(
          model->HookActivations(tokens)[hook].view({static_cast<int64_t>(tokens.size()), -1}));
    }
    const at::Tensor x = xs.size() == 1 ? xs[0] : at::cat(xs, 1);
    if (!x.isfinite().all().item<bool>()) {
      return absl::FailedPreconditionError(
          "the model's activations on this prompt are not all finite (NaN or Inf)");
    }
    const SparseCodes codes = sae->sae.EncodeSparse(x);
    // Each position's non-zero latents, in either layout.
    const at::Tensor indices = codes.indices.to(at::kLong).contiguous();
    const at::Tensor values = codes.values.contiguous();
    const int64_t* index = indices.data_ptr<int64_t>();
    const float* value = values.data_ptr<float>();
    std::vector<int64_t> begin(tokens.size() + 1, 0);
    if (codes.fixed_k()) {
      for (size_t r = 0; r <= tokens.size(); ++r) begin[r] = r * indices.size(1);
    } else {
      const at::Tensor ends = codes.row_counts.cumsum(0).to(at::kLong).contiguous();
      std::copy_n(ends.data_ptr<int64_t>(), tokens.size(), begin.begin() + 1);
    }
    std::map<int64_t, PromptLatent> seen;
    for (size_t r = 0; r < tokens.size(); ++r) {
      PromptToken token;
      token.token_id = tokens[r];
      for (int64_t e = begin[r]; e < begin[r + 1]; ++e) {
        if (value[e] == 0.0f) continue;  // fixed-k slots that did not fire
        token.latents.push_back({index[e], value[e]});
        PromptLatent& l = seen[index[e]];
        l.latent = index[e];
        if (l.positions == 0 || value[e] > l.max_value) {
          l.max_value = value[e];
          l.position = static_cast<int64_t>(r);
        }
        ++l.positions;
      }
      token.active = static_cast<int64_t>(token.latents.size());
      std::sort(token.latents.begin(), token.latents.end(),
                [](const ScoredIndex& a, const ScoredIndex& b) {
                  return a.score != b.score ? a.score > b.score : a.index < b.index;
                });
      if (static_cast<int64_t>(token.latents.size()) > per_token) token.latents.resize(per_token);
      out.tokens.push_back(std::move(token));
    }
    for (auto& [latent, l] : seen) out.top.push_back(l);
    std::sort(out.top.begin(), out.top.end(), [](const PromptLatent& a, const PromptLatent& b) {
      return a.max_value != b.max_value ? a.max_value > b.max_value : a.latent < b.latent;
    });
    if (static_cast<int64_t>(out.top.size()) > top_latents) out.top.resize(top_latents);
    return out;
  } catch (const c10::Error& e) {
    return TorchErrorStatus(
        e, absl::StrCat("encoding a prompt with dataset ", dataset.dataset_id, "'s model and SAE"));
  }
}

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
