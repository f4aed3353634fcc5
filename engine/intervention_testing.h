// Test helpers for steering and attribution: a small reference model and a random TopK SAE (or
// transcoder, or cross-layer transcoder) on its residual width, the same in every test that
// compares against them.
#ifndef LATENTD_ENGINE_INTERVENTION_TESTING_H_
#define LATENTD_ENGINE_INTERVENTION_TESTING_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/gpt2_model.h"
#include "engine/hook_name.h"
#include "engine/sae.h"
#include "engine/steering_model.h"

namespace latentd::engine {

inline constexpr int64_t kInterventionWidth = 32;    // d_model
inline constexpr int64_t kInterventionLatents = 64;  // d_sae, k = 4
inline const std::vector<int64_t> kInterventionPrompt = {7, 42, 3, 99, 15, 15, 60, 8};

// The reference model (3 layers, 4 heads, vocabulary 100, context 16, seed 5) with `hook`; other
// weights (the other model of a model-diffing crosscoder) with another seed, and `vocab`.
std::unique_ptr<Gpt2Model> InterventionModel(const std::string& hook, uint64_t seed = 5,
                                             int64_t vocab = 100);

// A TopK SAE of random weights (seed 11); a transcoder of the same width when asked.
Sae InterventionSae(bool transcoder);

// A TopK crosscoder (k = 4) of random weights (seed 17) over the model's kInterventionCrosscoder
// hooks, in that order: d_in 2 x kInterventionWidth.
inline const std::vector<std::string> kInterventionCrosscoder = {"blocks.1.hook_resid_post",
                                                                 "blocks.0.hook_resid_post"};
Sae InterventionCrosscoder();

// Writes a ReLU cross-layer transcoder over the model's 3 layers in circuit-tracer's release
// layout to `dir` (kInterventionLatents latents a layer, random weights of seed 13), reading
// hook_resid_mid and predicting hook_mlp_out; Sae::Load(dir, blocks.L.hook_resid_mid) loads
// layer L.
void WriteInterventionClt(const std::string& dir);

inline constexpr char kInterventionCltInput[] = "blocks.1.hook_resid_mid";

// That release written to TEST_TMPDIR/clt, its layer 1 loaded (reading kInterventionCltInput,
// writing the MLP outputs of blocks 1 and 2), and the model built with that hook.
struct InterventionCltLayer1 {
  std::string dir;
  std::unique_ptr<Gpt2Model> model;
  std::optional<Sae> sae;  // unset (after a test failure) when it did not load

  SteeringModel steering() const {
    return {model.get(), &*sae, *ParseHookName(kInterventionCltInput),
            *ParseHookName("blocks.1.hook_mlp_out"), dir};
  }
};
InterventionCltLayer1 LoadInterventionCltLayer1();

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_INTERVENTION_TESTING_H_
