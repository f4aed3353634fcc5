// The RocksDB merge operator of the latent_index family: commits add operands instead of
// rewriting whole blocks, and RocksDB folds them at read and compaction time: top-N operands
// (EncodeTopDelta, MergeTopBlocks; also folded among themselves) and statistics operands
// (StatsDeltaBuilder, MergeStatsBlocks; only ever folded onto a block, in order).
#ifndef LATENTD_STORAGE_LATENT_INDEX_MERGE_H_
#define LATENTD_STORAGE_LATENT_INDEX_MERGE_H_

#include <memory>

#include "rocksdb/merge_operator.h"

namespace latentd::storage {

// A malformed operand or base fails the merge, which RocksDB reports as Corruption (DATA_LOSS
// to callers of Db). The name is part of the on-disk contract: keep it.
std::shared_ptr<rocksdb::MergeOperator> NewLatentIndexMergeOperator();

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_LATENT_INDEX_MERGE_H_
