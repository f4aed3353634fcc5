// The language-modelling head at the end of a native model's forward pass: what an SAE's
// downstream loss (an EXTRACT job's downstream_loss_sequences) is measured with, and what a
// steered prompt (DatasetModels::SteerPrompt) is continued from.
#ifndef LATENTD_ENGINE_NEXT_TOKEN_LOSS_H_
#define LATENTD_ENGINE_NEXT_TOKEN_LOSS_H_

#include <ATen/ATen.h>

namespace latentd::engine {

struct NextTokenPredictions {
  // float32 [batch, seq - 1]: -log softmax(logits[b, s])[tokens[b, s + 1]], what position s
  // loses predicting the next token. Undefined unless asked for.
  at::Tensor losses;
  // float32 [batch, vocab]: the logits at the last position (what would come next).
  at::Tensor last_logits;
};

// The predictions of `normed` [batch, seq, d], the residual stream after the final norm, with
// logits = normed W_U^T in float32 (softcap > 0: softcap * tanh(logits / softcap), Gemma 2's
// final_logit_softcapping); W_U: [vocab, d]; tokens: int64 [batch, seq]. The losses' logits are
// formed a slice of positions at a time, at most 2^26 of them (256 MiB) at once, so a 256k
// vocabulary costs no more memory than a small one; without `losses` only the last position's
// are. May throw c10::Error.
NextTokenPredictions PredictNextTokens(const at::Tensor& normed, const at::Tensor& W_U,
                                       const at::Tensor& tokens, double softcap, bool losses);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_NEXT_TOKEN_LOSS_H_
