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
int64_t ModelRowSource::width() const {
  int64_t width = 0;
  for (const int64_t w : inputs_.model->hook_widths()) width += w;
  return width;
}
const std::string& ModelRowSource::model_id() const { return inputs_.model->model_id(); }

std::vector<int64_t> ModelRowSource::chunk_starts() const {
  return EvenChunkStarts(num_rows(), chunk_rows_);
}

void ModelRowSource::ShareWork(GradientSync* sync) { sync_ = sync; }

namespace {

// Runs `inputs`' model over sequences `seqs` (ascending), `batch` at a time, and returns their
// hidden states, [seqs.size() * L, w] fp32 on `device` (the hooks' side by side, w wide in all:
// ModelRowSource::width()).
absl::StatusOr<at::Tensor> RunSequences(ExtractInputs& inputs, const at::Device& device,
                                        const std::vector<int64_t>& seqs, int64_t batch, int64_t w,
                                        std::vector<int64_t>* ids) {
  const int64_t L = inputs.tokens->context_length();
  const int64_t vocab = inputs.model->vocab_size();
  std::vector<at::Tensor> parts;
  for (size_t begin = 0; begin < seqs.size();) {
    const size_t end = std::min(seqs.size(), begin + static_cast<size_t>(batch));
    const auto count = static_cast<int64_t>(end - begin);
    ids->resize(count * L);
    for (size_t i = begin; i < end; ++i) {
      RETURN_IF_ERROR(inputs.tokens->Read(seqs[i], 1, ids->data() + (i - begin) * L));
    }
    for (int64_t i = 0; i < count * L; ++i) {
      if (vocab > 0 && (*ids)[i] >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            "train.activations.tokens: token id ", (*ids)[i], " in sequence ",
            inputs.tokens->first_sequence() + seqs[begin + i / L], " >= vocab_size ", vocab));
      }
    }
    try {
      torch::NoGradGuard no_grad;
      std::vector<at::Tensor> hooked = inputs.model->ForwardHooks(
          torch::from_blob(ids->data(), {count, L}, torch::kInt64).to(device));
      for (at::Tensor& h : hooked) h = h.reshape({count * L, h.size(-1)});
      const at::Tensor hidden = hooked.size() == 1 ? hooked[0] : at::cat(hooked, 1);
      parts.push_back(hidden.to(at::kFloat));
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("the model's forward pass over sequences ",
                                              seqs[begin], "..", seqs[end - 1], ": ",
                                              e.what_without_backtrace()));
    }
    begin = end;
  }
  if (parts.empty()) return at::empty({0, w}, at::TensorOptions(at::kFloat).device(device));
  return parts.size() == 1 ? parts[0] : at::cat(parts);
}

// The rows of one sequence inside one requested range, and where they go in the output.
struct Piece {
  int64_t seq;        // the sequence holding them
  int64_t seq_index;  // its place among the read's distinct sequences (ascending)
  int64_t first;      // rows [first, last) of the source
  int64_t last;
  int64_t out_row;  // the output row of `first`
};

// The rows of `pieces`, in order ([their rows, width]), from `hidden`: the hidden states of
// the read's sequences from index `first_index` on, L rows each.
at::Tensor PieceRows(const at::Tensor& hidden, int64_t first_index,
                     const std::vector<Piece>& pieces, int64_t L) {
  std::vector<at::Tensor> rows;
  for (const Piece& piece : pieces) {
    rows.push_back(hidden.narrow(0,
                                 (piece.seq_index - first_index) * L + piece.first - piece.seq * L,
                                 piece.last - piece.first));
  }
  return rows.empty() ? hidden.narrow(0, 0, 0) : at::cat(rows);
}

int64_t RowsOf(const std::vector<Piece>& pieces) {
  int64_t rows = 0;
  for (const Piece& piece : pieces) rows += piece.last - piece.first;
  return rows;
}

}  // namespace

absl::Status ModelRowSource::Read(int64_t row_start, int64_t row_count, float* out) {
  return ReadRanges({{row_start, row_count}}, out);
}

