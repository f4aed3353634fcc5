// Option enums shared by the efcp optimizers.
#ifndef EFCP_OPTIONS_COMMON_H_
#define EFCP_OPTIONS_COMMON_H_

namespace efcp {

// How weight decay wd enters the step.
enum class WeightDecayKind {
  // g += wd * p before the gradient enters the window (what the M-FAC
  // reference code does): the decay is preconditioned too.
  kCoupled,
  // p *= 1 - lr * wd, outside the preconditioner (AdamW style).
  kDecoupled,
};

// The 1/s factor of the empirical Fisher F = damp * I + (1/s) G^T G.
enum class Scaling {
  kWindow,  // s = m, as in the original M-FAC (large steps while the window fills)
  kCount,   // s = min(count, m): the average over the rows actually stored
};

// What a step does when some gradient holds a NaN or an infinity.
enum class NonFinitePolicy {
  kSkip,       // skip the whole step (no state changes), count it, warn
  kThrow,      // throw c10::Error naming the step and the parameter
  kUnchecked,  // no check: saves one device-to-host sync per step
};

// Where the Top-K of the sparse history is taken.
enum class TopKScope {
  kGlobal,    // k = ceil(density * d) largest magnitudes of a whole device shard
  kPerBlock,  // ceil(density * block_size) largest of each block of the flat vector
};

// How the indices of the sparse history rows are stored.
enum class IndexEncoding {
  kInt64,        // global index, 8 bytes (any scope)
  kInt32,        // global index, 4 bytes (any scope, shard size < 2^31)
  kInt16Block,   // block-relative, 2 bytes; kPerBlock, block_size <= 32767
  kUInt16Block,  // block-relative, 2 bytes; kPerBlock, block_size <= 65535
};

}  // namespace efcp

#endif  // EFCP_OPTIONS_COMMON_H_
