#include "engine/llama_model.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/hook_collector.h"
#include "engine/next_token_loss.h"

namespace latentd::engine {
namespace {

// HF's RMSNorm: x / sqrt(mean(x^2) + eps), times the gain. In bfloat16 the normalization runs
// in float32, as Hugging Face's does; a float32 gain (Gemma's 1 + w) multiplies before the
// result returns to bfloat16, a bfloat16 one (Llama's) after.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.scalar_type() == at::kFloat) {
    return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
  }
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight.scalar_type() == at::kFloat ? (normed * weight).to(x.scalar_type())
                                            : weight * normed.to(x.scalar_type());
}

// The inverse frequencies of the rotary embedding for base `theta`; with `scaled`, the
// configured scaling: linear (every frequency divided by the factor) or Llama 3's (long
// wavelengths slowed by `factor`, short ones kept, the band between interpolated).
// LongRoPE divides each frequency by its own factor: `long_factors` picks which list.
at::Tensor InverseFrequencies(const LlamaConfig& c, double theta, bool scaled,
                              bool long_factors = false) {
  const int64_t dim = c.rotary_dim > 0 ? c.rotary_dim : c.head_dim;
  at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, dim, 2, at::kDouble) / dim);
  if (scaled && !c.rope_short_factors.empty()) {
    const std::vector<double>& factors = long_factors ? c.rope_long_factors : c.rope_short_factors;
    inv_freq = inv_freq / at::tensor(factors, at::kDouble);
  }
  if (scaled && c.rope_linear_factor > 0) inv_freq = inv_freq / c.rope_linear_factor;
  if (scaled && c.rope_factor > 0) {
    const double low_wavelen = c.rope_original_context / c.rope_low_freq_factor;
    const double high_wavelen = c.rope_original_context / c.rope_high_freq_factor;
    at::Tensor wavelen = 2 * M_PI / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / c.rope_factor, inv_freq);
    at::Tensor smooth = (c.rope_original_context / wavelen - c.rope_low_freq_factor) /
                        (c.rope_high_freq_factor - c.rope_low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
    at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  }
  return inv_freq.to(at::kFloat);
}

// HF's rotate_half: (x1, x2) -> (-x2, x1) over the last dimension's halves.
at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b) {
  return b.defined() ? at::linear(x, W, b) : at::linear(x, W);
}

}  // namespace

TransformerShape LlamaShape(const LlamaConfig& c) {
  TransformerShape s = CommonShape(c);
  const int64_t d = c.d_model, f = c.d_mlp, q = c.n_heads * c.head_dim,
                kv = c.n_kv_heads * c.head_dim;
  const int64_t biases = (c.qkv_bias ? q + 2 * kv : 0) + (c.o_bias ? d : 0) +
                         (c.mlp_bias ? (c.gated_mlp ? 2 : 1) * f + d : 0);
  const int64_t norms =
      ((c.pre_norms ? 2 : 0) + (c.post_norms ? 2 : 0)) * d * (c.layer_norm ? 2 : 1) +
      (c.qk_norm ? 2 * c.head_dim : 0) + (c.qk_norm_full ? q + kv : 0);
  const int64_t per_block =
      norms + d * (q + 2 * kv) + q * d + (c.gated_mlp ? 3 : 2) * d * f + biases;
  s.parameter_bytes = (c.bfloat16 ? 2 : 4) *
                      (c.vocab_size * d * (c.tied_embeddings ? 1 : 2) + c.n_layers * per_block);
  s.has_resid_mid = !c.parallel_residual;
  s.d_head = c.head_dim;
  return s;
}

