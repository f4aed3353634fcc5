// Attribution of a prediction to an SAE's latents (attribution patching through an SAE, as in
// Marks et al.'s sparse feature circuits and SAELens' tutorials): which latents at the dataset's
// hook, at which positions, push the model's next-token prediction after a prompt, to first
// order. With m the metric (log p(target), or logit(target) - logit(contrast)) and g = dm/dx the
// gradient at the hook the SAE's decoder writes, latent j at position p is credited
// z_j[p] * (dx/dz_j . g[p]), its contribution to m to first order (removing it moves m by about
// minus this). The SAE's error term x - x_hat is credited (x - x_hat) . g, so that latents,
// error and the decoder's bias add up to g . x. A cross-layer transcoder's latent writes several
// hooks (decoder_writes.h): it is credited the sum over them, each with its own gradient; its
// error term is the first hook's. A crosscoder's latent reads and writes each of its sources:
// it is credited the sum over them likewise, and its error term is every source's
// (x_s - x_hat_s) . g_s. A crosscoder over several models' activations (model diffing) credits
// its latents in one of them, source s (SteeringModel::diffed_source): z from every model's
// activation at the token (the others run beside it, SteeringModel::diffed_models), each latent
// credited z_j (W_dec_s[j] . g) with g that model's gradient at its hook, the error term
// x_s - x_hat_s: which of the diff's latents drive, say, the chat model's prediction here, or
// a later latent of the chat model (a target latent, read in the same forward).
//
// Torch-free header (dataset_models.h carries these).
#ifndef LATENTD_ENGINE_ATTRIBUTION_H_
#define LATENTD_ENGINE_ATTRIBUTION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/hook_name.h"
#include "engine/steering.h"

