#include "efcp/row_window.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace efcp {
namespace {

int64_t CeilFraction(double density, int64_t n) {
  const double x = density * static_cast<double>(n);
  // The tolerance absorbs 0.05 * 100 = 5.000000000000001.
  int64_t k = static_cast<int64_t>(std::ceil(x - 1e-9 * std::max(1.0, x)));
  return std::min(n, std::max<int64_t>(1, k));
}

int64_t IndexBytes(IndexEncoding e) {
  switch (e) {
    case IndexEncoding::kInt64:
      return 8;
    case IndexEncoding::kInt32:
      return 4;
    default:
      return 2;
  }
}

at::ScalarType IndexType(IndexEncoding e) {
  switch (e) {
    case IndexEncoding::kInt64:
      return at::kLong;
    case IndexEncoding::kInt32:
      return at::kInt;
    default:
      return at::kShort;
  }
}

bool BlockRelative(IndexEncoding e) {
  return e == IndexEncoding::kInt16Block || e == IndexEncoding::kUInt16Block;
}

}  // namespace

absl::Status ValidateSparseConfig(const RowWindowConfig& c, const std::string& prefix) {
  if (!(c.density > 0.0 && c.density <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ".density must be in (0, 1], got ", c.density));
  }
  if (c.k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ".k must be >= 0 (0: use density), got ", c.k));
  }
  if (c.value_dtype != at::kFloat && c.value_dtype != at::kBFloat16 &&
      c.value_dtype != at::kDouble && c.value_dtype != at::kHalf) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ".value_dtype must be float32, bfloat16, float16 or float64, got ",
                     std::string(c10::toString(c.value_dtype))));
  }
  if (c.topk_scope == TopKScope::kPerBlock) {
    const int64_t max_block = c.index_encoding == IndexEncoding::kInt16Block ? 32767
                              : c.index_encoding == IndexEncoding::kUInt16Block
                                  ? 65535
                                  : (int64_t{1} << 31) - 1;
    if (c.block_size < 1 || c.block_size > max_block) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, ".block_size must be in [1, ",
                                                     max_block, "] for this index_encoding, got ",
                                                     c.block_size));
    }
  } else if (BlockRelative(c.index_encoding)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix,
                     ".index_encoding: 16-bit block-relative indices need topk_scope kPerBlock "
                     "(a global Top-K does not keep a fixed count per block)"));
  }
  return absl::OkStatus();
}

SparseGeometry GeometryOf(int64_t numel, const RowWindowConfig& c) {
  SparseGeometry g;
  if (c.topk_scope == TopKScope::kGlobal) {
    g.padded = numel;
    g.blocks = 1;
    g.per_block = c.k > 0 ? std::min(c.k, numel) : CeilFraction(c.density, numel);
    g.row_entries = g.per_block;
    return g;
  }
  // Equal blocks of at most block_size: the padding stays below one entry per
  // block, and a short last block does not keep as many entries as a full one.
  g.blocks = (numel + c.block_size - 1) / c.block_size;
  const int64_t block = (numel + g.blocks - 1) / g.blocks;
  g.padded = g.blocks * block;
  g.per_block = c.k > 0 ? std::min(c.k, block) : CeilFraction(c.density, block);
  g.row_entries = g.blocks * g.per_block;
  return g;
}

MemoryBreakdown EstimateShardWindow(int64_t numel, at::ScalarType dtype, const RowWindowConfig& c) {
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  MemoryBreakdown b;
  if (!c.sparse) {
    b.add("history_values", c.window * numel * es);
    b.add("history_indices", 0);
    b.add("error_buffer", 0);
    b.add("scratch", numel * es);
    return b;
  }
  const SparseGeometry g = GeometryOf(numel, c);
  b.add("history_values",
        c.window * g.row_entries * static_cast<int64_t>(c10::elementSize(c.value_dtype)));
  b.add("history_indices", c.window * g.row_entries * IndexBytes(c.index_encoding));
  b.add("error_buffer", c.error_feedback ? g.padded * es : 0);
  b.add("scratch", g.padded * es);
  return b;
}

