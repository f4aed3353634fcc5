#include "engine/dataset_models.h"

#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/dataset_models_internal.h"
#include "engine/gpt2_model.h"
#include "engine/hf_model.h"
#include "engine/hook_name.h"
#include "engine/reference_model.h"
#include "engine/sae.h"
#include "engine/sae_config.h"
#include "engine/torch_status.h"
#include "engine/torchscript_model.h"

namespace latentd::engine {

using dataset_models_internal::AsRun;
using dataset_models_internal::CheckPromptFits;
using dataset_models_internal::CheckPromptLength;
using dataset_models_internal::CrosscoderSourceInputs;
using dataset_models_internal::DatasetInputs;
using dataset_models_internal::PreparedSae;
using dataset_models_internal::PreparedUnembedding;
using dataset_models_internal::PromptModel;
using dataset_models_internal::PromptSae;

namespace {

constexpr int kDefaultTopN = 10;

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

namespace dataset_models_internal {

absl::Status CheckPromptLength(const std::vector<int64_t>& ids) {
  if (ids.empty()) return absl::InvalidArgumentError("token_ids: empty");
  if (static_cast<int64_t>(ids.size()) > kMaxPromptTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_ids: ", ids.size(), " tokens, at most ", kMaxPromptTokens));
  }
  return absl::OkStatus();
}

std::vector<int64_t> AsRun(const std::vector<int64_t>& ids,
                           const latentd::v1::TokenSource& token_spec) {
  std::vector<int64_t> tokens;
  if (token_spec.prepend_bos()) tokens.push_back(token_spec.bos_token_id());
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  return tokens;
}

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

bool SameForward(const DatasetSource& a, const latentd::v1::ModelSpec& a_model,
                 const DatasetSource& b, const latentd::v1::ModelSpec& b_model) {
  const bool hashes_differ = !a.model_weight_hash.empty() && !b.model_weight_hash.empty() &&
                             a.model_weight_hash != b.model_weight_hash;
  return !hashes_differ && a_model.SerializeAsString() == b_model.SerializeAsString();
}

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

}  // namespace dataset_models_internal

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
    if (query.decoder) {
      const at::Tensor row = (unit * out.decoder_norm).contiguous();
      out.decoder.assign(row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
    }
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

}  // namespace latentd::engine
