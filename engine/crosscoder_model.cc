#include "engine/crosscoder_model.h"

#include <ATen/ATen.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/write_file.h"

namespace latentd::engine {

using nlohmann::json;

namespace {

// dictionary_learning's CodeNormalization.CROSSCODER (the first member of an auto() enum).
constexpr int64_t kCrosscoderCodeNormalization = 1;

}  // namespace

absl::StatusOr<CrosscoderModelOptions> CrosscoderModelOptionsFromProto(
    const latentd::v1::SaeTrainConfig& config, int64_t sources, int64_t d_in, uint64_t seed) {
  const auto architecture = config.architecture();
  if (architecture == latentd::v1::TOPK || architecture == latentd::v1::JUMPRELU) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.sae.architecture: ", latentd::v1::SaeArchitecture_Name(architecture),
        " is not trained for crosscoders: dictionary_learning's crosscoders, the layout latentd "
        "saves them in, are BATCHTOPK (default) or RELU"));
  }
  auto refuse = [](absl::string_view field) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.sae.", field, ": not defined for crosscoders"));
  };
  if (config.matryoshka_widths_size() > 0) return refuse("matryoshka_widths");
  if (config.skip_connection()) return refuse("skip_connection");
  if (config.aux_k_coefficient() != 0) return refuse("aux_k_coefficient");
  if (config.cross_layers() != 0) return refuse("cross_layers (a cross-layer transcoder's)");
  if (config.apply_b_dec_to_input()) {
    return absl::InvalidArgumentError(
        "train.sae.apply_b_dec_to_input: a crosscoder's encoder reads the hooks as they are "
        "(dictionary_learning's); leave it unset");
  }
  latentd::v1::SaeTrainConfig one = config;
  if (one.architecture() == latentd::v1::SAE_ARCHITECTURE_UNSPECIFIED) {
    one.set_architecture(latentd::v1::BATCHTOPK);
  }
  // d_sae, k and the coefficient are checked as an SAE's.
  ASSIGN_OR_RETURN(const SaeModelOptions sae, SaeModelOptionsFromProto(one, d_in, seed));
  CrosscoderModelOptions options;
  options.architecture = sae.architecture;
  options.sources = sources;
  options.d_in = d_in;
  options.d_sae = sae.d_sae;
  options.k = sae.k;
  options.l1_coefficient = sae.l1_coefficient;
  options.seed = seed;
  return options;
}

std::vector<std::vector<int64_t>> CrosscoderParameterShapes(const CrosscoderModelOptions& o) {
  return {{o.RowWidth(), o.d_sae}, {o.d_sae}, {o.d_sae, o.RowWidth()}, {o.RowWidth()}};
}

CrosscoderModelImpl::CrosscoderModelImpl(const CrosscoderModelOptions& options)
    : options_(options) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const int64_t width = options.RowWidth();
  W_enc = register_parameter("W_enc", torch::zeros({width, options.d_sae}, f32));
  b_enc = register_parameter("b_enc", torch::zeros({options.d_sae}, f32));
  W_dec = register_parameter("W_dec", torch::zeros({options.d_sae, width}, f32));
  b_dec = register_parameter("b_dec", torch::zeros({width}, f32));
  scale = register_buffer("scale", torch::ones({options.sources}, f32));
  fired = register_buffer("fired", torch::zeros({options.d_sae}, f32));
  if (options.architecture == latentd::v1::BATCHTOPK) {
    batch_threshold = register_buffer("batch_threshold", torch::zeros({1}, f32));
  }
  InitWeights();
}

void CrosscoderModelImpl::InitWeights() {
  torch::NoGradGuard no_grad;
  at::Generator generator = at::detail::createCPUGenerator(SaeInitStreamSeed(options_.seed));
  const torch::Tensor w = RandomUnitRows(generator, options_.d_sae, options_.RowWidth());
  W_dec.copy_(w);
  W_enc.copy_(w.t());
  b_enc.zero_();
  b_dec.zero_();
}

