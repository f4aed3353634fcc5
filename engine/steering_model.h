// What steering and attribution (steering.h, attribution.h) run a prompt through: a model able to
// run to its logits and the SAE whose latents they change or credit, with where it reads and
// writes. Torch-free.
#ifndef LATENTD_ENGINE_STEERING_MODEL_H_
#define LATENTD_ENGINE_STEERING_MODEL_H_

#include <optional>
#include <string>

#include "engine/hook_name.h"

namespace latentd::engine {

class ActivationModel;
class Sae;

// `model` (on the CPU), `sae` encoding `hook`'s activation, its decoder writing `hook_out` (a
// transcoder's output hook; unset: `hook` itself).
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
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_STEERING_MODEL_H_
