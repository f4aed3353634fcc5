#include "engine/next_token_loss.h"

#include <algorithm>
#include <vector>

namespace latentd::engine {
namespace {

at::Tensor Logits(const at::Tensor& normed, const at::Tensor& unembed, double softcap) {
  at::Tensor logits = at::matmul(normed.to(at::kFloat), unembed.t());
  if (softcap > 0) logits = at::tanh(logits / softcap) * softcap;
  return logits;
}

}  // namespace

NextTokenPredictions PredictNextTokens(const at::Tensor& normed, const at::Tensor& W_U,
                                       const at::Tensor& tokens, double softcap, bool losses) {
  const int64_t B = normed.size(0), S = normed.size(1), d = normed.size(2);
  const at::Tensor unembed = W_U.to(at::kFloat);
  NextTokenPredictions out;
  out.last_logits = Logits(normed.select(1, S - 1), unembed, softcap);
  if (!losses) return out;
  // Position s predicts token s + 1: the last position predicts nothing here.
  const at::Tensor inputs = normed.narrow(1, 0, S - 1).reshape({B * (S - 1), d});
  const at::Tensor targets = tokens.narrow(1, 1, S - 1).reshape({B * (S - 1)});
  const int64_t vocab = unembed.size(0);
  const int64_t rows_per_slice = std::max<int64_t>(1, (int64_t{1} << 26) / vocab);
  std::vector<at::Tensor> slices;
  for (int64_t r = 0; r < inputs.size(0); r += rows_per_slice) {
    const int64_t n = std::min(rows_per_slice, inputs.size(0) - r);
    const at::Tensor log_probs =
        at::log_softmax(Logits(inputs.narrow(0, r, n), unembed, softcap), -1);
    slices.push_back(-log_probs.gather(1, targets.narrow(0, r, n).unsqueeze(1)).squeeze(1));
  }
  out.losses = slices.empty() ? at::zeros({B, 0}, normed.options().dtype(at::kFloat))
                              : at::cat(slices).view({B, S - 1});
  return out;
}

}  // namespace latentd::engine
