#include "engine/reference_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/fnv1a.h"
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

Gpt2Config ReferenceGpt2Config(const latentd::v1::ReferenceModelSpec& s) {
  Gpt2Config c;
  c.d_model = s.d_model();
  c.n_layers = s.n_layers();
  c.n_heads = s.n_heads();
  c.d_mlp = s.d_mlp();
  c.vocab_size = s.vocab_size();
  c.context_length = s.context_length();
  c.what = "the reference model";
  return c;
}

Gpt2Weights DrawReferenceWeights(const latentd::v1::ReferenceModelSpec& s) {
  Gpt2Weights w;
  w.config = ReferenceGpt2Config(s);
  const int64_t d = s.d_model(), f = s.d_mlp();
  at::Generator gen = at::detail::createCPUGenerator(s.seed());
  const double out_scale = 1.0 / std::sqrt(2.0 * s.n_layers());
  auto normal = [&](std::vector<int64_t> shape, double scale) {
    return (at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * (0.02 * scale));
  };
  Fnv1a64 hash;
  auto hashed = [&](at::Tensor t) {
    t = t.contiguous();
    hash.Add(t.data_ptr(), t.numel() * sizeof(float));
    return t;
  };
  w.W_E = hashed(normal({s.vocab_size(), d}, 1.0));
  w.W_pos = hashed(normal({s.context_length(), d}, 1.0));
  for (int l = 0; l < s.n_layers(); ++l) {
    Gpt2Block b;
    b.ln1_w = hashed(at::ones({d}));
    b.ln1_b = hashed(at::zeros({d}));
    b.W_qkv = hashed(normal({d, 3 * d}, 1.0));
    b.b_qkv = hashed(at::zeros({3 * d}));
    b.W_O = hashed(normal({d, d}, out_scale));
    b.b_O = hashed(at::zeros({d}));
    b.ln2_w = hashed(at::ones({d}));
    b.ln2_b = hashed(at::zeros({d}));
    b.W_in = hashed(normal({d, f}, 1.0));
    b.b_in = hashed(at::zeros({f}));
    b.W_out = hashed(normal({f, d}, out_scale));
    b.b_out = hashed(at::zeros({d}));
    w.blocks.push_back(std::move(b));
  }
  // A final LayerNorm without a gain or a bias of its own; left out of the hash, which names what
  // the stored rows come from.
  w.ln_f_w = at::ones({d});
  w.ln_f_b = at::zeros({d});
  w.weight_hash = hash.ToString();
  w.model_id = absl::StrCat("reference:d", d, "-l", s.n_layers(), "-h", s.n_heads(), "-f", f, "-v",
                            s.vocab_size(), "-c", s.context_length(), "-seed", s.seed());
  return w;
}

absl::StatusOr<std::unique_ptr<Gpt2Model>> CreateReferenceModel(
    const latentd::v1::ReferenceModelSpec& spec, const std::vector<HookName>& hooks,
    const at::Device& device) {
  ASSIGN_OR_RETURN(latentd::v1::ReferenceModelSpec resolved, ResolveReferenceSpec(spec));
  // Hooks first: a bad one should not cost drawing the weights.
  RETURN_IF_ERROR(TransformerHookWidths(Gpt2Shape(ReferenceGpt2Config(resolved)), hooks).status());
  return Gpt2Model::Create(DrawReferenceWeights(resolved), hooks, device);
}

absl::StatusOr<std::unique_ptr<Gpt2Model>> CreateReferenceModel(
    const latentd::v1::ReferenceModelSpec& spec, const HookName& hook, const at::Device& device) {
  return CreateReferenceModel(spec, std::vector<HookName>{hook}, device);
}

}  // namespace latentd::engine
