#include "efcp/low_rank_mfac.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "efcp/row_window.h"

namespace efcp {
namespace {

struct MatrixShape {
  bool matrix;
  int64_t rows, cols, rank;
};

MatrixShape ShapeOf(const std::vector<int64_t>& shape, int64_t rank) {
  const int64_t numel = c10::multiply_integers(shape);
  if (shape.size() < 2 || numel == 0) return {false, numel, 1, 0};
  const int64_t rows = shape[0], cols = numel / rows;
  return {true, rows, cols, std::min({rank, rows, cols})};
}

void Check(const LowRankMFACOptions& o,
           const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  CheckOptionsAndBudget<LowRankMFAC>(ValidateLowRankMFACOptions(o), o, groups, "LowRankMFAC");
}

}  // namespace

absl::Status ValidateLowRankMFACOptions(const LowRankMFACOptions& o) {
  const std::string n = "LowRankMFACOptions.";
  if (!(o.lr() >= 0))
    return absl::InvalidArgumentError(absl::StrCat(n, "lr must be >= 0, got ", o.lr()));
  if (!(o.damp() > 0) || !std::isfinite(o.damp())) {
    return absl::InvalidArgumentError(absl::StrCat(n, "damp must be > 0, got ", o.damp()));
  }
  if (o.window() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(n, "window must be >= 1, got ", o.window()));
  }
  if (o.rank() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(n, "rank must be >= 1, got ", o.rank()));
  }
  if (!(o.momentum() >= 0 && o.momentum() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, "momentum must be in [0, 1), got ", o.momentum()));
  }
  if (!(o.weight_decay() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, "weight_decay must be >= 0, got ", o.weight_decay()));
  }
  return absl::OkStatus();
}

LowRankMFAC::LowRankMFAC(std::vector<torch::optim::OptimizerParamGroup> groups,
                         LowRankMFACOptions options)
    : AccountedOptimizer((Check(options, groups), groups),
                         std::make_unique<LowRankMFACOptions>(options), "LowRankMFAC",
                         options.non_finite()),
      options_(options) {
  const int64_t m = options_.window();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed());
  for (const Slot& slot : slots_) {
    const auto opts = slot.param.options();
    const MatrixShape s = ShapeOf(slot.shape, options_.rank());
    Factors f;
    f.matrix = s.matrix;
    f.rows = s.rows;
    f.cols = s.cols;
    f.rank = s.rank;
    if (s.matrix) {
      f.p_hist = at::zeros({s.rows, m * s.rank}, opts);
      f.q_hist = at::zeros({s.cols, m * s.rank}, opts);
      if (options_.error_feedback()) f.error = at::zeros({s.rows, s.cols}, opts);
      // Drawn on the CPU once, at construction: steps never leave the device.
      f.q = at::randn({s.cols, s.rank}, gen, at::TensorOptions().dtype(at::kDouble)).to(opts);
    } else {
      f.dense = at::zeros({m, slot.numel}, opts);
    }
    factors_.push_back(std::move(f));
  }
  gram_ = at::zeros({m, m}, at::TensorOptions().device(shards_[0].device).dtype(at::kDouble));
  InitMomentum();
}

AccountedOptimizer::Hyper LowRankMFAC::HyperOf(
    const torch::optim::OptimizerOptions& options) const {
  return HyperFrom<LowRankMFACOptions>(options);
}

torch::Tensor LowRankMFAC::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = BeginStep();
  if (grads.empty()) return loss;
  const int64_t m = options_.window();
  const int64_t slot = rows_written_ % m;
  ++rows_written_;
  count_ = std::min(count_ + 1, m);
  at::Tensor dots = at::zeros({m}, gram_.options());
  for (size_t i = 0; i < slots_.size(); ++i) {
    Factors& f = factors_[i];
    at::Tensor dot;
    if (f.matrix) {
      const int64_t r = f.rank;
      at::Tensor p_new = f.p_hist.narrow(1, slot * r, r);
      at::Tensor q_new = f.q_hist.narrow(1, slot * r, r);
      if (!grads[i].defined()) {
        p_new.zero_();
        q_new.zero_();
        continue;
      }
      at::Tensor g = grads[i].reshape({f.rows, f.cols});
      at::Tensor a = f.error.defined() ? f.error.add_(g) : g;
      at::Tensor p = std::get<0>(at::linalg_qr(a.mm(f.q), "reduced"));
      at::Tensor q = a.t().mm(p);
      if (f.error.defined()) f.error.sub_(p.mm(q.t()));
      if (options_.power_iteration_warm_start()) f.q.copy_(q);
      p_new.copy_(p);
      q_new.copy_(q);
      at::Tensor pp = p.t().mm(f.p_hist.narrow(1, 0, count_ * r)).view({r, count_, r});
      at::Tensor qq = q.t().mm(f.q_hist.narrow(1, 0, count_ * r)).view({r, count_, r});
      dot = (pp * qq).sum(at::IntArrayRef{0, 2});
    } else {
      at::Tensor row = f.dense.select(0, slot);
      if (!grads[i].defined()) {
        row.zero_();
        continue;
      }
      row.copy_(grads[i].reshape(-1));
      dot = f.dense.narrow(0, 0, count_).mv(row);
    }
    dots.narrow(0, 0, count_).add_(dot.to(gram_.device(), at::kDouble));
  }
  gram_.select(0, slot).copy_(dots);
  gram_.select(1, slot).copy_(dots);
  const double s =
      options_.scaling() == Scaling::kCount ? static_cast<double>(count_) : static_cast<double>(m);
  const double eps = shards_[0].dtype == at::kDouble
                         ? std::numeric_limits<double>::epsilon()
                         : static_cast<double>(std::numeric_limits<float>::epsilon());
  at::Tensor coef =
      WoodburyCoefficients(gram_, count_, slot, s, options_.damp(), eps).narrow(0, 0, count_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Factors& f = factors_[i];
    const at::Tensor& param = slots_[i].param;
    at::Tensor c = coef.to(param.device(), param.scalar_type());
    at::Tensor u;
    if (f.matrix) {
      const int64_t n = count_ * f.rank;
      u = (f.p_hist.narrow(1, 0, n) * c.repeat_interleave(f.rank).unsqueeze(0))
              .mm(f.q_hist.narrow(1, 0, n).t());
    } else {
      u = f.dense.narrow(0, 0, count_).t().mv(c);
    }
    ApplyUpdate(i, u.reshape(-1));
  }
  EndStep();
  return loss;
}

