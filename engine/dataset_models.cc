#include "engine/dataset_models.h"

#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <list>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "engine/hook_name.h"
#include "engine/reference_model.h"
#include "engine/sae.h"
#include "engine/sae_config.h"
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
  int64_t bytes() const {
    return TensorBytes(unit_dec) + TensorBytes(dec_norm) + TensorBytes(enc_norm) +
           TensorBytes(enc_dec_cos);
  }
};

// The map from the hooked activation space to the logits.
struct PreparedUnembedding {
  at::Tensor W_U;    // [vocab, d_resid] float32, contiguous
  at::Tensor W_out;  // [d_mlp, d_resid] for mlp.hook_post hooks; undefined otherwise
  std::string source;
  int64_t bytes() const { return TensorBytes(W_U) + TensorBytes(W_out); }
};

// num / den where den > 0, else 0 (a zero decoder row has no direction).
at::Tensor SafeDivide(const at::Tensor& num, const at::Tensor& den) {
  return at::where(den > 0, num / den.clamp_min(std::numeric_limits<float>::min()),
                   at::zeros_like(num));
}

PreparedSae Prepare(const SaeWeights& w) {
  PreparedSae p;
  p.dec_norm = w.W_dec.norm(2, {1});
  p.unit_dec = SafeDivide(w.W_dec, p.dec_norm.unsqueeze(1)).contiguous();
  p.enc_norm = w.W_enc.norm(2, {0});
  const at::Tensor dot = (w.W_enc.t() * w.W_dec).sum({1});
  p.enc_dec_cos = SafeDivide(dot, p.enc_norm * p.dec_norm);
  return p;
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

absl::Status TorchStatus(const c10::Error& e, const std::string& what) {
  const std::string message = e.what_without_backtrace();
  if (message.find("alloc") != std::string::npos ||
      message.find("out of memory") != std::string::npos) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": ", message));
  }
  return absl::InternalError(absl::StrCat(what, ": ", message));
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

  // RESOURCE_EXHAUSTED when loading the SAE in `dir` would take more than the memory limit.
  absl::Status CheckSaeFits(const DatasetSource& dataset, const std::string& dir) const;
  absl::StatusOr<std::shared_ptr<const PreparedSae>> SaeFor(const DatasetSource& dataset,
                                                            const std::string& dir);
  // The unembedding, or null with *unavailable saying why there is none.
  absl::StatusOr<std::shared_ptr<const PreparedUnembedding>> UnembeddingFor(
      const DatasetSource& dataset, const latentd::v1::ExtractSpec& spec, const HookName& hook,
      int64_t d_in, const std::string& requested, std::string* unavailable);
};

absl::Status DatasetModels::Impl::CheckSaeFits(const DatasetSource& dataset,
                                               const std::string& dir) const {
  ASSIGN_OR_RETURN(SaeConfig cfg, ReadAndCheckSae(dir));
  ASSIGN_OR_RETURN(std::string file, FindSaeWeightsFile(dir));
  std::error_code ec;
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(file, ec));
  if (ec) return absl::NotFoundError(absl::StrCat(file, ": ", ec.message()));
  // Sae::Load holds the file and float32 copies of W_enc and W_dec at once; Prepare adds the
  // unit rows (the biases are small next to these).
  const int64_t need = file_bytes + 3 * cfg.d_sae * cfg.d_in * int64_t{4};
  const int64_t limit =
      options.memory_limit_bytes > 0 ? options.memory_limit_bytes : HostAvailableMemoryBytes();
  if (limit > 0 && need > limit) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "dataset %d: reading its SAE (%s, d_sae %d x d_in %d) takes about %.2f GB (the file, "
        "W_enc and W_dec as float32, the unit decoder rows); %.2f GB are available",
        dataset.dataset_id, dir, cfg.d_sae, cfg.d_in, need / 1e9, limit / 1e9));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const PreparedSae>> DatasetModels::Impl::SaeFor(
    const DatasetSource& dataset, const std::string& dir) {
  const std::string key = absl::StrCat("sae\n", dir, "\n", dataset.sae_weight_hash);
  if (auto hit = Find<PreparedSae>(key)) return hit;
  RETURN_IF_ERROR(CheckSaeFits(dataset, dir));
  ASSIGN_OR_RETURN(Sae sae, Sae::Load(dir));
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
  auto prepared = std::make_shared<const PreparedSae>(Prepare(sae.weights()));
  Insert<PreparedSae>(key, prepared, prepared->bytes());
  return prepared;
}