std::string LlamaConfigFingerprint(const LlamaConfig& c) {
  // Options added later append only when set, so the hashes of earlier datasets stay valid.
  std::string later;
  if (c.qk_norm) later += " qknorm";
  if (c.sliding_window > 0) {
    later += absl::StrFormat(" window%d local%.9g:", c.sliding_window, c.rope_local_theta);
    for (const bool sliding : c.sliding_layers) later += sliding ? 'L' : 'G';
  }
  if (c.rope_linear_factor > 0) later += absl::StrFormat(" linear%.9g", c.rope_linear_factor);
  if (c.bfloat16) later += " bf16";
  if (c.qk_norm_full) later += " qknormfull";
  if (!c.pre_norms) later += " nopre";
  if (c.norm_gain_float32) later += " gainf32";
  if (!c.rope_short_factors.empty()) {
    later += absl::StrFormat(" longrope%d*%.9g:", c.rope_original_context, c.rope_attention_factor);
    for (const double f : c.rope_short_factors) later += absl::StrFormat("%.9g,", f);
    later += "/";
    for (const double f : c.rope_long_factors) later += absl::StrFormat("%.9g,", f);
  }
  return absl::StrFormat(
      "llama d%d l%d h%d kv%d dh%d f%d v%d c%d eps%.9g theta%.9g rope%.9g/%.9g/%.9g/%d act%d "
      "bias%d%d%d tied%d embed%.9g post%d cap%.9g scale%.9g offset%d ln%d rot%d gated%d par%d%s",
      c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.d_mlp, c.vocab_size,
      c.context_length, c.norm_eps, c.rope_theta, c.rope_factor, c.rope_low_freq_factor,
      c.rope_high_freq_factor, c.rope_original_context, static_cast<int>(c.activation), c.qkv_bias,
      c.o_bias, c.mlp_bias, c.tied_embeddings, c.embed_scale, c.post_norms, c.attn_softcap,
      c.attn_scale, c.norm_gain_offset, c.layer_norm, c.rotary_dim, c.gated_mlp,
      c.parallel_residual, later);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(LlamaWeights weights,
                                                               const std::vector<HookName>& hooks,
                                                               const at::Device& device) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  ASSIGN_OR_RETURN(m->hook_widths_, TransformerHookWidths(LlamaShape(weights.config), hooks));
  m->hooks_ = hooks;
  m->w_ = std::move(weights);
  const LlamaConfig& c = m->w_.config;
  // Matrices and biases in the model's dtype; norm gains keep theirs where they are float32 in
  // a bfloat16 model (Gemma's 1 + w), as Hugging Face computes them.
  const at::ScalarType dtype = c.bfloat16 ? at::kBFloat16 : at::kFloat;
  auto place = [&](at::Tensor& t, bool norm) {
    if (!t.defined()) return;
    const at::ScalarType type = norm && t.scalar_type() == at::kFloat ? at::kFloat : dtype;
    t = t.to(device, type).contiguous();
  };
  place(m->w_.W_E, false);
  place(m->w_.W_U, false);
  for (LlamaBlock& b : m->w_.blocks) {
    for (at::Tensor* t : {&b.W_q, &b.b_q, &b.W_k, &b.b_k, &b.W_v, &b.b_v, &b.W_o, &b.b_o, &b.W_gate,
                          &b.b_gate, &b.W_up, &b.b_up, &b.W_down, &b.b_down}) {
      place(*t, false);
    }
    for (at::Tensor* t : {&b.attn_norm, &b.attn_norm_b, &b.mlp_norm, &b.mlp_norm_b, &b.q_norm,
                          &b.k_norm, &b.post_attn_norm, &b.post_mlp_norm}) {
      place(*t, true);
    }
  }
  place(m->w_.final_norm, true);
  place(m->w_.final_norm_b, true);
  if (c.sliding_window > 0 && static_cast<int64_t>(c.sliding_layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.what, ": ", c.sliding_layers.size(), " sliding-layer flags for ", c.n_layers, " layers"));
  }
  m->inv_freq_ = InverseFrequencies(c, c.rope_theta, /*scaled=*/true).to(device);
  if (!c.rope_long_factors.empty()) {
    m->long_inv_freq_ =
        InverseFrequencies(c, c.rope_theta, /*scaled=*/true, /*long_factors=*/true).to(device);
  }
  if (c.sliding_window > 0 && c.rope_local_theta > 0) {
    m->local_inv_freq_ = InverseFrequencies(c, c.rope_local_theta, /*scaled=*/false).to(device);
  }
  return m;
}

