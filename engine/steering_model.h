// What steering and attribution (steering.h, attribution.h) run a prompt through: a model able to
// run to its logits and the SAE whose latents they change or credit, with where it reads and
// writes. Torch-free.
#ifndef LATENTD_ENGINE_STEERING_MODEL_H_
#define LATENTD_ENGINE_STEERING_MODEL_H_

#include <optional>
#include <string>
#include <vector>

#include "engine/hook_name.h"

namespace latentd::engine {

class ActivationModel;
class Sae;

// `model` (on the CPU), `sae` encoding `hook`'s activation, its decoder writing `hook_out` (a
// transcoder's output hook; unset: `hook` itself); or, for a crosscoder over hooks of the model,
// `crosscoder_sources`.
struct SteeringModel {
  ActivationModel* model = nullptr;
  const Sae* sae = nullptr;
  HookName hook;
  std::optional<HookName> hook_out;
  // When `sae` is layer L of a cross-layer transcoder (its config's circuit_tracer->cross_layer):
  // the release's directory. Its latents write hook_out's point in every layer from L to the
  // release's last, through decoders read from there a latent at a time
  // (LoadCrossLayerDecoderRows), so that a release too large for memory still steers.
  std::string cross_layer_dir;
  // When `sae` is a crosscoder over hooks of `model` (SaeConfig::crosscoder_sources of them): the
  // hooks in its blocks' order. It reads them side by side and block s of a latent's decoder
  // row writes crosscoder_sources[s], so its latents are known only once the forward has passed
  // the last of them: steering reads them in a pass before the one it changes (steering.h).
  // `hook` is the first; hook_out and cross_layer_dir are unset.
  std::vector<HookName> crosscoder_sources;
  // When `sae` is a crosscoder over several models' activations (model diffing; source s read
  // at each model's own `hook`) and `model` is source `diffed_source`'s: a latent writes block
  // diffed_source of its decoder row at `hook`. -1: not such a crosscoder.
  int diffed_source = -1;
  // With diffed_source set: every source in the crosscoder's blocks' order, the model it is read
  // from and its hook (entry diffed_source: `model` at `hook`, read as the steered pass reaches
  // it). The others run beside the steered (or credited) model on the same tokens, changing
  // nothing, so a latent's value is known: SET / SCALE steer too, and attribution credits it.
  // Empty: steering by ADD alone (the value added needs no value), no attribution, and
  // `diffed_alone` says why the others do not run.
  struct SourceModel {
    ActivationModel* model = nullptr;
    HookName hook;
  };
  std::vector<SourceModel> diffed_models;
  std::string diffed_alone;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_STEERING_MODEL_H_
