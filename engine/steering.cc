#include "engine/steering.h"

#include <ATen/ATen.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/activation_model.h"
#include "engine/hook_collector.h"
#include "engine/intervener.h"
#include "engine/sae.h"

namespace latentd::engine {
namespace {

// `interventions` (named `field`, e.g. "interventions") against the SAE's width and the prompt.
absl::Status CheckInterventions(const std::vector<LatentIntervention>& interventions, int64_t d_sae,
                                int64_t prompt_tokens, const std::string& field) {
  if (interventions.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": empty (name at least one latent)"));
  }
  if (interventions.size() > kMaxInterventions) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", interventions.size(), ", at most ", kMaxInterventions));
  }
  for (size_t i = 0; i < interventions.size(); ++i) {
    const LatentIntervention& in = interventions[i];
    if (in.latent < 0 || in.latent >= d_sae) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "].latent: ", in.latent, " outside [0, ", d_sae, ")"));
    }
    if (!std::isfinite(in.value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "].value: ", in.value, " is not finite"));
    }
    for (size_t p = 0; p < in.positions.size(); ++p) {
      if (in.positions[p] < 0 || in.positions[p] >= prompt_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, "[", i, "].positions[", p, "]: ", in.positions[p],
            " outside the prompt's positions [0, ", prompt_tokens, ") (a prepended BOS is 0)"));
      }
    }
  }
  return absl::OkStatus();
}

// Why a crosscoder over models cannot run its other models beside the steered one for this
// query ("" when it can, or when it is no such crosscoder).
std::string CannotRunBeside(const SteeringModel& steering, const SteeringQuery& query) {
  if (steering.diffed_source < 0) return "";
  if (steering.diffed_models.empty()) return steering.diffed_alone;
  const int64_t vocab = steering.model->vocab_size();
  for (size_t s = 0; s < steering.diffed_models.size(); ++s) {
    const int64_t reads = steering.diffed_models[s].model->vocab_size();
    if (query.new_tokens > 0 && reads > 0 && (vocab == 0 || reads < vocab)) {
      return absl::StrCat("source ", s, "'s model reads token ids below ", reads,
                          ", and the steered model may generate any below ", vocab);
    }
  }
  return "";
}

// A crosscoder over models whose other models run beside the steered one steers by any mode;
// alone, by ADD (steering.h).
absl::Status CheckDiffed(const SteeringModel& steering, const SteeringQuery& query) {
  if (steering.diffed_source < 0) return absl::OkStatus();
  const SaeConfig& cfg = steering.sae->config();
  if (!steering.diffed_models.empty()) {
    if (static_cast<int>(steering.diffed_models.size()) != cfg.crosscoder_sources ||
        steering.diffed_models[steering.diffed_source].model != steering.model) {
      return absl::InternalError(absl::StrCat("steering a crosscoder over ", cfg.crosscoder_sources,
                                              " models' activations with ",
                                              steering.diffed_models.size(), " models, source ",
                                              steering.diffed_source, "'s not the steered one"));
    }
    return absl::OkStatus();
  }
  const std::string alone = absl::StrCat(
      "one model runs", steering.diffed_alone.empty() ? "" : ": ", steering.diffed_alone);
  for (size_t i = 0; i < query.interventions.size(); ++i) {
    if (query.interventions[i].mode != InterventionMode::kAdd) {
      return absl::InvalidArgumentError(absl::StrCat(
          "interventions[", i,
          "].mode: a crosscoder over several models' activations is steered by ADD only when "
          "its other models do not run beside the steered one (a latent's value needs every "
          "model's activation at the token, and ",
          alone, ")"));
    }
  }
  if (cfg.input_normalization != InputNormalization::kNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the crosscoder normalizes its input (", InputNormalizationName(cfg.input_normalization),
        "): its decoder's scale depends on every model's activation, and ", alone));
  }
  return absl::OkStatus();
}

absl::Status CheckQuery(const SteeringQuery& query, int64_t d_sae, int64_t prompt_tokens,
                        int64_t max_context) {
  RETURN_IF_ERROR(CheckInterventions(query.interventions, d_sae, prompt_tokens, "interventions"));
  if (query.new_tokens < 0 || query.new_tokens > kMaxSteeredTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("new_tokens: ", query.new_tokens, " outside [0, ", kMaxSteeredTokens, "]"));
  }
  if (max_context > 0 && prompt_tokens + query.new_tokens > max_context) {
    return absl::InvalidArgumentError(
        absl::StrCat("new_tokens: ", query.new_tokens, " after a prompt of ", prompt_tokens,
                     " tokens pass the model's context of ", max_context));
  }
  if (!std::isfinite(query.temperature) || query.temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: ", query.temperature, ", must be finite and >= 0"));
  }
  if (query.sweep.size() > kMaxSweepValues) {
    return absl::InvalidArgumentError(
        absl::StrCat("sweep: ", query.sweep.size(), " values, at most ", kMaxSweepValues));
  }
  for (size_t i = 0; i < query.sweep.size(); ++i) {
    if (!std::isfinite(query.sweep[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("sweep[", i, "]: ", query.sweep[i], " is not finite"));
    }
  }
  if (query.top_tokens < 0 || query.top_tokens > kMaxSteeringTopTokens) {
    return absl::InvalidArgumentError(absl::StrCat("top_tokens: ", query.top_tokens,
                                                   " outside [0, ", kMaxSteeringTopTokens, "]"));
  }
  return absl::OkStatus();
}

