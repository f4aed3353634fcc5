#include "engine/clt_model.h"

#include <ATen/ATen.h>
#include <sys/stat.h>

#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/write_file.h"
#include "engine/circuit_tracer.h"
#include "engine/safetensors_tensor.h"

namespace latentd::engine {

absl::StatusOr<CltModelOptions> CltModelOptionsFromProto(const latentd::v1::SaeTrainConfig& config,
                                                         int64_t d_in, int64_t d_out,
                                                         uint64_t seed) {
  if (config.cross_layers() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.sae.cross_layers: a cross-layer transcoder spans >= 1 blocks, got ",
                     config.cross_layers()));
  }
  if (d_out <= 0) {
    return absl::InvalidArgumentError(
        "train.sae.cross_layers: a cross-layer transcoder predicts train.target_hook_name");
  }
  if (config.architecture() == latentd::v1::TOPK) {
    return absl::InvalidArgumentError(
        "train.sae.architecture: TOPK is not trained for cross-layer transcoders: circuit-tracer "
        "reads a TopK CLT as keeping the k largest pre-activations even when negative, so "
        "EXTRACT could not run it as trained; BATCHTOPK (saved as JumpReLU thresholds), JUMPRELU "
        "or RELU");
  }
  if (config.matryoshka_widths_size() > 0) {
    return absl::InvalidArgumentError(
        "train.sae.matryoshka_widths: not defined for cross-layer transcoders");
  }
  if (config.skip_connection()) {
    return absl::InvalidArgumentError(
        "train.sae.skip_connection: circuit-tracer's cross-layer transcoders have none");
  }
  if (config.aux_k_coefficient() != 0) {
    return absl::InvalidArgumentError(
        "train.sae.aux_k_coefficient: AuxK is a TopK SAE's; not defined for cross-layer "
        "transcoders");
  }
  latentd::v1::SaeTrainConfig per_layer = config;
  if (per_layer.architecture() == latentd::v1::SAE_ARCHITECTURE_UNSPECIFIED) {
    per_layer.set_architecture(latentd::v1::BATCHTOPK);
  }
  // One layer's checks (d_sae, k, coefficients) are a transcoder's.
  ASSIGN_OR_RETURN(const SaeModelOptions layer,
                   SaeModelOptionsFromProto(per_layer, d_in, seed, d_out));
  CltModelOptions options;
  options.architecture = layer.architecture;
  options.layers = config.cross_layers();
  options.d_in = d_in;
  options.d_sae = layer.d_sae;
  options.d_out = d_out;
  options.k = layer.k;
  options.l1_coefficient = layer.l1_coefficient;
  options.jumprelu_threshold = layer.jumprelu_threshold;
  options.jumprelu_bandwidth = layer.jumprelu_bandwidth;
  options.seed = seed;
  return options;
}

std::vector<std::vector<int64_t>> CltParameterShapes(const CltModelOptions& o) {
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t l = 0; l < o.layers; ++l) {
    shapes.push_back({o.d_in, o.d_sae});
    shapes.push_back({o.d_sae});
    shapes.push_back({o.d_sae, o.layers - l, o.d_out});
    shapes.push_back({o.d_out});
    if (o.architecture == latentd::v1::JUMPRELU) shapes.push_back({o.d_sae});
  }
  return shapes;
}

