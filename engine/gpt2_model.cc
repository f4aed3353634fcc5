#include "engine/gpt2_model.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/hook_collector.h"
#include "engine/next_token_loss.h"

namespace latentd::engine {

TransformerShape Gpt2Shape(const Gpt2Config& c) {
  TransformerShape s = CommonShape(c);
  const int64_t d = c.d_model, f = c.d_mlp;
  s.parameter_bytes = 4 * ((c.vocab_size + c.context_length) * d +
                           c.n_layers * (4 * d * d + 2 * d * f + 9 * d + f));
  return s;
}

absl::StatusOr<std::unique_ptr<Gpt2Model>> Gpt2Model::Create(Gpt2Weights weights,
                                                             const std::vector<HookName>& hooks,
                                                             const at::Device& device) {
  std::unique_ptr<Gpt2Model> m(new Gpt2Model());
  ASSIGN_OR_RETURN(m->hook_widths_, TransformerHookWidths(Gpt2Shape(weights.config), hooks));
  m->hooks_ = hooks;
  m->w_ = std::move(weights);
  auto place = [&](at::Tensor& t) { t = t.to(device, at::kFloat).contiguous(); };
  place(m->w_.W_E);
  place(m->w_.W_pos);
  for (at::Tensor* t : {&m->w_.ln_f_w, &m->w_.ln_f_b, &m->w_.W_U}) {
    if (t->defined()) place(*t);
  }
  for (Gpt2Block& b : m->w_.blocks) {
    for (at::Tensor* t : {&b.ln1_w, &b.ln1_b, &b.W_qkv, &b.b_qkv, &b.W_O, &b.b_O, &b.ln2_w,
                          &b.ln2_b, &b.W_in, &b.b_in, &b.W_out, &b.b_out}) {
      place(*t);
    }
  }
  return m;
}

std::vector<at::Tensor> Gpt2Model::Run(const at::Tensor& tokens, const std::vector<HookName>& hooks,
                                       std::vector<at::Tensor>* all, const HookSplices* splices,
                                       at::Tensor* last, KeyValueCache* cache) {
  const Gpt2Config& c = config();
  const int64_t B = tokens.size(0), S = tokens.size(1), d = c.d_model;
  const int64_t H = c.n_heads, dh = d / H;
  HookCollector collector(hooks, /*run_all=*/all != nullptr || last != nullptr, splices);
  auto activation = [&](const at::Tensor& x) {
    switch (c.activation) {
      case Gpt2Activation::kGeluErf:
        return at::gelu(x);
      case Gpt2Activation::kRelu:
        return at::relu(x);
      case Gpt2Activation::kGeluTanh:
        break;
    }
    return at::gelu(x, "tanh");
  };
  // With a cache the S tokens sit at positions past .. past + S - 1 after the ones it holds.
  const int64_t past = cache != nullptr ? cache->positions : 0;
  TORCH_CHECK(past + S <= w_.W_pos.size(0), past + S, " positions, the model has ",
              w_.W_pos.size(0));
  if (cache != nullptr) {
    cache->keys.resize(c.n_layers);
    cache->values.resize(c.n_layers);
  }
  at::Tensor x = w_.W_E.index_select(0, tokens.reshape({-1})).view({B, S, d}) +
                 w_.W_pos.slice(0, past, past + S).unsqueeze(0);
  // Query i (position past + i) sees keys 0 .. past + i.
  at::Tensor causal = at::ones({S, past + S}, tokens.options().dtype(at::kBool)).triu(past + 1);
  for (int l = 0; l < c.n_layers; ++l) {
    const Gpt2Block& b = w_.blocks[l];
    if (collector.Capture(l, HookPoint::kResidPre, x)) break;
    at::Tensor h = at::layer_norm(x, {d}, b.ln1_w, b.ln1_b, c.layer_norm_eps);
    at::Tensor qkv = at::addmm(b.b_qkv, h.view({B * S, d}), b.W_qkv).view({B, S, 3, H, dh});
    at::Tensor q = qkv.select(2, 0).transpose(1, 2);  // [B, H, S, dh]
    at::Tensor k = qkv.select(2, 1).transpose(1, 2);
    at::Tensor v = qkv.select(2, 2).transpose(1, 2);
    if (cache != nullptr) {
      if (past > 0) {
        k = at::cat({cache->keys[l], k}, 2);
        v = at::cat({cache->values[l], v}, 2);
      }
      cache->keys[l] = k;
      cache->values[l] = v;
    }
    double scale = c.scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(dh)) : 1.0;
    if (c.scale_attn_by_inverse_layer_idx) scale /= (l + 1);
    at::Tensor att = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
    att.masked_fill_(causal, -std::numeric_limits<float>::infinity());
    att = at::softmax(att, -1);
    at::Tensor z = at::matmul(att, v).transpose(1, 2).reshape({B, S, d});
    if (collector.Capture(l, HookPoint::kAttnZ, z)) break;
    at::Tensor attn_out = at::addmm(b.b_O, z.reshape({B * S, d}), b.W_O).view({B, S, d});
    if (collector.Capture(l, HookPoint::kAttnOut, attn_out)) break;
    x = x + attn_out;
    if (collector.Capture(l, HookPoint::kResidMid, x)) break;
    at::Tensor h2;
    if (collector.Wants(l, HookPoint::kMlpIn)) {
      at::Tensor normed = at::layer_norm(x, {d}, {}, {}, c.layer_norm_eps);
      const at::Tensor computed = normed;
      if (collector.Capture(l, HookPoint::kMlpIn, normed)) break;
      // Spliced, the MLP reads the replacement through the norm's gain and bias.
      h2 = normed.is_same(computed) ? at::layer_norm(x, {d}, b.ln2_w, b.ln2_b, c.layer_norm_eps)
                                    : at::addcmul(b.ln2_b, normed, b.ln2_w);
    } else {
      h2 = at::layer_norm(x, {d}, b.ln2_w, b.ln2_b, c.layer_norm_eps);
    }
    if (collector.Capture(l, HookPoint::kMlpInput, h2)) break;
    at::Tensor post = activation(at::addmm(b.b_in, h2.view({B * S, d}), b.W_in)).view({B, S, -1});
    if (collector.Capture(l, HookPoint::kMlpPost, post)) break;
    at::Tensor mlp_out = at::addmm(b.b_out, post.reshape({B * S, -1}), b.W_out).view({B, S, d});
    if (collector.Capture(l, HookPoint::kMlpOutput, mlp_out)) break;
    if (collector.Capture(l, HookPoint::kMlpOut, mlp_out)) break;
    x = x + mlp_out;
    if (all != nullptr) all->push_back(x);
    if (collector.Capture(l, HookPoint::kResidPost, x)) break;
  }
  if (last != nullptr) *last = x;
  if (cache != nullptr) cache->positions = past + S;
  return collector.Take();
}