// Within its scope this thread's ATen operations run on one OpenMP thread (the setting is the
// calling thread's own: jobs' threads keep theirs). A generation step multiplies two rows by each
// weight matrix: split over the cores, its element-wise work is shorter than the hand-offs, and
// the idle OpenMP workers spin against the BLAS threads doing the products (on 2 cores a step
// took 3x as long).
class OneOpenMpThread {
 public:
  OneOpenMpThread() : before_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneOpenMpThread() { omp_set_num_threads(before_); }

 private:
  const int before_;
};

// The token each run takes next from its logits [runs, vocab]: greedy, or sampled at
// `temperature` with one uniform draw `u` for every row.
std::vector<int64_t> NextTokens(const at::Tensor& logits, float temperature, double u) {
  std::vector<int64_t> next;
  for (int64_t row = 0; row < logits.size(0); ++row) {
    const at::Tensor l = logits.select(0, row);
    if (temperature == 0) {
      next.push_back(l.argmax().item<int64_t>());
      continue;
    }
    const at::Tensor cdf = at::softmax(l.to(at::kDouble) / temperature, -1).cumsum(0).contiguous();
    const double* c = cdf.data_ptr<double>();
    const int64_t n = cdf.numel();
    const int64_t pick = std::upper_bound(c, c + n, u * c[n - 1]) - c;
    next.push_back(std::min(pick, n - 1));
  }
  return next;
}

SteeredRun RunOf(const NextTokenPredictions& p, int64_t row, int64_t top) {
  SteeredRun run;
  const at::Tensor losses = p.losses.select(0, row).contiguous();
  run.token_losses.assign(losses.data_ptr<float>(), losses.data_ptr<float>() + losses.numel());
  run.mean_loss = losses.numel() > 0 ? losses.to(at::kDouble).mean().item<double>() : 0;
  const at::Tensor probs = at::softmax(p.last_logits.select(0, row), -1);
  const auto [values, ids] = probs.topk(std::min(top, probs.numel()));
  for (int64_t i = 0; i < values.numel(); ++i) {
    run.next.push_back({ids[i].item<int64_t>(), values[i].item<float>()});
  }
  return run;
}

}  // namespace