std::vector<at::Tensor> LlamaModel::Run(const at::Tensor& tokens,
                                        const std::vector<HookName>& hooks,
                                        const HookSplices* splices,
                                        NextTokenPredictions* predictions, bool losses,
                                        KeyValueCache* cache) {
  const LlamaConfig& c = w_.config;
  const int64_t B = tokens.size(0), S = tokens.size(1), d = c.d_model;
  // With a cache the S tokens sit at positions past .. past + S - 1 after the ones it holds.
  const int64_t past = cache != nullptr ? cache->positions : 0;
  if (cache != nullptr) {
    cache->keys.resize(c.n_layers);
    cache->values.resize(c.n_layers);
  }
  const int64_t H = c.n_heads, KV = c.n_kv_heads, dh = c.head_dim;
  const at::ScalarType dtype = c.bfloat16 ? at::kBFloat16 : at::kFloat;
  HookCollector collector(hooks, /*run_all=*/predictions != nullptr, splices);
  auto activation = [&](const at::Tensor& x) {
    switch (c.activation) {
      case LlamaActivation::kGeluTanh:
        return at::gelu(x, "tanh");
      case LlamaActivation::kGeluErf:
        return at::gelu(x);
      case LlamaActivation::kSilu:
        break;
    }
    return at::silu(x);
  };
  // cos and sin of each position's angles, [S, rotary dims], broadcast over B and H.
  auto angles = [&](const at::Tensor& inv_freq) {
    at::Tensor freqs =
        at::arange(past, past + S, inv_freq.options()).unsqueeze(1) * inv_freq.unsqueeze(0);
    at::Tensor both = at::cat({freqs, freqs}, -1);
    // LongRoPE scales both by its attention factor (1 otherwise), in float32 like Hugging Face.
    const double scale = c.rope_attention_factor;
    return std::make_pair((both.cos() * scale).to(dtype), (both.sin() * scale).to(dtype));
  };
  // LongRoPE switches to its long factors when the sequence outgrows the original context. A
  // cached continuation that crosses it keeps its held keys' short factors (as Hugging Face's
  // cache does), where a whole run would rotate every position by the long ones.
  const auto global_angles = angles(
      long_inv_freq_.defined() && past + S > c.rope_original_context ? long_inv_freq_ : inv_freq_);
  const auto local_angles = local_inv_freq_.defined() ? angles(local_inv_freq_) : global_angles;
  const int64_t rd = global_angles.first.size(-1);
  auto rotate = [&](const at::Tensor& x, const std::pair<at::Tensor, at::Tensor>& cs) {
    const at::Tensor &cos = cs.first, &sin = cs.second;
    if (rd == dh) return x * cos + RotateHalf(x) * sin;
    const at::Tensor r = x.slice(-1, 0, rd);  // GPT-NeoX: the rest of each head passes as is
    return at::cat({r * cos + RotateHalf(r) * sin, x.slice(-1, rd)}, -1);
  };
  auto norm = [&](const at::Tensor& x, const at::Tensor& gain, const at::Tensor& bias) {
    if (!c.layer_norm) return RmsNorm(x, gain, c.norm_eps);
    if (dtype == at::kFloat) return at::layer_norm(x, {d}, gain, bias, c.norm_eps);
    return at::layer_norm(x.to(at::kFloat), {d}, gain.to(at::kFloat), bias.to(at::kFloat),
                          c.norm_eps)
        .to(dtype);
  };
  // The norm without its gain (and bias), in float32 like the norm itself: TransformerLens'
  // hook_normalized (HookPoint::kMlpIn); apply_gain finishes what norm() computes.
  auto normalize = [&](const at::Tensor& x) {
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor normed =
        c.layer_norm ? at::layer_norm(xf, {d}, {}, {}, c.norm_eps)
                     : xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + c.norm_eps);
    return normed.to(dtype);
  };
  auto apply_gain = [&](const at::Tensor& normed, const at::Tensor& gain, const at::Tensor& bias) {
    at::Tensor out = normed.to(at::kFloat) * gain.to(at::kFloat);
    if (bias.defined()) out = out + bias.to(at::kFloat);
    return out.to(dtype);
  };
  // Query i (position past + i) sees keys 0 .. past + i; a sliding layer also hides positions
  // sliding_window or more behind it.
  const int64_t T = past + S;
  at::Tensor causal = at::ones({S, T}, tokens.options().dtype(at::kBool)).triu(past + 1);
  at::Tensor windowed =
      c.sliding_window > 0 && c.sliding_window < T
          ? causal.logical_or(at::ones({S, T}, causal.options()).tril(past - c.sliding_window))
          : causal;
  const double scale = c.attn_scale > 0 ? c.attn_scale : 1.0 / std::sqrt(static_cast<double>(dh));

  at::Tensor x = w_.W_E.index_select(0, tokens.reshape({-1})).view({B, S, d});
  if (c.embed_scale != 1) {
    // Hugging Face rounds Gemma's sqrt(d_model) to the model's dtype before multiplying.
    x = x * at::scalar_tensor(c.embed_scale, at::kFloat).to(dtype).item<double>();
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const LlamaBlock& b = w_.blocks[l];
    if (collector.Capture(l, HookPoint::kResidPre, x)) break;
    const at::Tensor h = c.pre_norms ? norm(x, b.attn_norm, b.attn_norm_b) : x;
    at::Tensor q = Linear(h, b.W_q, b.b_q);
    at::Tensor k = Linear(h, b.W_k, b.b_k);
    if (c.qk_norm_full) {
      q = RmsNorm(q, b.q_norm, c.norm_eps);
      k = RmsNorm(k, b.k_norm, c.norm_eps);
    }
    q = q.view({B, S, H, dh});
    k = k.view({B, S, KV, dh});
    if (c.qk_norm) {
      q = RmsNorm(q, b.q_norm, c.norm_eps);
      k = RmsNorm(k, b.k_norm, c.norm_eps);
    }
    const bool sliding = c.sliding_window > 0 && c.sliding_layers[l];
    q = rotate(q.transpose(1, 2), sliding ? local_angles : global_angles);
    k = rotate(k.transpose(1, 2), sliding ? local_angles : global_angles);
    at::Tensor v = Linear(h, b.W_v, b.b_v).view({B, S, KV, dh}).transpose(1, 2);
    if (cache != nullptr) {  // held before grouped-query attention's repeat: KV heads only
      if (past > 0) {
        k = at::cat({cache->keys[l], k}, 2);
        v = at::cat({cache->values[l], v}, 2);
      }
      cache->keys[l] = k;
      cache->values[l] = v;
    }
    if (KV != H) {  // grouped-query attention: each key/value head serves H / KV query heads
      k = k.repeat_interleave(H / KV, 1);
      v = v.repeat_interleave(H / KV, 1);
    }
    at::Tensor att = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
    if (c.attn_softcap > 0) att = at::tanh(att / c.attn_softcap) * c.attn_softcap;
    att.masked_fill_(sliding ? windowed : causal, -std::numeric_limits<float>::infinity());
    att = at::softmax(att, -1, at::kFloat).to(dtype);
    at::Tensor z = at::matmul(att, v).transpose(1, 2).reshape({B, S, H * dh});
    if (collector.Capture(l, HookPoint::kAttnZ, z)) break;
    at::Tensor attn_out = Linear(z, b.W_o, b.b_o);
    if (c.post_norms) attn_out = RmsNorm(attn_out, b.post_attn_norm, c.norm_eps);
    if (collector.Capture(l, HookPoint::kAttnOut, attn_out)) break;
    if (!c.parallel_residual) {
      x = x + attn_out;
      if (collector.Capture(l, HookPoint::kResidMid, x)) break;
    }
    at::Tensor h2;
    if (c.pre_norms && collector.Wants(l, HookPoint::kMlpIn)) {
      at::Tensor normed = normalize(x);
      const at::Tensor computed = normed;
      if (collector.Capture(l, HookPoint::kMlpIn, normed)) break;
      // Spliced, the MLP reads the replacement through the norm's gain (and bias).
      h2 = normed.is_same(computed) ? norm(x, b.mlp_norm, b.mlp_norm_b)
                                    : apply_gain(normed, b.mlp_norm, b.mlp_norm_b);
    } else if (c.pre_norms) {
      h2 = norm(x, b.mlp_norm, b.mlp_norm_b);
    } else {
      h2 = x;  // no norm before the MLP (OLMo 2): its input is the normalized one too
      if (collector.Capture(l, HookPoint::kMlpIn, h2)) break;
    }
    if (collector.Capture(l, HookPoint::kMlpInput, h2)) break;
    at::Tensor post = b.W_gate.defined()
                          ? activation(Linear(h2, b.W_gate, b.b_gate)) * Linear(h2, b.W_up, b.b_up)
                          : activation(Linear(h2, b.W_up, b.b_up));
    if (collector.Capture(l, HookPoint::kMlpPost, post)) break;
    at::Tensor mlp_out = Linear(post, b.W_down, b.b_down);
    if (collector.Capture(l, HookPoint::kMlpOutput, mlp_out)) break;
    if (c.post_norms) mlp_out = RmsNorm(mlp_out, b.post_mlp_norm, c.norm_eps);
    if (collector.Capture(l, HookPoint::kMlpOut, mlp_out)) break;
    x = c.parallel_residual ? x + attn_out + mlp_out : x + mlp_out;
    if (collector.Capture(l, HookPoint::kResidPost, x)) break;
  }
  if (cache != nullptr) cache->positions = past + S;
  if (predictions != nullptr) {
    *predictions = engine::PredictNextTokens(norm(x, w_.final_norm, w_.final_norm_b), w_.W_U,
                                             tokens, c.final_logit_softcap, losses);
  }
  std::vector<at::Tensor> out = collector.Take();
  for (at::Tensor& t : out) t = t.to(at::kFloat);  // what SAEs and the store take
  return out;
}