torch::Tensor CrosscoderModelImpl::ColumnScales() const {
  return scale.repeat_interleave(options_.d_in);
}

torch::Tensor CrosscoderModelImpl::Scaled(const torch::Tensor& rows) const {
  return rows * ColumnScales();
}

torch::Tensor CrosscoderModelImpl::SourceWeights() const {
  const torch::Tensor inverse = scale.reciprocal();
  return inverse / inverse.mean();
}

torch::Tensor CrosscoderModelImpl::CodeNorm() const {
  return W_dec.view({options_.d_sae, options_.sources, options_.d_in})
      .norm(2, {2})
      .matmul(SourceWeights());
}

void CrosscoderModelImpl::InitFromData(const torch::Tensor& rows) {
  torch::NoGradGuard no_grad;
  for (int64_t s = 0; s < options_.sources; ++s) {
    const torch::Tensor x = rows.narrow(1, s * options_.d_in, options_.d_in).to(torch::kFloat64);
    const double mean_norm = x.norm(2, {1}).mean().item<double>();
    scale[s].fill_(mean_norm > 0 ? std::sqrt(static_cast<double>(options_.d_in)) / mean_norm : 1.0);
  }
  b_dec.copy_(Scaled(rows.to(torch::kFloat32).to(b_dec.device())).mean(0));
}

torch::Tensor CrosscoderModelImpl::PreActivation(const torch::Tensor& rows) const {
  return torch::addmm(b_enc, Scaled(rows), W_enc);
}

torch::Tensor CrosscoderModelImpl::Encode(const torch::Tensor& rows) {
  const torch::Tensor f = torch::relu(PreActivation(rows));
  if (!batch_threshold.defined()) return f;
  return f * (f * CodeNorm() > batch_threshold).to(f.scalar_type());
}

torch::Tensor CrosscoderModelImpl::Decode(const torch::Tensor& latents) const {
  return torch::addmm(b_dec, latents, W_dec) / ColumnScales();
}

SaeForward CrosscoderModelImpl::Forward(const torch::Tensor& rows) {
  SaeForward out;
  const torch::Tensor x = Scaled(rows);
  const torch::Tensor f = torch::relu(torch::addmm(b_enc, x, W_enc));
  torch::Tensor latents = f;
  if (options_.architecture == latentd::v1::BATCHTOPK) {
    // The k * rows largest f_j c_j of the batch keep their f_j; the choice itself has no gradient.
    const torch::Tensor scores = (f.detach() * CodeNorm().detach()).flatten();
    const int64_t keep = std::min(options_.k * rows.size(0), scores.numel());
    const torch::Tensor kept =
        std::get<1>(scores.topk(keep, 0, /*largest=*/true, /*sorted=*/false));
    latents = f * torch::zeros_like(scores).index_fill_(0, kept, 1).view_as(f);
  }
  out.x_hat = torch::addmm(b_dec, latents, W_dec);
  const torch::Tensor errors = (x - out.x_hat).pow(2);
  const torch::Tensor sq = errors.sum(1);
  const torch::Tensor mse = sq.mean();
  out.loss = mse;
  if (options_.architecture == latentd::v1::RELU) {
    out.loss = out.loss + options_.l1_coefficient * (f * CodeNorm()).sum(1).mean();
  }
  out.latents = latents;
  torch::NoGradGuard no_grad;
  out.mse = mse.item<double>();
  const torch::Tensor centred = x - b_dec;
  SetFitStatistics(centred, sq, &out);
  SetBlockStatistics(errors, centred, options_.sources, &out);  // each source's own FVU
  out.l0 = (latents != 0).sum(1).to(torch::kFloat64).mean().item<double>();
  return out;
}

