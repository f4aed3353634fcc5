#include "engine/sae_model.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace latentd::engine {

absl::StatusOr<SaeModelOptions> SaeModelOptionsFromProto(const latentd::v1::SaeTrainConfig& config,
                                                         int64_t d_in, uint64_t seed,
                                                         int64_t d_out) {
  SaeModelOptions options;
  options.architecture = config.architecture() == latentd::v1::SAE_ARCHITECTURE_UNSPECIFIED
                             ? latentd::v1::TOPK
                             : config.architecture();
  if (!latentd::v1::SaeArchitecture_IsValid(options.architecture)) {
    return absl::InvalidArgumentError(absl::StrCat("train.sae.architecture: unknown architecture ",
                                                   static_cast<int>(config.architecture())));
  }
  if (d_in <= 0) return absl::InvalidArgumentError(absl::StrCat("train.sae: d_in is ", d_in));
  if (config.d_sae() <= 0 || config.d_sae() > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.sae.d_sae: must be in [1, 16777216], got ", config.d_sae()));
  }
  options.d_in = d_in;
  options.d_sae = config.d_sae();
  options.k = config.k() == 0 ? std::min<int64_t>(32, options.d_sae) : config.k();
  if ((options.architecture == latentd::v1::TOPK ||
       options.architecture == latentd::v1::BATCHTOPK) &&
      (options.k < 1 || options.k > options.d_sae)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.sae.k: must be in [1, d_sae = ", options.d_sae, "], got ", config.k()));
  }
  if (config.l1_coefficient() < 0 || !std::isfinite(config.l1_coefficient())) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.sae.l1_coefficient: must be >= 0, got ", config.l1_coefficient()));
  }
  if (config.jumprelu_threshold() < 0 || config.jumprelu_bandwidth() < 0) {
    return absl::InvalidArgumentError(
        "train.sae.jumprelu_threshold / jumprelu_bandwidth: must be >= 0");
  }
  if (config.aux_k() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.sae.aux_k: must be >= 0 (0: d_in / 2), got ", config.aux_k()));
  }
  if (config.aux_k_coefficient() < 0 || !std::isfinite(config.aux_k_coefficient())) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.sae.aux_k_coefficient: must be >= 0 (0: no AuxK), got ",
                     config.aux_k_coefficient()));
  }
  for (int i = 0; i < config.matryoshka_widths_size(); ++i) {
    const int64_t w = config.matryoshka_widths(i);
    if (w < 1 || w > options.d_sae) {
      return absl::InvalidArgumentError(absl::StrCat("train.sae.matryoshka_widths[", i, "]: ", w,
                                                     " is not in [1, d_sae = ", options.d_sae,
                                                     "]"));
    }
    if (!options.matryoshka_widths.empty() && w <= options.matryoshka_widths.back()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.sae.matryoshka_widths[", i, "]: ", w, " does not exceed the width before it (",
          options.matryoshka_widths.back(), "); the widths must increase strictly"));
    }
    options.matryoshka_widths.push_back(w);
  }
  if (!options.matryoshka_widths.empty() && options.matryoshka_widths.back() != options.d_sae) {
    options.matryoshka_widths.push_back(options.d_sae);  // the whole SAE is the last level
  }
  options.aux_k = config.aux_k() > 0 ? config.aux_k() : std::max<int64_t>(1, d_in / 2);
  options.aux_k_coefficient = config.aux_k_coefficient();
  if (config.l1_coefficient() > 0) options.l1_coefficient = config.l1_coefficient();
  if (config.jumprelu_threshold() > 0) options.jumprelu_threshold = config.jumprelu_threshold();
  if (config.jumprelu_bandwidth() > 0) options.jumprelu_bandwidth = config.jumprelu_bandwidth();
  // proto3 cannot tell an unset bool from false, so the default (true) is switched off through
  // disable_apply_b_dec_to_input, like disable_error_feedback.
  options.apply_b_dec_to_input = !config.disable_apply_b_dec_to_input() && d_out <= 0;
  options.d_out = std::max<int64_t>(d_out, 0);
  if (config.skip_connection() && options.d_out == 0) {
    return absl::InvalidArgumentError(
        "train.sae.skip_connection: a transcoder's (train.target_dataset_id); an SAE's input is "
        "its target, which a skip connection would copy");
  }
  options.skip = config.skip_connection();
  options.seed = seed;
  return options;
}

