#include "engine/stored_dense.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace latentd::engine {
namespace {

class InMemoryRows final : public StoredDenseRows {
 public:
  InMemoryRows(StoredDenseInfo info, std::vector<float> values, std::vector<int32_t> token_ids)
      : info_(std::move(info)), values_(std::move(values)), token_ids_(std::move(token_ids)) {
    info_.rows = static_cast<int64_t>(token_ids_.size());
  }
  const StoredDenseInfo& info() const override { return info_; }
  absl::Status ReadValues(int64_t row_start, int64_t row_count,
                          std::vector<float>* values) const override {
    if (absl::Status s = CheckRange(row_start, row_count); !s.ok()) return s;
    values->assign(values_.begin() + row_start * info_.width,
                   values_.begin() + (row_start + row_count) * info_.width);
    return absl::OkStatus();
  }
  absl::Status ReadTokens(int64_t row_start, int64_t row_count,
                          std::vector<int32_t>* token_ids) const override {
    if (absl::Status s = CheckRange(row_start, row_count); !s.ok()) return s;
    token_ids->assign(token_ids_.begin() + row_start, token_ids_.begin() + row_start + row_count);
    return absl::OkStatus();
  }

 private:
  absl::Status CheckRange(int64_t row_start, int64_t row_count) const {
    if (row_start < 0 || row_count < 0 || row_start + row_count > info_.rows) {
      return absl::OutOfRangeError(absl::StrCat("rows [", row_start, ", ", row_start + row_count,
                                                ") past dataset ", info_.id, "'s ", info_.rows));
    }
    return absl::OkStatus();
  }

  StoredDenseInfo info_;
  std::vector<float> values_;
  std::vector<int32_t> token_ids_;
};

}  // namespace

std::shared_ptr<const StoredDenseRows> InMemoryStoredDenseRows(StoredDenseInfo info,
                                                               std::vector<float> values,
                                                               std::vector<int32_t> token_ids) {
  return std::make_shared<InMemoryRows>(std::move(info), std::move(values), std::move(token_ids));
}

}  // namespace latentd::engine
