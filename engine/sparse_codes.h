// What an SAE's sparse encoder returns, and what can be done with it without the SAE: decoding
// (a weighted sum of decoder rows per row) and the sums reconstruction figures are made of. Only
// ATen: the GPU check kit (tests/gpu) builds this file alone.
#ifndef LATENTD_ENGINE_SPARSE_CODES_H_
#define LATENTD_ENGINE_SPARSE_CODES_H_

#include <ATen/ATen.h>

#include <cstdint>

namespace latentd::engine {

// Sparse codes of a batch of n rows, still on the device.
struct SparseCodes {
  // Fixed-k layout (TopK): indices int32 [n, k], values float32 [n, k]; zero values mean "not
  // active" and are dropped when stored. row_counts undefined.
  // Ragged layout (ReLU, JumpReLU): indices int32 [nnz], values float32 [nnz], row_counts int64
  // [n].
  at::Tensor indices;
  at::Tensor values;
  at::Tensor row_counts;
  bool fixed_k() const { return !row_counts.defined(); }
};

// The ragged codes of the rows whose pre-activations are `pre` [n, d_sae]: ReLU (threshold
// undefined: z = relu(pre)) or JumpReLU (threshold [d_sae]: z = pre * (pre > threshold)), the
// non-zero entries of z by row, columns ascending. A float32 CPU `pre` takes one fused pass per
// row range (count, then fill, over the cores) instead of the masks, products and nonzero that
// materialize z several times over (at d_sae 4096 those made a JumpReLU extraction a third
// slower than a TopK one); other devices and dtypes take those ATen ops. Both keep the same
// entries in the same order for finite pre.
SparseCodes RaggedCodes(const at::Tensor& pre, const at::Tensor& threshold);

// The fixed-k codes of the rows whose pre-activations are `pre` [n, d_sae] (TopK: the k largest
// of each row, then ReLU'd), indices ascending within a row. A float32 CPU `pre` takes one pass
// per row keeping a k-entry min-heap (most entries fail one comparison with its root), over the
// cores, instead of at::topk, a sort of the indices and a gather; other devices and dtypes take
// those ATen ops. The two agree except where entries tie at the k-th value, which each breaks its
// own way (both keep k of them).
SparseCodes FixedKCodes(const at::Tensor& pre, int64_t k);

// x_hat of `rows` rows from their codes, without forming z: each row the value-weighted sum of
// its latents' rows of W_dec [d_sae, d_in] (an embedding_bag; k x d_in multiply-adds a row),
// + b_dec [d_in] (undefined: none). On the weights' device.
at::Tensor DecodeSparseCodes(const at::Tensor& W_dec, const at::Tensor& b_dec,
                             const SparseCodes& codes, int64_t rows);

// The values `latents` (int64 [n]) take in each of `rows` rows' codes, float32 [rows, n] (0
// where a latent does not fire), on the codes' device.
at::Tensor CodeValues(const SparseCodes& codes, int64_t rows, const at::Tensor& latents);

// What reconstruction figures are made of, over the rows of x [n, d] where `keep` (bool [n])
// holds, as one float64 tensor on x's device: [sum of ||x - x_hat||^2, sum of ||x||^2, sum of
// cos(x, x_hat), rows, then sum of x per dimension (d)]. Summed over many batches these give
// explained variance around the mean of all rows exactly (storage::ReconstructionFit), with
// nothing synchronized per batch.
at::Tensor ReconstructionSums(const at::Tensor& x, const at::Tensor& x_hat, const at::Tensor& keep);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_SPARSE_CODES_H_