SaeModelImpl::SaeModelImpl(const SaeModelOptions& options) : options_(options) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  W_enc = register_parameter("W_enc", torch::zeros({options.d_in, options.d_sae}, f32));
  b_enc = register_parameter("b_enc", torch::zeros({options.d_sae}, f32));
  W_dec = register_parameter("W_dec", torch::zeros({options.d_sae, options.OutWidth()}, f32));
  b_dec = register_parameter("b_dec", torch::zeros({options.OutWidth()}, f32));
  if (options.architecture == latentd::v1::JUMPRELU) {
    log_threshold = register_parameter(
        "log_threshold", torch::full({options.d_sae}, std::log(options.jumprelu_threshold), f32));
  }
  if (options.architecture == latentd::v1::BATCHTOPK) {
    batch_threshold = register_buffer("batch_threshold", torch::zeros({}, f32));
  }
  if (options.skip) {
    W_skip = register_parameter("W_skip", torch::zeros({options.OutWidth(), options.d_in}, f32));
  }
  InitWeights();
}

uint64_t SaeInitStreamSeed(uint64_t seed) {
  // splitmix64 of the seed and a constant: a different stream from every plain seed, so that no
  // other seeded component (the reference model seeds its generator with its own seed) shares it.
  uint64_t z = seed ^ 0x5ae1a7e5eed0f5aeULL;
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

torch::Tensor RandomUnitRows(at::Generator& generator, int64_t rows, int64_t width) {
  torch::Tensor w = at::randn({rows, width}, generator, torch::kFloat32);
  return w / w.norm(2, {1}, true).clamp_min(1e-12);
}

void SaeModelImpl::InitWeights() {
  torch::NoGradGuard no_grad;
  at::Generator generator = at::detail::createCPUGenerator(SaeInitStreamSeed(options_.seed));
  auto unit_rows = [&](int64_t width) { return RandomUnitRows(generator, options_.d_sae, width); };
  const torch::Tensor w = unit_rows(options_.OutWidth());
  W_dec.copy_(w);
  W_enc.copy_(options_.d_out > 0 ? unit_rows(options_.d_in).t() : w.t());
  b_enc.zero_();
  b_dec.zero_();
  if (W_skip.defined()) W_skip.zero_();
}

void SaeModelImpl::InitDecoderBiasFromData(const torch::Tensor& rows) {
  torch::NoGradGuard no_grad;
  b_dec.copy_(rows.to(torch::kFloat32).mean(0).to(b_dec.device()));
}

void SaeModelImpl::ScaleEncoderToTarget(const torch::Tensor& x, const torch::Tensor& y) {
  torch::NoGradGuard no_grad;
  const torch::Tensor yf = y.to(torch::kFloat64);
  const double spread = (yf - yf.mean(0)).norm(2, {1}).mean().item<double>();
  const double size = x.to(torch::kFloat64).norm(2, {1}).mean().item<double>();
  if (spread > 0 && size > 0) W_enc.mul_(spread / size);
}

torch::Tensor SaeModelImpl::PreActivation(const torch::Tensor& x) {
  // A transcoder's b_dec is on its output side (d_out wide): never subtracted from x.
  torch::Tensor input = options_.apply_b_dec_to_input && options_.d_out == 0 ? x - b_dec : x;
  return torch::addmm(b_enc, input, W_enc);
}

torch::Tensor JumpReluStep(const torch::Tensor& pre, const torch::Tensor& log_threshold,
                           double bandwidth) {
  torch::Tensor threshold = log_threshold.exp();
  torch::Tensor above = (pre > threshold).to(pre.scalar_type()).detach();
  torch::Tensor kernel =
      ((pre.detach() - threshold.detach()).abs() < bandwidth / 2).to(pre.scalar_type()) / bandwidth;
  return above + (threshold.detach() - threshold) * kernel;
}

torch::Tensor BatchTopKActivation(const torch::Tensor& pre, int64_t k) {
  const torch::Tensor acts = torch::relu(pre);
  const int64_t keep = std::min(k * pre.size(0), acts.numel());
  auto [values, indices] = acts.flatten().topk(keep, /*dim=*/0, /*largest=*/true, /*sorted=*/false);
  return torch::zeros_like(acts).flatten().scatter(0, indices, values).view_as(acts);
}

std::optional<double> BatchTopKCutoff(const torch::Tensor& pre, int64_t k) {
  const torch::Tensor acts = torch::relu(pre).flatten();
  const int64_t keep = std::min(k * pre.size(0), acts.numel());
  const torch::Tensor kept = std::get<0>(acts.topk(keep, 0, /*largest=*/true, /*sorted=*/false));
  const torch::Tensor positive = kept.masked_select(kept > 0);
  if (positive.numel() == 0) return std::nullopt;
  return positive.min().item<double>();
}

double SetFitStatistics(const torch::Tensor& centred, const torch::Tensor& row_squared_error,
                        SaeForward* out) {
  torch::NoGradGuard no_grad;
  // The rows' spread about their mean from their sums about b_dec, which the train loop adds
  // over ranks (TrainableModel::Output) for the FVU of the whole batch.
  out->centred_squares = centred.pow(2).sum().item<double>();
  out->centred_sum = centred.sum(0);
  const double variance =
      out->centred_squares - out->centred_sum.to(torch::kFloat64).pow(2).sum().item<double>() /
                                 static_cast<double>(centred.size(0));
  out->squared_error = row_squared_error.sum().item<double>();
  out->fvu = variance > 0 ? out->squared_error / variance : 0.0;
  return variance;
}

void SetBlockStatistics(const torch::Tensor& squared_errors, const torch::Tensor& centred,
                        int64_t blocks, SaeForward* out) {
  torch::NoGradGuard no_grad;
  auto by_block = [&](const torch::Tensor& t) -> torch::Tensor {
    return t.reshape({t.size(0), blocks, -1}).sum(std::vector<int64_t>{0, 2});
  };
  const torch::Tensor sums = torch::stack({by_block(squared_errors), by_block(centred.pow(2))})
                                 .to(torch::kCPU, torch::kFloat64);
  const auto per_block = sums.accessor<double, 2>();
  for (int64_t b = 0; b < blocks; ++b) {
    out->block_squared_error.push_back(per_block[0][b]);
    out->block_centred_squares.push_back(per_block[1][b]);
  }
}

torch::Tensor SaeModelImpl::JumpStep(const torch::Tensor& pre) {
  return JumpReluStep(pre, log_threshold, options_.jumprelu_bandwidth);
}

torch::Tensor SaeModelImpl::BatchTopK(const torch::Tensor& pre) const {
  return BatchTopKActivation(pre, options_.k);
}

void SaeModelImpl::CalibrateBatchThreshold(const std::vector<torch::Tensor>& batches) {
  if (!batch_threshold.defined()) return;
  torch::NoGradGuard no_grad;
  double sum = 0;
  int64_t counted = 0;
  for (const torch::Tensor& x : batches) {
    const std::optional<double> cutoff = BatchTopKCutoff(PreActivation(x), options_.k);
    if (!cutoff.has_value()) continue;
    sum += *cutoff;
    ++counted;
  }
  if (counted > 0) batch_threshold.fill_(sum / static_cast<double>(counted));
}

torch::Tensor SaeModelImpl::Activate(const torch::Tensor& pre) {
  switch (options_.architecture) {
    case latentd::v1::RELU:
      return torch::relu(pre);
    case latentd::v1::JUMPRELU:
      return pre * JumpStep(pre);
    case latentd::v1::BATCHTOPK:
      return pre * (pre > batch_threshold).to(pre.scalar_type());
    default: {
      auto top = torch::topk(pre, options_.k, /*dim=*/1);
      return torch::zeros_like(pre).scatter(1, std::get<1>(top), torch::relu(std::get<0>(top)));
    }
  }
}

torch::Tensor SaeModelImpl::Encode(const torch::Tensor& x) { return Activate(PreActivation(x)); }

SaeForward SaeModelImpl::Forward(const torch::Tensor& x, const torch::Tensor& dead,
                                 const torch::Tensor& target) {
  SaeForward out;
  const torch::Tensor& y = target.defined() ? target : x;  // what the decoder is to give
  torch::Tensor pre = PreActivation(x);
  torch::Tensor step;
  if (options_.architecture == latentd::v1::JUMPRELU) {
    step = JumpStep(pre);
    out.latents = pre * step;
  } else if (options_.architecture == latentd::v1::BATCHTOPK) {
    out.latents = BatchTopK(pre);
  } else {
    out.latents = Activate(pre);
  }
  // Matryoshka: the inner levels' squared errors, each x_hat growing by the next slice of latents.
  std::vector<torch::Tensor> prefix_sq;
  // What the latents add to: b_dec, and a skip transcoder's linear map of the input.
  const torch::Tensor base =
      W_skip.defined() ? torch::addmm(b_dec, x, W_skip.t()) : torch::Tensor();
  if (options_.matryoshka_widths.size() > 1) {
    torch::Tensor x_hat = base.defined() ? base : b_dec.unsqueeze(0);
    int64_t begin = 0;
    for (const int64_t end : options_.matryoshka_widths) {
      x_hat = x_hat + out.latents.slice(1, begin, end).matmul(W_dec.slice(0, begin, end));
      if (end < options_.d_sae) prefix_sq.push_back((y - x_hat).pow(2).sum(1));
      begin = end;
    }
    out.x_hat = x_hat;
  } else {
    out.x_hat = base.defined() ? base + out.latents.matmul(W_dec) : Decode(out.latents);
  }
  torch::Tensor sq = (y - out.x_hat).pow(2).sum(1);
  torch::Tensor mse = sq.mean();
  torch::Tensor loss = mse;
  for (const torch::Tensor& level : prefix_sq) loss = loss + level.mean();
  if (options_.architecture == latentd::v1::RELU) {
    loss = loss + options_.l1_coefficient *
                      (out.latents.abs() * W_dec.norm(2, {1}).unsqueeze(0)).sum(1).mean();
  } else if (options_.architecture == latentd::v1::JUMPRELU) {
    loss = loss + options_.l1_coefficient * step.sum(1).mean();
  }
  torch::Tensor aux;
  if (has_aux_k() && options_.aux_k_coefficient > 0 && dead.defined()) {
    const int64_t num_dead = dead.sum().item<int64_t>();
    if (num_dead > 0) {
      const int64_t aux_k =
          options_.aux_k > 0 ? options_.aux_k : std::max<int64_t>(1, options_.d_in / 2);
      const int64_t k = std::min(aux_k, num_dead);
      torch::Tensor masked =
          pre.masked_fill(dead.logical_not().unsqueeze(0), -std::numeric_limits<float>::infinity());
      auto [values, indices] = masked.topk(k, /*dim=*/1, /*largest=*/true, /*sorted=*/false);
      // Negative pre-activations give 0 (k <= |D|, so no -inf is taken).
      torch::Tensor acts = torch::zeros_like(pre).scatter(1, indices, torch::relu(values));
      torch::Tensor e_hat = acts.matmul(W_dec);
      torch::Tensor residual = (y - out.x_hat).detach();
      aux = (residual - e_hat).pow(2).sum(1).mean();
      const double scale = std::min(1.0, static_cast<double>(num_dead) / aux_k);
      loss = loss + options_.aux_k_coefficient * scale * aux;
    }
  }
  out.loss = loss;
  torch::NoGradGuard no_grad;
  out.mse = mse.item<double>();
  if (aux.defined()) out.aux_k_loss = aux.item<double>();
  const double variance = SetFitStatistics(y - b_dec.detach(), sq, &out);
  for (const torch::Tensor& level : prefix_sq) {
    out.prefix_squared_error.push_back(level.sum().item<double>());
    out.prefix_fvu.push_back(variance > 0 ? out.prefix_squared_error.back() / variance : 0.0);
  }
  out.l0 = (out.latents != 0).sum(1).to(torch::kFloat64).mean().item<double>();
  return out;
}

void RemoveRadialGradient(const torch::Tensor& weight) {
  if (!weight.grad().defined()) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor rows = weight.view({weight.size(0), -1});
  torch::Tensor grad = weight.mutable_grad().view({weight.size(0), -1});
  const torch::Tensor unit = rows / rows.norm(2, {1}, true).clamp_min(1e-12);
  grad.sub_((grad * unit).sum(1, true) * unit);
}

void NormalizeRows(const torch::Tensor& weight) {
  torch::NoGradGuard no_grad;
  torch::Tensor rows = weight.view({weight.size(0), -1});
  rows.div_(rows.norm(2, {1}, true).clamp_min(1e-12));
}

void SaeModelImpl::RemoveParallelDecoderGrad() {
  if (options_.architecture != latentd::v1::RELU) RemoveRadialGradient(W_dec);
}

void SaeModelImpl::NormalizeDecoder() {
  if (options_.architecture != latentd::v1::RELU) NormalizeRows(W_dec);
}

std::vector<torch::Tensor> SaeModelImpl::ordered_parameters() const {
  std::vector<torch::Tensor> params = {W_enc, b_enc, W_dec, b_dec};
  if (log_threshold.defined()) params.push_back(log_threshold);
  if (W_skip.defined()) params.push_back(W_skip);  // last: older checkpoints keep their order
  return params;
}

std::vector<torch::Tensor> SaeModelImpl::ordered_buffers() const {
  if (batch_threshold.defined()) return {batch_threshold};
  return {};
}

std::map<std::string, torch::Tensor> SaeModelImpl::ExportWeights() const {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> weights;
  weights["W_enc"] = W_enc.detach().to(torch::kCPU).contiguous().clone();
  weights["b_enc"] = b_enc.detach().to(torch::kCPU).contiguous().clone();
  weights["W_dec"] = W_dec.detach().to(torch::kCPU).contiguous().clone();
  weights["b_dec"] = b_dec.detach().to(torch::kCPU).contiguous().clone();
  if (log_threshold.defined()) {
    weights["threshold"] = log_threshold.detach().exp().to(torch::kCPU).contiguous();
  }
  if (W_skip.defined()) weights["W_skip"] = W_skip.detach().to(torch::kCPU).contiguous().clone();
  if (batch_threshold.defined()) {
    weights["threshold"] =
        batch_threshold.detach().to(torch::kCPU).expand({options_.d_sae}).contiguous();
  }
  return weights;
}

}  // namespace latentd::engine