std::string Gpt2Model::next_token_loss_unsupported() const {
  return w_.ln_f_w.defined() ? "" : "the checkpoint has no final LayerNorm (ln_f)";
}

NextTokenPredictions Gpt2Model::PredictNextTokens(const at::Tensor& tokens,
                                                  const HookSplices& splices, bool losses,
                                                  KeyValueCache* cache) {
  TORCH_CHECK(w_.ln_f_w.defined(), next_token_loss_unsupported());
  at::Tensor x;
  Run(tokens, {}, nullptr, &splices, &x, cache);
  const at::Tensor normed =
      at::layer_norm(x, {config().d_model}, w_.ln_f_w, w_.ln_f_b, config().layer_norm_eps);
  return engine::PredictNextTokens(normed, w_.W_U.defined() ? w_.W_U : w_.W_E, tokens,
                                   /*softcap=*/0, losses);
}

std::vector<at::Tensor> Gpt2Model::ForwardSpliced(const at::Tensor& tokens,
                                                  const std::vector<HookName>& hooks,
                                                  const HookSplices& splices,
                                                  KeyValueCache* cache) {
  return Run(tokens, hooks, nullptr, &splices, nullptr, cache);
}

std::vector<std::pair<std::string, at::Tensor>> Gpt2Model::NamedWeights() const {
  std::vector<std::pair<std::string, at::Tensor>> out = {{"embed.W_E", w_.W_E},
                                                         {"embed.W_pos", w_.W_pos}};
  for (size_t l = 0; l < w_.blocks.size(); ++l) {
    const Gpt2Block& b = w_.blocks[l];
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

at::Tensor Gpt2Model::Forward(const at::Tensor& tokens) {
  return Run(tokens, {hooks_[0]}, nullptr)[0];
}

std::vector<at::Tensor> Gpt2Model::ForwardHooks(const at::Tensor& tokens) {
  return Run(tokens, hooks_, nullptr);
}

std::vector<at::Tensor> Gpt2Model::AllResidPost(const at::Tensor& tokens) {
  std::vector<at::Tensor> all;
  Run(tokens, {}, &all);
  return all;
}

}  // namespace latentd::engine