MemoryBreakdown EstimateRowWindow(const std::vector<std::vector<int64_t>>& shapes,
                                  at::ScalarType dtype, const RowWindowConfig& c, double momentum) {
  int64_t numel = 0;
  for (const auto& s : shapes) numel += c10::multiply_integers(s);
  const MemoryBreakdown shard = EstimateShardWindow(numel, dtype, c);
  MemoryBreakdown b;
  b.add("history_values", shard.get("history_values"));
  b.add("history_indices", shard.get("history_indices"));
  b.add("gram", c.window * c.window * 8);
  b.add("error_buffer", shard.get("error_buffer"));
  b.add("momentum", momentum != 0 ? numel * static_cast<int64_t>(c10::elementSize(dtype)) : 0);
  b.add("scratch", shard.get("scratch"));
  return b;
}

at::Tensor WoodburyCoefficients(const at::Tensor& gram, int64_t count, int64_t newest, double s,
                                double damp, double floor_eps) {
  at::Tensor k = gram.narrow(0, 0, count).narrow(1, 0, count);
  at::Tensor diag_add = k.diagonal().max().mul(floor_eps).add(s * damp);
  at::Tensor a = k + at::eye(count, k.options()) * diag_add;
  at::Tensor l = std::get<0>(at::linalg_cholesky_ex(a));
  at::Tensor e = at::zeros({count, 1}, k.options());
  e.select(0, newest).fill_(1.0);
  at::Tensor c = at::cholesky_solve(e, l).squeeze(1).mul_(s);
  at::Tensor out = at::zeros({gram.size(0)}, k.options());
  out.narrow(0, 0, count).copy_(c);
  return out;
}

RowWindowOptimizer::RowWindowOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                       std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                                       std::string kind, NonFinitePolicy policy,
                                       const RowWindowConfig& config)
    : AccountedOptimizer(std::move(groups), std::move(defaults), std::move(kind), policy),
      config_(config) {
  const int64_t m = config_.window;
  for (const Shard& shard : shards_) {
    const auto opts = at::TensorOptions().device(shard.device).dtype(shard.dtype);
    ShardState st;
    if (!config_.sparse) {
      st.history = at::zeros({m, shard.numel}, opts);
      st.scratch = at::zeros({shard.numel}, opts);
    } else {
      st.geo = GeometryOf(shard.numel, config_);
      st.history = at::zeros({m, st.geo.row_entries}, opts.dtype(config_.value_dtype));
      st.indices =
          at::zeros({m, st.geo.row_entries}, opts.dtype(IndexType(config_.index_encoding)));
      if (config_.error_feedback) st.error = at::zeros({st.geo.padded}, opts);
      st.scratch = at::zeros({st.geo.padded}, opts);
    }
    state_s_.push_back(std::move(st));
  }
  gram_ = at::zeros({m, m}, at::TensorOptions().device(shards_[0].device).dtype(at::kDouble));
}

MemoryBreakdown RowWindowOptimizer::memory_breakdown() const {
  MemoryBreakdown b;
  int64_t values = 0, indices = 0, error = 0, scratch = 0;
  for (const ShardState& st : state_s_) {
    values += TensorBytes(st.history);
    indices += TensorBytes(st.indices);
    error += TensorBytes(st.error);
    scratch += TensorBytes(st.scratch);
  }
  b.add("history_values", values);
  b.add("history_indices", indices);
  b.add("gram", TensorBytes(gram_));
  b.add("error_buffer", error);
  b.add("momentum", MomentumBytes());
  b.add("scratch", scratch);
  return b;
}

int64_t RowWindowOptimizer::ChunkRows(size_t s) const {
  const int64_t entries = std::max<int64_t>(1, state_s_[s].history.size(1));
  // Bounds the transient int64 index / product tensors to ~4M entries.
  return std::max<int64_t>(1, (int64_t{1} << 22) / entries);
}

at::Tensor RowWindowOptimizer::DecodeIndices(size_t s, int64_t row0, int64_t rows) const {
  const ShardState& st = state_s_[s];
  at::Tensor raw = st.indices.narrow(0, row0, rows);
  if (!BlockRelative(config_.index_encoding)) {
    if (config_.topk_scope == TopKScope::kGlobal) return raw.to(at::kLong);
  }
  at::Tensor rel;
  if (BlockRelative(config_.index_encoding)) {
    // uint16 lives in int16 storage: undo the sign extension.
    rel = raw.to(at::kLong).bitwise_and_(0xFFFF);
  } else {
    return raw.to(at::kLong);  // global indices stored for kPerBlock too
  }
  const int64_t block = st.geo.padded / st.geo.blocks;
  at::Tensor base = at::arange(st.geo.blocks, raw.options().dtype(at::kLong)).mul_(block);
  rel.view({rows, st.geo.blocks, st.geo.per_block}).add_(base.view({1, st.geo.blocks, 1}));
  return rel.view({rows, st.geo.row_entries});
}

