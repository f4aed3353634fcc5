#include "storage/latent_index_merge.h"

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "storage/latent_stats.h"

namespace latentd::storage {
namespace {

// keys::LatentStats ends in 'S', keys::LatentTop in 'T'.
bool IsStatsKey(const rocksdb::Slice& key) { return !key.empty() && key[key.size() - 1] == 'S'; }

class LatentIndexMergeOperator : public rocksdb::MergeOperator {
 public:
  const char* Name() const override { return "latentd.TopBlockMerge.v1"; }

  bool FullMergeV2(const MergeOperationInput& in, MergeOperationOutput* out) const override {
    std::vector<absl::string_view> operands;
    operands.reserve(in.operand_list.size());
    for (const rocksdb::Slice& op : in.operand_list) operands.emplace_back(op.data(), op.size());
    absl::string_view base;
    const absl::string_view* base_or_null = nullptr;
    if (in.existing_value != nullptr) {
      base = absl::string_view(in.existing_value->data(), in.existing_value->size());
      base_or_null = &base;
    }
    if (IsStatsKey(in.key)) return MergeStatsBlocks(base_or_null, operands, &out->new_value).ok();
    return MergeTopBlocks(base_or_null, operands, /*as_operand=*/false, &out->new_value).ok();
  }

  bool PartialMergeMulti(const rocksdb::Slice& key, const std::deque<rocksdb::Slice>& operand_list,
                         std::string* new_value, rocksdb::Logger*) const override {
    // Statistics operands fold only onto a block, in order: their sums are not associative to
    // the last bit, and the writer's own fold is base + operands in commit order.
    if (IsStatsKey(key)) return false;
    std::vector<absl::string_view> operands;
    operands.reserve(operand_list.size());
    for (const rocksdb::Slice& op : operand_list) operands.emplace_back(op.data(), op.size());
    return MergeTopBlocks(nullptr, operands, /*as_operand=*/true, new_value).ok();
  }
};

}  // namespace

std::shared_ptr<rocksdb::MergeOperator> NewLatentIndexMergeOperator() {
  return std::make_shared<LatentIndexMergeOperator>();
}

}  // namespace latentd::storage
