// A change of one SAE latent's value, what steering (steering.h) and the ablation check of
// attribution (attribution.h) make: torch-free, so that the service's headers can carry it.
#ifndef LATENTD_ENGINE_INTERVENTION_H_
#define LATENTD_ENGINE_INTERVENTION_H_

#include <cstdint>
#include <vector>

namespace latentd::engine {

enum class InterventionMode {
  kSet,    // z'_j = value: 0 ablates the latent; a multiple of its largest value clamps it on
  kAdd,    // z'_j = z_j + value: x + value W_dec[j], steering along its decoder direction
  kScale,  // z'_j = value z_j
};

struct LatentIntervention {
  int64_t latent = 0;
  InterventionMode mode = InterventionMode::kSet;
  float value = 0;
  // The prompt's positions it applies at (a prepended BOS is position 0); empty: every
  // position, each generated token's included. Interventions apply in order (two on one latent
  // compose).
  std::vector<int64_t> positions;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_INTERVENTION_H_
