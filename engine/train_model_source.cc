#include "engine/train_model_source.h"

#include <ATen/ATen.h>
#include <torch/types.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/activation_model.h"
#include "engine/device_util.h"
#include "engine/token_source.h"

namespace latentd::engine {

absl::StatusOr<std::unique_ptr<ModelRowSource>> ModelRowSource::Open(
    const latentd::v1::ExtractSpec& spec, const ExtractEnv& env, const DeviceRef& device,
    int64_t chunk_rows) {
  if (chunk_rows < 1) return absl::InvalidArgumentError("chunk_rows must be >= 1");
  ASSIGN_OR_RETURN(ExtractInputs inputs, OpenExtractInputs(spec, env, device));
  return std::unique_ptr<ModelRowSource>(new ModelRowSource(std::move(inputs), device, chunk_rows));
}

ModelRowSource::ModelRowSource(ExtractInputs inputs, DeviceRef device, int64_t chunk_rows)
    : inputs_(std::move(inputs)), device_(std::move(device)), chunk_rows_(chunk_rows) {}

ModelRowSource::~ModelRowSource() = default;

int64_t ModelRowSource::num_rows() const { return inputs_.tokens->num_rows(); }
int64_t ModelRowSource::width() const { return inputs_.model->hook_width(); }
const std::string& ModelRowSource::model_id() const { return inputs_.model->model_id(); }

std::vector<int64_t> ModelRowSource::chunk_starts() const {
  return EvenChunkStarts(num_rows(), chunk_rows_);
}

absl::Status ModelRowSource::Read(int64_t row_start, int64_t row_count, float* out) {
  if (row_start < 0 || row_count < 0 || row_start + row_count > num_rows()) {
    return absl::OutOfRangeError(
        absl::StrCat("rows [", row_start, ", ", row_start + row_count, ") of ", num_rows()));
  }
  const int64_t L = inputs_.tokens->context_length();
  const int64_t w = width();
  const int64_t vocab = inputs_.model->vocab_size();
  const int64_t row_end = row_start + row_count;
  ASSIGN_OR_RETURN(const at::Device device, ToAtDevice(device_));
  int64_t row = row_start;
  // A batch of whole sequences at a time; the first and last may hold rows outside the range
  // (a chunk boundary inside a sequence), which are computed and not copied.
  for (int64_t seq = row_start / L; row < row_end;) {
    const int64_t last_seq = (row_end - 1) / L;
    const int64_t count = std::min<int64_t>(inputs_.batch_sequences, last_seq - seq + 1);
    ids_.resize(count * L);
    RETURN_IF_ERROR(inputs_.tokens->Read(seq, count, ids_.data()));
    for (int64_t i = 0; i < count * L; ++i) {
      if (vocab > 0 && ids_[i] >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("train.activations.tokens: token id ", ids_[i], " in sequence ",
                         inputs_.tokens->first_sequence() + seq + i / L, " >= vocab_size ", vocab));
      }
    }
    try {
      torch::NoGradGuard no_grad;
      const at::Tensor hidden = inputs_.model->Forward(
          torch::from_blob(ids_.data(), {count, L}, torch::kInt64).to(device));
      const int64_t first = std::max(row, seq * L);
      const int64_t last = std::min(row_end, (seq + count) * L);
      // Only the requested rows leave the device.
      const at::Tensor rows = hidden.reshape({count * L, w})
                                  .narrow(0, first - seq * L, last - first)
                                  .to(at::kCPU, at::kFloat)
                                  .contiguous();
      std::memcpy(out + (first - row_start) * w, rows.data_ptr<float>(),
                  sizeof(float) * (last - first) * w);
      row = last;
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("the model's forward pass over sequences ", seq, "..",
                                              seq + count - 1, ": ", e.what_without_backtrace()));
    }
    seq += count;
  }
  return absl::OkStatus();
}

}  // namespace latentd::engine