CltModelImpl::CltModelImpl(const CltModelOptions& options) : options_(options) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  for (int64_t l = 0; l < options.layers; ++l) {
    const std::string suffix = absl::StrCat("_", l);
    W_enc.push_back(
        register_parameter("W_enc" + suffix, torch::zeros({options.d_in, options.d_sae}, f32)));
    b_enc.push_back(register_parameter("b_enc" + suffix, torch::zeros({options.d_sae}, f32)));
    W_dec.push_back(register_parameter(
        "W_dec" + suffix, torch::zeros({options.d_sae, options.layers - l, options.d_out}, f32)));
    b_dec.push_back(register_parameter("b_dec" + suffix, torch::zeros({options.d_out}, f32)));
    if (options.architecture == latentd::v1::JUMPRELU) {
      log_threshold.push_back(register_parameter(
          "log_threshold" + suffix,
          torch::full({options.d_sae}, std::log(options.jumprelu_threshold), f32)));
    }
  }
  input_scale = register_buffer("input_scale", torch::ones({options.layers}, f32));
  output_scale = register_buffer("output_scale", torch::ones({options.layers}, f32));
  if (options.architecture == latentd::v1::BATCHTOPK) {
    batch_threshold = register_buffer("batch_threshold", torch::zeros({options.layers}, f32));
  }
  InitWeights();
}

void CltModelImpl::InitWeights() {
  torch::NoGradGuard no_grad;
  at::Generator generator = at::detail::createCPUGenerator(SaeInitStreamSeed(options_.seed));
  auto unit_rows = [&](int64_t width) { return RandomUnitRows(generator, options_.d_sae, width); };
  for (int64_t l = 0; l < options_.layers; ++l) {
    W_dec[l].copy_(unit_rows(W_dec[l].numel() / options_.d_sae).view_as(W_dec[l]));
    W_enc[l].copy_(unit_rows(options_.d_in).t());
    b_enc[l].zero_();
    b_dec[l].zero_();
  }
}

torch::Tensor CltModelImpl::Input(const torch::Tensor& rows, int64_t layer) const {
  return rows.narrow(1, layer * options_.d_in, options_.d_in) * input_scale[layer];
}

torch::Tensor CltModelImpl::Target(const torch::Tensor& rows, int64_t layer) const {
  return rows.narrow(1, options_.layers * options_.d_in + layer * options_.d_out, options_.d_out) *
         output_scale[layer];
}

torch::Tensor CltModelImpl::OutputScales() const {
  return output_scale.repeat_interleave(options_.d_out);
}

namespace {

// The factor that brings the rows' mean norm to sqrt(width); 1 for rows of norm 0.
double UnitRmsScale(const torch::Tensor& rows) {
  const double mean_norm = rows.to(torch::kFloat64).norm(2, {1}).mean().item<double>();
  return mean_norm > 0 ? std::sqrt(static_cast<double>(rows.size(1))) / mean_norm : 1.0;
}

}  // namespace

void CltModelImpl::InitFromData(const torch::Tensor& rows) {
  torch::NoGradGuard no_grad;
  for (int64_t l = 0; l < options_.layers; ++l) {
    // The hooks as they come (Input and Target apply the scales being set here).
    torch::Tensor x = rows.narrow(1, l * options_.d_in, options_.d_in).to(torch::kFloat64);
    torch::Tensor y =
        rows.narrow(1, options_.layers * options_.d_in + l * options_.d_out, options_.d_out)
            .to(torch::kFloat64);
    const double in_scale = UnitRmsScale(x), out_scale = UnitRmsScale(y);
    input_scale[l].fill_(in_scale);
    output_scale[l].fill_(out_scale);
    x = x * in_scale;
    y = y * out_scale;
    b_dec[l].copy_(y.mean(0).to(torch::kFloat32).to(b_dec[l].device()));
    const double spread = (y - y.mean(0)).norm(2, {1}).mean().item<double>();
    const double size = x.norm(2, {1}).mean().item<double>();
    if (spread > 0 && size > 0) W_enc[l].mul_(spread / size);
  }
}

torch::Tensor CltModelImpl::PreActivation(const torch::Tensor& rows, int64_t layer) const {
  return torch::addmm(b_enc[layer], Input(rows, layer), W_enc[layer]);
}

torch::Tensor CltModelImpl::TrainingLatents(const torch::Tensor& pre, int64_t layer,
                                            torch::Tensor* step) {
  switch (options_.architecture) {
    case latentd::v1::RELU:
      return torch::relu(pre);
    case latentd::v1::JUMPRELU:
      *step = JumpReluStep(pre, log_threshold[layer], options_.jumprelu_bandwidth);
      return pre * *step;
    default:
      return BatchTopKActivation(pre, options_.k);
  }
}