namespace latentd::engine {

inline constexpr int kMaxAttributionTop = 1000;
inline constexpr int kMaxAblatedEntries = 64;

// A latent of another SAE on the same model, read at a hook the forward computes at or after
// the hooks the attributed SAE writes: the target of latent-to-latent attribution.
struct TargetLatent {
  int64_t latent = 0;
  int64_t position = 0;  // of the prompt as run (a prepended BOS is 0)
};

// The SAE that reads a TargetLatent, and the hook it reads; a crosscoder over hooks of the
// model reads `crosscoder_sources` side by side instead (in its blocks' order; `hook` the first).
// A crosscoder over several models' activations (model diffing) whose source `diffed_source` is
// the forward's model reads that model at `hook`, and every other source from its own model run
// beside on the same tokens, changing nothing (`diffed_models`: every source in its blocks'
// order with its model and hook; the forward's own at diffed_source): what drives, say, a
// chat-only latent in the chat model. The upstream latents move it through that model alone.
struct TargetSae {
  const Sae* sae = nullptr;
  HookName hook;
  std::vector<HookName> crosscoder_sources;
  int diffed_source = -1;
  std::vector<SteeringModel::SourceModel> diffed_models;
};

struct AttributionQuery {
  std::vector<int64_t> token_ids;  // the prompt, without BOS; 1 to kMaxPromptTokens ids
  // The prediction after the prompt's last token: log p(target); with a contrast, the logit
  // difference target - contrast. Unset target: the model's most likely next token.
  std::optional<int64_t> target_token_id;
  std::optional<int64_t> contrast_token_id;
  int top = 0;  // entries and latents listed; 0: 20, at most kMaxAttributionTop
  // Set: m is this latent's value instead (the target SAE passed beside the query), and
  // target_token_id and contrast_token_id must be unset.
  std::optional<TargetLatent> target_latent;
  // The ablation check: the first `ablate` top entries (at most kMaxAblatedEntries) are each
  // taken out of a run of their own (the latent's value 0 at its position, as steering's SET 0
  // does, the error left in), one batch, and m measured: how far the first-order credit holds.
  // AttributeToLatents checks each target's entries so (a batch per target). 0: none.
  int ablate = 0;
  // For a dataset whose SAE is a crosscoder over several models' activations (model diffing):
  // the source whose model runs and is credited (DatasetModels builds the SteeringModel, the
  // other models beside it); required there, refused elsewhere and beside a target latent.
  std::optional<int> crosscoder_source;
};

struct LatentAttribution {
  int64_t latent = 0;
  int64_t position = 0;    // of the prompt (BOS counts); for a latent's sum: its largest entry's
  float activation = 0;    // z_j[position]
  double attribution = 0;  // an entry's, or the latent's summed over positions
};

struct AttributionResult {
  bool bos_prepended = false;
  std::vector<int64_t> prompt;  // as run: BOS included
  int64_t target_token_id = 0;  // 0 with a target latent
  std::optional<int64_t> contrast_token_id;
  std::optional<TargetLatent> target_latent;
  double metric = 0;  // m on the clean run
  // (latent, position) pairs by |attribution| descending, ties by position then latent.
  std::vector<LatentAttribution> top_entries;
  // Latents by |their attribution summed over positions| descending, ties by latent.
  std::vector<LatentAttribution> top_latents;
  double latent_attribution = 0;  // summed over every active latent at every position
  double error_attribution = 0;   // of the SAE's error term, over every position
  // Per prompt position: its latents' sum and its error term's (where the prediction reads).
  std::vector<double> latent_attribution_by_position, error_attribution_by_position;
  // With query.ablate: per top entry of the first `ablate`, m's change with that entry alone
  // taken out, by a forward pass (to first order: minus its attribution).
  std::vector<double> ablated_changes;
};

// One forward and one backward pass of `prompt` (BOS included where the dataset prepends it, ids
// checked) through steering.model, the gradients taken at the hooks the SAE's decoder writes.
// With query.target_latent, `target` is the SAE that reads it. INVALID_ARGUMENT naming
// target_token_id or contrast_token_id outside the vocabulary (or the contrast equal to the
// target, or either beside a target latent), target_latent.latent or .position outside their
// ranges, target_latent.dataset_id when the target's hook comes before the hooks the SAE
// writes, top outside [0, kMaxAttributionTop], ablate outside [0, kMaxAblatedEntries];
// FAILED_PRECONDITION when the model cannot run to its logits, or the target latent is 0 at its
// position, or for a crosscoder over models whose other models cannot run beside it (saying
// why). May throw c10::Error.
absl::StatusOr<AttributionResult> AttributePrompt(const SteeringModel& steering,
                                                  const std::vector<int64_t>& prompt,
                                                  bool bos_prepended, const AttributionQuery& query,
                                                  const TargetSae* target = nullptr);

// Several latents of `target`'s SAE at once (the passes of an attribution graph): one forward
// pass, as far as the target's hook, shared by one backward pass per target; query's
// target_latent is not read. One answer per target: its attribution, or INVALID_ARGUMENT
// naming target_latent.latent or .position, FAILED_PRECONDITION for a latent that is 0 there.
// The call's own errors as AttributePrompt's. May throw c10::Error.
absl::StatusOr<std::vector<absl::StatusOr<AttributionResult>>> AttributeToLatents(
    const SteeringModel& steering, const std::vector<int64_t>& prompt, bool bos_prepended,
    const AttributionQuery& query, const TargetSae& target,
    const std::vector<TargetLatent>& targets);

// Latents of several SAEs of one model (each `saes[i].model` the same, the SAEs at their own
// hooks), each (latent, position) of removed[i] taken out of one run together (as the ablation
// check takes one out: its value scaled to 0 there, the error left in; an SAE after another
// encodes the activations the earlier removals left), beside a clean run: the metric's change.
// The metric is `metric`'s token metric with target_token_id `target_token` (its contrast if
// any), or with metric.target_latent that latent of `target`. An attribution graph's circuit,
// taken out at once. INVALID_ARGUMENT naming removed[i] for a latent or position out of range;
// the decoder reads' errors. May throw c10::Error.
absl::StatusOr<double> AblateTogether(const std::vector<SteeringModel>& saes,
                                      const std::vector<std::vector<TargetLatent>>& removed,
                                      const std::vector<int64_t>& prompt,
                                      const AttributionQuery& metric, int64_t target_token,
                                      const TargetSae* target);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_ATTRIBUTION_H_
