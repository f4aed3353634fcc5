#include "efcp/accounted_optimizer.h"

#include <c10/util/Exception.h>

#include <utility>

namespace efcp {

int64_t TensorBytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

AccountedOptimizer::AccountedOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                       std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                                       std::string kind, NonFinitePolicy policy)
    : torch::optim::Optimizer(std::move(groups), std::move(defaults)),
      kind_(std::move(kind)),
      policy_(policy) {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    for (const at::Tensor& p : param_groups_[g].params()) {
      TORCH_CHECK(p.defined(), kind_, ": parameter ", slots_.size(), " is undefined");
      TORCH_CHECK(at::isFloatingType(p.scalar_type()), kind_, ": parameter ", slots_.size(),
                  " has non-floating dtype ", p.scalar_type());
      Slot slot;
      slot.param = p;
      slot.group = g;
      slot.numel = p.numel();
      slot.shape = p.sizes().vec();
      size_t s = 0;
      for (; s < shards_.size(); ++s) {
        if (shards_[s].device == p.device() && shards_[s].dtype == p.scalar_type()) break;
      }
      if (s == shards_.size()) {
        Shard shard;
        shard.device = p.device();
        shard.dtype = p.scalar_type();
        shards_.push_back(shard);
      }
      slot.shard = s;
      slot.offset = shards_[s].numel;
      shards_[s].numel += slot.numel;
      shards_[s].slots.push_back(slots_.size());
      slots_.push_back(std::move(slot));
    }
  }
  TORCH_CHECK(!slots_.empty(), kind_, ": no parameters given");
}

void AccountedOptimizer::InitMomentum() {
  momentum_.assign(slots_.size(), at::Tensor());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Hyper h = HyperOf(param_groups_[slots_[i].group].options());
    if (h.momentum != 0) momentum_[i] = at::zeros_like(slots_[i].param);
  }
}

std::vector<at::Tensor> AccountedOptimizer::BeginStep() {
  std::vector<at::Tensor> grads(slots_.size());
  bool any = false;
  at::Tensor all_finite;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    TORCH_CHECK(slot.param.sizes().equals(slot.shape), kind_, ": parameter ", i,
                " changed shape from ", c10::IntArrayRef(slot.shape), " to ", slot.param.sizes(),
                " since the optimizer was built; build a new optimizer for new shapes");
    TORCH_CHECK(slot.param.device() == shards_[slot.shard].device &&
                    slot.param.scalar_type() == shards_[slot.shard].dtype,
                kind_, ": parameter ", i, " changed device or dtype since the optimizer was built");
    const at::Tensor& g = slot.param.grad();
    if (!g.defined()) continue;
    TORCH_CHECK(g.sizes().equals(slot.shape), kind_, ": gradient of parameter ", i, " has shape ",
                g.sizes(), ", parameter has ", c10::IntArrayRef(slot.shape));
    TORCH_CHECK(!g.is_sparse(), kind_, ": sparse gradients are not supported (parameter ", i, ")");
    any = true;
    if (policy_ != NonFinitePolicy::kUnchecked) {
      at::Tensor fin = at::isfinite(g).all();
      if (all_finite.defined()) fin = fin.to(all_finite.device());
      all_finite = all_finite.defined() ? at::logical_and(all_finite, fin) : fin;
    }
    const Hyper h = HyperOf(param_groups_[slot.group].options());
    if (h.weight_decay != 0 && h.weight_decay_kind == WeightDecayKind::kCoupled) {
      grads[i] = g.add(slot.param.detach(), h.weight_decay);
    } else {
      grads[i] = g;
    }
  }
  if (!any) return {};
  // One device-to-host sync: the step must know whether to go ahead.
  if (all_finite.defined() && !all_finite.item<bool>()) {
    size_t bad = 0;
    for (; bad < slots_.size(); ++bad) {
      const at::Tensor& g = slots_[bad].param.grad();
      if (g.defined() && !at::isfinite(g).all().item<bool>()) break;
    }
    const int64_t step = applied_steps_ + skipped_steps_ + 1;
    TORCH_CHECK(policy_ != NonFinitePolicy::kThrow, kind_, ": non-finite gradient at step ", step,
                " (parameter ", bad, "); non_finite policy is kThrow");
    ++skipped_steps_;
    TORCH_WARN(kind_, ": skipped step ", step, ": non-finite gradient in parameter ", bad, " (",
               skipped_steps_, " skipped so far)");
    return {};
  }
  return grads;
}