std::vector<torch::Tensor> CltModelImpl::Encode(const torch::Tensor& rows) {
  std::vector<torch::Tensor> latents;
  for (int64_t l = 0; l < options_.layers; ++l) {
    const torch::Tensor pre = PreActivation(rows, l);
    switch (options_.architecture) {
      case latentd::v1::RELU:
        latents.push_back(torch::relu(pre));
        break;
      case latentd::v1::JUMPRELU:
        latents.push_back(pre * (pre > log_threshold[l].exp()).to(pre.scalar_type()));
        break;
      default:
        latents.push_back(pre * (pre > batch_threshold[l]).to(pre.scalar_type()));
    }
  }
  return latents;
}

torch::Tensor CltModelImpl::Decode(const std::vector<torch::Tensor>& latents) const {
  return ScaledPrediction(latents) / OutputScales();
}

torch::Tensor CltModelImpl::ScaledPrediction(const std::vector<torch::Tensor>& latents) const {
  // Layer l's latents write to blocks l..layers-1: their product with the flattened decoder
  // covers the last (layers - l) * d_out columns of the prediction.
  torch::Tensor prediction = torch::cat(b_dec).unsqueeze(0);
  for (int64_t l = 0; l < options_.layers; ++l) {
    const torch::Tensor written = latents[l].matmul(W_dec[l].view({options_.d_sae, -1}));
    prediction = prediction + torch::constant_pad_nd(written, {l * options_.d_out, 0});
  }
  return prediction;
}

SaeForward CltModelImpl::Forward(const torch::Tensor& rows) {
  SaeForward out;
  std::vector<torch::Tensor> latents;
  torch::Tensor sparsity;
  for (int64_t l = 0; l < options_.layers; ++l) {
    torch::Tensor step;
    const torch::Tensor pre = PreActivation(rows, l);
    latents.push_back(TrainingLatents(pre, l, &step));
    torch::Tensor term;
    if (options_.architecture == latentd::v1::RELU) {
      const torch::Tensor norms = W_dec[l].view({options_.d_sae, -1}).norm(2, {1});
      term = (latents.back() * norms.unsqueeze(0)).sum(1).mean();
    } else if (options_.architecture == latentd::v1::JUMPRELU) {
      term = step.sum(1).mean();
    }
    if (term.defined()) sparsity = sparsity.defined() ? sparsity + term : term;
  }
  // Every layer's target side by side, in the order of the prediction's columns.
  const torch::Tensor y =
      rows.narrow(1, options_.layers * options_.d_in, options_.layers * options_.d_out) *
      OutputScales();
  out.x_hat = ScaledPrediction(latents);
  const torch::Tensor errors = (y - out.x_hat).pow(2);
  const torch::Tensor sq = errors.sum(1);
  const torch::Tensor mse = sq.mean();
  out.loss = sparsity.defined() ? mse + options_.l1_coefficient * sparsity : mse;
  out.latents = torch::cat(latents, 1);
  torch::NoGradGuard no_grad;
  out.mse = mse.item<double>();
  const torch::Tensor centred = y - torch::cat(b_dec);
  SetFitStatistics(centred, sq, &out);
  // Each block's share, for its own FVU (TrainableModel::fvu_blocks).
  SetBlockStatistics(errors, centred, options_.layers, &out);
  out.l0 = (out.latents != 0).sum(1).to(torch::kFloat64).mean().item<double>() /
           static_cast<double>(options_.layers);
  return out;
}