absl::StatusOr<std::shared_ptr<const PreparedUnembedding>> DatasetModels::Impl::UnembeddingFor(
    const DatasetSource& dataset, const latentd::v1::ExtractSpec& spec, const HookName& hook,
    int64_t d_in, const std::string& requested, std::string* unavailable) {
  if (spec.model().has_reference()) {
    if (!requested.empty()) {
      return absl::InvalidArgumentError(
          "unembedding: only for TorchScript models (the reference model's unembedding is its "
          "tied embedding)");
    }
    ASSIGN_OR_RETURN(latentd::v1::ReferenceModelSpec resolved,
                     ResolveReferenceSpec(spec.model().reference()));
    const std::string key =
        absl::StrCat("reference\n", resolved.SerializeAsString(), "\n", spec.hook_name());
    if (auto hit = Find<PreparedUnembedding>(key)) return hit;
    ASSIGN_OR_RETURN(std::unique_ptr<ReferenceModel> model,
                     ReferenceModel::Create(resolved, hook, at::Device(at::kCPU)));
    if (!dataset.model_weight_hash.empty() && model->weight_hash() != dataset.model_weight_hash) {
      *unavailable = absl::StrCat("the reference model's weights hash to ", model->weight_hash(),
                                  ", the dataset recorded ", dataset.model_weight_hash);
      return nullptr;
    }
    auto prepared = std::make_shared<PreparedUnembedding>();
    const std::string w_out = absl::StrCat("blocks.", hook.layer, ".mlp.W_out");
    for (const auto& [name, tensor] : model->NamedWeights()) {
      if (name == "embed.W_E") prepared->W_U = tensor.contiguous();
      if (hook.point == HookPoint::kMlpPost && name == w_out) prepared->W_out = tensor.contiguous();
    }
    prepared->source = hook.point == HookPoint::kMlpPost
                           ? absl::StrCat(w_out, " then embed.W_E (tied)")
                           : std::string("embed.W_E (tied)");
    Insert<PreparedUnembedding>(key, prepared, prepared->bytes());
    return std::shared_ptr<const PreparedUnembedding>(prepared);
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
  const std::string key =
      absl::StrCat("torchscript\n", *path, "\n", dataset.model_weight_hash, "\n", requested);
  if (auto hit = Find<PreparedUnembedding>(key)) return hit;
  if (!dataset.model_weight_hash.empty()) {
    ASSIGN_OR_RETURN(std::string hash, HashFile(*path));
    if (hash != dataset.model_weight_hash) {
      *unavailable = absl::StrCat("the model ", *path, " changed since the dataset was made (",
                                  hash, ", recorded ", dataset.model_weight_hash, ")");
      return nullptr;
    }
  }
  torch::jit::Module module;
  try {
    module = torch::jit::load(*path, at::Device(at::kCPU));
  } catch (const c10::Error& e) {
    *unavailable =
        absl::StrCat("the model ", *path, " does not load: ", e.what_without_backtrace());
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
        absl::StrCat("unembedding: the model ", *path, " has no parameter ", name));
  }
  auto prepared = std::make_shared<PreparedUnembedding>();
  auto W_U = AsUnembedding(name, parameters[name].detach(), d_in);
  if (!W_U.ok()) {
    if (!requested.empty()) return W_U.status();
    *unavailable = std::string(W_U.status().message());
    return nullptr;
  }
  prepared->W_U = *std::move(W_U);
  prepared->source = name;
  if (name.find("wte") != std::string::npos || name.find("embed_tokens") != std::string::npos ||
      name == "embed.W_E") {
    prepared->source += " (tied)";
  }
  Insert<PreparedUnembedding>(key, prepared, prepared->bytes());
  return std::shared_ptr<const PreparedUnembedding>(prepared);
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
    return absl::OutOfRangeError(absl::StrCat("latent ", query.latent, " outside [0, ",
                                              dataset.d_sae, ") of dataset ", dataset.dataset_id));
  }
  const int64_t top_n = query.top_n > 0 ? query.top_n : kDefaultTopN;
  if (!impl_->env.find_job) {
    return absl::FailedPreconditionError("the daemon keeps no job records");
  }
  auto job = impl_->env.find_job(dataset.job_id);
  if (!job.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset ", dataset.dataset_id, ": the record of job ", dataset.job_id,
        " that wrote it, which names its SAE and model, is gone (", job.status().message(), ")"));
  }
  const latentd::v1::ExtractSpec& spec = job->spec().extract();
  if (!job->spec().has_extract() || !spec.has_sae() ||
      spec.sae().source_case() == latentd::v1::SaeSource::SOURCE_NOT_SET) {
    return absl::FailedPreconditionError(absl::StrCat("dataset ", dataset.dataset_id, ": job ",
                                                      dataset.job_id,
                                                      " is not an EXTRACT job with an SAE"));
  }
  auto dir = ResolveSaeDir(spec, impl_->env);
  if (!dir.ok()) {
    // The dataset exists; its SAE file or artifact was deleted since: a state, not a bad name.
    const absl::StatusCode code = dir.status().code() == absl::StatusCode::kNotFound
                                      ? absl::StatusCode::kFailedPrecondition
                                      : dir.status().code();
    return absl::Status(code, absl::StrCat("dataset ", dataset.dataset_id,
                                           "'s SAE is not readable: ", dir.status().message()));
  }
  ASSIGN_OR_RETURN(HookName hook, ParseHookName(spec.hook_name()));
  try {
    ASSIGN_OR_RETURN(std::shared_ptr<const PreparedSae> sae, impl_->SaeFor(dataset, *dir));
    const int64_t j = query.latent;
    LatentWeights out;
    out.decoder_norm = sae->dec_norm[j].item<float>();
    out.encoder_norm = sae->enc_norm[j].item<float>();
    out.encoder_decoder_cosine = sae->enc_dec_cos[j].item<float>();
    const at::Tensor unit = sae->unit_dec[j];
    out.neighbors = Largest(sae->unit_dec.mv(unit), top_n, j, /*ascending=*/false);

    std::string unavailable;
    ASSIGN_OR_RETURN(std::shared_ptr<const PreparedUnembedding> unembedding,
                     impl_->UnembeddingFor(dataset, spec, hook, sae->unit_dec.size(1),
                                           query.unembedding, &unavailable));
    if (unembedding == nullptr) {
      out.logits_unavailable = unavailable;
      return out;
    }
    at::Tensor direction = unit * out.decoder_norm;
    if (unembedding->W_out.defined()) direction = direction.unsqueeze(0).mm(unembedding->W_out)[0];
    if (direction.size(0) != unembedding->W_U.size(1)) {
      out.logits_unavailable = absl::StrCat("the unembedding's width ", unembedding->W_U.size(1),
                                            " is not the SAE's ", direction.size(0));
      return out;
    }
    const at::Tensor logits = unembedding->W_U.mv(direction);
    out.positive_logits = Largest(logits, top_n, -1, /*ascending=*/false);
    out.negative_logits = Largest(logits, top_n, -1, /*ascending=*/true);
    out.logits_source = unembedding->source;
    return out;
  } catch (const c10::Error& e) {
    return TorchStatus(e, absl::StrCat("reading the weights of dataset ", dataset.dataset_id));
  }
}

}  // namespace latentd::engine
