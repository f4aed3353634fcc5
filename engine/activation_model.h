// A model that turns token ids into the activations of one or more hooks, on one device.
#ifndef LATENTD_ENGINE_ACTIVATION_MODEL_H_
#define LATENTD_ENGINE_ACTIVATION_MODEL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/hook_collector.h"
#include "engine/next_token_loss.h"

namespace latentd::engine {

// The keys and values of the positions a model has run, per layer, so that a continuation runs
// its new tokens only (generation): their attention reads the held positions instead of
// recomputing them. Filled and extended by PredictNextTokens; one cache per sequence batch.
struct KeyValueCache {
  std::vector<at::Tensor> keys, values;  // per layer: [batch, key/value heads, positions, dim]
  int64_t positions = 0;                 // positions held
};

class ActivationModel {
 public:
  virtual ~ActivationModel() = default;

  // tokens: int64 [batch, seq] on the model's device, ids < vocab_size(). Returns the hooked
  // activations as float32 [batch, seq, hook_width()] on the same device. May throw c10::Error.
  // The model's first hook when it has several.
  virtual at::Tensor Forward(const at::Tensor& tokens) = 0;
  // The activations of every hook the model was built with, in that order, from one forward pass
  // (which stops after the deepest hook where the model can stop early). Same contract as
  // Forward; a one-hook model returns {Forward(tokens)}.
  virtual std::vector<at::Tensor> ForwardHooks(const at::Tensor& tokens) {
    return {Forward(tokens)};
  }
  // ForwardHooks of rows [shard_row, shard_row + tokens.numel()) of the shard an EXTRACT job
  // runs over, whose token ids are `tokens` (this default computes them from the ids alone). A
  // model over stored activations reads them by row instead, and returns what a read fails with
  // (DATA_LOSS naming the chunk) as it is. May throw c10::Error.
  virtual absl::StatusOr<std::vector<at::Tensor>> HooksOfRows(int64_t shard_row,
                                                              const at::Tensor& tokens) {
    return ForwardHooks(tokens);
  }

  virtual int64_t hook_width() const = 0;  // of the first hook
  virtual std::vector<int64_t> hook_widths() const { return {hook_width()}; }
  virtual int64_t vocab_size() const = 0;   // 0: unknown (no check)
  virtual int64_t max_context() const = 0;  // 0: unbounded
  virtual int64_t parameter_bytes() const = 0;
  // Activation bytes one token costs inside Forward (a rough upper bound, for memory checks).
  virtual int64_t activation_bytes_per_token(int64_t seq_len) const = 0;
  // The blocks a pass to the logits runs (what a backward pass keeps activations of); 0:
  // unknown.
  virtual int64_t num_blocks() const { return 0; }
  virtual const std::string& model_id() const = 0;
  virtual const std::string& weight_hash() const = 0;
  // Weights by name, for the queries that read them: "embed.W_E" and "unembed.W_U" [vocab, d]
  // (a tied model has only the first), "blocks.L.mlp.W_out" [d_mlp, d], as the model holds them
  // (views, in its dtype: a caller widens only what it uses). Empty where the model does not
  // expose its weights (TorchScript: dataset_models.h finds them by parameter name).
  virtual std::vector<std::pair<std::string, at::Tensor>> NamedWeights() const { return {}; }

  // Why PredictNextTokens cannot run ("" when it can): TorchScript modules give hidden states,
  // not logits; a checkpoint may lack its final norm.
  virtual std::string next_token_loss_unsupported() const {
    return "the model gives its hidden states, not its logits";
  }
  // A forward pass over tokens [batch, seq] through the whole model to its logits, the
  // activations at the splices' hooks replaced on the way (none: the model as it is): the
  // last position's logits, and with `losses` every position's next-token cross-entropy
  // (next_token_loss.h). With `cache`, `tokens` continue the positions it holds (the splices see
  // the new positions only), and it is extended by them. May throw c10::Error.
  virtual NextTokenPredictions PredictNextTokens(const at::Tensor& tokens,
                                                 const HookSplices& splices, bool losses,
                                                 KeyValueCache* cache = nullptr) {
    TORCH_CHECK(false, next_token_loss_unsupported());
    return {};
  }
  // The activations at `hooks` (in that order, each after the splices at it) of one forward
  // pass over tokens [batch, seq] with `splices` applied on the way, which stops once it has
  // them all: what a later SAE reads when earlier activations change (latent-to-latent
  // attribution), without the rest of the model and its unembedding. With `cache`, `tokens`
  // continue its positions as in PredictNextTokens; a pass that stops early leaves it holding
  // only the blocks it ran, so give it a copy (a copy shares the tensors, which passes never
  // change in place) to read a continuation's activations and keep the cache. Models that can
  // run PredictNextTokens can run this. May throw c10::Error.
  virtual std::vector<at::Tensor> ForwardSpliced(const at::Tensor& tokens,
                                                 const std::vector<HookName>& hooks,
                                                 const HookSplices& splices,
                                                 KeyValueCache* cache = nullptr) {
    TORCH_CHECK(false, next_token_loss_unsupported());
    return {};
  }
  // The summed next-token cross-entropy over tokens [batch, seq] (batch * (seq - 1)
  // predictions), as PredictNextTokens forms it.
  double NextTokenLossSum(const at::Tensor& tokens, const HookSplices& splices) {
    return PredictNextTokens(tokens, splices, /*losses=*/true)
        .losses.sum(at::kDouble)
        .item<double>();
  }
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_ACTIVATION_MODEL_H_