MemoryBreakdown LowRankMFAC::memory_breakdown() const {
  int64_t values = 0, error = 0, power = 0;
  for (const Factors& f : factors_) {
    values += TensorBytes(f.p_hist) + TensorBytes(f.q_hist) + TensorBytes(f.dense);
    error += TensorBytes(f.error);
    power += TensorBytes(f.q);
  }
  MemoryBreakdown b;
  b.add("history_values", values);
  b.add("history_indices", 0);
  b.add("gram", TensorBytes(gram_));
  b.add("error_buffer", error);
  b.add("momentum", MomentumBytes());
  b.add("power_iteration", power);
  b.add("scratch", 0);
  return b;
}

MemoryBreakdown LowRankMFAC::EstimateMemory(const std::vector<std::vector<int64_t>>& shapes,
                                            const LowRankMFACOptions& o, at::ScalarType dtype) {
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t m = o.window();
  int64_t values = 0, error = 0, power = 0;
  for (const auto& shape : shapes) {
    const MatrixShape s = ShapeOf(shape, o.rank());
    if (s.matrix) {
      values += m * s.rank * (s.rows + s.cols) * es;
      if (o.error_feedback()) error += s.rows * s.cols * es;
      power += s.cols * s.rank * es;
    } else {
      values += m * s.rows * es;
    }
  }
  MemoryBreakdown b;
  b.add("history_values", values);
  b.add("history_indices", 0);
  b.add("gram", m * m * 8);
  b.add("error_buffer", error);
  b.add("momentum", EstimateMomentumBytes(shapes, dtype, o.momentum()));
  b.add("power_iteration", power);
  b.add("scratch", 0);
  return b;
}

at::Tensor LowRankMFAC::ErrorBuffer(size_t slot) const {
  const at::Tensor& e = factors_[slot].error;
  return e.defined() ? e.clone() : at::Tensor();
}

void LowRankMFAC::SaveState(torch::serialize::OutputArchive& archive) const {
  archive.write("lr.count", c10::IValue(count_));
  archive.write("lr.rows_written", c10::IValue(rows_written_));
  archive.write("lr.gram", gram_, true);
  for (size_t i = 0; i < factors_.size(); ++i) {
    const Factors& f = factors_[i];
    const std::string p = "lr." + std::to_string(i) + ".";
    if (f.p_hist.defined()) archive.write(p + "p_hist", f.p_hist, true);
    if (f.q_hist.defined()) archive.write(p + "q_hist", f.q_hist, true);
    if (f.dense.defined()) archive.write(p + "dense", f.dense, true);
    if (f.error.defined()) archive.write(p + "error", f.error, true);
    if (f.q.defined()) archive.write(p + "q", f.q, true);
  }
}

void LowRankMFAC::LoadState(torch::serialize::InputArchive& archive) {
  count_ = ReadInt(archive, "lr.count");
  rows_written_ = ReadInt(archive, "lr.rows_written");
  TORCH_CHECK(count_ >= 0 && count_ <= options_.window(), kind_, ": archive window count ", count_,
              " does not fit window ", options_.window());
  ReadInto(archive, "lr.gram", gram_);
  for (size_t i = 0; i < factors_.size(); ++i) {
    Factors& f = factors_[i];
    const std::string p = "lr." + std::to_string(i) + ".";
    if (f.p_hist.defined()) ReadInto(archive, p + "p_hist", f.p_hist);
    if (f.q_hist.defined()) ReadInto(archive, p + "q_hist", f.q_hist);
    if (f.dense.defined()) ReadInto(archive, p + "dense", f.dense);
    if (f.error.defined()) ReadInto(archive, p + "error", f.error);
    if (f.q.defined()) ReadInto(archive, p + "q", f.q);
  }
}

}  // namespace efcp