absl::StatusOr<SteeringResult> SteerPrompt(const SteeringModel& given,
                                           const std::vector<int64_t>& prompt, bool bos_prepended,
                                           const SteeringQuery& query,
                                           const std::function<bool()>& cancelled,
                                           const std::vector<MoreInterventions>& more) {
  SteeringModel steering = given;
  if (std::string why = CannotRunBeside(steering, query); !why.empty()) {
    steering.diffed_models.clear();
    steering.diffed_alone = std::move(why);
  }
  ActivationModel& model = *steering.model;
  const int64_t n = static_cast<int64_t>(prompt.size());
  RETURN_IF_ERROR(CheckQuery(query, steering.sae->config().d_sae, n, model.max_context()));
  RETURN_IF_ERROR(CheckDiffed(steering, query));
  if (const std::string why = model.next_token_loss_unsupported(); !why.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("steering runs the model to its logits: ", why));
  }
  if (n < 1) return absl::InvalidArgumentError("token_ids: empty");
  at::NoGradGuard no_grad;
  const int64_t top = query.top_tokens > 0 ? query.top_tokens : 10;
  // Each intervention's value in the steered row and the sweep's rows.
  std::vector<std::vector<float>> by_intervention;
  for (const LatentIntervention& in : query.interventions) {
    std::vector<float>& by_row = by_intervention.emplace_back(1 + query.sweep.size(), in.value);
    if (&in == &query.interventions.front()) {
      std::copy(query.sweep.begin(), query.sweep.end(), by_row.begin() + 1);
    }
  }
  Intervener intervener(steering, query.interventions, by_intervention);
  RETURN_IF_ERROR(intervener.Init());
  HookSplices splices = intervener.Splices();
  // The other SAEs' changes, each value in every steered row.
  std::vector<std::unique_ptr<Intervener>> others;
  for (size_t k = 0; k < more.size(); ++k) {
    RETURN_IF_ERROR(CheckInterventions(more[k].interventions, more[k].sae.sae->config().d_sae, n,
                                       absl::StrCat("more_interventions[", k, "].interventions")));
    std::vector<std::vector<float>> values;
    for (const LatentIntervention& in : more[k].interventions) {
      values.emplace_back(1 + query.sweep.size(), in.value);
    }
    ASSIGN_OR_RETURN(others.emplace_back(),
                     Intervener::Joining(more[k].sae, more[k].interventions, values, &splices));
  }
  // Every intervener before a pass over `tokens` (continuing `cache`) starting at `first`.
  auto before_pass = [&](const at::Tensor& tokens, const KeyValueCache& cache, int64_t first) {
    intervener.set_first_position(first);
    intervener.BeforePass(model, tokens, cache);
    for (auto& other : others) {
      other->set_first_position(first);
      other->BeforePass(model, tokens, cache);
    }
  };
  const int64_t rows = 2 + static_cast<int64_t>(query.sweep.size());  // clean, steered, sweep
  const at::Tensor tokens =
      at::tensor(prompt, at::TensorOptions().dtype(at::kLong)).view({1, n}).repeat({rows, 1});
  // The prompt once; then each new token alone, its attention reading the cached positions.
  KeyValueCache cache;
  before_pass(tokens, cache, 0);
  NextTokenPredictions p = model.PredictNextTokens(tokens, splices, /*losses=*/true, &cache);

  SteeringResult out;
  out.bos_prepended = bos_prepended;
  out.prompt = prompt;
  out.sweep.resize(query.sweep.size());
  std::vector<SteeredRun*> runs = {&out.clean, &out.steered};  // in row order
  for (size_t i = 0; i < out.sweep.size(); ++i) runs.push_back(&out.sweep[i].run);
  const at::Tensor log_probs = at::log_softmax(p.last_logits.to(at::kDouble), -1);
  const at::Tensor probs = log_probs.exp();
  auto kl_from_clean = [&](int64_t row) {
    return (probs[0] * (log_probs[0] - log_probs[row])).sum().clamp_min(0).item<double>();
  };
  for (int64_t row = 0; row < rows; ++row) *runs[row] = RunOf(p, row, top);
  out.kl_divergence = kl_from_clean(1);
  for (size_t i = 0; i < out.sweep.size(); ++i) {
    out.sweep[i].value = query.sweep[i];
    out.sweep[i].kl_divergence = kl_from_clean(2 + static_cast<int64_t>(i));
  }
  const at::Tensor change = probs[1] - probs[0];
  const int64_t listed = std::min(top, change.numel());
  for (const bool rising : {true, false}) {
    const at::Tensor ids = std::get<1>(change.topk(listed, -1, /*largest=*/rising));
    for (int64_t i = 0; i < listed; ++i) {
      const int64_t id = ids[i].item<int64_t>();
      if ((change[id].item<double>() > 0) != rising || change[id].item<double>() == 0) break;
      (rising ? out.most_increased : out.most_decreased)
          .push_back({id, probs[0][id].item<float>(), probs[1][id].item<float>()});
    }
  }
  const at::Tensor values = intervener.first_values().defined()
                                ? intervener.first_values().contiguous()
                                : at::zeros({0, 0});
  for (int64_t c = 0; c < values.size(1); ++c) {
    const at::Tensor column = values.select(1, c).contiguous();
    out.latent_values.emplace_back(
        intervener.latents()[c].item<int64_t>(),
        std::vector<float>(column.data_ptr<float>(), column.data_ptr<float>() + column.numel()));
  }

  std::mt19937_64 draws(query.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int t = 0; t < query.new_tokens; ++t) {
    if (cancelled && cancelled()) {
      return absl::CancelledError(
          absl::StrCat("steering cancelled after ", t, " of ", query.new_tokens, " new tokens"));
    }
    if (t > 0) {
      OneOpenMpThread one_thread;
      std::vector<int64_t> last;
      for (const SteeredRun* run : runs) last.push_back(run->generated.back());
      const at::Tensor step = at::tensor(last, tokens.options()).view({rows, 1});
      before_pass(step, cache, cache.positions);
      p = model.PredictNextTokens(step, splices, /*losses=*/false, &cache);
    }
    const std::vector<int64_t> next = NextTokens(p.last_logits, query.temperature, uniform(draws));
    for (int64_t row = 0; row < rows; ++row) runs[row]->generated.push_back(next[row]);
  }
  return out;
}

}  // namespace latentd::engine
