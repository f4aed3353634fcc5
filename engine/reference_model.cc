#include "engine/reference_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace latentd::engine {

absl::StatusOr<latentd::v1::ReferenceModelSpec> ResolveReferenceSpec(
    const latentd::v1::ReferenceModelSpec& in) {
  latentd::v1::ReferenceModelSpec s = in;
  if (s.d_model() == 0) s.set_d_model(256);
  if (s.n_layers() == 0) s.set_n_layers(4);
  if (s.n_heads() == 0) s.set_n_heads(4);
  if (s.d_mlp() == 0) s.set_d_mlp(4 * s.d_model());
  if (s.vocab_size() == 0) s.set_vocab_size(4096);
  if (s.context_length() == 0) s.set_context_length(128);
  auto bad = [](const char* field, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("extract.model.reference.", field, ": ", what));
  };
  if (s.d_model() < 0 || s.d_model() > 65536) return bad("d_model", "must be in [1, 65536]");
  if (s.n_layers() < 0 || s.n_layers() > 1024) return bad("n_layers", "must be in [1, 1024]");
  if (s.n_heads() < 0 || s.d_model() % s.n_heads() != 0) {
    return bad("n_heads", absl::StrCat("must divide d_model = ", s.d_model()));
  }
  if (s.d_mlp() < 0 || s.d_mlp() > 1 << 20) return bad("d_mlp", "must be in [1, 2^20]");
  if (s.vocab_size() < 0 || s.vocab_size() > 1 << 24)
    return bad("vocab_size", "must be in [1, 2^24]");
  if (s.context_length() < 0 || s.context_length() > 1 << 16) {
    return bad("context_length", "must be in [1, 65536]");
  }
  return s;
}

absl::Status CheckReferenceHook(const latentd::v1::ReferenceModelSpec& s, const HookName& hook) {
  if (hook.point == HookPoint::kHiddenStates) {
    return absl::InvalidArgumentError(
        "extract.hook_name: the reference model takes TransformerLens names (blocks.L.hook_...)");
  }
  if (hook.layer >= s.n_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("extract.hook_name: layer ", hook.layer,
                                                   " out of range, the model has ", s.n_layers(),
                                                   " layers"));
  }
  return absl::OkStatus();
}

int64_t ReferenceHookWidth(const latentd::v1::ReferenceModelSpec& s, const HookName& hook) {
  return hook.point == HookPoint::kMlpPost ? s.d_mlp() : s.d_model();
}

absl::StatusOr<std::unique_ptr<ReferenceModel>> ReferenceModel::Create(
    const latentd::v1::ReferenceModelSpec& spec, const HookName& hook, const at::Device& device) {
  return Create(spec, std::vector<HookName>{hook}, device);
}

