#include "storage/latent_index_merge.h"

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "storage/latent_stats.h"

namespace latentd::storage {
namespace {

class LatentIndexMergeOperator : public rocksdb::MergeOperator {
 public:
  const char* Name() const override { return "latentd.TopBlockMerge.v1"; }

  bool FullMergeV2(const MergeOperationInput& in, MergeOperationOutput* out) const override {
    std::vector<absl::string_view> operands;
    operands.reserve(in.operand_list.size());
    for (const rocksdb::Slice& op : in.operand_list) operands.emplace_back(op.data(), op.size());
    absl::string_view base;
    if (in.existing_value != nullptr) {
      base = absl::string_view(in.existing_value->data(), in.existing_value->size());
    }
    return MergeTopBlocks(in.existing_value != nullptr ? &base : nullptr, operands,
                          /*as_operand=*/false, &out->new_value)
        .ok();
  }

  bool PartialMergeMulti(const rocksdb::Slice&, const std::deque<rocksdb::Slice>& operand_list,
                         std::string* new_value, rocksdb::Logger*) const override {
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
