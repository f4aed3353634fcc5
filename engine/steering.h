// Steering and ablation through an SAE (Neuronpedia's steer, SAELens' interventions on a hooked
// SAE): a prompt runs through the model with some of the SAE's latents changed at the hook its
// decoder writes (each of them, for a cross-layer transcoder: decoder_writes.h), and is
// continued, beside the model as it is. The activation x there becomes
// x + (z' - z) W_dec, where z is the SAE's encoding and z' the changed one: the SAE's
// reconstruction error stays in, so an intervention that changes nothing leaves the run exactly
// the clean one, and only the named latents' contributions move.
//
// A crosscoder over hooks of the model reads all of them, and block s of its decoder writes
// source s: its latents are known only once the forward has passed the last source, after the
// first has been written. So each steered pass is preceded by one that changes nothing, stopped
// at the last source, whose z the interventions change (at the prompt the clean run's; at a
// generated token, each run's own as its past stands); then x_s + (z' - z) W_dec_s at each
// source. About twice a forward's work per pass.
//
// A crosscoder over two (or more) models' activations (model diffing) steers one of them, its
// source s: latent j's change writes (z' - z) * block s of its decoder row at that model's hook
// (steering the model along the direction the crosscoder learned for it; a latent of the other
// model's own has a block near 0 here). The other models run beside it on the same tokens (the
// prompt, then each run's generated ones), changing nothing, each to its hook: z is the
// crosscoder's encoding of their activations and the steered model's own at the token, so SET
// (an ablation of a chat-only latent in the chat model, say) and SCALE work as for an SAE. Where
// the others cannot run (SteeringModel::diffed_models empty, or a model with a smaller
// vocabulary than the steered one's, which may generate ids it cannot read) only ADD steers,
// its value added without z.
//
// Torch-free header (dataset_models.h, which the Datasets service includes, carries these).
#ifndef LATENTD_ENGINE_STEERING_H_
#define LATENTD_ENGINE_STEERING_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/intervention.h"
#include "engine/steering_model.h"

namespace latentd::engine {

inline constexpr int kMaxInterventions = 64;
inline constexpr int kMaxSteeredTokens = 256;
inline constexpr int kMaxSteeringTopTokens = 1000;
inline constexpr int kMaxSweepValues = 16;

// Latents of another SAE of the same model that the steered runs change too (every steered run
// alike: a sweep varies interventions[0] only): steering a circuit across hooks at once.
struct MoreInterventions {
  SteeringModel sae;  // its model the steered SAE's
  std::vector<LatentIntervention> interventions;
};

struct SteeringQuery {
  std::vector<int64_t> token_ids;  // the prompt, without BOS; 1 to kMaxPromptTokens ids
  std::vector<LatentIntervention> interventions;  // 1 to kMaxInterventions
  int new_tokens = 0;  // tokens generated after the prompt by each run; at most kMaxSteeredTokens
  // 0: greedy (the most likely token; the lowest id on ties). > 0: sampled from softmax(logits /
  // temperature) with `seed`, one uniform draw per step shared by both runs (common random
  // numbers), so that where the runs differ the intervention made them differ, not the draw.
  float temperature = 0;
  uint64_t seed = 0;
  int top_tokens = 0;  // next-token predictions and changes listed; 0: 10
  // A strength sweep: one more steered run per value, interventions[0]'s value replaced by it
  // (the others as given), in the same batch; at most kMaxSweepValues.
  std::vector<float> sweep;
  // For a dataset whose SAE is a crosscoder over several models' activations (model diffing):
  // the source whose model runs (DatasetModels builds the SteeringModel of it); required there
  // and refused elsewhere.
  std::optional<int> crosscoder_source;
};

struct TokenProbability {
  int64_t token_id = 0;
  float probability = 0;
};

struct NextTokenChange {
  int64_t token_id = 0;
  float clean_probability = 0;
  float steered_probability = 0;
};

// One run of the prompt: the model as it is (clean) or with the interventions (steered).
struct SteeredRun {
  std::vector<int64_t> generated;  // new_tokens ids after the prompt
  // After the prompt's last token: the top_tokens most likely, probability descending.
  std::vector<TokenProbability> next;
  // Per position s < n - 1 of the n-token prompt: -log p(token s + 1); and their mean.
  std::vector<float> token_losses;
  double mean_loss = 0;
};

// One run of a strength sweep.
struct SweptRun {
  float value = 0;  // interventions[0]'s value in this run
  SteeredRun run;
  double kl_divergence = 0;  // of its next token from the clean run's
};

struct SteeringResult {
  bool bos_prepended = false;
  std::vector<int64_t> prompt;  // as run: BOS included where prepended
  SteeredRun clean, steered;
  // KL(clean || steered) of the next-token distributions after the prompt, in nats.
  double kl_divergence = 0;
  // The top_tokens tokens whose probability after the prompt rose (fell) most.
  std::vector<NextTokenChange> most_increased, most_decreased;
  // Each intervened latent (ascending, once) with its value at every prompt position as the
  // SAE encodes the clean run's activation: what a SET value compares with. Empty for a
  // crosscoder over models steered alone (its values need every model's run).
  std::vector<std::pair<int64_t, std::vector<float>>> latent_values;
  std::vector<SweptRun> sweep;  // query.sweep's runs, in its order
};

// Runs `prompt` (BOS included where the dataset prepends it; its ids already checked against
// the vocabulary) clean and steered (and swept) as one batch, then generates query.new_tokens
// more for each, a token a forward pass whose attention reads the earlier positions' cached
// keys and values (KeyValueCache). INVALID_ARGUMENT naming the query's field
// (interventions, their latent, value or positions, new_tokens beyond kMaxSteeredTokens or the
// model's context, temperature, top_tokens, sweep); FAILED_PRECONDITION when the model cannot run
// to its logits (TorchScript); CANCELLED when `cancelled` says so between tokens. May throw
// c10::Error (the caller turns it into a Status). With steering.diffed_source set and the model
// steered alone, an intervention other than ADD is INVALID_ARGUMENT naming
// interventions[i].mode, and a crosscoder that normalizes its input (its output scale depends on
// every model's) FAILED_PRECONDITION, both saying why the others do not run.
// `more`: other SAEs' interventions in the same steered runs (each SAE after another encoding
// what the earlier changes left); INVALID_ARGUMENT naming more_interventions[k] as for
// interventions.
absl::StatusOr<SteeringResult> SteerPrompt(const SteeringModel& steering,
                                           const std::vector<int64_t>& prompt, bool bos_prepended,
                                           const SteeringQuery& query,
                                           const std::function<bool()>& cancelled,
                                           const std::vector<MoreInterventions>& more = {});

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_STEERING_H_
