// An SAE's downstream loss: the language model's next-token cross-entropy with the hooked
// activation replaced by the SAE's reconstruction, against the model as it is and with the
// activation zeroed (ExtractSpec.downstream_loss_sequences).
#ifndef LATENTD_ENGINE_DOWNSTREAM_LOSS_H_
#define LATENTD_ENGINE_DOWNSTREAM_LOSS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/activation_model.h"
#include "engine/hook_name.h"
#include "engine/sae.h"
#include "engine/token_source.h"
#include "proto/latentd/v1/extract.pb.h"

namespace latentd::engine {

struct SplicedSae {
  HookName hook;             // what the SAE encodes
  const Sae* sae = nullptr;  // on the model's device
  // A transcoder's output hook, where its prediction replaces the activation (and which is
  // zeroed for the ablation); unset for an SAE, which replaces `hook` itself.
  std::optional<HookName> hook_out;
  // Layer L of a cross-layer transcoder: its layers before L, each encoded from the same pass
  // at its own hook (the pass is clean up to the replaced hook), whose decoders into L add to
  // the prediction. Empty for others.
  struct EarlierLayer {
    HookName hook;
    const Sae* sae = nullptr;  // on the model's device
    at::Tensor W_dec;          // into this layer, [d_sae, d_out], on the model's device
    size_t output = 0;         // the index of that layer's own SplicedSae
  };
  std::vector<EarlierLayer> earlier;
  // A cross-layer transcoder's layer (any, 0 included): DownstreamLoss.with_layers_replaced is
  // measured, every earlier layer's SplicedSae being among the list.
  bool cross_layer = false;

  const HookName& replaced() const { return hook_out ? *hook_out : hook; }
};

// Over `sequences` sequences of `tokens` spread evenly over them (floor(i * S / sequences) of the
// S there are; all when sequences >= S: a sample of the whole shard, not of its first
// documents), batch_sequences at a time on `device`: the clean
// loss once per batch, then for each SAE its reconstruction (EncodeSparse + Predict, so a
// wide SAE's scratch stays bounded) and zeros spliced in at the hook it replaces (once per
// activation: SAEs on one hook, or on resid_post L and resid_pre L + 1, share the zero-ablated
// loss). One
// DownstreamLoss per SAE, in order. FAILED_PRECONDITION when the model cannot run to its logits
// (the reason why); CANCELLED when `cancelled` says so between batches; INTERNAL for a LibTorch
// error.
absl::StatusOr<std::vector<latentd::v1::DownstreamLoss>> MeasureDownstreamLoss(
    ActivationModel& model, const std::vector<SplicedSae>& saes, const TokenSource& tokens,
    int64_t sequences, int64_t batch_sequences, const at::Device& device,
    const std::function<bool()>& cancelled);

// "96.0% recovered", or where recovered_unreliable, "recovered not meaningful: zeroing the hook
// changes the loss by only -0.0112".
std::string DescribeRecovered(const latentd::v1::DownstreamLoss& loss);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_DOWNSTREAM_LOSS_H_