absl::Status ModelRowSource::ReadRanges(const std::vector<RowRange>& ranges, float* out) {
  const int64_t L = inputs_.tokens->context_length();
  const int64_t w = width();
  std::vector<Piece> pieces;
  std::vector<int64_t> seqs;
  int64_t out_row = 0;
  for (const RowRange& range : ranges) {
    if (range.start < 0 || range.count < 0 || range.start + range.count > num_rows()) {
      return absl::OutOfRangeError(absl::StrCat("rows [", range.start, ", ",
                                                range.start + range.count, ") of ", num_rows()));
    }
    for (int64_t row = range.start; row < range.start + range.count;) {
      const int64_t seq = row / L;
      const int64_t last = std::min(range.start + range.count, (seq + 1) * L);
      pieces.push_back({seq, 0, row, last, out_row + row - range.start});
      seqs.push_back(seq);
      row = last;
    }
    out_row += range.count;
  }
  std::sort(seqs.begin(), seqs.end());
  seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
  ASSIGN_OR_RETURN(const at::Device device, ToAtDevice(device_));

  // Rank r runs sequences [S * r / world, S * (r + 1) / world) of `seqs` and holds the pieces in
  // them, in request order; every rank knows every rank's share.
  const int world = sync_ == nullptr ? 1 : sync_->world_size();
  const int rank = sync_ == nullptr ? 0 : sync_->rank();
  const auto num_seqs = static_cast<int64_t>(seqs.size());
  auto first_index = [&](int r) { return num_seqs * r / world; };
  std::vector<std::vector<int64_t>> share_seqs(world);
  std::vector<int> owner(num_seqs);
  for (int r = 0; r < world; ++r) {
    share_seqs[r].assign(seqs.begin() + first_index(r), seqs.begin() + first_index(r + 1));
    std::fill(owner.begin() + first_index(r), owner.begin() + first_index(r + 1), r);
  }
  std::vector<std::vector<Piece>> share_pieces(world);
  for (Piece& piece : pieces) {
    piece.seq_index = std::lower_bound(seqs.begin(), seqs.end(), piece.seq) - seqs.begin();
    share_pieces[owner[piece.seq_index]].push_back(piece);
  }
  auto unpack = [&](int r, const float* rows) {
    for (const Piece& piece : share_pieces[r]) {
      const int64_t n = piece.last - piece.first;
      std::memcpy(out + piece.out_row * w, rows, sizeof(float) * n * w);
      rows += n * w;
    }
  };

  // Forward passes of at most a chunk's rows (and batch_sequences): a window's sequences in one
  // pass would be larger than any the chunk-by-chunk reads ran, and measured on CPU at 1024-token
  // contexts 4 sequences a pass cost 1.6x the time of 1 at a time (attention's [B, H, S, S]
  // scores outgrow the caches); docs/TRAIN.md.
  const int64_t batch =
      std::clamp<int64_t>(chunk_rows_ / L, 1, std::max<int64_t>(inputs_.batch_sequences, 1));
  absl::StatusOr<at::Tensor> hidden =
      RunSequences(inputs_, device, share_seqs[rank], batch, w, &ids_);
  sequences_computed_ += static_cast<int64_t>(share_seqs[rank].size());
  if (world == 1) {
    RETURN_IF_ERROR(hidden.status());
    try {
      const at::Tensor rows =
          PieceRows(*hidden, first_index(0), share_pieces[0], L).to(at::kCPU).contiguous();
      unpack(0, rows.data_ptr<float>());
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("copying the model's activations: ", e.what_without_backtrace()));
    }
    return absl::OkStatus();
  }

  // This rank's rows padded to the most any rank holds, then one flag: whether it failed. A
  // rank that fails still joins the gather, so the others learn of it instead of waiting for
  // it until a timeout.
  int64_t most_rows = 0;
  for (int r = 0; r < world; ++r) most_rows = std::max(most_rows, RowsOf(share_pieces[r]));
  at::Tensor packed;
  try {
    packed = at::zeros({most_rows * w + 1}, at::TensorOptions(at::kFloat).device(device));
    if (hidden.ok()) {
      const int64_t mine = RowsOf(share_pieces[rank]);
      packed.narrow(0, 0, mine * w)
          .copy_(PieceRows(*hidden, first_index(rank), share_pieces[rank], L).reshape({-1}));
    } else {
      packed[most_rows * w].fill_(1.0f);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("packing rows for the other ranks: ", e.what_without_backtrace()));
  }
  std::vector<at::Tensor> gathered;
  RETURN_IF_ERROR(sync_->AllGather(packed, &gathered));
  RETURN_IF_ERROR(hidden.status());
  for (int r = 0; r < world; ++r) {
    try {
      const at::Tensor host = gathered[r].to(at::kCPU).contiguous();
      if (host[most_rows * w].item<float>() != 0.0f) {
        return absl::AbortedError(absl::StrCat("rank ", r, " failed to compute its ",
                                               share_seqs[r].size(),
                                               " sequences of the model's activations"));
      }
      unpack(r, host.data_ptr<float>());
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("unpacking rank ", r, "'s rows: ", e.what_without_backtrace()));
    }
  }
  return absl::OkStatus();
}

}  // namespace latentd::engine