void CltModelImpl::CalibrateBatchThresholds(const std::vector<torch::Tensor>& batches) {
  if (!batch_threshold.defined()) return;
  torch::NoGradGuard no_grad;
  for (int64_t l = 0; l < options_.layers; ++l) {
    double sum = 0;
    int64_t counted = 0;
    for (const torch::Tensor& rows : batches) {
      const std::optional<double> cutoff = BatchTopKCutoff(PreActivation(rows, l), options_.k);
      if (!cutoff.has_value()) continue;
      sum += *cutoff;
      ++counted;
    }
    if (counted > 0) batch_threshold[l].fill_(sum / static_cast<double>(counted));
  }
}

void CltModelImpl::RemoveParallelDecoderGrad() {
  if (options_.architecture == latentd::v1::RELU) return;
  for (const torch::Tensor& w : W_dec) RemoveRadialGradient(w);
}

void CltModelImpl::NormalizeDecoder() {
  if (options_.architecture == latentd::v1::RELU) return;
  for (const torch::Tensor& w : W_dec) NormalizeRows(w);
}

std::vector<torch::Tensor> CltModelImpl::ordered_parameters() const {
  std::vector<torch::Tensor> params;
  for (int64_t l = 0; l < options_.layers; ++l) {
    params.insert(params.end(), {W_enc[l], b_enc[l], W_dec[l], b_dec[l]});
    if (!log_threshold.empty()) params.push_back(log_threshold[l]);
  }
  return params;
}

std::vector<torch::Tensor> CltModelImpl::ordered_buffers() const {
  std::vector<torch::Tensor> buffers = {input_scale, output_scale};
  if (batch_threshold.defined()) buffers.push_back(batch_threshold);
  return buffers;
}

absl::Status CltModelImpl::Save(const std::string& dir, const CltProvenance& provenance) const {
  mkdir(dir.c_str(), 0755);
  torch::NoGradGuard no_grad;
  for (int64_t l = 0; l < options_.layers; ++l) {
    const std::string suffix = absl::StrCat("_", l);
    torch::Tensor threshold;
    if (!log_threshold.empty()) threshold = log_threshold[l].exp();
    if (batch_threshold.defined()) threshold = batch_threshold[l].expand({options_.d_sae});
    // The scales folded in: the encoder reads x_l itself, the decoders into block L and b_dec_L
    // give y_L itself. circuit-tracer's encoder is an nn.Linear's weight: [d_sae, d_in].
    const torch::Tensor into =
        output_scale.narrow(0, l, options_.layers - l).view({1, options_.layers - l, 1});
    RETURN_IF_ERROR(WriteFloatTensors(CircuitTracerEncoderFile(dir, /*cross_layer=*/true, l),
                                      {{"W_enc" + suffix, (W_enc[l] * input_scale[l]).t()},
                                       {"b_enc" + suffix, b_enc[l]},
                                       {"b_dec" + suffix, b_dec[l] / output_scale[l]},
                                       {"threshold" + suffix, threshold}},
                                      {{"format", "pt"}}));
    RETURN_IF_ERROR(WriteFloatTensors(CircuitTracerDecoderFile(dir, l),
                                      {{"W_dec" + suffix, W_dec[l] / into}}, {{"format", "pt"}}));
  }
  // config.yaml names the hooks within a block and the activation (thresholds or plain ReLU).
  std::string yaml = absl::StrCat(
      "model_kind: cross_layer_transcoder\n", "feature_input_hook: ", provenance.input_hook, "\n",
      "feature_output_hook: ", provenance.output_hook, "\n",
      "activation: ", options_.architecture == latentd::v1::RELU ? "relu" : "jumprelu", "\n");
  if (!provenance.model_name.empty() &&
      provenance.model_name.find_first_of("\"\n") == std::string::npos) {
    absl::StrAppend(&yaml, "model_name: \"", provenance.model_name, "\"\n");
  }
  absl::StrAppend(&yaml, "# trained by latentd: ", options_.layers, " layers, d_sae ",
                  options_.d_sae, " each\n");
  return WriteFileAtomically(absl::StrCat(dir, "/", kCircuitTracerConfig), yaml);
}

}  // namespace latentd::engine