void AccountedOptimizer::ApplyUpdate(size_t i, const at::Tensor& direction) {
  const Slot& slot = slots_[i];
  const Hyper h = HyperOf(param_groups_[slot.group].options());
  at::Tensor p = slot.param.detach();
  at::Tensor u = direction.view(slot.shape);
  if (momentum_.size() == slots_.size() && momentum_[i].defined() && h.momentum != 0) {
    momentum_[i].mul_(h.momentum).add_(u);
    u = momentum_[i];
  }
  if (h.weight_decay != 0 && h.weight_decay_kind == WeightDecayKind::kDecoupled) {
    p.mul_(1.0 - h.lr * h.weight_decay);
  }
  p.add_(u, -h.lr);
}

int64_t AccountedOptimizer::MomentumBytes() const {
  int64_t bytes = 0;
  for (const at::Tensor& m : momentum_) bytes += TensorBytes(m);
  return bytes;
}

int64_t AccountedOptimizer::EstimateMomentumBytes(const std::vector<std::vector<int64_t>>& shapes,
                                                  at::ScalarType dtype, double momentum) {
  if (momentum == 0) return 0;
  int64_t n = 0;
  for (const auto& s : shapes) n += c10::multiply_integers(s);
  return n * static_cast<int64_t>(c10::elementSize(dtype));
}

void AccountedOptimizer::ReadInto(torch::serialize::InputArchive& archive, const std::string& key,
                                  at::Tensor& held) {
  at::Tensor t;
  archive.read(key, t);
  TORCH_CHECK(t.sizes().equals(held.sizes()), "efcp: state '", key, "' has shape ", t.sizes(),
              " in the archive but ", held.sizes(),
              " in this optimizer (different options or parameters?)");
  at::NoGradGuard no_grad;
  held.copy_(t);
}

int64_t AccountedOptimizer::ReadInt(torch::serialize::InputArchive& archive,
                                    const std::string& key) {
  c10::IValue v;
  archive.read(key, v);
  TORCH_CHECK(v.isInt(), "efcp: state '", key, "' is not an integer");
  return v.toInt();
}

void AccountedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  archive.write("efcp.kind", c10::IValue(kind_));
  archive.write("efcp.num_slots", c10::IValue(static_cast<int64_t>(slots_.size())));
  archive.write("efcp.applied_steps", c10::IValue(applied_steps_));
  archive.write("efcp.skipped_steps", c10::IValue(skipped_steps_));
  for (size_t i = 0; i < momentum_.size(); ++i) {
    if (momentum_[i].defined()) {
      archive.write("efcp.momentum." + std::to_string(i), momentum_[i], /*is_buffer=*/true);
    }
  }
  SaveState(archive);
}

void AccountedOptimizer::load(torch::serialize::InputArchive& archive) {
  c10::IValue kind;
  archive.read("efcp.kind", kind);
  TORCH_CHECK(kind.isString() && kind.toStringRef() == kind_, kind_,
              ": archive holds the state of a different optimizer (",
              kind.isString() ? kind.toStringRef() : std::string("?"), ")");
  const int64_t num_slots = ReadInt(archive, "efcp.num_slots");
  TORCH_CHECK(num_slots == static_cast<int64_t>(slots_.size()), kind_, ": archive has ", num_slots,
              " parameters, this optimizer ", slots_.size());
  applied_steps_ = ReadInt(archive, "efcp.applied_steps");
  skipped_steps_ = ReadInt(archive, "efcp.skipped_steps");
  for (size_t i = 0; i < momentum_.size(); ++i) {
    if (momentum_[i].defined())
      ReadInto(archive, "efcp.momentum." + std::to_string(i), momentum_[i]);
  }
  LoadState(archive);
}

}  // namespace efcp
