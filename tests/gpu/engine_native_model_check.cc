// GPU check kit: the natively run transformers (engine/gpt2_model.cc, engine/llama_model.cc)
// that EXTRACT uses for the reference model and Hugging Face checkpoints:
//   - on the CPU, several hooks from one forward equal one-hook forwards (the early stop);
//   - on CUDA, every hook equals the CPU's for the same weights and tokens (1e-4 of the largest
//     value), for a GPT-2, for a Llama with grouped-query attention, Llama 3 rope scaling and
//     Gemma 2's post-norms and soft-capping, and for a GPT-NeoX (LayerNorm, partial rotary,
//     parallel residual).

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/gpt2_model.h"
#include "engine/llama_model.h"
#include "tests/gpu/kit_report.h"

namespace gpu_kit {
namespace {

using latentd::engine::Gpt2Block;
using latentd::engine::Gpt2Model;
using latentd::engine::Gpt2Weights;
using latentd::engine::HookName;
using latentd::engine::LlamaBlock;
using latentd::engine::LlamaModel;
using latentd::engine::LlamaWeights;
using latentd::engine::ParseHookName;

at::Tensor R(std::vector<int64_t> shape, double scale = 0.1) { return at::randn(shape) * scale; }

Gpt2Weights Gpt2() {
  Gpt2Weights w;
  auto& c = w.config;
  c.d_model = 64, c.n_layers = 3, c.n_heads = 4, c.d_mlp = 256, c.vocab_size = 100;
  c.context_length = 32;
  w.W_E = R({100, 64}), w.W_pos = R({32, 64});
  for (int l = 0; l < 3; ++l) {
    Gpt2Block b{1 + R({64}), R({64}), R({64, 192}), R({192}), R({64, 64}),  R({64}),
                1 + R({64}), R({64}), R({64, 256}), R({256}), R({256, 64}), R({64})};
    w.blocks.push_back(b);
  }
  return w;
}

LlamaWeights Llama() {
  LlamaWeights w;
  auto& c = w.config;
  c.d_model = 64, c.n_layers = 3, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16, c.d_mlp = 96;
  c.vocab_size = 100, c.context_length = 32;
  c.rope_factor = 8, c.rope_original_context = 16;  // Llama 3 scaling
  c.embed_scale = 8, c.post_norms = true, c.attn_softcap = 5, c.attn_scale = 0.2;  // Gemma 2
  w.W_E = R({100, 64}, 1.0), w.W_U = R({100, 64});
  for (int l = 0; l < 3; ++l) {
    LlamaBlock b;
    b.attn_norm = 1 + R({64}), b.mlp_norm = 1 + R({64});
    b.post_attn_norm = 1 + R({64}), b.post_mlp_norm = 1 + R({64});
    b.W_q = R({64, 64}), b.W_k = R({32, 64}), b.W_v = R({32, 64}), b.W_o = R({64, 64});
    b.b_q = R({64}), b.b_k = R({32}), b.b_v = R({32});
    b.W_gate = R({96, 64}), b.W_up = R({96, 64}), b.W_down = R({64, 96});
    w.blocks.push_back(b);
  }
  return w;
}

// GPT-NeoX's options on the same forward: LayerNorm, partial rotary, ungated MLP, parallel
// residual.
LlamaWeights Neox() {
  LlamaWeights w = Llama();
  auto& c = w.config;
  c.n_kv_heads = 4, c.rope_factor = 0, c.embed_scale = 1, c.post_norms = false;
  c.attn_softcap = 0, c.attn_scale = 0;
  c.layer_norm = true, c.rotary_dim = 4, c.gated_mlp = false, c.parallel_residual = true;
  for (LlamaBlock& b : w.blocks) {
    b.W_k = R({64, 64}), b.W_v = R({64, 64}), b.b_k = R({64}), b.b_v = R({64});
    b.attn_norm_b = R({64}), b.mlp_norm_b = R({64});
    b.W_gate = at::Tensor(), b.b_up = R({96}), b.b_down = R({64}), b.b_o = R({64});
  }
  return w;
}

// Gemma 3's options: q/k norms, a sliding window on the local layers with their own rotary base,
// linear scaling on the global one; no soft-capping.
LlamaWeights Gemma3() {
  LlamaWeights w = Llama();
  auto& c = w.config;
  c.rope_factor = 0, c.attn_softcap = 0, c.rope_linear_factor = 8, c.rope_theta = 1e6;
  c.qk_norm = true, c.sliding_window = 5, c.sliding_layers = {true, false, true};
  c.rope_local_theta = 1e4;
  for (LlamaBlock& b : w.blocks) b.q_norm = 1 + R({16}), b.k_norm = 1 + R({16});
  return w;
}

const std::vector<std::string> kHooks = {"blocks.2.hook_resid_post", "blocks.0.hook_attn_out",
                                         "blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out",
                                         "blocks.1.attn.hook_z"};

std::vector<HookName> Hooks(const std::vector<std::string>& names) {
  std::vector<HookName> hooks;
  for (const auto& n : names) hooks.push_back(*ParseHookName(n));
  return hooks;
}

double WorstRelative(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = a.size() == b.size() ? 0 : 1e9;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double scale = std::max(1e-12, b[i].abs().max().item<double>());
    worst = std::max(worst, (a[i].to(at::kCPU) - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

template <typename Model, typename Weights>
std::vector<at::Tensor> Run(const Weights& w, const std::vector<std::string>& hooks,
                            const at::Device& device, const at::Tensor& tokens) {
  auto model = Model::Create(w, Hooks(hooks), device);
  if (!model.ok()) return {};
  return (*model)->ForwardHooks(tokens.to(device));
}

int Main() {
  Report r;
  const bool cuda = torch::cuda::is_available() && torch::cuda::device_count() > 0;
  at::manual_seed(3);
  const Gpt2Weights gpt2 = Gpt2();
  const LlamaWeights llama = Llama();
  const LlamaWeights neox = Neox();
  const LlamaWeights gemma3 = Gemma3();
  LlamaWeights gemma3_bf16 = gemma3;  // bfloat16 weights and matmuls, float32 norms and softmax
  gemma3_bf16.config.bfloat16 = true;
  const at::Tensor tokens = at::randint(0, 100, {3, 32}, at::kLong);
  const at::Device cpu(at::kCPU);

  r.Guard("engine.native_models.cpu", [&] {
    double worst = 0;
    const auto gpt2_all = Run<Gpt2Model>(gpt2, kHooks, cpu, tokens);
    const auto llama_all = Run<LlamaModel>(llama, kHooks, cpu, tokens);
    for (size_t i = 0; i < kHooks.size(); ++i) {
      worst = std::max(
          worst, WorstRelative({gpt2_all.at(i)}, Run<Gpt2Model>(gpt2, {kHooks[i]}, cpu, tokens)));
      worst = std::max(worst, WorstRelative({llama_all.at(i)},
                                            Run<LlamaModel>(llama, {kHooks[i]}, cpu, tokens)));
      worst = std::max(worst, WorstRelative({Run<LlamaModel>(neox, kHooks, cpu, tokens).at(i)},
                                            Run<LlamaModel>(neox, {kHooks[i]}, cpu, tokens)));
      worst = std::max(worst, WorstRelative({Run<LlamaModel>(gemma3, kHooks, cpu, tokens).at(i)},
                                            Run<LlamaModel>(gemma3, {kHooks[i]}, cpu, tokens)));
    }
    r.Check(worst < 1e-5, "engine.native_models.cpu",
            "several hooks from one forward against one-hook forwards (GPT-2, Llama/Gemma 2, "
            "GPT-NeoX, Gemma 3): " +
                Sci(worst));
  });
  r.Guard("engine.native_models.bf16_cpu", [&] {
    const double e = WorstRelative(Run<LlamaModel>(gemma3_bf16, kHooks, cpu, tokens),
                                   Run<LlamaModel>(gemma3, kHooks, cpu, tokens));
    r.Check(
        e < 3e-2 && e > 1e-5, "engine.native_models.bf16_cpu",
        "Gemma 3 in bfloat16 against float32 on the CPU, relative to the largest value: " + Sci(e));
  });
  if (!cuda) {
    r.Skip("engine.native_models.cuda", "SKIP (no CUDA)");
    r.Skip("engine.native_models.bf16_cuda", "SKIP (no CUDA)");
    return r.exit_code();
  }
  r.Guard("engine.native_models.cuda", [&] {
    const at::Device dev(at::kCUDA, 0);
    const double g = WorstRelative(Run<Gpt2Model>(gpt2, kHooks, dev, tokens),
                                   Run<Gpt2Model>(gpt2, kHooks, cpu, tokens));
    const double l = WorstRelative(Run<LlamaModel>(llama, kHooks, dev, tokens),
                                   Run<LlamaModel>(llama, kHooks, cpu, tokens));
    const double n = WorstRelative(Run<LlamaModel>(neox, kHooks, dev, tokens),
                                   Run<LlamaModel>(neox, kHooks, cpu, tokens));
    const double g3 = WorstRelative(Run<LlamaModel>(gemma3, kHooks, dev, tokens),
                                    Run<LlamaModel>(gemma3, kHooks, cpu, tokens));
    r.Check(std::max({g, l, n, g3}) < 1e-4, "engine.native_models.cuda",
            "every hook on the device against the CPU, relative to the largest value: GPT-2 " +
                Sci(g) + ", Llama/Gemma 2 " + Sci(l) + ", GPT-NeoX " + Sci(n) + ", Gemma 3 " +
                Sci(g3));
  });
  r.Guard("engine.native_models.bf16_cuda", [&] {
    const at::Device dev(at::kCUDA, 0);
    const double e = WorstRelative(Run<LlamaModel>(gemma3_bf16, kHooks, dev, tokens),
                                   Run<LlamaModel>(gemma3, kHooks, cpu, tokens));
    r.Check(e < 3e-2, "engine.native_models.bf16_cuda",
            "Gemma 3 in bfloat16 on the device against float32 on the CPU: " + Sci(e));
  });
  return r.exit_code();
}

}  // namespace
}  // namespace gpu_kit

int main() { return gpu_kit::Main(); }
