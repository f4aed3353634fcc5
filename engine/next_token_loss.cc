#include "engine/next_token_loss.h"

#include <algorithm>

namespace latentd::engine {

double NextTokenCrossEntropySum(const at::Tensor& normed, const at::Tensor& W_U,
                                const at::Tensor& tokens, double softcap) {
  const int64_t B = normed.size(0), S = normed.size(1), d = normed.size(2);
  if (S < 2) return 0;
  // Position s predicts token s + 1: the last position predicts nothing here.
  const at::Tensor inputs = normed.narrow(1, 0, S - 1).reshape({B * (S - 1), d});
  const at::Tensor targets = tokens.narrow(1, 1, S - 1).reshape({B * (S - 1)});
  const at::Tensor unembed = W_U.to(at::kFloat);
  const int64_t vocab = unembed.size(0);
  const int64_t rows_per_slice = std::max<int64_t>(1, (int64_t{1} << 26) / vocab);
  double sum = 0;
  for (int64_t r = 0; r < inputs.size(0); r += rows_per_slice) {
    const int64_t n = std::min(rows_per_slice, inputs.size(0) - r);
    at::Tensor logits = at::matmul(inputs.narrow(0, r, n).to(at::kFloat), unembed.t());
    if (softcap > 0) logits = at::tanh(logits / softcap) * softcap;
    const at::Tensor log_probs = at::log_softmax(logits, -1);
    sum -= log_probs.gather(1, targets.narrow(0, r, n).unsqueeze(1)).sum().item<double>();
  }
  return sum;
}

}  // namespace latentd::engine
