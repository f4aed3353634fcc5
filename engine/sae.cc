#include "engine/sae.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/write_file.h"
#include "engine/circuit_tracer.h"
#include "engine/npz.h"
#include "engine/safetensors_tensor.h"
#include "engine/torch_pickle.h"
#include "storage/crc32c.h"

namespace latentd::engine {
namespace {

absl::Status CheckShape(const at::Tensor& t, const char* name, std::vector<int64_t> want) {
  if (!t.defined())
    return absl::InvalidArgumentError(absl::StrCat("SAE tensor ", name, " missing"));
  if (t.sizes().vec() != want) {
    std::ostringstream got;
    got << t.sizes();
    return absl::InvalidArgumentError(
        absl::StrCat("SAE tensor ", name, " has shape ", got.str(), ", expected [", want[0],
                     want.size() > 1 ? absl::StrCat(", ", want[1]) : "", "]"));
  }
  if (!at::isfinite(t).all().item<bool>()) {
    return absl::InvalidArgumentError(absl::StrCat("SAE tensor ", name, " has NaN or Inf entries"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::pair<const char*, const at::Tensor*>> SaeWeights::Named(bool gated) const {
  std::vector<std::pair<const char*, const at::Tensor*>> named;
  for (const auto& [name, t] : std::initializer_list<std::pair<const char*, const at::Tensor*>>{
           {"W_enc", &W_enc},
           {gated ? "b_gate" : "b_enc", &b_enc},
           {"W_dec", &W_dec},
           {"b_dec", &b_dec},
           {"threshold", &threshold},
           {"r_mag", &r_mag},
           {"b_mag", &b_mag},
           {"W_skip", &W_skip}}) {
    if (t->defined()) named.emplace_back(name, t);
  }
  return named;
}

absl::StatusOr<Sae> Sae::Create(const SaeConfig& cfg, SaeWeights w) {
  RETURN_IF_ERROR(CheckShape(w.W_enc, "W_enc", {cfg.d_in, cfg.d_sae}));
  RETURN_IF_ERROR(CheckShape(
      w.b_enc, cfg.architecture == SaeArchitecture::kGated ? "b_gate" : "b_enc", {cfg.d_sae}));
  RETURN_IF_ERROR(CheckShape(w.W_dec, "W_dec", {cfg.d_sae, cfg.OutWidth()}));
  RETURN_IF_ERROR(CheckShape(w.b_dec, "b_dec", {cfg.OutWidth()}));
  if (cfg.skip) RETURN_IF_ERROR(CheckShape(w.W_skip, "W_skip", {cfg.OutWidth(), cfg.d_in}));
  if (cfg.transcoder && cfg.apply_b_dec_to_input) {
    return absl::InvalidArgumentError(
        "a transcoder's b_dec is on its output side: apply_b_dec_to_input must be false");
  }
  if (cfg.architecture == SaeArchitecture::kJumpRelu) {
    RETURN_IF_ERROR(CheckShape(w.threshold, "threshold", {cfg.d_sae}));
  }
  if (cfg.architecture == SaeArchitecture::kGated) {
    RETURN_IF_ERROR(CheckShape(w.r_mag, "r_mag", {cfg.d_sae}));
    RETURN_IF_ERROR(CheckShape(w.b_mag, "b_mag", {cfg.d_sae}));
  }
  if (cfg.architecture == SaeArchitecture::kTopK && (cfg.k <= 0 || cfg.k > cfg.d_sae)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SAE k = ", cfg.k, " out of [1, ", cfg.d_sae, "]"));
  }
  Sae sae;
  sae.cfg_ = cfg;
  sae.w_ = w.Map([](const at::Tensor& t) { return t.to(at::kFloat).contiguous(); });
  return sae;
}

namespace {

struct LoadedWeights {
  SaeWeights weights;
  std::string hash;
};

// Gemma Scope's params.npz (ReadAndCheckSae checked names, shapes and dtypes); the hash is a
// CRC32C of the arrays' data in a fixed order.
absl::StatusOr<LoadedWeights> ReadGemmaScopeWeights(const std::string& path) {
  ASSIGN_OR_RETURN(NpzReader npz, NpzReader::Open(path));
  SaeWeights w;
  uint32_t crc = 0;
  int64_t bytes = 0;
  for (auto [name, out] :
       std::vector<std::pair<const char*, at::Tensor*>>{{"W_enc", &w.W_enc},
                                                        {"b_enc", &w.b_enc},
                                                        {"W_dec", &w.W_dec},
                                                        {"b_dec", &w.b_dec},
                                                        {"threshold", &w.threshold}}) {
    const NpyArrayInfo* info = npz.Find(name);
    ASSIGN_OR_RETURN(std::string data, npz.ReadData(name));
    const at::ScalarType type = info->descr == "<f2"   ? at::kHalf
                                : info->descr == "<f8" ? at::kDouble
                                                       : at::kFloat;
    // A column-major array is the row-major one of the reversed shape, transposed back.
    std::vector<int64_t> shape = info->shape;
    if (info->fortran_order) std::reverse(shape.begin(), shape.end());
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    std::memcpy(t.data_ptr(), data.data(), data.size());
    if (info->fortran_order && t.dim() > 1) {
      std::vector<int64_t> reversed(t.dim());
      for (int64_t i = 0; i < t.dim(); ++i) reversed[i] = t.dim() - 1 - i;
      t = t.permute(reversed);
    }
    crc = storage::Crc32cExtend(crc, data.data(), data.size());
    bytes += static_cast<int64_t>(data.size());
    *out = t;
  }
  return LoadedWeights{std::move(w), absl::StrFormat("crc32c:%08x:%d", crc, bytes)};
}

// lm-saes' encoder in SAELens' form (LmSaesFold in sae_config.h): pre and z stay what lm-saes
// computes, x_hat comes back in the hook's own scale.
void FoldLmSaes(const LmSaesFold& fold, const SaeConfig& cfg, SaeWeights* w) {
  if (!fold.decoder_bias || !w->b_dec.defined()) w->b_dec = at::zeros({cfg.OutWidth()});
  if (cfg.architecture == SaeArchitecture::kJumpRelu) {
    at::Tensor t = w->threshold.defined() ? w->threshold : at::full({cfg.d_sae}, *fold.threshold);
    if (fold.threshold_over_decoder_norm) {
      // pre * |d_j| > t is pre > t / |d_j| for |d_j| > 0. With |d_j| = 0 it is 0 > t: never
      // for t >= 0, always otherwise; the largest finite floats say so (weights stay finite).
      const at::Tensor norms = w->W_dec.norm(2, {1});
      const at::Tensor never = at::full_like(t, std::numeric_limits<float>::max());
      t = at::where(norms > 0, t / norms, at::where(t >= 0, never, -never));
    }
    w->threshold = t;
  }
  w->W_enc = w->W_enc * fold.input_scale;
  w->W_dec = w->W_dec / fold.output_scale;
  w->b_dec = w->b_dec / fold.output_scale;
}

// A crosscoder's model.safetensors (ReadAndCheckSae checked names, shapes and dtypes) as the SAE
// over its hooks side by side (SaeConfig::crosscoder_sources). INVALID_ARGUMENT for a BatchTopK
// threshold below 0 (dictionary_learning's "not calibrated": it would need a batch).
absl::StatusOr<LoadedWeights> ReadCrosscoderWeights(const std::string& path, const SaeConfig& cfg) {
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  auto read = [&](const char* name) -> absl::StatusOr<at::Tensor> {
    const StTensorInfo* info = file.header().Find(name);
    if (info == nullptr) return at::Tensor();
    return ReadFloatTensor(file, *info, "crosscoder");
  };
  const int64_t m = cfg.d_sae;
  SaeWeights w;
  ASSIGN_OR_RETURN(const at::Tensor encoder, read("encoder.weight"));  // [n, d, m]
  ASSIGN_OR_RETURN(const at::Tensor decoder, read("decoder.weight"));  // [n, m, d]
  ASSIGN_OR_RETURN(w.b_enc, read("encoder.bias"));
  ASSIGN_OR_RETURN(const at::Tensor decoder_bias, read("decoder.bias"));
  ASSIGN_OR_RETURN(const at::Tensor threshold, read("threshold"));
  w.W_enc = encoder.reshape({cfg.d_in, m});
  w.W_dec = decoder.permute({1, 0, 2}).reshape({m, cfg.d_in}).contiguous();
  w.b_dec = decoder_bias.reshape({cfg.d_in});
  if (threshold.defined()) {
    const double t = threshold.item<double>();
    if (t < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": threshold ", t,
          " < 0: a BatchTopK crosscoder not calibrated (without a "
          "threshold it keeps the k x rows largest of a batch, which EXTRACT does not do)"));
    }
    // relu(pre)_j c_j > t is pre_j > t / c_j for c_j > 0; a latent that writes nothing never
    // fires.
    const at::Tensor code_norm = decoder.norm(2, {2}).sum(0);
    w.threshold = at::where(code_norm > 0, t / code_norm,
                            at::full_like(code_norm, std::numeric_limits<float>::max()));
  }
  const std::string& bytes = file.bytes();
  return LoadedWeights{
      std::move(w), absl::StrFormat("crc32c:%08x:%d", storage::Crc32c(bytes.data(), bytes.size()),
                                    static_cast<int64_t>(bytes.size()))};
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A layer of a circuit-tracer release (ReadAndCheckSae checked names, shapes and dtypes). The
// hash covers the encoder's file, config.yaml (its activation decides the encoder) and, for a
// CLT, the layer's own decoder slice.
absl::StatusOr<LoadedWeights> ReadCircuitTracerWeights(const std::string& dir,
                                                       const SaeConfig& cfg) {
  const CircuitTracerLayer& ct = *cfg.circuit_tracer;
  const std::string path = CircuitTracerEncoderFile(dir, ct.cross_layer, ct.layer);
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  const std::string suffix = ct.cross_layer ? absl::StrCat("_", ct.layer) : "";
  auto read = [&](const std::string& name, at::Tensor* out) -> absl::Status {
    const StTensorInfo* info = file.header().Find(name);
    if (info == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(*out, ReadFloatTensor(file, *info, "SAE"));
    return absl::OkStatus();
  };
  SaeWeights w;
  RETURN_IF_ERROR(read("W_enc" + suffix, &w.W_enc));
  w.W_enc = w.W_enc.t().contiguous();  // nn.Linear's [d_sae, d_in]
  RETURN_IF_ERROR(read("b_enc" + suffix, &w.b_enc));
  RETURN_IF_ERROR(read("b_dec" + suffix, &w.b_dec));
  if (cfg.architecture == SaeArchitecture::kJumpRelu) {
    RETURN_IF_ERROR(read(ct.cross_layer ? "threshold" + suffix : "activation_function.threshold",
                         &w.threshold));
    w.threshold = w.threshold.reshape({cfg.d_sae});  // stored [d_sae] or [1, d_sae]
  }
  uint32_t crc = storage::Crc32c(file.bytes().data(), file.bytes().size());
  int64_t hashed = static_cast<int64_t>(file.bytes().size());
  if (ct.cross_layer) {
    ASSIGN_OR_RETURN(w.W_dec, LoadCrossLayerDecoder(dir, ct.layer, ct.layer));
    crc = storage::Crc32cExtend(crc, w.W_dec.data_ptr(), w.W_dec.nbytes());
    hashed += static_cast<int64_t>(w.W_dec.nbytes());
  } else {
    RETURN_IF_ERROR(read("W_dec", &w.W_dec));
    if (cfg.skip) RETURN_IF_ERROR(read("W_skip", &w.W_skip));
  }
  const std::string config = ReadWholeFile(dir + "/" + kCircuitTracerConfig);
  crc = storage::Crc32cExtend(crc, config.data(), config.size());
  hashed += static_cast<int64_t>(config.size());
  return LoadedWeights{std::move(w), absl::StrFormat("crc32c:%08x:%d", crc, hashed)};
}

// A torch.save'd state dict (dictionary_learning's ae.pt, Goodfire's .pth; ReadAndCheckSae
// checked names, shapes and dtypes) in the SAELens
// form: nn.Linear weights transposed, a BatchTopK's single threshold for every latent, and a
// JumpReluAutoEncoder's decoder-norm scaling folded in (its latent j is relu(pre_j * [pre_j >
// t_j]) * n_j, n_j = |W_dec[j]|, decoded as z_j / n_j: so W_enc, b_enc and t take n_j, W_dec
// 1 / n_j; a zero direction's latent is 0 either way). A GatedAutoEncoder's likewise: W_enc,
// the gate's and the magnitude's biases take n_j (r_mag, a log-scale, does not). The hash covers
// every tensor read and the class.
absl::StatusOr<LoadedWeights> ReadStateDictWeights(const std::string& dir, const SaeConfig& cfg) {
  ASSIGN_OR_RETURN(const std::string path, FindSaeWeightsFile(dir));
  ASSIGN_OR_RETURN(const TorchStateDict state, TorchStateDict::Open(path));
  const StateDictTensors names = StateDictTensorsOf(*cfg.state_dict_class);
  uint32_t crc = 0;
  int64_t hashed = 0;
  auto read = [&](const char* name, at::Tensor* out) -> absl::Status {
    const TorchTensorInfo* t = state.Find(name);
    if (t == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(const std::string bytes, state.ReadStorage(*t));
    crc = storage::Crc32cExtend(crc, bytes.data(), bytes.size());
    hashed += static_cast<int64_t>(bytes.size());
    ASSIGN_OR_RETURN(const at::ScalarType type, StFloatType(t->dtype, t->name, "SAE"));
    at::Tensor storage = at::empty({t->storage_numel}, at::TensorOptions().dtype(type));
    std::memcpy(storage.data_ptr(), bytes.data(), bytes.size());
    *out = storage.as_strided(t->shape, t->strides, t->storage_offset).to(at::kFloat).contiguous();
    return absl::OkStatus();
  };
  SaeWeights w;
  RETURN_IF_ERROR(read(names.W_enc, &w.W_enc));
  RETURN_IF_ERROR(read(names.b_enc, &w.b_enc));
  RETURN_IF_ERROR(read(names.W_dec, &w.W_dec));
  RETURN_IF_ERROR(read(names.b_dec, &w.b_dec));
  RETURN_IF_ERROR(read(names.r_mag, &w.r_mag));
  RETURN_IF_ERROR(read(names.b_mag, &w.b_mag));
  if (names.linear) {
    w.W_enc = w.W_enc.t().contiguous();
    w.W_dec = w.W_dec.t().contiguous();
  }
  if (*names.threshold != '\0') {
    RETURN_IF_ERROR(read(names.threshold, &w.threshold));
    w.threshold = w.threshold.expand({cfg.d_sae}).contiguous();  // BatchTopK's: one for all
  }
  if (names.decoder_norm_scaled) {
    const at::Tensor norms = w.W_dec.norm(2, {1});
    const at::Tensor divisor = at::where(norms > 0, norms, at::ones_like(norms));
    w.W_enc = w.W_enc * norms;
    w.b_enc = w.b_enc * norms;  // a Gated one's gate bias: the gate's sign is unchanged
    if (w.threshold.defined()) w.threshold = w.threshold * norms;
    if (w.b_mag.defined()) w.b_mag = w.b_mag * norms;
    w.W_dec = w.W_dec / divisor.unsqueeze(1);
  }
  const std::string tag =
      absl::StrCat("state dict:", StateDictTensorsOf(*cfg.state_dict_class).module);
  crc = storage::Crc32cExtend(crc, tag.data(), tag.size());
  hashed += static_cast<int64_t>(tag.size());
  return LoadedWeights{std::move(w), absl::StrFormat("crc32c:%08x:%d", crc, hashed)};
}

}  // namespace

namespace {

// W_dec_{layer}, the decoder of a cross-layer transcoder's layer [d_sae, layers - layer, d_out]:
// `read` of the file's path, header and tensor, checked finite.
template <typename Read>
absl::StatusOr<at::Tensor> ReadCrossLayerDecoder(const std::string& dir, int layer, Read read) {
  const std::string path = CircuitTracerDecoderFile(dir, layer);
  ASSIGN_OR_RETURN(const StHeader header, ReadStHeader(path));
  const std::string name = absl::StrCat("W_dec_", layer);
  const StTensorInfo* info = header.Find(name);
  if (info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no tensor ", name));
  }
  ASSIGN_OR_RETURN(at::Tensor slice, read(path, header, *info));
  if (!at::isfinite(slice).all().item<bool>()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor ", name, " has NaN or Inf entries"));
  }
  return slice;
}

}  // namespace

absl::StatusOr<at::Tensor> LoadCrossLayerDecoder(const std::string& dir, int from_layer,
                                                 int to_layer) {
  if (to_layer < from_layer) {
    return absl::InvalidArgumentError(absl::StrCat("a cross-layer transcoder's layer ", from_layer,
                                                   " writes to layers from ", from_layer,
                                                   " on, not to ", to_layer));
  }
  return ReadCrossLayerDecoder(
      dir, from_layer,
      [&](const std::string& path, const StHeader& header, const StTensorInfo& info) {
        return ReadFloatTensorSlice(path, header, info, 1, to_layer - from_layer, "SAE");
      });
}

absl::StatusOr<at::Tensor> LoadCrossLayerDecoderRows(const std::string& dir, int layer,
                                                     const std::vector<int64_t>& latents) {
  return ReadCrossLayerDecoder(
      dir, layer, [&](const std::string& path, const StHeader& header, const StTensorInfo& info) {
        return ReadFloatTensorBlocks(path, header, info, latents, "SAE");
      });
}

absl::StatusOr<Sae> Sae::Load(const std::string& dir, const std::optional<HookName>& hook) {
  ASSIGN_OR_RETURN(SaeConfig cfg, ReadAndCheckSae(dir, hook));
  // The SAE of the weights read from `where`, checked against cfg, with their hash.
  auto create = [&cfg](LoadedWeights loaded, const std::string& where) -> absl::StatusOr<Sae> {
    // Which JumpReLU the layout means: SAELens', Gemma Scope's (1 and 2) and the state-dict
    // classes' gate a ReLU'd value, relu(pre) * (pre > t), which is latentd's
    // pre * (pre > max(t, 0)); lm-saes' and circuit-tracer's are pre * (pre > t) as written.
    at::Tensor& threshold = loaded.weights.threshold;
    if (threshold.defined() && !cfg.lm_saes && !cfg.circuit_tracer) {
      threshold = threshold.clamp_min(0);
    }
    auto sae = Create(cfg, std::move(loaded.weights));
    if (!sae.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", sae.status().message()));
    }
    sae->weight_hash_ = std::move(loaded.hash);
    return sae;
  };
  if (cfg.circuit_tracer) {
    ASSIGN_OR_RETURN(LoadedWeights loaded, ReadCircuitTracerWeights(dir, cfg));
    return create(std::move(loaded), dir);
  }
  if (cfg.state_dict_class) {
    ASSIGN_OR_RETURN(LoadedWeights loaded, ReadStateDictWeights(dir, cfg));
    return create(std::move(loaded), dir);
  }
  if (cfg.crosscoder_sources > 0) {
    const std::string path = dir + "/model.safetensors";
    ASSIGN_OR_RETURN(LoadedWeights loaded, ReadCrosscoderWeights(path, cfg));
    return create(std::move(loaded), path);
  }
  ASSIGN_OR_RETURN(std::string path, FindSaeWeightsFile(dir));
  if (absl::EndsWith(path, ".npz")) {
    ASSIGN_OR_RETURN(LoadedWeights loaded, ReadGemmaScopeWeights(path));
    return create(std::move(loaded), path);
  }
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  SaeWeights w;
  auto load = [&](std::initializer_list<const char*> names, at::Tensor* out) -> absl::Status {
    for (const char* name : names) {
      if (const StTensorInfo* info = file.header().Find(name)) {
        ASSIGN_OR_RETURN(*out, ReadFloatTensor(file, *info, "SAE"));
        // nn.Linear's [out, in] (sparsify's and lm-saes' layouts) to SAELens' [in, out].
        const std::string n = name;
        if (n == "encoder.weight" || n == "decoder.weight") *out = out->t().contiguous();
        if (n == "log_jumprelu_threshold") *out = out->exp();
        // Gemma Scope 2: x times affine_skip_connection [d_in, d_out] is x W_skip^T.
        if (n == "affine_skip_connection") *out = out->t().contiguous();
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(load({"W_enc", "encoder.weight", "w_enc"}, &w.W_enc));
  RETURN_IF_ERROR(load({"b_enc", "encoder.bias", "b_gate"}, &w.b_enc));
  RETURN_IF_ERROR(load({"W_dec", "decoder.weight", "w_dec"}, &w.W_dec));
  RETURN_IF_ERROR(load({"b_dec", "decoder.bias"}, &w.b_dec));
  RETURN_IF_ERROR(load({"threshold", "log_jumprelu_threshold"}, &w.threshold));
  RETURN_IF_ERROR(load({"r_mag"}, &w.r_mag));
  RETURN_IF_ERROR(load({"b_mag"}, &w.b_mag));
  if (cfg.skip) RETURN_IF_ERROR(load({"W_skip", "affine_skip_connection"}, &w.W_skip));
  if (cfg.finetuning_scaling_factor) {
    // SAELens decodes z * s: z's latents stay as stored, each decoder row takes its s.
    at::Tensor scale;
    RETURN_IF_ERROR(load({"finetuning_scaling_factor"}, &scale));
    w.W_dec = w.W_dec * scale.unsqueeze(1);
  }
  // CRC32C runs at memory speed (SSE4.2), so even a 1M-latent SAE's gigabytes cost little
  // next to reading them; it guards against a changed file, not against an adversary.
  const std::string& bytes = file.bytes();
  uint32_t crc = storage::Crc32c(bytes.data(), bytes.size());
  int64_t hashed = static_cast<int64_t>(bytes.size());
  if (cfg.lm_saes) {
    FoldLmSaes(*cfg.lm_saes, cfg, &w);
    // Its threshold and scales live in hyperparams.json: a changed one changes the latents.
    const std::string hyperparams = ReadWholeFile(dir + "/" + kLmSaesHyperparams);
    crc = storage::Crc32cExtend(crc, hyperparams.data(), hyperparams.size());
    hashed += static_cast<int64_t>(hyperparams.size());
  }
  // cfg.json options that change the latents or the reconstruction, so that a resumed job must
  // see the same ones (none: the hash of the file alone, as before they were read).
  std::string options;
  if (cfg.input_normalization != InputNormalization::kNone) {
    absl::StrAppend(&options,
                    "normalize_activations=", InputNormalizationName(cfg.input_normalization), ";");
  }
  if (cfg.finetuning_scaling_factor) absl::StrAppend(&options, "finetuning_scaling_factor;");
  crc = storage::Crc32cExtend(crc, options.data(), options.size());
  hashed += static_cast<int64_t>(options.size());
  return create(LoadedWeights{std::move(w), absl::StrFormat("crc32c:%08x:%d", crc, hashed)}, path);
}

Sae Sae::To(const at::Device& device) const {
  Sae copy;
  copy.cfg_ = cfg_;
  copy.w_ = w_.Map([&](const at::Tensor& t) { return t.to(device); });
  return copy;
}

namespace {

constexpr double kLayerNormEps = 1e-5;  // SAELens' (and OpenAI's) run-time layer norm

// An SAE's input normalization, row by row: x' = (x - shift) / divisor and, undone on the
// reconstruction, x_hat = x_hat' * multiplier + shift.
struct RowNormalization {
  at::Tensor shift;       // [rows, 1]; undefined: none
  at::Tensor divisor;     // [rows, 1]
  at::Tensor multiplier;  // [rows, 1]
};

RowNormalization RowNormalizationOf(InputNormalization kind, const at::Tensor& x) {
  switch (kind) {
    case InputNormalization::kNone:
      break;
    case InputNormalization::kConstantNormRescale: {
      // The smallest normal float in place of a zero norm keeps a zero row zero, not NaN.
      const at::Tensor norm =
          x.norm(2, {1}, /*keepdim=*/true).clamp_min(std::numeric_limits<float>::min());
      const at::Tensor divisor = norm.div_(std::sqrt(static_cast<double>(x.size(1))));
      return {at::Tensor(), divisor, divisor};
    }
    case InputNormalization::kLayerNorm: {
      const at::Tensor mean = x.mean({1}, /*keepdim=*/true);
      const at::Tensor sigma = at::std(x - mean, {1}, /*unbiased=*/true, /*keepdim=*/true);
      return {mean, sigma + kLayerNormEps, sigma};  // SAELens undoes it without the epsilon
    }
  }
  return {};
}

}  // namespace

at::Tensor Sae::EncoderInput(const at::Tensor& x) const {
  at::Tensor in = x;
  if (cfg_.input_normalization != InputNormalization::kNone) {
    const RowNormalization n = RowNormalizationOf(cfg_.input_normalization, x);
    in = n.shift.defined() ? (x - n.shift).div_(n.divisor) : x / n.divisor;
  }
  if (!cfg_.apply_b_dec_to_input) return in;
  return in.is_same(x) ? x - w_.b_dec : in.sub_(w_.b_dec);
}

at::Tensor Sae::PreActivations(const at::Tensor& x) const {
  return at::addmm(w_.b_enc, EncoderInput(x), w_.W_enc);
}

at::Tensor Sae::GatedActivations(const at::Tensor& x) const {
  const at::Tensor in = EncoderInput(x);
  // In place on m: one [rows, d_sae] float tensor and a bool mask, within the pass's scratch.
  at::Tensor m = at::mm(in, w_.W_enc);
  const at::Tensor gate = m > w_.b_enc.neg();  // m + b_gate > 0, without a float temporary
  m.mul_(w_.r_mag.exp()).add_(w_.b_mag).relu_();
  return m.mul_(gate);
}

at::Tensor Sae::EncodeDense(const at::Tensor& x) const {
  switch (cfg_.architecture) {
    case SaeArchitecture::kRelu:
      return at::relu(PreActivations(x));
    case SaeArchitecture::kJumpRelu: {
      const at::Tensor pre = PreActivations(x);
      return pre * (pre > w_.threshold).to(pre.scalar_type());
    }
    case SaeArchitecture::kTopK: {
      const at::Tensor pre = PreActivations(x);
      auto [vals, idx] = pre.topk(cfg_.k, /*dim=*/1);
      return at::zeros_like(pre).scatter_(1, idx, at::relu(vals));
    }
    case SaeArchitecture::kGated:
      return GatedActivations(x);
  }
  return at::Tensor();
}

SparseCodes Sae::EncodePass(const at::Tensor& x) const {
  switch (cfg_.architecture) {
    case SaeArchitecture::kTopK:
      return FixedKCodes(PreActivations(x), cfg_.k);
    case SaeArchitecture::kJumpRelu:
      return RaggedCodes(PreActivations(x), w_.threshold);
    case SaeArchitecture::kGated:  // z >= 0: its ReLU codes are its non-zeros
      return RaggedCodes(GatedActivations(x), at::Tensor());
    case SaeArchitecture::kRelu:
      break;
  }
  return RaggedCodes(PreActivations(x), at::Tensor());
}

SparseCodes Sae::EncodeSparse(const at::Tensor& x, int64_t rows_per_pass) const {
  const int64_t n = x.size(0);
  const int64_t per_pass = rows_per_pass > 0 ? rows_per_pass : EncodeRowsPerPass(cfg_.d_sae);
  if (n <= per_pass) return EncodePass(x);
  std::vector<at::Tensor> indices, values, row_counts;
  for (int64_t a = 0; a < n; a += per_pass) {
    SparseCodes part = EncodePass(x.narrow(0, a, std::min(per_pass, n - a)));
    indices.push_back(part.indices);
    values.push_back(part.values);
    if (!part.fixed_k()) row_counts.push_back(part.row_counts);
  }
  // Rows stay in order: fixed-k parts stack, ragged parts (row-major) concatenate.
  SparseCodes codes;
  codes.indices = at::cat(indices);
  codes.values = at::cat(values);
  if (!row_counts.empty()) codes.row_counts = at::cat(row_counts);
  return codes;
}

at::Tensor Sae::Decode(const at::Tensor& z) const { return at::addmm(w_.b_dec, z, w_.W_dec); }

at::Tensor Sae::Predict(const at::Tensor& x, const SparseCodes& codes) const {
  at::Tensor out = DecodeSparse(codes, x.size(0));
  if (cfg_.input_normalization != InputNormalization::kNone) {
    const RowNormalization n = RowNormalizationOf(cfg_.input_normalization, x);
    out.mul_(n.multiplier);
    if (n.shift.defined()) out.add_(n.shift);
  }
  if (w_.W_skip.defined()) out.addmm_(x, w_.W_skip.t());
  return out;
}

at::Tensor Sae::DecoderOutputScale(const at::Tensor& x) const {
  if (cfg_.input_normalization == InputNormalization::kNone) {
    return at::ones({x.size(0), 1}, x.options().dtype(at::kFloat));
  }
  return RowNormalizationOf(cfg_.input_normalization, x).multiplier;
}

at::Tensor Sae::LatentValue(const at::Tensor& x, int64_t latent) const {
  if (cfg_.architecture == SaeArchitecture::kGated) {
    const at::Tensor m = EncoderInput(x).mv(w_.W_enc.select(1, latent));
    const at::Tensor gate = (m + w_.b_enc[latent] > 0).to(m.scalar_type());
    return gate * at::relu(m * w_.r_mag[latent].exp() + w_.b_mag[latent]);
  }
  const at::Tensor pre = PreActivations(x);
  const at::Tensor p = pre.select(1, latent);
  switch (cfg_.architecture) {
    case SaeArchitecture::kRelu:
      return at::relu(p);
    case SaeArchitecture::kJumpRelu:
      return p * (p > w_.threshold[latent]).to(p.scalar_type());
    case SaeArchitecture::kTopK: {
      // Kept where it is among the row's k largest (by at::topk's pick, as EncodeDense).
      const at::Tensor kept = (std::get<1>(pre.detach().topk(cfg_.k, /*dim=*/1)) == latent).any(1);
      return at::relu(p) * kept.to(p.scalar_type());
    }
    case SaeArchitecture::kGated:
      break;
  }
  return at::Tensor();
}

int64_t Sae::weight_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : w_.Named(false)) n += t->numel() * 4;
  return n;
}

absl::Status SaveSae(const std::string& dir, const SaeWeights& weights, const SaeConfig& cfg) {
  ASSIGN_OR_RETURN(Sae sae, Sae::Create(cfg, weights));  // validates before anything is written
  mkdir(dir.c_str(), 0755);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : sae.weights().Named(cfg.architecture == SaeArchitecture::kGated)) {
    tensors.emplace_back(name, *t);
  }
  RETURN_IF_ERROR(WriteFloatTensors(dir + "/sae_weights.safetensors", tensors, {{"format", "pt"}}));
  return WriteFileAtomically(dir + "/cfg.json", SaeConfigToJson(cfg));
}

}  // namespace latentd::engine