at::Tensor LlamaModel::Forward(const at::Tensor& tokens) { return Run(tokens, {hooks_[0]})[0]; }

std::vector<at::Tensor> LlamaModel::ForwardHooks(const at::Tensor& tokens) {
  return Run(tokens, hooks_);
}

std::string LlamaModel::next_token_loss_unsupported() const {
  return w_.final_norm.defined() ? "" : "the checkpoint has no final norm (model.norm.weight)";
}

NextTokenPredictions LlamaModel::PredictNextTokens(const at::Tensor& tokens,
                                                   const HookSplices& splices, bool losses,
                                                   KeyValueCache* cache) {
  TORCH_CHECK(w_.final_norm.defined(), next_token_loss_unsupported());
  NextTokenPredictions predictions;
  Run(tokens, {}, &splices, &predictions, losses, cache);
  return predictions;
}

std::vector<at::Tensor> LlamaModel::ForwardSpliced(const at::Tensor& tokens,
                                                   const std::vector<HookName>& hooks,
                                                   const HookSplices& splices,
                                                   KeyValueCache* cache) {
  return Run(tokens, hooks, &splices, nullptr, /*losses=*/false, cache);
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::NamedWeights() const {
  std::vector<std::pair<std::string, at::Tensor>> out = {{"embed.W_E", w_.W_E},
                                                         {"unembed.W_U", w_.W_U}};
  for (size_t l = 0; l < w_.blocks.size(); ++l) {
    out.push_back({absl::StrCat("blocks.", l, ".attn.W_O"), w_.blocks[l].W_o.t()});
    out.push_back({absl::StrCat("blocks.", l, ".mlp.W_out"), w_.blocks[l].W_down.t()});
  }
  return out;
}

}  // namespace latentd::engine
