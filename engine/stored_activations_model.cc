#include "engine/stored_activations_model.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

// The sources' values of `get`, once each in source order, " + "-joined.
template <typename Get>
std::string JoinDistinct(const std::vector<std::shared_ptr<const StoredDenseRows>>& sources,
                         Get get) {
  std::vector<std::string> seen;
  for (const auto& source : sources) {
    const std::string& v = get(source->info());
    if (std::find(seen.begin(), seen.end(), v) == seen.end()) seen.push_back(v);
  }
  std::string joined;
  for (const std::string& v : seen) absl::StrAppend(&joined, joined.empty() ? "" : " + ", v);
  return joined;
}

}  // namespace

StoredActivationsModel::StoredActivationsModel(
    std::vector<std::shared_ptr<const StoredDenseRows>> sources, int64_t shard_first_row,
    const at::Device& device, int outputs)
    : sources_(std::move(sources)),
      shard_first_row_(shard_first_row),
      device_(device),
      outputs_(std::max(outputs, 1)) {
  for (const auto& source : sources_) width_ += source->info().width;
  model_id_ = JoinDistinct(
      sources_, [](const StoredDenseInfo& i) -> const std::string& { return i.model_id; });
  weight_hash_ = JoinDistinct(
      sources_, [](const StoredDenseInfo& i) -> const std::string& { return i.model_weight_hash; });
}

at::Tensor StoredActivationsModel::Forward(const at::Tensor&) {
  TORCH_CHECK(false, "stored activations are read by row (HooksOfRows), not computed from ids");
  return at::Tensor();
}

absl::StatusOr<std::vector<at::Tensor>> StoredActivationsModel::HooksOfRows(
    int64_t shard_row, const at::Tensor& tokens) {
  const int64_t rows = tokens.numel();
  // Filled side by side on the host (a row's sources next to each other), then one copy to the
  // device; pinned there so the copy overlaps the previous batch's work.
  at::Tensor host =
      at::empty({rows, width_}, at::TensorOptions(at::kFloat).pinned_memory(device_.is_cuda()));
  float* dst = host.data_ptr<float>();
  std::vector<float> part;
  int64_t offset = 0;
  for (const auto& source : sources_) {
    const int64_t w = source->info().width;
    RETURN_IF_ERROR(source->ReadValues(shard_first_row_ + shard_row, rows, &part));
    if (static_cast<int64_t>(part.size()) != rows * w) {
      return absl::DataLossError(absl::StrCat("dataset ", source->info().id, ": rows [",
                                              shard_first_row_ + shard_row, ", +", rows, ") read ",
                                              part.size(), " values, expected ", rows * w));
    }
    for (int64_t i = 0; i < rows; ++i) {
      std::copy(part.begin() + i * w, part.begin() + (i + 1) * w, dst + i * width_ + offset);
    }
    offset += w;
  }
  std::vector<int64_t> shape(tokens.sizes().begin(), tokens.sizes().end());
  shape.push_back(width_);
  return std::vector<at::Tensor>(outputs_,
                                 host.to(device_, /*non_blocking=*/device_.is_cuda()).view(shape));
}

absl::Status ReadStoredSequences(const std::vector<std::shared_ptr<const StoredDenseRows>>& sources,
                                 int64_t shard_first_row, int64_t context_length,
                                 const std::string& field, int64_t first, int64_t count,
                                 int64_t* out) {
  const int64_t row = shard_first_row + first * context_length;
  const int64_t rows = count * context_length;
  std::vector<int32_t> ids, other;
  RETURN_IF_ERROR(sources[0]->ReadTokens(row, rows, &ids));
  if (static_cast<int64_t>(ids.size()) != rows) {
    return absl::DataLossError(absl::StrCat("dataset ", sources[0]->info().id, ": rows [", row,
                                            ", +", rows, ") read ", ids.size(), " token ids"));
  }
  for (size_t s = 1; s < sources.size(); ++s) {
    RETURN_IF_ERROR(sources[s]->ReadTokens(row, rows, &other));
    if (other.size() != ids.size()) {
      return absl::DataLossError(absl::StrCat("dataset ", sources[s]->info().id, ": rows [", row,
                                              ", +", rows, ") read ", other.size(), " token ids"));
    }
    for (int64_t i = 0; i < rows; ++i) {
      if (other[i] == ids[i]) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", s, "]: dataset ", sources[s]->info().id, " holds token ", other[i],
          " at row ", row + i, ", dataset ", sources[0]->info().id, " token ", ids[i],
          ": a crosscoder's datasets must hold the same tokens, row for row (extract them from "
          "one token file with the same shard and context length)"));
    }
  }
  std::copy(ids.begin(), ids.end(), out);
  return absl::OkStatus();
}

}  // namespace latentd::engine