double CrosscoderModelImpl::CalibrateBatchThreshold(const std::vector<torch::Tensor>& batches) {
  torch::NoGradGuard no_grad;
  if (batch_threshold.defined()) {
    const torch::Tensor code = CodeNorm();
    double sum = 0;
    int64_t counted = 0;
    for (const torch::Tensor& rows : batches) {
      const std::optional<double> cutoff =
          BatchTopKCutoff(torch::relu(PreActivation(rows)) * code, options_.k);
      if (!cutoff.has_value()) continue;
      sum += *cutoff;
      ++counted;
    }
    if (counted > 0) batch_threshold.fill_(sum / static_cast<double>(counted));
  }
  fired.zero_();
  double kept = 0;
  int64_t rows_seen = 0;
  for (const torch::Tensor& rows : batches) {
    const torch::Tensor firing = Encode(rows) > 0;
    fired.copy_(torch::maximum(fired, firing.any(0).to(fired.scalar_type())));
    kept += firing.sum().item<double>();
    rows_seen += rows.size(0);
  }
  return rows_seen > 0 ? kept / static_cast<double>(rows_seen) : 0.0;
}

torch::Tensor CrosscoderModelImpl::DecoderNorms() const {
  return W_dec.detach()
      .view({options_.d_sae, options_.sources, options_.d_in})
      .norm(2, {2})
      .t()
      .to(torch::kCPU, torch::kFloat64)
      .contiguous();
}

