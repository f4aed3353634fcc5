#include "engine/train_model_source.h"

#include <ATen/ATen.h>
#include <torch/types.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/activation_model.h"
#include "engine/data_parallel.h"
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

void ModelRowSource::ShareWork(GradientSync* sync) { sync_ = sync; }

namespace {

// Runs `model` over sequences [seq_begin, seq_end) of `tokens`, batch_sequences at a time, and
// returns rows [row_begin, row_end) (which they hold) as fp32 on `device`: a sequence cut by the
// range is computed whole and only its rows in the range are kept.
absl::StatusOr<at::Tensor> RunSequences(ExtractInputs& inputs, const at::Device& device,
                                        int64_t seq_begin, int64_t seq_end, int64_t row_begin,
                                        int64_t row_end, std::vector<int64_t>* ids) {
  const int64_t L = inputs.tokens->context_length();
  const int64_t w = inputs.model->hook_width();
  const int64_t vocab = inputs.model->vocab_size();
  std::vector<at::Tensor> parts;
  for (int64_t seq = seq_begin; seq < seq_end;) {
    const int64_t count = std::min<int64_t>(inputs.batch_sequences, seq_end - seq);
    ids->resize(count * L);
    RETURN_IF_ERROR(inputs.tokens->Read(seq, count, ids->data()));
    for (int64_t i = 0; i < count * L; ++i) {
      if (vocab > 0 && (*ids)[i] >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("train.activations.tokens: token id ", (*ids)[i], " in sequence ",
                         inputs.tokens->first_sequence() + seq + i / L, " >= vocab_size ", vocab));
      }
    }
    try {
      torch::NoGradGuard no_grad;
      const at::Tensor hidden = inputs.model->Forward(
          torch::from_blob(ids->data(), {count, L}, torch::kInt64).to(device));
      const int64_t first = std::max(row_begin, seq * L);
      const int64_t last = std::min(row_end, (seq + count) * L);
      parts.push_back(
          hidden.reshape({count * L, w}).narrow(0, first - seq * L, last - first).to(at::kFloat));
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("the model's forward pass over sequences ", seq, "..",
                                              seq + count - 1, ": ", e.what_without_backtrace()));
    }
    seq += count;
  }
  if (parts.empty()) return at::empty({0, w}, at::TensorOptions(at::kFloat).device(device));
  return parts.size() == 1 ? parts[0] : at::cat(parts);
}

void CopyToHost(const at::Tensor& rows, float* out) {
  const at::Tensor host = rows.to(at::kCPU).contiguous();
  std::memcpy(out, host.data_ptr<float>(), sizeof(float) * host.numel());
}

}  // namespace

absl::Status ModelRowSource::Read(int64_t row_start, int64_t row_count, float* out) {
  if (row_start < 0 || row_count < 0 || row_start + row_count > num_rows()) {
    return absl::OutOfRangeError(
        absl::StrCat("rows [", row_start, ", ", row_start + row_count, ") of ", num_rows()));
  }
  if (row_count == 0) return absl::OkStatus();
  const int64_t L = inputs_.tokens->context_length();
  const int64_t w = width();
  const int64_t row_end = row_start + row_count;
  const int64_t seq_begin = row_start / L;
  const int64_t seq_end = (row_end - 1) / L + 1;
  ASSIGN_OR_RETURN(const at::Device device, ToAtDevice(device_));
  const int world = sync_ == nullptr ? 1 : sync_->world_size();
  if (world == 1) {
    ASSIGN_OR_RETURN(const at::Tensor rows,
                     RunSequences(inputs_, device, seq_begin, seq_end, row_start, row_end, &ids_));
    sequences_computed_ += seq_end - seq_begin;
    CopyToHost(rows, out);
    return absl::OkStatus();
  }

  // Rank r runs sequences [seq_begin + S * r / world, seq_begin + S * (r + 1) / world) and holds
  // their rows inside the range; every rank knows every part's bounds.
  const int64_t num_seqs = seq_end - seq_begin;
  auto part_rows = [&](int r) -> std::pair<int64_t, int64_t> {
    const int64_t first_seq = seq_begin + num_seqs * r / world;
    const int64_t end_seq = seq_begin + num_seqs * (r + 1) / world;
    const int64_t first = std::clamp(first_seq * L, row_start, row_end);
    return {first, std::clamp(end_seq * L, first, row_end)};
  };
  int64_t most_rows = 0;
  for (int r = 0; r < world; ++r) {
    most_rows = std::max(most_rows, part_rows(r).second - part_rows(r).first);
  }
  const int rank = sync_->rank();
  const auto [first, last] = part_rows(rank);
  // Rank r's part padded to most_rows, then one flag: whether it failed. A rank that fails still
  // joins the gather, so the others learn of it instead of waiting for it until a timeout.
  absl::Status own;
  at::Tensor packed;
  try {
    packed = at::zeros({most_rows * w + 1}, at::TensorOptions(at::kFloat).device(device));
    auto rows = RunSequences(inputs_, device, seq_begin + num_seqs * rank / world,
                             seq_begin + num_seqs * (rank + 1) / world, first, last, &ids_);
    if (rows.ok()) {
      packed.narrow(0, 0, (last - first) * w).copy_(rows->reshape({-1}));
    } else {
      own = rows.status();
      packed[most_rows * w].fill_(1.0f);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("packing rows [", first, ", ", last,
                                            ") for the other ranks: ", e.what_without_backtrace()));
  }
  sequences_computed_ += num_seqs * (rank + 1) / world - num_seqs * rank / world;
  std::vector<at::Tensor> gathered;
  RETURN_IF_ERROR(sync_->AllGather(packed, &gathered));
  RETURN_IF_ERROR(own);
  for (int r = 0; r < world; ++r) {
    const auto [r_first, r_last] = part_rows(r);
    try {
      const at::Tensor host = gathered[r].to(at::kCPU);
      if (host[most_rows * w].item<float>() != 0.0f) {
        return absl::AbortedError(absl::StrCat("rank ", r, " failed to compute rows [", r_first,
                                               ", ", r_last, ") of the model's activations"));
      }
      std::memcpy(out + (r_first - row_start) * w, host.data_ptr<float>(),
                  sizeof(float) * (r_last - r_first) * w);
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("unpacking rank ", r, "'s rows: ", e.what_without_backtrace()));
    }
  }
  return absl::OkStatus();
}

}  // namespace latentd::engine
