// Changes some of an SAE's latents inside a forward pass, row by row of a batch: the mechanism
// under steering (steering.h: a clean row and steered ones) and attribution's ablation check
// (attribution.h: one entry taken out per row). Row 0 runs clean; in row r >= 1 the latents'
// values z become z' and the activation at each hook the decoder writes becomes
// x + (z' - z) * DecoderOutputScale * rows (decoder_writes.h), the SAE's error left in.
//
// Internal to engine/: a torch header.
#ifndef LATENTD_ENGINE_INTERVENER_H_
#define LATENTD_ENGINE_INTERVENER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/activation_model.h"
#include "engine/hook_collector.h"
#include "engine/intervention.h"
#include "engine/steering_model.h"

namespace latentd::engine {

// A crosscoder over models (SteeringModel::diffed_models set): each other model's activation at
// its hook over `tokens` [batch, seq] (continuing (*caches)[s] when caches is not null; its
// positions must be where the pass starts), the steered source's entry left undefined. Rows
// that read the same tokens with nothing cached run once, their activation and cache shared
// (expanded) by every row.
std::vector<at::Tensor> ActivationsBeside(const SteeringModel& steering, const at::Tensor& tokens,
                                          std::vector<KeyValueCache>* caches = nullptr);
// The crosscoder's input [batch, seq, sources * width]: `beside` (ActivationsBeside) with the
// steered model's activation `x` at its hook in its block.
at::Tensor CrosscoderInputBeside(const SteeringModel& steering,
                                 const std::vector<at::Tensor>& beside, const at::Tensor& x);

class Intervener {
 public:
  // `values[i][r]`: intervention i's value in row 1 + r (its own `value` is not read; the values
  // are copied). `steering` and `interventions` must outlive the Intervener.
  Intervener(const SteeringModel& steering, const std::vector<LatentIntervention>& interventions,
             const std::vector<std::vector<float>>& values);

  // One more Intervener in a forward that changes several SAEs: built, Init done, and its
  // splices appended to *splices (after those already there, so an SAE added later encodes what
  // the earlier ones changed when it reads at or after their hooks).
  static absl::StatusOr<std::unique_ptr<Intervener>> Joining(
      const SteeringModel& steering, const std::vector<LatentIntervention>& interventions,
      const std::vector<std::vector<float>>& values, HookSplices* splices);

  // Reads the intervened latents' decoder rows at every hook the SAE writes (a cross-layer
  // release's from its files: INVALID_ARGUMENT or DATA_LOSS from there).
  absl::Status Init();

  // The splices that change a forward: one where the SAE reads that works out what the
  // interventions change, then one at each hook its decoder writes that adds it (an SAE's is
  // the same hook, spliced in that order). A crosscoder's change comes from the pass before
  // (BeforePass).
  HookSplices Splices();

  // Before each changed pass over `tokens` (continuing `cache`; set_first_position first).
  // For a crosscoder over hooks: its sources' activations from a pass that changes nothing,
  // stopped at the last of them (on a copy of the cache, which the changed pass then
  // continues), and what the interventions change from there. The latents are those of each row
  // as it stands before this pass's writes: at the prompt the clean run's, at a generated token
  // the row's own past. For a crosscoder over models with SteeringModel::diffed_models: each
  // other model's activation at its hook, from its own run over the same tokens (its own cache,
  // started afresh by a pass at position 0), which the changed pass reads beside the steered
  // model's. Others read their input in the changed pass itself: a no-op.
  void BeforePass(ActivationModel& model, const at::Tensor& tokens, const KeyValueCache& cache);

  // The position the next pass's first token sits at (a cached continuation's).
  void set_first_position(int64_t position) { first_position_ = position; }

  // The latents' clean values over the first pass's positions, [positions, latents]; undefined
  // for a crosscoder over models steered alone (SteeringModel::diffed_models empty).
  const at::Tensor& first_values() const { return first_values_; }
  // The intervened latents, each once, ascending (the columns of first_values).
  const at::Tensor& latents() const { return latents_; }

 private:
  // From the SAE's input x [batch, seq, d_in], the change of the latents' values in rows 1.. in
  // the hook's units: (z' - z) * DecoderOutputScale, [runs * seq, latents].
  void Change(const at::Tensor& in);
  // The SAE's input from the activation `x` at steering_.hook: x, or for a crosscoder over
  // models the other models' activations (BeforePass) and x side by side in its blocks' order.
  at::Tensor InputAtHook(const at::Tensor& x) const;
  // A crosscoder over models steered without the others: its latents' values are unknown and
  // every intervention adds.
  bool AddedAlone() const {
    return steering_.diffed_source >= 0 && steering_.diffed_models.empty();
  }
  // `out` [batch, seq, width] of written hook h with rows 1.. moved by the change.
  at::Tensor Changed(const at::Tensor& out, size_t h) const;

  const SteeringModel& steering_;
  const std::vector<LatentIntervention>& interventions_;
  std::vector<at::Tensor> values_;     // per intervention: its value in each changed row, [rows, 1]
  std::map<int64_t, int64_t> column_;  // latent -> its column in latents_
  at::Tensor latents_;                 // int64, ascending
  std::vector<at::Tensor> rows_;       // per written hook: the latents' decoder rows there
  at::Tensor delta_;                   // the current pass's change (Change)
  int64_t first_position_ = 0;
  at::Tensor first_values_;
  // A crosscoder over models: per source, its model's cache and activation in this pass (the
  // steered source's left empty).
  std::vector<KeyValueCache> beside_caches_;
  std::vector<at::Tensor> beside_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_INTERVENER_H_