absl::StatusOr<std::unique_ptr<ReferenceModel>> ReferenceModel::Create(
    const latentd::v1::ReferenceModelSpec& in, const std::vector<HookName>& hooks,
    const at::Device& device) {
  ASSIGN_OR_RETURN(latentd::v1::ReferenceModelSpec s, ResolveReferenceSpec(in));
  if (hooks.empty()) return absl::InvalidArgumentError("extract.hook_name: no hook");
  for (const HookName& hook : hooks) RETURN_IF_ERROR(CheckReferenceHook(s, hook));
  std::unique_ptr<ReferenceModel> m(new ReferenceModel());
  m->spec_ = s;
  m->hooks_ = hooks;
  m->hook_width_ = ReferenceHookWidth(s, hooks[0]);
  const int64_t d = s.d_model(), f = s.d_mlp();
  at::Generator gen = at::detail::createCPUGenerator(s.seed());
  const double out_scale = 1.0 / std::sqrt(2.0 * s.n_layers());
  auto normal = [&](std::vector<int64_t> shape, double scale) {
    return (at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * (0.02 * scale));
  };
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over every weight byte, in creation order
  auto place = [&](at::Tensor t) {
    t = t.contiguous();
    const unsigned char* p = static_cast<const unsigned char*>(t.data_ptr());
    for (int64_t i = 0, n = t.numel() * 4; i < n; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
    return t.to(device);
  };
  m->W_E_ = place(normal({s.vocab_size(), d}, 1.0));
  m->W_pos_ = place(normal({s.context_length(), d}, 1.0));
  for (int l = 0; l < s.n_layers(); ++l) {
    Block b;
    b.ln1_w = place(at::ones({d}));
    b.ln1_b = place(at::zeros({d}));
    b.W_qkv = place(normal({d, 3 * d}, 1.0));
    b.b_qkv = place(at::zeros({3 * d}));
    b.W_O = place(normal({d, d}, out_scale));
    b.b_O = place(at::zeros({d}));
    b.ln2_w = place(at::ones({d}));
    b.ln2_b = place(at::zeros({d}));
    b.W_in = place(normal({d, f}, 1.0));
    b.b_in = place(at::zeros({f}));
    b.W_out = place(normal({f, d}, out_scale));
    b.b_out = place(at::zeros({d}));
    m->blocks_.push_back(std::move(b));
  }
  m->weight_hash_ = absl::StrFormat("fnv1a64:%016x", hash);
  m->model_id_ = absl::StrCat("reference:d", d, "-l", s.n_layers(), "-h", s.n_heads(), "-f", f,
                              "-v", s.vocab_size(), "-c", s.context_length(), "-seed", s.seed());
  return m;
}

int64_t ReferenceModel::parameter_bytes() const {
  const int64_t d = spec_.d_model(), f = spec_.d_mlp();
  return 4 * ((spec_.vocab_size() + spec_.context_length()) * d +
              spec_.n_layers() * (4 * d * d + 2 * d * f + 9 * d + f));
}

int64_t ReferenceModel::activation_bytes_per_token(int64_t seq_len) const {
  // Live at once inside one block: a few residual-sized tensors, qkv, the attention row per head
  // and the MLP hidden layer.
  return 4 * (8 * spec_.d_model() + 3 * spec_.d_model() + 2 * spec_.n_heads() * seq_len +
              2 * spec_.d_mlp());
}

std::vector<at::Tensor> ReferenceModel::Run(const at::Tensor& tokens,
                                            const std::vector<HookName>& hooks,
                                            std::vector<at::Tensor>* all) {
  const int64_t B = tokens.size(0), S = tokens.size(1), d = spec_.d_model();
  const int64_t H = spec_.n_heads(), dh = d / H;
  std::vector<at::Tensor> hooked(hooks.size());
  size_t remaining = hooks.size();
  // Keeps `t` for every hook at (layer, point); true once every hook has its activation.
  auto capture = [&](int layer, HookPoint point, const at::Tensor& t) {
    for (size_t i = 0; i < hooks.size(); ++i) {
      if (hooks[i].layer == layer && hooks[i].point == point && !hooked[i].defined()) {
        hooked[i] = t;
        --remaining;
      }
    }
    return remaining == 0 && all == nullptr;
  };
  at::Tensor x = W_E_.index_select(0, tokens.reshape({-1})).view({B, S, d}) +
                 W_pos_.slice(0, 0, S).unsqueeze(0);
  at::Tensor causal = at::ones({S, S}, tokens.options().dtype(at::kBool)).triu(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  for (int l = 0; l < spec_.n_layers(); ++l) {
    const Block& b = blocks_[l];
    if (capture(l, HookPoint::kResidPre, x)) break;
    at::Tensor h = at::layer_norm(x, {d}, b.ln1_w, b.ln1_b, 1e-5);
    at::Tensor qkv = at::addmm(b.b_qkv, h.view({B * S, d}), b.W_qkv).view({B, S, 3, H, dh});
    at::Tensor q = qkv.select(2, 0).transpose(1, 2);  // [B, H, S, dh]
    at::Tensor k = qkv.select(2, 1).transpose(1, 2);
    at::Tensor v = qkv.select(2, 2).transpose(1, 2);
    at::Tensor att = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
    att.masked_fill_(causal, -std::numeric_limits<float>::infinity());
    att = at::softmax(att, -1);
    at::Tensor z = at::matmul(att, v).transpose(1, 2).reshape({B * S, d});
    at::Tensor attn_out = at::addmm(b.b_O, z, b.W_O).view({B, S, d});
    if (capture(l, HookPoint::kAttnOut, attn_out)) break;
    x = x + attn_out;
    if (capture(l, HookPoint::kResidMid, x)) break;
    at::Tensor h2 = at::layer_norm(x, {d}, b.ln2_w, b.ln2_b, 1e-5);
    at::Tensor post = at::gelu(at::addmm(b.b_in, h2.view({B * S, d}), b.W_in), "tanh");
    if (capture(l, HookPoint::kMlpPost, post.view({B, S, -1}))) break;
    at::Tensor mlp_out = at::addmm(b.b_out, post, b.W_out).view({B, S, d});
    if (capture(l, HookPoint::kMlpOut, mlp_out)) break;
    x = x + mlp_out;
    if (all != nullptr) all->push_back(x);
    if (capture(l, HookPoint::kResidPost, x)) break;
  }
  return hooked;
}

std::vector<std::pair<std::string, at::Tensor>> ReferenceModel::NamedWeights() const {
  std::vector<std::pair<std::string, at::Tensor>> out = {{"embed.W_E", W_E_},
                                                         {"embed.W_pos", W_pos_}};
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    const std::string p = absl::StrCat("blocks.", l, ".");
    for (auto& [name, t] :
         std::vector<std::pair<const char*, const at::Tensor*>>{{"ln1.w", &b.ln1_w},
                                                                {"ln1.b", &b.ln1_b},
                                                                {"attn.W_qkv", &b.W_qkv},
                                                                {"attn.b_qkv", &b.b_qkv},
                                                                {"attn.W_O", &b.W_O},
                                                                {"attn.b_O", &b.b_O},
                                                                {"ln2.w", &b.ln2_w},
                                                                {"ln2.b", &b.ln2_b},
                                                                {"mlp.W_in", &b.W_in},
                                                                {"mlp.b_in", &b.b_in},
                                                                {"mlp.W_out", &b.W_out},
                                                                {"mlp.b_out", &b.b_out}}) {
      out.push_back({p + name, *t});
    }
  }
  return out;
}

at::Tensor ReferenceModel::Forward(const at::Tensor& tokens) {
  return Run(tokens, {hooks_[0]}, nullptr)[0];
}

std::vector<at::Tensor> ReferenceModel::ForwardHooks(const at::Tensor& tokens) {
  return Run(tokens, hooks_, nullptr);
}

std::vector<int64_t> ReferenceModel::hook_widths() const {
  std::vector<int64_t> widths;
  for (const HookName& hook : hooks_) widths.push_back(ReferenceHookWidth(spec_, hook));
  return widths;
}

std::vector<at::Tensor> ReferenceModel::AllResidPost(const at::Tensor& tokens) {
  std::vector<at::Tensor> all;
  Run(tokens, {}, &all);
  return all;
}

}  // namespace latentd::engine
