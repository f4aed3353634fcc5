#include "engine/torchscript_model.h"

#include <torch/script.h>

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/fnv1a.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

class TorchScriptModel : public ActivationModel {
 public:
  at::Tensor Forward(const at::Tensor& tokens) override { return ForwardHooks(tokens)[0]; }
  std::vector<at::Tensor> ForwardHooks(const at::Tensor& tokens) override {
    torch::NoGradGuard no_grad;
    c10::IValue out = module_.forward({tokens});
    std::vector<at::Tensor> hooked;
    for (int64_t index : indices_) {
      at::Tensor h = Pick(out, index);
      if (!h.defined()) {
        TORCH_CHECK(false, "TorchScript forward returned no hidden state ", index);
      }
      hooked.push_back(h.to(at::kFloat));
    }
    return hooked;
  }
  int64_t hook_width() const override { return widths_[0]; }
  std::vector<int64_t> hook_widths() const override { return widths_; }
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t max_context() const override { return 0; }
  int64_t parameter_bytes() const override { return parameter_bytes_; }
  int64_t activation_bytes_per_token(int64_t seq_len) const override {
    // Unknown architecture: every hidden state is kept, plus working space of a few of them.
    return 4 * *std::max_element(widths_.begin(), widths_.end()) * (num_states_ + 8) + 16 * seq_len;
  }
  const std::string& model_id() const override { return model_id_; }
  const std::string& weight_hash() const override { return weight_hash_; }

  // Element i of a tuple/list output; undefined when absent or not a tensor. Sets *count.
  static at::Tensor Pick(const c10::IValue& out, int64_t i, int64_t* count = nullptr) {
    std::vector<c10::IValue> items;
    if (out.isTuple()) {
      for (const auto& e : out.toTupleRef().elements()) items.push_back(e);
    } else if (out.isList()) {
      for (const auto& e : out.toListRef()) items.push_back(e);
    } else if (out.isTensor()) {
      items.push_back(out);
    }
    if (count != nullptr) *count = static_cast<int64_t>(items.size());
    if (i < 0 || i >= static_cast<int64_t>(items.size()) || !items[i].isTensor()) {
      return at::Tensor();
    }
    return items[i].toTensor();
  }

  torch::jit::Module module_;
  std::vector<int64_t> indices_, widths_;  // per hook
  int64_t vocab_size_ = 0, parameter_bytes_ = 0, num_states_ = 0;
  std::string model_id_, weight_hash_;
};

}  // namespace

absl::StatusOr<std::string> HashFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, " not found"));
  Fnv1a64 hash;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), buf.size());
    hash.Add(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return hash.ToString();
}

absl::StatusOr<std::unique_ptr<ActivationModel>> LoadTorchScriptModel(
    const TorchScriptModelOptions& options, const HookName& hook, const at::Device& device) {
  return LoadTorchScriptModel(options, std::vector<HookName>{hook}, device);
}

absl::StatusOr<std::unique_ptr<ActivationModel>> LoadTorchScriptModel(
    const TorchScriptModelOptions& options, const std::vector<HookName>& hooks,
    const at::Device& device) {
  if (hooks.empty()) return absl::InvalidArgumentError("extract.hook_name: no hook");
  auto model = std::make_unique<TorchScriptModel>();
  for (const HookName& hook : hooks) {
    ASSIGN_OR_RETURN(int index, HiddenStateIndex(hook));
    model->indices_.push_back(index);
  }
  ASSIGN_OR_RETURN(std::string hash, HashFile(options.path));
  model->weight_hash_ = hash;
  model->model_id_ = absl::StrCat("torchscript:", options.path);
  model->vocab_size_ = options.vocab_size;
  try {
    model->module_ = torch::jit::load(options.path, device);
    model->module_.eval();
    for (const auto& p : model->module_.parameters()) {
      model->parameter_bytes_ += p.numel() * p.element_size();
    }
    for (const auto& b : model->module_.buffers()) {
      model->parameter_bytes_ += b.numel() * b.element_size();
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("extract.model.torchscript.path: ", options.path,
                     " is not a loadable TorchScript module: ", e.what_without_backtrace()));
  }
  try {
    torch::NoGradGuard no_grad;
    at::Tensor probe = at::zeros({1, 2}, at::TensorOptions().dtype(at::kLong).device(device));
    c10::IValue out = model->module_.forward({probe});
    for (int64_t index : model->indices_) {
      int64_t count = 0;
      at::Tensor h = TorchScriptModel::Pick(out, index, &count);
      if (count == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("extract.model.torchscript.path: forward of ", options.path,
                         " must return a tuple or list of hidden-state tensors"));
      }
      if (!h.defined()) {
        return absl::InvalidArgumentError(absl::StrCat("extract.hook_name: hidden state ", index,
                                                       " out of range, the model returns ", count));
      }
      if (h.dim() != 3 || h.size(0) != 1 || h.size(1) != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("extract.model.torchscript.path: hidden state ", index, " has ", h.dim(),
                         " dimensions; [batch, seq, d] expected"));
      }
      model->num_states_ = count;
      model->widths_.push_back(h.size(2));
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("extract.model.torchscript.path: probe forward of ", options.path,
                     " failed: ", e.what_without_backtrace()));
  }
  return std::unique_ptr<ActivationModel>(std::move(model));
}

}  // namespace latentd::engine