void RowWindowOptimizer::Ingest(size_t s, int64_t slot, const std::vector<at::Tensor>& grads) {
  ShardState& st = state_s_[s];
  const Shard& shard = shards_[s];
  if (!config_.sparse) {
    at::Tensor row = st.history.select(0, slot);
    for (size_t i : shard.slots) {
      at::Tensor part = row.narrow(0, slots_[i].offset, slots_[i].numel);
      if (grads[i].defined()) {
        part.copy_(grads[i].reshape(-1));
      } else {
        part.zero_();
      }
    }
    return;
  }
  // a = e + g (or a = g without error feedback, in the scratch vector).
  at::Tensor acc = config_.error_feedback ? st.error : st.scratch;
  if (!config_.error_feedback) acc.zero_();
  for (size_t i : shard.slots) {
    if (!grads[i].defined()) continue;
    acc.narrow(0, slots_[i].offset, slots_[i].numel).add_(grads[i].reshape(-1));
  }
  const SparseGeometry& g = st.geo;
  at::Tensor acc2 = acc.view({g.blocks, g.padded / g.blocks});
  at::Tensor idx = std::get<1>(acc2.abs().topk(g.per_block, /*dim=*/1, /*largest=*/true,
                                               /*sorted=*/false));
  at::Tensor vals = acc2.gather(1, idx);
  at::Tensor stored = vals.to(config_.value_dtype);
  at::Tensor kept = stored.to(shard.dtype);
  // e = a - c: what the row does not hold (dropped entries and the rounding of
  // kept ones) is carried to the next step.
  if (config_.error_feedback) acc2.scatter_(1, idx, vals - kept);
  st.scratch.zero_();
  st.scratch.view({g.blocks, g.padded / g.blocks}).scatter_(1, idx, kept);
  st.history.select(0, slot).copy_(stored.reshape(-1));
  at::Tensor encoded;
  if (BlockRelative(config_.index_encoding)) {
    encoded = idx.to(at::kShort);  // values > 32767 wrap to the uint16 bit pattern
  } else {
    const int64_t block = g.padded / g.blocks;
    at::Tensor base = at::arange(g.blocks, idx.options()).mul_(block).unsqueeze(1);
    encoded = (idx + base).to(IndexType(config_.index_encoding));
  }
  st.indices.select(0, slot).copy_(encoded.reshape(-1));
}

at::Tensor RowWindowOptimizer::Dots(size_t s, int64_t slot) const {
  const ShardState& st = state_s_[s];
  const int64_t m = config_.window;
  at::Tensor dots = at::zeros({m}, st.scratch.options());
  if (!config_.sparse) {
    dots.narrow(0, 0, count_).copy_(st.history.narrow(0, 0, count_).mv(st.history.select(0, slot)));
    return dots.to(at::kDouble);
  }
  const int64_t chunk = ChunkRows(s);
  const int64_t k = st.geo.row_entries;
  for (int64_t r0 = 0; r0 < count_; r0 += chunk) {
    const int64_t nr = std::min(chunk, count_ - r0);
    at::Tensor gidx = DecodeIndices(s, r0, nr);
    at::Tensor v = st.history.narrow(0, r0, nr).to(st.scratch.scalar_type());
    at::Tensor x = st.scratch.index_select(0, gidx.reshape(-1)).view({nr, k});
    dots.narrow(0, r0, nr).copy_(x.mul_(v).sum(1));
  }
  return dots.to(at::kDouble);
}

void RowWindowOptimizer::Combine(size_t s, const at::Tensor& coef64) {
  ShardState& st = state_s_[s];
  at::Tensor coef = coef64.to(st.scratch.device(), st.scratch.scalar_type());
  if (!config_.sparse) {
    at::mv_out(st.scratch, st.history.narrow(0, 0, count_).t(), coef.narrow(0, 0, count_));
    return;
  }
  st.scratch.zero_();
  const int64_t chunk = ChunkRows(s);
  for (int64_t r0 = 0; r0 < count_; r0 += chunk) {
    const int64_t nr = std::min(chunk, count_ - r0);
    at::Tensor gidx = DecodeIndices(s, r0, nr);
    // copy = true: with fp32 values .to() would alias the history.
    at::Tensor v = st.history.narrow(0, r0, nr).to(st.scratch.scalar_type(), false, true);
    v.mul_(coef.narrow(0, r0, nr).unsqueeze(1));
    st.scratch.index_add_(0, gidx.reshape(-1), v.reshape(-1));
  }
}