latentd::v1::CrosscoderSummary CrosscoderModelImpl::Summary() const {
  constexpr double kExclusiveShare = 0.9;
  constexpr int kHistogramBins = 20;
  constexpr int64_t kOwnListed = 256;
  torch::NoGradGuard no_grad;
  const int64_t n = options_.sources;
  const torch::Tensor norms = DecoderNorms();  // [n, d_sae]
  const torch::Tensor live = fired.to(torch::kCPU) > 0;
  const torch::Tensor shares = (norms / norms.sum(0, /*keepdim=*/true).clamp_min(1e-30))
                                   .index({torch::indexing::Slice(), live});
  latentd::v1::CrosscoderSummary summary;
  summary.set_live_latents(shares.size(1));
  const torch::Tensor live_ids = live.nonzero().view(-1);
  for (int64_t s = 0; s < n; ++s) {
    const torch::Tensor own = (shares[s] >= kExclusiveShare).nonzero().view(-1);
    summary.add_exclusive_latents(own.numel());
    // Largest share first; a stable sort keeps ties in latent order.
    const torch::Tensor order =
        std::get<1>(shares[s].index({own}).sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
    const torch::Tensor listed = live_ids.index({own.index({order})})
                                     .narrow(0, 0, std::min<int64_t>(kOwnListed, own.numel()));
    latentd::v1::LatentList* list = summary.add_own_latents();
    for (int64_t i = 0; i < listed.numel(); ++i) {
      list->add_latents(static_cast<int32_t>(listed[i].item<int64_t>()));
    }
  }
  const torch::Tensor shared = std::get<0>(shares.max(0)) <= 1.5 / static_cast<double>(n);
  summary.set_shared_latents(shared.sum().item<int64_t>());
  if (n == 2) {
    const torch::Tensor bins =
        (shares[1] * kHistogramBins).floor().clamp(0, kHistogramBins - 1).to(torch::kLong);
    const torch::Tensor counts = torch::bincount(bins, /*weights=*/{}, kHistogramBins);
    for (int b = 0; b < kHistogramBins; ++b) {
      summary.add_relative_norm_histogram(counts[b].item<int64_t>());
    }
    if (summary.shared_latents() > 0) {
      const torch::Tensor decoder = W_dec.detach()
                                        .to(torch::kCPU, torch::kFloat64)
                                        .view({options_.d_sae, n, options_.d_in})
                                        .index({live})
                                        .index({shared});
      const torch::Tensor cosine = torch::cosine_similarity(
          decoder.select(1, 0), decoder.select(1, 1), /*dim=*/1, /*eps=*/1e-12);
      summary.set_shared_decoder_cosine(cosine.mean().item<double>());
    }
  }
  return summary;
}

std::vector<torch::Tensor> CrosscoderModelImpl::ordered_parameters() const {
  return {W_enc, b_enc, W_dec, b_dec};
}

std::vector<torch::Tensor> CrosscoderModelImpl::ordered_buffers() const {
  std::vector<torch::Tensor> buffers = {scale, fired};
  if (batch_threshold.defined()) buffers.push_back(batch_threshold);
  return buffers;
}

absl::Status CrosscoderModelImpl::Save(const std::string& dir,
                                       const std::vector<CrosscoderSource>& sources) const {
  if (static_cast<int64_t>(sources.size()) != options_.sources) {
    return absl::InternalError(absl::StrCat("crosscoder of ", options_.sources,
                                            " sources saved with ", sources.size(),
                                            " source descriptions"));
  }
  mkdir(dir.c_str(), 0755);
  torch::NoGradGuard no_grad;
  const int64_t n = options_.sources, d = options_.d_in, m = options_.d_sae;
  const torch::Tensor columns = ColumnScales();
  auto cpu = [](const torch::Tensor& t) { return t.to(torch::kCPU, torch::kFloat32).contiguous(); };
  // The scales folded in (the model reads and writes the hooks in their own units), in
  // dictionary_learning's orientation.
  const torch::Tensor encoder = cpu((W_enc * columns.unsqueeze(1)).view({n, d, m}));
  const torch::Tensor decoder = cpu((W_dec / columns).view({m, n, d}).permute({1, 0, 2}));
  const torch::Tensor encoder_bias = cpu(b_enc);
  const torch::Tensor decoder_bias = cpu((b_dec / columns).view({n, d}));
  const int64_t code_normalization = kCrosscoderCodeNormalization;
  std::vector<StTensorToWrite> tensors = {
      {"encoder.weight", StDtype::kF32, {n, d, m}, encoder.data_ptr()},
      {"encoder.bias", StDtype::kF32, {m}, encoder_bias.data_ptr()},
      {"decoder.weight", StDtype::kF32, {n, m, d}, decoder.data_ptr()},
      {"decoder.bias", StDtype::kF32, {n, d}, decoder_bias.data_ptr()},
      {"code_normalization_id", StDtype::kI64, {}, &code_normalization}};
  json config = {{"activation_dim", d},
                 {"dict_size", m},
                 {"num_encoder_layers", n},
                 {"code_normalization", "CROSSCODER"}};
  const bool batch_top_k = batch_threshold.defined();
  const int32_t k = static_cast<int32_t>(options_.k);
  // The saved decoders' norm sums are c_j times mean(1 / s): the threshold scales with them.
  const float threshold =
      batch_top_k ? batch_threshold.item<float>() * scale.reciprocal().mean().item<float>() : 0.0f;
  if (batch_top_k) {
    tensors.push_back({"k", StDtype::kI32, {}, &k});
    tensors.push_back({"threshold", StDtype::kF32, {}, &threshold});
    config["k"] = k;
  }
  RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}}));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/config.json", config.dump(2) + "\n"));
  json about = {{"trained_by", "latentd"},
                {"kind", "crosscoder"},
                {"dictionary_learning_class", batch_top_k ? "BatchTopKCrossCoder" : "CrossCoder"},
                {"architecture", batch_top_k ? "batchtopk" : "relu"},
                {"sources", json::array()}};
  const torch::Tensor scales = scale.to(torch::kCPU, torch::kFloat64);
  for (int64_t s = 0; s < n; ++s) {
    about["sources"].push_back({{"hook_name", sources[s].hook_name},
                                {"model_name", sources[s].model_name},
                                {"rows_from", sources[s].rows_from},
                                {"training_scale", scales[s].item<double>()}});
  }
  return WriteFileAtomically(dir + "/latentd.json", about.dump(2) + "\n");
}

}  // namespace latentd::engine
