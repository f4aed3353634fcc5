#include "engine/sae.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/safetensors.h"
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

absl::StatusOr<at::Tensor> ToTensor(const SafetensorsFile& file, const StTensorInfo& info) {
  at::ScalarType type;
  switch (info.dtype) {
    case StDtype::kF32:
      type = at::kFloat;
      break;
    case StDtype::kF16:
      type = at::kHalf;
      break;
    case StDtype::kBF16:
      type = at::kBFloat16;
      break;
    case StDtype::kF64:
      type = at::kDouble;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("SAE tensor ", info.name, " has dtype ", StDtypeName(info.dtype)));
  }
  at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(type));
  std::memcpy(t.data_ptr(), file.data(info), info.end - info.begin);
  return t.to(at::kFloat);
}

}  // namespace

absl::StatusOr<Sae> Sae::Create(const SaeConfig& cfg, SaeWeights w) {
  RETURN_IF_ERROR(CheckShape(w.W_enc, "W_enc", {cfg.d_in, cfg.d_sae}));
  RETURN_IF_ERROR(CheckShape(w.b_enc, "b_enc", {cfg.d_sae}));
  RETURN_IF_ERROR(CheckShape(w.W_dec, "W_dec", {cfg.d_sae, cfg.d_in}));
  RETURN_IF_ERROR(CheckShape(w.b_dec, "b_dec", {cfg.d_in}));
  if (cfg.architecture == SaeArchitecture::kJumpRelu) {
    RETURN_IF_ERROR(CheckShape(w.threshold, "threshold", {cfg.d_sae}));
  }
  if (cfg.architecture == SaeArchitecture::kTopK && (cfg.k <= 0 || cfg.k > cfg.d_sae)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SAE k = ", cfg.k, " out of [1, ", cfg.d_sae, "]"));
  }
  Sae sae;
  sae.cfg_ = cfg;
  auto f = [](const at::Tensor& t) { return t.defined() ? t.to(at::kFloat).contiguous() : t; };
  sae.w_ = {f(w.W_enc), f(w.b_enc), f(w.W_dec), f(w.b_dec), f(w.threshold)};
  return sae;
}

absl::StatusOr<Sae> Sae::Load(const std::string& dir) {
  ASSIGN_OR_RETURN(SaeConfig cfg, ReadAndCheckSae(dir));
  ASSIGN_OR_RETURN(std::string path, FindSaeWeightsFile(dir));
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  SaeWeights w;
  auto load = [&](std::initializer_list<const char*> names, at::Tensor* out) -> absl::Status {
    for (const char* name : names) {
      if (const StTensorInfo* info = file.header().Find(name)) {
        ASSIGN_OR_RETURN(*out, ToTensor(file, *info));
        if (std::string(name) == "encoder.weight") *out = out->t().contiguous();
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(load({"W_enc", "encoder.weight"}, &w.W_enc));
  RETURN_IF_ERROR(load({"b_enc", "encoder.bias"}, &w.b_enc));
  RETURN_IF_ERROR(load({"W_dec"}, &w.W_dec));
  RETURN_IF_ERROR(load({"b_dec"}, &w.b_dec));
  RETURN_IF_ERROR(load({"threshold"}, &w.threshold));
  auto sae = Create(cfg, std::move(w));
  if (!sae.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", sae.status().message()));
  // CRC32C runs at memory speed (SSE4.2), so even a 1M-latent SAE's gigabytes cost little
  // next to reading them; it guards against a changed file, not against an adversary.
  const std::string& bytes = file.bytes();
  sae->weight_hash_ =
      absl::StrFormat("crc32c:%08x:%d", storage::Crc32c(bytes.data(), bytes.size()), bytes.size());
  return sae;
}

Sae Sae::To(const at::Device& device) const {
  Sae copy;
  copy.cfg_ = cfg_;
  auto mv = [&](const at::Tensor& t) { return t.defined() ? t.to(device) : t; };
  copy.w_ = {mv(w_.W_enc), mv(w_.b_enc), mv(w_.W_dec), mv(w_.b_dec), mv(w_.threshold)};
  return copy;
}

at::Tensor Sae::PreActivations(const at::Tensor& x) const {
  at::Tensor in = cfg_.apply_b_dec_to_input ? x - w_.b_dec : x;
  return at::addmm(w_.b_enc, in, w_.W_enc);
}

at::Tensor Sae::EncodeDense(const at::Tensor& x) const {
  at::Tensor pre = PreActivations(x);
  switch (cfg_.architecture) {
    case SaeArchitecture::kRelu:
      return at::relu(pre);
    case SaeArchitecture::kJumpRelu:
      return pre * (pre > w_.threshold).to(pre.scalar_type());
    case SaeArchitecture::kTopK: {
      auto [vals, idx] = pre.topk(cfg_.k, /*dim=*/1);
      return at::zeros_like(pre).scatter_(1, idx, at::relu(vals));
    }
  }
  return pre;
}

namespace {

// The codes of the rows whose pre-activations are `pre`.
SparseCodes EncodePass(const at::Tensor& pre, const SaeConfig& cfg, const at::Tensor& threshold) {
  if (cfg.architecture == SaeArchitecture::kTopK) return FixedKCodes(pre, cfg.k);
  return RaggedCodes(pre, cfg.architecture == SaeArchitecture::kRelu ? at::Tensor() : threshold);
}

}  // namespace

SparseCodes Sae::EncodeSparse(const at::Tensor& x, int64_t rows_per_pass) const {
  const int64_t n = x.size(0);
  const int64_t per_pass = rows_per_pass > 0 ? rows_per_pass : EncodeRowsPerPass(cfg_.d_sae);
  if (n <= per_pass) return EncodePass(PreActivations(x), cfg_, w_.threshold);
  std::vector<at::Tensor> indices, values, row_counts;
  for (int64_t a = 0; a < n; a += per_pass) {
    SparseCodes part =
        EncodePass(PreActivations(x.narrow(0, a, std::min(per_pass, n - a))), cfg_, w_.threshold);
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

int64_t Sae::weight_bytes() const {
  int64_t n = 0;
  for (const at::Tensor* t : {&w_.W_enc, &w_.b_enc, &w_.W_dec, &w_.b_dec, &w_.threshold}) {
    if (t->defined()) n += t->numel() * 4;
  }
  return n;
}

absl::Status SaveSae(const std::string& dir, const SaeWeights& weights, const SaeConfig& cfg) {
  ASSIGN_OR_RETURN(Sae sae, Sae::Create(cfg, weights));  // validates before anything is written
  mkdir(dir.c_str(), 0755);
  const SaeWeights& w = sae.weights();
  std::vector<at::Tensor> cpu;
  std::vector<StTensorToWrite> tensors;
  auto add = [&](const char* name, const at::Tensor& t) {
    if (!t.defined()) return;
    cpu.push_back(t.to(at::kCPU).contiguous());
    tensors.push_back({name, StDtype::kF32, t.sizes().vec(), nullptr});
  };
  add("W_enc", w.W_enc);
  add("b_enc", w.b_enc);
  add("W_dec", w.W_dec);
  add("b_dec", w.b_dec);
  add("threshold", w.threshold);
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = cpu[i].data_ptr();
  RETURN_IF_ERROR(WriteSafetensors(dir + "/sae_weights.safetensors", tensors, {{"format", "pt"}}));
  const std::string tmp = dir + "/cfg.json.tmp";
  {
    std::ofstream out(tmp);
    out << SaeConfigToJson(cfg);
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (rename(tmp.c_str(), (dir + "/cfg.json").c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp));
  }
  return absl::OkStatus();
}

}  // namespace latentd::engine
