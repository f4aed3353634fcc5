// The language-modelling loss at the end of a native model's forward pass: what the downstream
// loss of an SAE (an EXTRACT job's downstream_loss_sequences) is measured with.
#ifndef LATENTD_ENGINE_NEXT_TOKEN_LOSS_H_
#define LATENTD_ENGINE_NEXT_TOKEN_LOSS_H_

#include <ATen/ATen.h>

namespace latentd::engine {

// sum over b and s < seq - 1 of -log softmax(logits[b, s])[tokens[b, s + 1]], with
// logits = normed W_U^T in float32 (softcap > 0: softcap * tanh(logits / softcap), Gemma 2's
// final_logit_softcapping). normed: [batch, seq, d], the residual stream after the final norm;
// W_U: [vocab, d]; tokens: int64 [batch, seq]. The logits are formed a slice of positions at a
// time, at most 2^26 of them (256 MiB) at once, so a 256k vocabulary costs no more memory than
// a small one. May throw c10::Error.
double NextTokenCrossEntropySum(const at::Tensor& normed, const at::Tensor& W_U,
                                const at::Tensor& tokens, double softcap = 0);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_NEXT_TOKEN_LOSS_H_