at::Tensor RowWindowOptimizer::DenseRow(size_t s, int64_t slot) const {
  const ShardState& st = state_s_[s];
  const int64_t numel = shards_[s].numel;
  if (!config_.sparse) return st.history.select(0, slot).clone();
  at::Tensor out = at::zeros({st.geo.padded}, st.scratch.options());
  out.index_put_({DecodeIndices(s, slot, 1).reshape(-1)},
                 st.history.select(0, slot).to(out.scalar_type()));
  return out.narrow(0, 0, numel).clone();
}

at::Tensor RowWindowOptimizer::ErrorBuffer(size_t s) const {
  const ShardState& st = state_s_[s];
  if (!st.error.defined()) return at::Tensor();
  return st.error.narrow(0, 0, shards_[s].numel).clone();
}

torch::Tensor RowWindowOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = BeginStep();
  if (grads.empty()) return loss;
  const int64_t m = config_.window;
  const int64_t slot = rows_written_ % m;
  ++rows_written_;
  count_ = std::min(count_ + 1, m);
  at::Tensor dots;
  for (size_t s = 0; s < shards_.size(); ++s) {
    Ingest(s, slot, grads);
    at::Tensor d = Dots(s, slot).to(gram_.device());
    dots = dots.defined() ? dots.add_(d) : d;
  }
  gram_.select(0, slot).copy_(dots);
  gram_.select(1, slot).copy_(dots);
  at::Tensor coef = Coefficients(gram_, count_, slot);
  for (size_t s = 0; s < shards_.size(); ++s) {
    Combine(s, coef);
    for (size_t i : shards_[s].slots) {
      if (!grads[i].defined()) continue;
      ApplyUpdate(i, state_s_[s].scratch.narrow(0, slots_[i].offset, slots_[i].numel));
    }
  }
  EndStep();
  return loss;
}

void RowWindowOptimizer::SaveState(torch::serialize::OutputArchive& archive) const {
  archive.write("rw.count", c10::IValue(count_));
  archive.write("rw.rows_written", c10::IValue(rows_written_));
  archive.write("rw.gram", gram_, true);
  for (size_t s = 0; s < state_s_.size(); ++s) {
    const std::string p = "rw." + std::to_string(s) + ".";
    archive.write(p + "history", state_s_[s].history, true);
    if (state_s_[s].indices.defined()) archive.write(p + "indices", state_s_[s].indices, true);
    if (state_s_[s].error.defined()) archive.write(p + "error", state_s_[s].error, true);
  }
}

void RowWindowOptimizer::LoadState(torch::serialize::InputArchive& archive) {
  count_ = ReadInt(archive, "rw.count");
  rows_written_ = ReadInt(archive, "rw.rows_written");
  TORCH_CHECK(count_ >= 0 && count_ <= config_.window, kind_, ": archive window count ", count_,
              " does not fit window ", config_.window);
  ReadInto(archive, "rw.gram", gram_);
  for (size_t s = 0; s < state_s_.size(); ++s) {
    const std::string p = "rw." + std::to_string(s) + ".";
    ReadInto(archive, p + "history", state_s_[s].history);
    if (state_s_[s].indices.defined()) ReadInto(archive, p + "indices", state_s_[s].indices);
    if (state_s_[s].error.defined()) ReadInto(archive, p + "error", state_s_[s].error);
  }
}

at::Tensor MfacCoefficients(const at::Tensor& gram, int64_t count, int64_t newest, Scaling scaling,
                            int64_t window, double damp, at::ScalarType dtype) {
  const double s =
      scaling == Scaling::kCount ? static_cast<double>(count) : static_cast<double>(window);
  const double eps = dtype == at::kDouble
                         ? std::numeric_limits<double>::epsilon()
                         : static_cast<double>(std::numeric_limits<float>::epsilon());
  return WoodburyCoefficients(gram, count, newest, s, damp, eps);
}

}  // namespace efcp
