#include "engine/sae.h"

#include <torch/serialize.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "common/safetensors.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

std::string TempDir(const std::string& name) {
  std::string d = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  mkdir(d.c_str(), 0755);
  return d;
}

SaeWeights RandomWeights(int64_t d_in, int64_t d_sae, uint64_t seed) {
  at::manual_seed(seed);
  // threshold for JumpReLU; r_mag and b_mag for Gated (the others ignore what they do not use).
  return {at::randn({d_in, d_sae}),      at::randn({d_sae}) * 0.1, at::randn({d_sae, d_in}),
          at::randn({d_in}) * 0.1,       at::rand({d_sae}),        at::randn({d_sae}) * 0.3,
          at::randn({d_sae}) * 0.5 - 0.2};
}

SaeConfig Cfg(SaeArchitecture arch, int64_t d_in, int64_t d_sae, int k = 0) {
  SaeConfig c;
  c.d_in = d_in;
  c.d_sae = d_sae;
  c.architecture = arch;
  c.k = k;
  return c;
}

// The stored set of row r from sparse codes, as {index -> value}.
std::map<int, float> Row(const SparseCodes& c, int64_t r) {
  std::map<int, float> out;
  if (c.fixed_k()) {
    for (int64_t j = 0; j < c.indices.size(1); ++j) {
      float v = c.values[r][j].item<float>();
      if (v != 0) out[c.indices[r][j].item<int>()] = v;
    }
    return out;
  }
  int64_t start = r == 0 ? 0 : c.row_counts.slice(0, 0, r).sum().item<int64_t>();
  for (int64_t j = start; j < start + c.row_counts[r].item<int64_t>(); ++j) {
    out[c.indices[j].item<int>()] = c.values[j].item<float>();
  }
  return out;
}

// The ragged codes of a dense z: every non-zero, columns ascending.
SparseCodes RaggedOf(const at::Tensor& z) {
  const at::Tensor nonzero = z.ne(0);
  return {nonzero.nonzero().select(1, 1).to(at::kInt), z.masked_select(nonzero),
          nonzero.sum(1).to(at::kLong)};
}

// What steering reads and writes: a latent's value in either layout of codes, and the change
// a change of values makes in Predict, input normalization included: delta_z W_dec[latents]
// times DecoderOutputScale (decoder_writes.h).
TEST(SaeTest, CodeValuesAndTheDecoderOutputScaleFollowTheDenseCodes) {
  for (SaeArchitecture arch :
       {SaeArchitecture::kTopK, SaeArchitecture::kRelu, SaeArchitecture::kJumpRelu}) {
    for (InputNormalization norm :
         {InputNormalization::kNone, InputNormalization::kConstantNormRescale}) {
      SaeConfig cfg = Cfg(arch, 8, 40, 5);
      cfg.input_normalization = norm;
      auto sae = Sae::Create(cfg, RandomWeights(8, 40, 3));
      ASSERT_TRUE(sae.ok()) << sae.status();
      at::manual_seed(4);
      const at::Tensor x = at::randn({6, 8}) * 3;
      const at::Tensor latents = at::tensor({0, 7, 39, 12}, at::TensorOptions().dtype(at::kLong));
      const at::Tensor z = sae->EncodeDense(x);
      ASSERT_GT(z.index_select(1, latents).ne(0).sum().item<int64_t>(), 0);
      EXPECT_TRUE(
          at::allclose(CodeValues(sae->EncodeSparse(x), 6, latents), z.index_select(1, latents)));
      const at::Tensor delta_z = at::randn({6, 4});
      const at::Tensor changed = z.index_add(1, latents, delta_z);
      const at::Tensor want = sae->Predict(x, RaggedOf(changed)) - sae->Predict(x, RaggedOf(z));
      const at::Tensor change =
          delta_z.mm(sae->weights().W_dec.index_select(0, latents)) * sae->DecoderOutputScale(x);
      EXPECT_TRUE(at::allclose(change, want, 1e-4, 1e-4))
          << static_cast<int>(arch) << " " << static_cast<int>(norm);
    }
  }
}

// LatentValue is EncodeDense's column, and autograd's gradient of it is the finite
// difference's.
TEST(SaeTest, LatentValueIsTheDenseCodesColumnAndDifferentiable) {
  for (SaeArchitecture arch : {SaeArchitecture::kRelu, SaeArchitecture::kTopK,
                               SaeArchitecture::kJumpRelu, SaeArchitecture::kGated}) {
    SaeConfig cfg = Cfg(arch, 8, 40, arch == SaeArchitecture::kTopK ? 5 : 0);
    cfg.input_normalization = InputNormalization::kConstantNormRescale;
    auto sae = Sae::Create(cfg, RandomWeights(8, 40, 5));
    ASSERT_TRUE(sae.ok()) << sae.status();
    at::manual_seed(6);
    const at::Tensor x = at::randn({6, 8}) * 3;
    const at::Tensor z = sae->EncodeDense(x);
    for (int64_t j = 0; j < 40; ++j) {
      ASSERT_TRUE(at::allclose(sae->LatentValue(x, j), z.select(1, j), 1e-5, 1e-5))
          << static_cast<int>(arch) << " latent " << j;
    }
    // A latent firing on row 2: its gradient in row 2.
    const int64_t j = z[2].argmax().item<int64_t>();
    ASSERT_GT(z[2][j].item<float>(), 0);
    const at::Tensor row = x.narrow(0, 2, 1).clone().requires_grad_(true);
    sae->LatentValue(row, j).sum().backward();
    const at::Tensor direction = at::randn({1, 8});
    const double eps = 1e-3;
    const double numeric = (sae->LatentValue(x.narrow(0, 2, 1) + eps * direction, j) -
                            sae->LatentValue(x.narrow(0, 2, 1) - eps * direction, j))
                               .item<double>() /
                           (2 * eps);
    EXPECT_NEAR((row.grad() * direction).sum().item<double>(), numeric,
                1e-2 * std::abs(numeric) + 1e-3)
        << static_cast<int>(arch);
  }
}

TEST(SaeTest, SparseCodesEqualTheNonZerosOfTheDenseDefinition) {
  for (auto arch : {SaeArchitecture::kRelu, SaeArchitecture::kTopK, SaeArchitecture::kJumpRelu,
                    SaeArchitecture::kGated}) {
    auto sae = Sae::Create(Cfg(arch, 8, 40, 5), RandomWeights(8, 40, 1));
    ASSERT_TRUE(sae.ok()) << sae.status();
    at::Tensor x = at::randn({6, 8});
    const SaeWeights& w = sae->weights();
    at::Tensor pre = (x - w.b_dec).matmul(w.W_enc) + w.b_enc;
    // Gated: the magnitude path (SAELens' GatedSAE: W_enc scaled by exp(r_mag), bias b_mag).
    at::Tensor magnitude = ((x - w.b_dec).matmul(w.W_enc * w.r_mag.exp()) + w.b_mag).relu();
    SparseCodes codes = sae->EncodeSparse(x);
    for (int64_t r = 0; r < 6; ++r) {
      std::map<int, float> want;
      std::vector<std::pair<float, int>> order;
      for (int j = 0; j < 40; ++j) order.push_back({pre[r][j].item<float>(), j});
      std::sort(order.rbegin(), order.rend());
      for (int rank = 0; rank < 40; ++rank) {
        auto [p, j] = order[rank];
        const float mag = magnitude[r][j].item<float>();
        bool keep = arch == SaeArchitecture::kRelu    ? p > 0
                    : arch == SaeArchitecture::kTopK  ? rank < 5 && p > 0
                    : arch == SaeArchitecture::kGated ? p > 0 && mag > 0
                                                      : p > w.threshold[j].item<float>();
        if (keep) want[j] = arch == SaeArchitecture::kGated ? mag : p;
      }
      auto got = Row(codes, r);
      ASSERT_EQ(got.size(), want.size()) << SaeArchitectureName(arch) << " row " << r;
      for (auto& [j, v] : want) EXPECT_NEAR(got[j], v, 1e-5);
      at::Tensor dense = sae->EncodeDense(x)[r];
      EXPECT_EQ(dense.ne(0).sum().item<int64_t>(), static_cast<int64_t>(want.size()));
    }
  }
}

// Wide SAEs encode a batch in passes of a bounded number of rows (EncodeRowsPerPass): the codes
// must be each pass's codes, in row order, whatever the architecture's layout.
TEST(SaeTest, EncodingInPassesStitchesThePassesInRowOrder) {
  EXPECT_EQ(EncodeRowsPerPass(4096), 16384);
  EXPECT_EQ(EncodeRowsPerPass(int64_t{1} << 20), 64);
  EXPECT_EQ(EncodeRowsPerPass(int64_t{1} << 30), 1);
  for (auto arch : {SaeArchitecture::kRelu, SaeArchitecture::kTopK, SaeArchitecture::kJumpRelu,
                    SaeArchitecture::kGated}) {
    auto sae = Sae::Create(Cfg(arch, 8, 40, 5), RandomWeights(8, 40, 11));
    ASSERT_TRUE(sae.ok()) << sae.status();
    at::Tensor x = at::randn({11, 8});
    SparseCodes passes = sae->EncodeSparse(x, /*rows_per_pass=*/4);  // rows 0-3, 4-7, 8-10
    for (int64_t first = 0; first < 11; first += 4) {
      const int64_t rows = std::min<int64_t>(4, 11 - first);
      SparseCodes one = sae->EncodeSparse(x.narrow(0, first, rows), /*rows_per_pass=*/4);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(Row(passes, first + r), Row(one, r))
            << SaeArchitectureName(arch) << " row " << first + r;
      }
    }
    if (!passes.fixed_k()) {
      EXPECT_EQ(passes.row_counts.size(0), 11);
      EXPECT_EQ(passes.row_counts.sum().item<int64_t>(), passes.indices.size(0));
    } else {
      EXPECT_EQ(passes.indices.size(0), 11);
    }
  }
}

// The sparse decoder gives z W_dec + b_dec of the dense codes, for both code layouts.
TEST(SaeTest, DecodingSparseCodesEqualsDecodingTheDenseCodes) {
  for (auto [arch, k] :
       {std::pair{SaeArchitecture::kTopK, 5}, std::pair{SaeArchitecture::kRelu, 0},
        std::pair{SaeArchitecture::kJumpRelu, 0}, std::pair{SaeArchitecture::kGated, 0}}) {
    auto sae = Sae::Create(Cfg(arch, 12, 40, k), RandomWeights(12, 40, 6));
    ASSERT_TRUE(sae.ok()) << sae.status();
    at::manual_seed(7);
    const at::Tensor x = at::randn({33, 12});
    const at::Tensor want = sae->Decode(sae->EncodeDense(x));
    const at::Tensor got = sae->DecodeSparse(sae->EncodeSparse(x, /*rows_per_pass=*/10), 33);
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5)) << SaeArchitectureName(arch);
  }
}

TEST(SaeTest, TopKWithFewerThanKPositiveKeepsOnlyThePositives) {
  SaeWeights w = RandomWeights(4, 10, 2);
  w.b_enc = at::full({10}, -100.0);
  w.b_enc[3] = 100.0;  // exactly one latent can be positive
  auto sae = Sae::Create(Cfg(SaeArchitecture::kTopK, 4, 10, 4), w);
  ASSERT_TRUE(sae.ok());
  auto got = Row(sae->EncodeSparse(at::randn({1, 4}) * 0.01), 0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got.begin()->first, 3);
}

TEST(SaeTest, ApplyBDecToInputFalseSkipsTheSubtraction) {
  SaeConfig cfg = Cfg(SaeArchitecture::kRelu, 4, 6);
  cfg.apply_b_dec_to_input = false;
  SaeWeights w = RandomWeights(4, 6, 3);
  auto sae = Sae::Create(cfg, w);
  at::Tensor x = at::randn({2, 4});
  EXPECT_TRUE(at::allclose(sae->PreActivations(x), x.matmul(w.W_enc) + w.b_enc));
}

// SAELens' run-time input normalizations, written out in float64 from their definitions: the
// latents come from the normalized input, Predict gives the reconstruction in the hook's units.
TEST(SaeTest, NormalizesItsInputPerRowAsSaeLensDoes) {
  const int64_t d_in = 8, d_sae = 32;
  SaeWeights w = RandomWeights(d_in, d_sae, 11);
  at::manual_seed(12);
  // Rows far from unit scale and off-centre, so that a missing normalization shows.
  at::Tensor x = at::randn({5, d_in}) * 7 + 3;
  const at::Tensor xd = x.to(at::kDouble);
  struct Case {
    const char* name;
    at::Tensor normalized, undo_scale, undo_shift;  // x' and x_hat = x_hat' * scale + shift
  };
  const at::Tensor norm = xd.norm(2, {1}, true);
  const at::Tensor mean = xd.mean({1}, true);
  const at::Tensor centred = xd - mean;
  // torch.std's default: Bessel's correction.
  const at::Tensor sigma = (centred.pow(2).sum({1}, true) / (d_in - 1)).sqrt();
  const std::vector<Case> cases = {{"constant_norm_rescale", xd * std::sqrt(double(d_in)) / norm,
                                    norm / std::sqrt(double(d_in)), at::zeros_like(norm)},
                                   {"layer_norm", centred / (sigma + 1e-5), sigma, mean}};
  const std::string dir = TempDir("sae_normalized");
  for (const Case& c : cases) {
    SaeConfig cfg = Cfg(SaeArchitecture::kTopK, d_in, d_sae, 4);
    ASSERT_TRUE(SaveSae(dir, w, cfg).ok());
    std::ofstream(dir + "/cfg.json") << R"({"d_in": 8, "d_sae": 32, "architecture": "topk", )"
                                     << R"("k": 4, "normalize_activations": ")" << c.name << "\"}";
    auto sae = Sae::Load(dir);
    ASSERT_TRUE(sae.ok()) << sae.status();
    EXPECT_EQ(InputNormalizationName(sae->config().input_normalization), std::string(c.name));
    const at::Tensor pre = at::addmm(
        w.b_enc.to(at::kDouble), c.normalized - w.b_dec.to(at::kDouble), w.W_enc.to(at::kDouble));
    EXPECT_TRUE(at::allclose(sae->PreActivations(x).to(at::kDouble), pre, 1e-4, 1e-4)) << c.name;
    const SparseCodes codes = sae->EncodeSparse(x);
    const at::Tensor z =
        at::zeros_like(pre).scatter_(1, codes.indices.to(at::kLong), codes.values.to(at::kDouble));
    auto [top, top_index] = pre.topk(4, 1);
    EXPECT_TRUE(
        at::equal(std::get<0>(codes.indices.to(at::kLong).sort(1)), std::get<0>(top_index.sort(1))))
        << c.name;
    const at::Tensor x_hat =
        at::addmm(w.b_dec.to(at::kDouble), z, w.W_dec.to(at::kDouble)) * c.undo_scale +
        c.undo_shift;
    EXPECT_TRUE(at::allclose(sae->Predict(x, codes).to(at::kDouble), x_hat, 1e-4, 1e-3)) << c.name;
    // The same weights without the normalization are another SAE to a resuming job.
    std::ofstream(dir + "/cfg.json")
        << R"({"d_in": 8, "d_sae": 32, "architecture": "topk", "k": 4})";
    auto plain = Sae::Load(dir);
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_NE(plain->weight_hash(), sae->weight_hash()) << c.name;
    // SaveSae keeps the normalization.
    ASSERT_TRUE(SaveSae(dir, w, sae->config()).ok());
    auto saved = Sae::Load(dir);
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_EQ(saved->config().input_normalization, sae->config().input_normalization);
  }
  // A row of zeros stays finite under constant_norm_rescale (SAELens divides by its zero norm).
  SaeConfig cfg = Cfg(SaeArchitecture::kRelu, d_in, d_sae);
  cfg.input_normalization = InputNormalization::kConstantNormRescale;
  auto sae = Sae::Create(cfg, w);
  ASSERT_TRUE(sae.ok()) << sae.status();
  const at::Tensor zero = at::zeros({1, d_in});
  EXPECT_TRUE(at::isfinite(sae->Predict(zero, sae->EncodeSparse(zero))).all().item<bool>());
}

TEST(SaeTest, SaveThenLoadRoundTrips) {
  std::string dir = TempDir("sae_rt");
  SaeConfig cfg = Cfg(SaeArchitecture::kJumpRelu, 8, 16);
  SaeWeights w = RandomWeights(8, 16, 4);
  ASSERT_TRUE(SaveSae(dir, w, cfg).ok());
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  EXPECT_EQ(sae->config().architecture, SaeArchitecture::kJumpRelu);
  EXPECT_TRUE(at::equal(sae->weights().W_enc, w.W_enc));
  EXPECT_TRUE(at::equal(sae->weights().threshold, w.threshold));
}

// A Gated SAE in SAELens' layout: b_gate (no b_enc), r_mag, b_mag; a file without r_mag is
// refused naming it.
TEST(SaeTest, GatedSaesSaveAndLoadInSaeLensLayout) {
  std::string dir = TempDir("sae_gated");
  SaeWeights w = RandomWeights(8, 16, 9);
  ASSERT_TRUE(SaveSae(dir, w, Cfg(SaeArchitecture::kGated, 8, 16)).ok());
  auto header = ReadStHeader(dir + "/sae_weights.safetensors");
  ASSERT_TRUE(header.ok());
  EXPECT_NE(header->Find("b_gate"), nullptr);
  EXPECT_EQ(header->Find("b_enc"), nullptr);
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  EXPECT_EQ(sae->config().architecture, SaeArchitecture::kGated);
  EXPECT_TRUE(at::equal(sae->weights().b_enc, w.b_enc));
  EXPECT_TRUE(at::equal(sae->weights().r_mag, w.r_mag));
  const at::Tensor x = at::randn({5, 8});
  auto made = Sae::Create(Cfg(SaeArchitecture::kGated, 8, 16), w);
  ASSERT_TRUE(made.ok());
  EXPECT_TRUE(at::equal(sae->EncodeDense(x), made->EncodeDense(x)));
  SaeWeights no_r_mag = w;
  no_r_mag.r_mag = at::Tensor();
  const absl::Status missing = Sae::Create(Cfg(SaeArchitecture::kGated, 8, 16), no_r_mag).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("r_mag"), std::string::npos) << missing;
}

TEST(SaeTest, LoadsTheSparsifyLayout) {
  std::string dir = TempDir("sae_sparsify");
  SaeWeights w = RandomWeights(4, 12, 5);
  at::Tensor enc = w.W_enc.t().contiguous();  // encoder.weight is [d_sae, d_in]
  ASSERT_TRUE(WriteSafetensors(dir + "/sae.safetensors",
                               {{"encoder.weight", StDtype::kF32, {12, 4}, enc.data_ptr()},
                                {"encoder.bias", StDtype::kF32, {12}, w.b_enc.data_ptr()},
                                {"W_dec", StDtype::kF32, {12, 4}, w.W_dec.data_ptr()},
                                {"b_dec", StDtype::kF32, {4}, w.b_dec.data_ptr()}})
                  .ok());
  std::ofstream(dir + "/cfg.json") << R"({"d_in": 4, "num_latents": 12, "k": 3})";
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  EXPECT_EQ(sae->config().architecture, SaeArchitecture::kTopK);
  EXPECT_EQ(sae->config().k, 3);
  EXPECT_TRUE(at::equal(sae->weights().W_enc, w.W_enc));
  // sparsify's groupmax activation is not a TopK: refused rather than encoded as one.
  std::ofstream(dir + "/cfg.json")
      << R"({"d_in": 4, "num_latents": 12, "k": 3, "activation": "groupmax"})";
  const absl::Status groupmax = Sae::Load(dir).status();
  EXPECT_EQ(groupmax.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(groupmax.message().find("groupmax"), std::string::npos) << groupmax;
}

// SAELens' JumpReLUSAE (and Gemma Scope's own encoder) compute relu(pre) * (pre > t): with a
// negative threshold, pre-activations between it and 0 give 0, not a negative latent.
TEST(SaeTest, SaeLensJumpReLUWithNegativeThresholdsIsReLUd) {
  const std::string dir = TempDir("sae_negative_threshold");
  SaeWeights w = RandomWeights(4, 12, 10);
  w.threshold = at::rand({12}) - 0.5;  // about half negative
  ASSERT_TRUE(SaveSae(dir, w, Cfg(SaeArchitecture::kJumpRelu, 4, 12)).ok());
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  const at::Tensor x = at::randn({64, 4});
  const at::Tensor pre = at::addmm(w.b_enc, x - w.b_dec, w.W_enc);
  ASSERT_TRUE(((pre < 0) & (pre > w.threshold)).any().item<bool>());  // the case that differs
  const at::Tensor want = at::relu(pre) * (pre > w.threshold).to(at::kFloat);
  EXPECT_TRUE(at::allclose(sae->EncodeDense(x), want, 1e-5, 1e-5));
  const SparseCodes codes = sae->EncodeSparse(x);
  EXPECT_GE(codes.values.min().item<float>(), 0);
}

// SAELens' finetuning_scaling_factor multiplies the latents before they are decoded: the stored
// latents are the unscaled ones, the reconstruction uses the scaled ones.
TEST(SaeTest, FinetuningScalingFactorScalesWhatIsDecoded) {
  const std::string dir = TempDir("sae_finetuning_scale");
  SaeWeights w = RandomWeights(4, 12, 9);
  const at::Tensor scale = at::rand({12}) + 0.5;
  ASSERT_TRUE(
      WriteSafetensors(dir + "/sae_weights.safetensors",
                       {{"W_enc", StDtype::kF32, {4, 12}, w.W_enc.data_ptr()},
                        {"b_enc", StDtype::kF32, {12}, w.b_enc.data_ptr()},
                        {"W_dec", StDtype::kF32, {12, 4}, w.W_dec.data_ptr()},
                        {"b_dec", StDtype::kF32, {4}, w.b_dec.data_ptr()},
                        {"finetuning_scaling_factor", StDtype::kF32, {12}, scale.data_ptr()}})
          .ok());
  std::ofstream(dir + "/cfg.json") << R"({"d_in": 4, "d_sae": 12, "architecture": "standard",
                                          "finetuning_scaling_factor": true})";
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  const at::Tensor x = at::randn({6, 4});
  const at::Tensor z = at::relu(at::addmm(w.b_enc, x - w.b_dec, w.W_enc));
  const SparseCodes codes = sae->EncodeSparse(x);
  EXPECT_TRUE(at::allclose(sae->EncodeDense(x), z, 1e-5, 1e-5));
  EXPECT_TRUE(
      at::allclose(sae->Predict(x, codes), at::addmm(w.b_dec, z * scale, w.W_dec), 1e-5, 1e-5));
  // Without the flag the tensor is ignored, as SAELens ignores it: another SAE to a resuming job.
  std::ofstream(dir + "/cfg.json") << R"({"d_in": 4, "d_sae": 12, "architecture": "standard"})";
  auto plain = Sae::Load(dir);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(at::allclose(plain->Predict(x, codes), at::addmm(w.b_dec, z, w.W_dec), 1e-5, 1e-5));
  EXPECT_NE(plain->weight_hash(), sae->weight_hash());
  // The flag without the tensor: refused naming it.
  ASSERT_TRUE(SaveSae(dir, w, Cfg(SaeArchitecture::kRelu, 4, 12)).ok());
  std::ofstream(dir + "/cfg.json") << R"({"d_in": 4, "d_sae": 12, "architecture": "standard",
                                          "finetuning_scaling_factor": true})";
  const absl::Status missing = Sae::Load(dir).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("finetuning_scaling_factor"), std::string::npos) << missing;
}

// dictionary_learning's ae.pt + config.json: the state dict's k wins over config.json's (the
// module encodes with its buffer), the hook comes from submodule_name; what latentd would not
// reproduce is refused naming it.
TEST(SaeTest, ReadsDictionaryLearningDictionaries) {
  const std::string dir = TempDir("dictionary_learning_topk");
  at::manual_seed(40);
  const at::Tensor enc = at::randn({12, 4}), enc_b = at::randn({12}), dec = at::randn({4, 12}),
                   b_dec = at::randn({4});
  auto save = [&](const std::string& d, bool with_threshold) {
    c10::Dict<std::string, at::Tensor> state;
    state.insert("encoder.weight", enc);
    state.insert("encoder.bias", enc_b);
    state.insert("decoder.weight", dec);
    state.insert("b_dec", b_dec);
    state.insert("k", at::scalar_tensor(3, at::kInt));
    if (with_threshold) state.insert("threshold", at::scalar_tensor(-1.0));
    const std::vector<char> bytes = torch::pickle_save(state);
    std::ofstream(d + "/ae.pt", std::ios::binary).write(bytes.data(), bytes.size());
  };
  auto config = [&](const std::string& d, const std::string& dict_class, int dict_size) {
    std::ofstream(d + "/config.json")
        << R"({"trainer": {"dict_class": ")" << dict_class
        << R"(", "activation_dim": 4, "dict_size": )" << dict_size
        << R"(, "k": 5, "layer": 2, "lm_name": "m", "submodule_name": "mlp_out_layer_2"}})";
  };
  save(dir, true);
  config(dir, "AutoEncoderTopK", 12);
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  EXPECT_EQ(sae->config().architecture, SaeArchitecture::kTopK);
  EXPECT_EQ(sae->config().k, 3);
  EXPECT_EQ(sae->config().hook_name, "blocks.2.hook_mlp_out");
  EXPECT_TRUE(sae->config().apply_b_dec_to_input);
  EXPECT_TRUE(at::equal(sae->weights().W_enc, enc.t()));
  EXPECT_TRUE(at::equal(sae->weights().W_dec, dec.t()));
  // A BatchTopK whose threshold was never learned (-1) keeps every positive pre-activation.
  config(dir, "BatchTopKSAE", 12);
  sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  const at::Tensor x = at::randn({5, 4});
  EXPECT_TRUE(at::allclose(sae->EncodeDense(x), at::relu(at::addmm(enc_b, x - b_dec, enc.t()))));
  auto refused = [&](const std::string& d, const std::string& needle) {
    const absl::Status s = Sae::Load(d).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
  };
  config(dir, "CrossCoder", 12);
  refused(dir, "CrossCoder");
  std::ofstream(dir + "/config.json") << R"({"trainer": {"dict_class": 7, "submodule_name": 3}})";
  refused(dir, R"(dict_class "7")");    // a number where a name belongs: named, not a crash
  config(dir, "GatedAutoEncoder", 12);  // a TopK's tensors
  refused(dir, "tensor gate_bias missing");
  config(dir, "AutoEncoderTopK", 16);
  refused(dir, "dict_size 16");
  const std::string batch = TempDir("dictionary_learning_batch");
  save(batch, false);
  config(batch, "BatchTopKSAE", 12);
  refused(batch, "no threshold");
}

// Goodfire's release: one .pth state dict, nothing beside it. A ReLU SAE whose encoder adds
// no b_dec first; its widths come from the tensors. Two .pth files are not guessed between.
TEST(SaeTest, ReadsGoodfiresStateDict) {
  const std::string dir = TempDir("goodfire");
  at::manual_seed(41);
  c10::Dict<std::string, at::Tensor> state;
  const at::Tensor enc = at::randn({12, 4}), enc_b = at::randn({12}), dec = at::randn({4, 12}),
                   dec_b = at::randn({4});
  state.insert("encoder_linear.weight", enc.to(at::kBFloat16));
  state.insert("encoder_linear.bias", enc_b.to(at::kBFloat16));
  state.insert("decoder_linear.weight", dec.to(at::kBFloat16));
  state.insert("decoder_linear.bias", dec_b.to(at::kBFloat16));
  const std::vector<char> bytes = torch::pickle_save(state);
  std::ofstream(dir + "/Model-SAE-l3.pth", std::ios::binary).write(bytes.data(), bytes.size());
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  EXPECT_EQ(sae->config().architecture, SaeArchitecture::kRelu);
  EXPECT_FALSE(sae->config().apply_b_dec_to_input);
  EXPECT_EQ(sae->config().d_in, 4);
  EXPECT_EQ(sae->config().d_sae, 12);
  const at::Tensor x = at::randn({3, 4});
  const at::Tensor z = at::relu(at::addmm(enc_b.to(at::kBFloat16).to(at::kFloat), x,
                                          enc.to(at::kBFloat16).to(at::kFloat).t()));
  EXPECT_TRUE(at::allclose(sae->EncodeDense(x), z, 1e-5, 1e-5));
  std::ofstream(dir + "/another.pth", std::ios::binary).write(bytes.data(), bytes.size());
  EXPECT_EQ(Sae::Load(dir).status().code(), absl::StatusCode::kNotFound);
  // The only .pth file, but some other module's: refused, saying what it holds.
  const std::string other = TempDir("not_goodfire");
  c10::Dict<std::string, at::Tensor> model;
  model.insert("fc.weight", at::randn({3, 4}));
  const std::vector<char> model_bytes = torch::pickle_save(model);
  std::ofstream(other + "/model.pth", std::ios::binary)
      .write(model_bytes.data(), model_bytes.size());
  const absl::Status s = Sae::Load(other).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not Goodfire's SparseAutoEncoder's state dict (it holds fc.weight)"),
            std::string::npos)
      << s;
}

// SAELens 3-5 wrote a TopK SAE as "architecture": "standard" with the activation beside it
// (OpenAI's GPT-2 SAEs and SAEBench's TopK releases are served so): a TopK of that k, not a ReLU.
TEST(SaeTest, ReadsTheOlderSaeLensSchemasActivation) {
  const std::string dir = TempDir("sae_activation_fn_str");
  ASSERT_TRUE(SaveSae(dir, RandomWeights(4, 12, 8), Cfg(SaeArchitecture::kRelu, 4, 12)).ok());
  std::ofstream(dir + "/cfg.json")
      << R"({"d_in": 4, "d_sae": 12, "architecture": "standard", "activation_fn_str": "topk",
             "activation_fn_kwargs": {"k": 5}, "normalize_activations": "layer_norm"})";
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  EXPECT_EQ(sae->config().architecture, SaeArchitecture::kTopK);
  EXPECT_EQ(sae->config().k, 5);
  EXPECT_EQ(sae->config().input_normalization, InputNormalization::kLayerNorm);
  // "relu" (and the architecture's own name) leave the architecture as it is.
  std::ofstream(dir + "/cfg.json")
      << R"({"d_in": 4, "d_sae": 12, "architecture": "standard", "activation_fn_str": "relu"})";
  sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  EXPECT_EQ(sae->config().architecture, SaeArchitecture::kRelu);
  // Anthropic's tanh-relu, and a signed TopK (SAELens' spelling and sparsify's): refused naming
  // the field.
  for (const auto& [cfg, field] : std::vector<std::pair<const char*, const char*>>{
           {R"({"d_in": 4, "d_sae": 12, "activation_fn_str": "tanh-relu"})", "activation_fn_str"},
           {R"({"d_in": 4, "d_sae": 12, "activation_fn_str": "topk",
                "activation_fn_kwargs": {"k": 5, "signed": true}})",
            "signed"},
           {R"({"d_in": 4, "num_latents": 12, "k": 5, "signed": true})", "signed"}}) {
    std::ofstream(dir + "/cfg.json") << cfg;
    const absl::Status s = Sae::Load(dir).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << cfg;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  }
  std::ofstream(dir + "/cfg.json") << R"({"d_in": 4, "num_latents": 12, "k": 5, "signed": false})";
  EXPECT_TRUE(Sae::Load(dir).ok());
}

// What an SAE says it was trained on, wherever its release put it: the start-of-job warnings
// compare it with the job's hook and model.
TEST(SaeTest, FindsTheHookAndProcessingItWasTrainedOn) {
  SaeWeights w = RandomWeights(4, 12, 6);
  at::Tensor enc = w.W_enc.t().contiguous();
  auto write_sparsify = [&](const std::string& dir) {
    ASSERT_TRUE(WriteSafetensors(dir + "/sae.safetensors",
                                 {{"encoder.weight", StDtype::kF32, {12, 4}, enc.data_ptr()},
                                  {"encoder.bias", StDtype::kF32, {12}, w.b_enc.data_ptr()},
                                  {"W_dec", StDtype::kF32, {12, 4}, w.W_dec.data_ptr()},
                                  {"b_dec", StDtype::kF32, {4}, w.b_dec.data_ptr()}})
                    .ok());
    std::ofstream(dir + "/cfg.json") << R"({"d_in": 4, "num_latents": 12, "k": 3})";
  };
  // sparsify: no hook in cfg.json, the directory is named after the module.
  TempDir("sparsify_release");
  const std::string layer = TempDir("sparsify_release/layers.6");
  write_sparsify(layer);
  EXPECT_EQ(ReadAndCheckSae(layer)->hook_name, "layers.6");
  EXPECT_EQ(ReadAndCheckSae(layer + "/")->hook_name, "layers.6");
  const std::string plain = TempDir("sparsify_plain");
  write_sparsify(plain);
  EXPECT_EQ(ReadAndCheckSae(plain)->hook_name, "");

  auto cfg = ParseSaeConfigJson(
      R"({"d_in": 4, "d_sae": 12, "hook_point": "blocks.8.hook_resid_pre",
          "model_from_pretrained_kwargs": {"center_writing_weights": true}})");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->hook_name, "blocks.8.hook_resid_pre");  // SAELens before 3.0
  EXPECT_EQ(cfg->center_writing_weights, std::optional<bool>(true));
  cfg = ParseSaeConfigJson(R"({"d_in": 4, "d_sae": 12, "hook_name": "blocks.2.hook_resid_post",
                               "hook_point": "blocks.8.hook_resid_pre"})");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->hook_name, "blocks.2.hook_resid_post");
  EXPECT_FALSE(cfg->center_writing_weights.has_value());
  // SAELens 6 keeps them under "metadata".
  cfg = ParseSaeConfigJson(R"({"d_in": 4, "d_sae": 12, "architecture": "topk", "k": 2,
      "metadata": {"hook_name": "blocks.5.attn.hook_z", "model_name": "gpt2-small",
                   "hook_head_index": null,
                   "model_from_pretrained_kwargs": {"center_writing_weights": false}}})");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->hook_name, "blocks.5.attn.hook_z");
  EXPECT_EQ(cfg->model_name, "gpt2-small");
  EXPECT_EQ(cfg->center_writing_weights, std::optional<bool>(false));
  // An SAE of one attention head: refused, naming the field.
  for (const char* one_head :
       {R"({"d_in": 4, "d_sae": 12, "hook_name": "blocks.5.attn.hook_z", "hook_head_index": 3})",
        R"({"d_in": 4, "d_sae": 12, "metadata": {"hook_head_index": 3}})"}) {
    const absl::Status s = ParseSaeConfigJson(one_head).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << one_head;
    EXPECT_NE(s.message().find("hook_head_index 3"), std::string::npos) << s;
  }
}

// A transcoder reads one hook (d_in 6) and predicts another (d_out 4): SAELens' skip_transcoder
// loads as SAELens computes it (no b_dec subtracted from the input, whatever
// apply_b_dec_to_input says; the prediction adds x W_skip^T), saves and loads back.
TEST(SaeTest, TranscodersPredictTheirOutputHookAsSaeLensDoes) {
  const std::string dir = TempDir("transcoder_skip");
  at::manual_seed(31);
  const at::Tensor W_enc = at::randn({6, 10}), b_enc = at::randn({10}) * 0.1;
  const at::Tensor W_dec = at::randn({10, 4}), b_dec = at::randn({4});
  const at::Tensor W_skip = at::randn({4, 6});
  ASSERT_TRUE(WriteSafetensors(dir + "/sae_weights.safetensors",
                               {{"W_enc", StDtype::kF32, {6, 10}, W_enc.data_ptr()},
                                {"b_enc", StDtype::kF32, {10}, b_enc.data_ptr()},
                                {"W_dec", StDtype::kF32, {10, 4}, W_dec.data_ptr()},
                                {"b_dec", StDtype::kF32, {4}, b_dec.data_ptr()},
                                {"W_skip", StDtype::kF32, {4, 6}, W_skip.data_ptr()}})
                  .ok());
  std::ofstream(dir + "/cfg.json") << R"({"architecture": "skip_transcoder", "d_in": 6,
      "d_out": 4, "d_sae": 10, "apply_b_dec_to_input": true,
      "hook_name": "blocks.1.ln2.hook_normalized", "hook_name_out": "blocks.1.hook_mlp_out"})";
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  const SaeConfig& cfg = sae->config();
  EXPECT_TRUE(cfg.transcoder);
  EXPECT_TRUE(cfg.skip);
  EXPECT_FALSE(cfg.apply_b_dec_to_input);
  EXPECT_EQ(cfg.architecture, SaeArchitecture::kRelu);
  EXPECT_EQ(cfg.OutWidth(), 4);
  EXPECT_EQ(cfg.hook_name_out, "blocks.1.hook_mlp_out");
  const at::Tensor x = at::randn({7, 6});
  const at::Tensor z = at::relu(at::mm(x, W_enc) + b_enc);
  const at::Tensor want = at::mm(z, W_dec) + b_dec + at::mm(x, W_skip.t());
  const at::Tensor got = sae->Predict(x, sae->EncodeSparse(x));
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max();

  const std::string saved = TempDir("transcoder_saved");
  ASSERT_TRUE(SaveSae(saved, sae->weights(), cfg).ok());
  auto back = Sae::Load(saved);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->config().transcoder && back->config().skip);
  EXPECT_EQ(back->config().hook_name_out, "blocks.1.hook_mlp_out");
  EXPECT_TRUE(at::equal(back->Predict(x, back->EncodeSparse(x)), got));

  // The weights must match the declared widths, W_skip included.
  std::ofstream(dir + "/cfg.json") << R"({"architecture": "skip_transcoder", "d_in": 6,
      "d_out": 6, "d_sae": 10})";
  absl::Status s = ReadAndCheckSae(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("W_dec"), std::string::npos) << s;
  std::ofstream(dir + "/cfg.json") << R"({"architecture": "glu_transcoder", "d_in": 6,
      "d_out": 4, "d_sae": 10})";
  s = ReadAndCheckSae(dir).status();
  EXPECT_NE(s.message().find("glu_transcoder"), std::string::npos) << s;
  // jumprelu_transcoder and topk_transcoder name their encoders; without "skip" no W_skip.
  std::ofstream(dir + "/cfg.json") << R"({"architecture": "topk_transcoder", "d_in": 6,
      "d_out": 4, "d_sae": 10, "k": 3})";
  auto topk = Sae::Load(dir);
  ASSERT_TRUE(topk.ok()) << topk.status();
  EXPECT_EQ(topk->config().architecture, SaeArchitecture::kTopK);
  EXPECT_FALSE(topk->config().skip);
  EXPECT_FALSE(topk->weights().W_skip.defined());
  // SAELens would undo the input's normalization on the output hook's prediction: refused.
  std::ofstream(dir + "/cfg.json") << R"({"architecture": "topk_transcoder", "d_in": 6,
      "d_out": 4, "d_sae": 10, "k": 3, "normalize_activations": "layer_norm"})";
  s = Sae::Load(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("normalize_activations"), std::string::npos) << s;
}

// Writes the named float32 tensors (contiguous, on the CPU) to `path`; F16 for names in `half`.
void WriteTensors(const std::string& path,
                  const std::vector<std::pair<std::string, at::Tensor>>& named,
                  const std::set<std::string>& half = {}) {
  std::vector<at::Tensor> keep;
  std::vector<StTensorToWrite> tensors;
  for (const auto& [name, t] : named) {
    const bool f16 = half.count(name) > 0;
    keep.push_back(t.to(f16 ? at::kHalf : at::kFloat).contiguous());
    tensors.push_back({name, f16 ? StDtype::kF16 : StDtype::kF32, t.sizes().vec(), nullptr});
  }
  for (size_t i = 0; i < keep.size(); ++i) tensors[i].data = keep[i].data_ptr();
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok()) << path;
}

HookName Hook(const char* name) { return *ParseHookName(name); }

// Gemma Scope 2 (Gemma 3's SAEs and transcoders) as downloaded: params.safetensors with
// w_enc [d_in, d_sae], the place in the path, z = relu(pre) * (pre > threshold).
TEST(SaeTest, ReadsGemmaScope2AsDownloaded) {
  const std::string root = TempDir("gemma-scope-2-1b-pt");
  mkdir((root + "/resid_post").c_str(), 0755);
  const std::string dir = root + "/resid_post/layer_7_width_16k_l0_small";
  mkdir(dir.c_str(), 0755);
  at::manual_seed(51);
  const at::Tensor w_enc = at::randn({6, 20}), w_dec = at::randn({20, 6});
  const at::Tensor b_enc = at::randn({20}) * 0.5, b_dec = at::randn({6});
  const at::Tensor threshold = at::rand({20}) - 0.5;  // some negative: relu decides there
  WriteTensors(dir + "/params.safetensors", {{"w_enc", w_enc},
                                             {"w_dec", w_dec},
                                             {"b_enc", b_enc},
                                             {"b_dec", b_dec},
                                             {"threshold", threshold}});
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  EXPECT_EQ(sae->config().architecture, SaeArchitecture::kJumpRelu);
  EXPECT_FALSE(sae->config().apply_b_dec_to_input);
  EXPECT_FALSE(sae->config().transcoder);
  EXPECT_EQ(sae->config().hook_name, "blocks.7.hook_resid_post");
  const at::Tensor x = at::randn({50, 6});
  const at::Tensor pre = at::mm(x, w_enc) + b_enc;
  const at::Tensor z = at::relu(pre) * (pre > threshold).to(at::kFloat);  // Gemma Scope 2's
  ASSERT_GT((pre < 0).logical_and(pre > threshold).sum().item<int64_t>(), 0);
  const SparseCodes codes = sae->EncodeSparse(x);
  for (int64_t r = 0; r < 50; ++r) {
    std::map<int, float> want;
    for (int j = 0; j < 20; ++j) {
      if (z[r][j].item<float>() != 0) want[j] = z[r][j].item<float>();
    }
    EXPECT_EQ(Row(codes, r), want) << "row " << r;
  }
  EXPECT_TRUE(at::allclose(sae->Predict(x, codes), at::mm(z, w_dec) + b_dec, 1e-5, 1e-5));
  // Its other sites by their directory names: an SAE of the MLP's output.
  for (const auto& [site, hook] :
       std::vector<std::pair<std::string, std::string>>{{"mlp_out", "blocks.4.hook_mlp_out"}}) {
    mkdir((root + "/" + site).c_str(), 0755);
    const std::string other = root + "/" + site + "/layer_4_width_16k_l0_small";
    mkdir(other.c_str(), 0755);
    WriteTensors(other + "/params.safetensors", {{"w_enc", w_enc},
                                                 {"w_dec", w_dec},
                                                 {"b_enc", b_enc},
                                                 {"b_dec", b_dec},
                                                 {"threshold", threshold}});
    auto cfg = ReadAndCheckSae(other);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    EXPECT_EQ(cfg->hook_name, hook);
    EXPECT_FALSE(cfg->transcoder) << site;
  }

  // A transcoder with an affine skip: x times it is added to the prediction of its MLP output.
  mkdir((root + "/transcoder").c_str(), 0755);
  const std::string tc = root + "/transcoder/layer_3_width_16k_l0_small";
  mkdir(tc.c_str(), 0755);
  const at::Tensor affine = at::randn({6, 6});
  WriteTensors(tc + "/params.safetensors", {{"w_enc", w_enc},
                                            {"w_dec", w_dec},
                                            {"b_enc", b_enc},
                                            {"b_dec", b_dec},
                                            {"threshold", threshold},
                                            {"affine_skip_connection", affine}});
  auto transcoder = Sae::Load(tc);
  ASSERT_TRUE(transcoder.ok()) << transcoder.status();
  EXPECT_TRUE(transcoder->config().transcoder);
  EXPECT_TRUE(transcoder->config().skip);
  EXPECT_EQ(transcoder->config().hook_name_out, "blocks.3.hook_mlp_out");
  EXPECT_TRUE(transcoder->config().hook_name.empty());  // the path does not say
  EXPECT_TRUE(at::allclose(transcoder->Predict(x, transcoder->EncodeSparse(x)),
                           at::mm(z, w_dec) + b_dec + at::mm(x, affine), 1e-4, 1e-5));
  // Shapes are checked against w_enc.
  WriteTensors(tc + "/params.safetensors", {{"w_enc", w_enc},
                                            {"w_dec", w_dec},
                                            {"b_enc", b_enc},
                                            {"b_dec", b_dec},
                                            {"threshold", at::rand({19})}});
  absl::Status s = ReadAndCheckSae(tc).status();
  EXPECT_NE(s.message().find("tensor threshold has shape [19], w_enc implies [20]"),
            std::string::npos)
      << s;
}

// circuit-tracer's per-layer transcoders (a "transcoder_set"): layer_{L}.safetensors with
// nn.Linear's W_enc [d_sae, d_in], picked by the layer of the job's hook.
TEST(SaeTest, ReadsCircuitTracerTranscoderSetsByTheHooksLayer) {
  const std::string dir = TempDir("ct_plt");
  std::ofstream(dir + "/config.yaml") << "model_kind: transcoder_set\n"
                                         "feature_input_hook: \"mlp.hook_in\"\n"
                                         "feature_output_hook: \"mlp.hook_out\"\n"
                                         "scan: test/plt\n";
  at::manual_seed(41);
  std::vector<std::map<std::string, at::Tensor>> layers(2);
  for (int l = 0; l < 2; ++l) {
    layers[l] = {{"W_enc", at::randn({10, 6})},
                 {"b_enc", at::randn({10}) * 0.1},
                 {"W_dec", at::randn({10, 6})},
                 {"b_dec", at::randn({6})}};
  }
  layers[0]["W_skip"] = at::randn({6, 6});                         // layer 0: ReLU with a skip
  layers[1]["activation_function.threshold"] = at::rand({1, 10});  // layer 1: JumpReLU
  for (int l = 0; l < 2; ++l) {
    WriteTensors(dir + "/layer_" + std::to_string(l) + ".safetensors",
                 {layers[l].begin(), layers[l].end()});
  }
  const at::Tensor x = at::randn({9, 6});
  for (int l = 0; l < 2; ++l) {
    const std::string in = "blocks." + std::to_string(l) + ".mlp.hook_in";
    auto sae = Sae::Load(dir, Hook(in.c_str()));
    ASSERT_TRUE(sae.ok()) << sae.status();
    const SaeConfig& cfg = sae->config();
    EXPECT_TRUE(cfg.transcoder);
    EXPECT_FALSE(cfg.apply_b_dec_to_input);
    ASSERT_TRUE(cfg.circuit_tracer.has_value());
    EXPECT_EQ(cfg.circuit_tracer->layer, l);
    EXPECT_FALSE(cfg.circuit_tracer->cross_layer);
    EXPECT_EQ(cfg.hook_name, in);
    EXPECT_EQ(cfg.hook_name_out, "blocks." + std::to_string(l) + ".mlp.hook_out");
    std::map<std::string, at::Tensor>& w = layers[l];
    // circuit-tracer: F.linear(x, W_enc, b_enc), its activation, then acts @ W_dec + b_dec
    // (+ x @ W_skip.T).
    at::Tensor pre = at::linear(x, w["W_enc"], w["b_enc"]);
    at::Tensor want;
    if (l == 0) {
      EXPECT_EQ(cfg.architecture, SaeArchitecture::kRelu);
      EXPECT_TRUE(cfg.skip);
      want = at::mm(at::relu(pre), w["W_dec"]) + w["b_dec"] + at::mm(x, w["W_skip"].t());
    } else {
      EXPECT_EQ(cfg.architecture, SaeArchitecture::kJumpRelu);
      EXPECT_FALSE(cfg.skip);
      const at::Tensor t = w["activation_function.threshold"].reshape({10});
      want = at::mm(pre * (pre > t).to(at::kFloat), w["W_dec"]) + w["b_dec"];
    }
    const at::Tensor got = sae->Predict(x, sae->EncodeSparse(x));
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << l << ": " << (got - want).abs().max();
  }
  EXPECT_NE(Sae::Load(dir, Hook("blocks.0.mlp.hook_in"))->weight_hash(),
            Sae::Load(dir, Hook("blocks.1.mlp.hook_in"))->weight_hash());

  // Without a hook there is no layer to pick; past the release's layers there is none.
  absl::Status s = Sae::Load(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the hook picks the layer"), std::string::npos) << s;
  s = ReadAndCheckSae(dir, Hook("blocks.2.mlp.hook_in")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer 2 is not in the circuit-tracer release"), std::string::npos)
      << s;
  s = ReadAndCheckSae(dir, Hook("hidden_states.1")).status();
  EXPECT_NE(s.message().find("blocks.L.mlp.hook_in"), std::string::npos) << s;
  // A TopK set: circuit-tracer keeps negative pre-activations among the k, latentd would not.
  std::ofstream(dir + "/config.yaml") << "model_kind: transcoder_set\nactivation: topk\nk: 3\n";
  s = ReadAndCheckSae(dir, Hook("blocks.0.mlp.hook_in")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("TopK"), std::string::npos) << s;
  // activation: relu ignores a stored threshold, as circuit-tracer does.
  std::ofstream(dir + "/config.yaml") << "model_kind: transcoder_set\nactivation: relu\n";
  auto relu = ReadAndCheckSae(dir, Hook("blocks.1.mlp.hook_in"));
  ASSERT_TRUE(relu.ok()) << relu.status();
  EXPECT_EQ(relu->architecture, SaeArchitecture::kRelu);
  EXPECT_TRUE(relu->hook_name_out.empty());  // unsaid: the MLP output of the hook's block
  std::ofstream(dir + "/config.yaml") << "model_kind: transcoder_set\n"
                                         "feature_output_hook: hook_mlp_post\n";
  s = ReadAndCheckSae(dir, Hook("blocks.1.mlp.hook_in")).status();
  EXPECT_NE(s.message().find("feature_output_hook \"hook_mlp_post\""), std::string::npos) << s;
  // Shapes are checked against W_enc.
  std::ofstream(dir + "/config.yaml") << "model_kind: transcoder_set\n";
  WriteTensors(dir + "/layer_1.safetensors", {{"W_enc", at::randn({10, 6})},
                                              {"b_enc", at::randn({10})},
                                              {"W_dec", at::randn({9, 6})},
                                              {"b_dec", at::randn({6})}});
  s = ReadAndCheckSae(dir, Hook("blocks.1.mlp.hook_in")).status();
  EXPECT_NE(s.message().find("tensor W_dec has shape [9, 6], W_enc implies [10, 6]"),
            std::string::npos)
      << s;
}

// circuit-tracer's cross-layer transcoder: the latents of layer L read layer L's input and
// write to layers L..n-1 through W_dec_L [d_sae, n - L, d_out].
TEST(SaeTest, ReadsCircuitTracerCrossLayerTranscoders) {
  const std::string dir = TempDir("ct_clt");
  std::ofstream(dir + "/config.yaml") << "model_kind: cross_layer_transcoder\n"
                                         "feature_input_hook: hook_resid_mid\n"
                                         "feature_output_hook: hook_mlp_out\n";
  const int n = 3;
  at::manual_seed(43);
  std::vector<at::Tensor> W_enc, b_enc, b_dec, threshold, W_dec;
  for (int l = 0; l < n; ++l) {
    const std::string i = std::to_string(l);
    W_enc.push_back(at::randn({10, 6}));
    b_enc.push_back(at::randn({10}) * 0.1);
    b_dec.push_back(at::randn({6}));
    threshold.push_back(at::rand({10}));
    W_dec.push_back(at::randn({10, n - l, 6}));
    WriteTensors(dir + "/W_enc_" + i + ".safetensors", {{"W_enc_" + i, W_enc[l]},
                                                        {"b_enc_" + i, b_enc[l]},
                                                        {"b_dec_" + i, b_dec[l]},
                                                        {"threshold_" + i, threshold[l]}});
    // Layer 1's decoder in float16: slices convert like whole tensors.
    WriteTensors(dir + "/W_dec_" + i + ".safetensors", {{"W_dec_" + i, W_dec[l]}},
                 l == 1 ? std::set<std::string>{"W_dec_1"} : std::set<std::string>{});
    if (l == 1) W_dec[l] = W_dec[l].to(at::kHalf).to(at::kFloat);
  }
  auto sae = Sae::Load(dir, Hook("blocks.2.hook_resid_mid"));
  ASSERT_TRUE(sae.ok()) << sae.status();
  const SaeConfig& cfg = sae->config();
  ASSERT_TRUE(cfg.circuit_tracer.has_value());
  EXPECT_TRUE(cfg.circuit_tracer->cross_layer);
  EXPECT_EQ(cfg.circuit_tracer->layer, 2);
  EXPECT_EQ(cfg.circuit_tracer->n_layers, n);
  EXPECT_EQ(cfg.architecture, SaeArchitecture::kJumpRelu);
  EXPECT_EQ(cfg.hook_name, "blocks.2.hook_resid_mid");
  EXPECT_EQ(cfg.hook_name_out, "blocks.2.hook_mlp_out");
  EXPECT_TRUE(at::equal(sae->weights().W_dec, W_dec[2].select(1, 0)));
  // The prediction of layer 2's output sums what layers 0, 1 and 2 decode into it.
  std::vector<at::Tensor> x, z;
  for (int l = 0; l < n; ++l) {
    x.push_back(at::randn({5, 6}));
    const at::Tensor pre = at::linear(x[l], W_enc[l], b_enc[l]);
    z.push_back(pre * (pre > threshold[l]).to(at::kFloat));
  }
  at::Tensor want = b_dec[2].clone();
  at::Tensor got = sae->Predict(x[2], sae->EncodeSparse(x[2]));
  for (int l = 0; l < n; ++l) want = want + at::mm(z[l], W_dec[l].select(1, 2 - l));
  for (int l = 0; l < 2; ++l) {
    auto decoder = LoadCrossLayerDecoder(dir, l, 2);
    ASSERT_TRUE(decoder.ok()) << decoder.status();
    EXPECT_TRUE(at::equal(*decoder, W_dec[l].select(1, 2 - l))) << l;
    auto earlier =
        Sae::Load(dir, Hook(l == 0 ? "blocks.0.hook_resid_mid" : "blocks.1.hook_resid_mid"));
    ASSERT_TRUE(earlier.ok()) << earlier.status();
    got = got + earlier->EncodeDense(x[l]).mm(*decoder);
  }
  EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5)) << (got - want).abs().max();

  EXPECT_FALSE(LoadCrossLayerDecoder(dir, 2, 1).ok());  // latents write forward only
  EXPECT_FALSE(LoadCrossLayerDecoder(dir, 0, 3).ok());  // past the last layer
  // A decoder that does not span the layers after its own.
  WriteTensors(dir + "/W_dec_1.safetensors", {{"W_dec_1", at::randn({10, 1, 6})}});
  absl::Status s = ReadAndCheckSae(dir, Hook("blocks.1.hook_resid_mid")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor W_dec_1 has shape [10, 1, 6]"), std::string::npos) << s;
}

// lm-saes' layout (Llama Scope's release), d_in 5, d_sae 20: nn.Linear weights in
// checkpoints/final.safetensors, the encoder's settings in hyperparams.json.
struct LmSaesWeights {
  at::Tensor encoder_weight, encoder_bias, decoder_weight, decoder_bias, log_threshold;
};

LmSaesWeights RandomLmSaesWeights(uint64_t seed) {
  at::manual_seed(seed);
  LmSaesWeights w{at::randn({20, 5}), at::randn({20}) * 0.3, at::randn({5, 20}),
                  at::randn({5}) * 0.2, at::rand({20}) * 0.5 - 1.5};
  // Decoder directions of unequal norms (what sparsity_include_decoder_norm weighs), one zero.
  w.decoder_weight.mul_(at::rand({1, 20}) * 1.7 + 0.3);
  w.decoder_weight.select(1, 5).zero_();
  return w;
}

void WriteLmSaes(const std::string& dir, const LmSaesWeights& w, const std::string& hyperparams,
                 bool with_log_threshold = false) {
  mkdir((dir + "/checkpoints").c_str(), 0755);
  std::vector<StTensorToWrite> tensors = {
      {"encoder.weight", StDtype::kF32, {20, 5}, w.encoder_weight.data_ptr()},
      {"encoder.bias", StDtype::kF32, {20}, w.encoder_bias.data_ptr()},
      {"decoder.weight", StDtype::kF32, {5, 20}, w.decoder_weight.data_ptr()},
      {"decoder.bias", StDtype::kF32, {5}, w.decoder_bias.data_ptr()}};
  if (with_log_threshold) {
    tensors.push_back({"log_jumprelu_threshold", StDtype::kF32, {20}, w.log_threshold.data_ptr()});
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/checkpoints/final.safetensors", tensors, {}).ok());
  std::ofstream(dir + "/hyperparams.json") << hyperparams;
}

// What lm-saes computes, in float64: x scaled by s_in, b_dec subtracted when asked, a latent
// firing where its score (pre, times its decoder norm when asked) passes its threshold, the
// reconstruction scaled back by s_out. `boundary` is |score - threshold| (ties are not asserted).
struct LmSaesReference {
  at::Tensor z, x_hat, boundary;
};

LmSaesReference LmSaesEncode(const LmSaesWeights& w, const at::Tensor& x, double s_in, double s_out,
                             bool subtract_b_dec, bool times_decoder_norm,
                             const at::Tensor& threshold, bool relu) {
  auto d = [](const at::Tensor& t) { return t.to(at::kDouble); };
  at::Tensor in = d(x) * s_in;
  if (subtract_b_dec) in = in - d(w.decoder_bias);
  const at::Tensor pre = at::addmm(d(w.encoder_bias), in, d(w.encoder_weight).t());
  const at::Tensor score = times_decoder_norm ? pre * d(w.decoder_weight).norm(2, {0}) : pre;
  const at::Tensor t = relu ? at::zeros({20}, at::kDouble) : d(threshold);
  const at::Tensor z = pre * (score > t).to(at::kDouble);
  const at::Tensor x_hat = at::addmm(d(w.decoder_bias), z, d(w.decoder_weight).t()) / s_out;
  return {z, x_hat, (score - t).abs()};
}

void ExpectLatentsMatch(const Sae& sae, const at::Tensor& x, const LmSaesReference& want) {
  const at::Tensor got = sae.EncodeDense(x).to(at::kDouble);
  const at::Tensor differ = ((got != 0) != (want.z != 0)) & (want.boundary > 1e-4);
  EXPECT_EQ(differ.sum().item<int64_t>(), 0) << "latents that fire differently";
  const at::Tensor both = (got != 0) & (want.z != 0);
  EXPECT_TRUE(at::allclose(got * both, want.z * both, 1e-4, 1e-4));
  EXPECT_GT(both.sum().item<int64_t>(), 0);
  EXPECT_LT(both.sum().item<int64_t>(), x.size(0) * 20);  // the threshold does cut
  EXPECT_TRUE(
      at::allclose(sae.Decode(want.z.to(at::kFloat)).to(at::kDouble), want.x_hat, 1e-4, 1e-4));
}

TEST(SaeTest, LoadsLlamaScopesLayoutAndEncodesAsLmSaesDoes) {
  const std::string dir = TempDir("sae_llama_scope");
  const LmSaesWeights w = RandomLmSaesWeights(8);
  // Llama Scope's settings: a scalar threshold on pre * |decoder direction|, the input scaled to
  // mean norm sqrt(d_model), b_dec only on the decoder side.
  WriteLmSaes(dir, w, R"({"d_model": 5, "expansion_factor": 4, "d_sae": 20,
      "hook_point_in": "blocks.3.hook_resid_post", "hook_point_out": "blocks.3.hook_resid_post",
      "act_fn": "jumprelu", "jump_relu_threshold": 0.4, "top_k": 50,
      "norm_activation": "dataset-wise",
      "dataset_average_activation_norm": {"in": 1.7, "out": 1.7},
      "use_decoder_bias": true, "apply_decoder_bias_to_pre_encoder": false,
      "sparsity_include_decoder_norm": true})");
  auto cfg = ReadAndCheckSae(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->architecture, SaeArchitecture::kJumpRelu);
  EXPECT_EQ(cfg->hook_name, "blocks.3.hook_resid_post");
  EXPECT_FALSE(cfg->apply_b_dec_to_input);
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  at::manual_seed(9);
  const at::Tensor x = at::randn({64, 5}) * 2;
  const double s = std::sqrt(5.0) / 1.7;
  const LmSaesReference want =
      LmSaesEncode(w, x, s, s, false, true, at::full({20}, 0.4, at::kDouble), false);
  ExpectLatentsMatch(*sae, x, want);
  EXPECT_EQ(sae->EncodeDense(x).select(1, 5).abs().sum().item<float>(), 0);  // zero direction
  // The sparse codes hold the same latents.
  const SparseCodes codes = sae->EncodeSparse(x);
  const at::Tensor dense = sae->EncodeDense(x);
  for (int64_t r = 0; r < x.size(0); ++r) {
    std::map<int, float> from_dense;
    for (int64_t j = 0; j < 20; ++j) {
      if (dense[r][j].item<float>() != 0) from_dense[j] = dense[r][j].item<float>();
    }
    EXPECT_EQ(Row(codes, r), from_dense) << "row " << r;
  }

  // The threshold lives in hyperparams.json, so the recorded hash follows it.
  const std::string hash = sae->weight_hash();
  WriteLmSaes(dir, w, R"({"d_model": 5, "d_sae": 20, "hook_point_in": "blocks.3.hook_resid_post",
      "act_fn": "jumprelu", "jump_relu_threshold": 0.5, "norm_activation": "dataset-wise",
      "dataset_average_activation_norm": {"in": 1.7, "out": 1.7},
      "apply_decoder_bias_to_pre_encoder": false})");
  auto changed = Sae::Load(dir);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_NE(changed->weight_hash(), hash);
}

TEST(SaeTest, LoadsLmSaesOtherSettings) {
  const LmSaesWeights w = RandomLmSaesWeights(10);
  at::manual_seed(11);
  const at::Tensor x = at::randn({64, 5}) * 2;
  {  // Per-latent log thresholds in the weights, standardised weights, b_dec subtracted first,
     // scores without the decoder norm.
    const std::string dir = TempDir("sae_lm_saes_log_threshold");
    WriteLmSaes(dir, w, R"({"d_model": 5, "expansion_factor": 4,
        "hook_point_in": "blocks.1.hook_mlp_out", "act_fn": "jumprelu",
        "norm_activation": "inference", "apply_decoder_bias_to_pre_encoder": true,
        "sparsity_include_decoder_norm": false})",
                /*with_log_threshold=*/true);
    auto sae = Sae::Load(dir);
    ASSERT_TRUE(sae.ok()) << sae.status();
    EXPECT_TRUE(sae->config().apply_b_dec_to_input);
    ExpectLatentsMatch(*sae, x,
                       LmSaesEncode(w, x, 1, 1, true, false, w.log_threshold.exp(), false));
  }
  {  // ReLU, input and output norms keyed by hook point, different.
    const std::string dir = TempDir("sae_lm_saes_relu");
    WriteLmSaes(dir, w, R"({"d_model": 5, "d_sae": 20, "hook_point_in": "blocks.2.hook_attn_out",
        "act_fn": "relu", "norm_activation": "dataset-wise",
        "dataset_average_activation_norm": {"blocks.2.hook_attn_out": 3.0},
        "apply_decoder_bias_to_pre_encoder": false})");
    auto sae = Sae::Load(dir);
    ASSERT_TRUE(sae.ok()) << sae.status();
    EXPECT_EQ(sae->config().architecture, SaeArchitecture::kRelu);
    const double s = std::sqrt(5.0) / 3.0;
    ExpectLatentsMatch(*sae, x, LmSaesEncode(w, x, s, s, false, true, at::Tensor(), true));
  }
}

// sparsify names a transcoder's directory after the MLP it replaces (layers.3.mlp: reads the
// MLP's input, predicts its output); lm-saes' has a hook_point_out of its own, whose norm scales
// the prediction.
TEST(SaeTest, FindsTranscodersInSparsifyAndLmSaesLayouts) {
  TempDir("sparsify_tc");
  const std::string dir = TempDir("sparsify_tc/layers.3.mlp");
  SaeWeights w = RandomWeights(4, 12, 8);
  const at::Tensor enc = w.W_enc.t().contiguous();
  const at::Tensor skip = at::randn({4, 4});
  ASSERT_TRUE(WriteSafetensors(dir + "/sae.safetensors",
                               {{"encoder.weight", StDtype::kF32, {12, 4}, enc.data_ptr()},
                                {"encoder.bias", StDtype::kF32, {12}, w.b_enc.data_ptr()},
                                {"W_dec", StDtype::kF32, {12, 4}, w.W_dec.data_ptr()},
                                {"b_dec", StDtype::kF32, {4}, w.b_dec.data_ptr()},
                                {"W_skip", StDtype::kF32, {4, 4}, skip.data_ptr()}})
                  .ok());
  std::ofstream(dir + "/cfg.json")
      << R"({"d_in": 4, "num_latents": 12, "k": 3, "transcode": true, "skip_connection": true})";
  auto cfg = ReadAndCheckSae(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(cfg->transcoder && cfg->skip);
  EXPECT_FALSE(cfg->apply_b_dec_to_input);
  EXPECT_EQ(cfg->hook_name, "");
  EXPECT_EQ(cfg->hook_name_out, "layers.3.mlp");

  const std::string lm = TempDir("lm_saes_tc");
  const LmSaesWeights lw = RandomLmSaesWeights(13);
  WriteLmSaes(lm, lw,
              R"({"d_model": 5, "d_sae": 20, "hook_point_in": "blocks.3.ln2.hook_normalized",
      "hook_point_out": "blocks.3.hook_mlp_out", "act_fn": "relu",
      "norm_activation": "dataset-wise", "dataset_average_activation_norm": {"in": 2.0, "out": 4.0},
      "apply_decoder_bias_to_pre_encoder": false})");
  auto sae = Sae::Load(lm);
  ASSERT_TRUE(sae.ok()) << sae.status();
  EXPECT_TRUE(sae->config().transcoder);
  EXPECT_EQ(sae->config().hook_name_out, "blocks.3.hook_mlp_out");
  const at::Tensor x = at::randn({6, 5});
  const double s_in = std::sqrt(5.0) / 2.0, s_out = std::sqrt(5.0) / 4.0;
  const LmSaesReference want = LmSaesEncode(lw, x, s_in, s_out, false, true, at::Tensor(), true);
  ExpectLatentsMatch(*sae, x, want);
}

// Settings whose latents latentd would not reproduce are refused at submit, naming the field.
TEST(SaeTest, RefusesLmSaesSettingsItCannotReproduce) {
  const std::string dir = TempDir("sae_lm_saes_bad");
  const LmSaesWeights w = RandomLmSaesWeights(12);
  const std::string base =
      R"("d_model": 5, "d_sae": 20, "hook_point_in": "blocks.3.hook_resid_post",
      "jump_relu_threshold": 0.4, "dataset_average_activation_norm": {"in": 1.7, "out": 1.7})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("act_fn": "jumprelu", "norm_activation": "token-wise", "apply_decoder_bias_to_pre_encoder": false)",
       "token-wise"},
      {R"("act_fn": "jumprelu", "norm_activation": "dataset-wise")",
       "apply_decoder_bias_to_pre_encoder missing"},
      {R"("act_fn": "batchtopk", "norm_activation": "dataset-wise", "apply_decoder_bias_to_pre_encoder": false)",
       "batchtopk"},
      {R"("act_fn": "topk", "top_k": 4, "norm_activation": "dataset-wise", "apply_decoder_bias_to_pre_encoder": false)",
       "sparsity_include_decoder_norm"},
      {R"("act_fn": "jumprelu", "norm_activation": "dataset-wise", "apply_decoder_bias_to_pre_encoder": true,
          "hook_point_out": "blocks.3.hook_mlp_out")",
       "transcoder's decoder bias"},
      {R"("act_fn": "jumprelu", "norm_activation": "dataset-wise", "apply_decoder_bias_to_pre_encoder": false,
          "use_glu_encoder": true)",
       "use_glu_encoder"},
      {R"("norm_activation": "dataset-wise", "apply_decoder_bias_to_pre_encoder": false)",
       "act_fn missing"},
  };
  for (const auto& [fields, expected] : cases) {
    WriteLmSaes(dir, w, "{" + base + ", " + fields + "}");
    const absl::Status s = ReadAndCheckSae(dir).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << fields;
    EXPECT_NE(s.message().find(expected), std::string::npos) << s;
  }
  // dataset-wise without its norms; jumprelu without any threshold.
  WriteLmSaes(dir, w, R"({"d_model": 5, "d_sae": 20, "hook_point_in": "blocks.3.hook_resid_post",
      "act_fn": "jumprelu", "jump_relu_threshold": 0.4, "norm_activation": "dataset-wise",
      "apply_decoder_bias_to_pre_encoder": false})");
  EXPECT_NE(ReadAndCheckSae(dir).status().message().find("dataset_average_activation_norm"),
            std::string::npos);
  WriteLmSaes(dir, w, R"({"d_model": 5, "d_sae": 20, "hook_point_in": "blocks.3.hook_resid_post",
      "act_fn": "jumprelu", "norm_activation": "inference",
      "apply_decoder_bias_to_pre_encoder": false})");
  EXPECT_NE(ReadAndCheckSae(dir).status().message().find("jump_relu_threshold"), std::string::npos);
  // A d_model the weights do not have.
  WriteLmSaes(dir, w, R"({"d_model": 6, "d_sae": 20, "hook_point_in": "blocks.3.hook_resid_post",
      "act_fn": "relu", "norm_activation": "inference",
      "apply_decoder_bias_to_pre_encoder": false})");
  EXPECT_NE(ReadAndCheckSae(dir).status().message().find("encoder.weight has shape [20, 5]"),
            std::string::npos)
      << ReadAndCheckSae(dir).status();
  // No weights where lm-saes puts them.
  const std::string empty = TempDir("sae_lm_saes_no_weights");
  std::ofstream(empty + "/hyperparams.json")
      << R"({"d_model": 5, "d_sae": 20, "hook_point_in": "blocks.3.hook_resid_post",
             "act_fn": "relu", "norm_activation": "inference",
             "apply_decoder_bias_to_pre_encoder": false})";
  EXPECT_EQ(Sae::Load(empty).status().code(), absl::StatusCode::kNotFound);
}

TEST(SaeTest, RejectsShapeMismatchMissingTensorsBadConfigAndNonFiniteWeights) {
  std::string dir = TempDir("sae_bad");
  SaeWeights w = RandomWeights(8, 16, 6);
  ASSERT_TRUE(SaveSae(dir, w, Cfg(SaeArchitecture::kRelu, 8, 16)).ok());
  std::ofstream(dir + "/cfg.json") << R"({"d_in": 8, "d_sae": 32, "architecture": "standard"})";
  EXPECT_EQ(Sae::Load(dir).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(dir + "/cfg.json") << R"({"d_in": 8, "d_sae": 16, "architecture": "jumprelu"})";
  ASSERT_TRUE(SaveSae(dir, {w.W_enc, w.b_enc, w.W_dec, w.b_dec, at::Tensor()},
                      Cfg(SaeArchitecture::kRelu, 8, 16))
                  .ok());
  std::ofstream(dir + "/cfg.json") << R"({"d_in": 8, "d_sae": 16, "architecture": "jumprelu"})";
  EXPECT_EQ(Sae::Load(dir).status().code(), absl::StatusCode::kInvalidArgument);  // no threshold
  std::ofstream(dir + "/cfg.json")
      << R"({"d_in": 8, "d_sae": 16, "architecture": "topk", "k": 99})";
  EXPECT_EQ(Sae::Load(dir).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(dir + "/cfg.json") << R"({"d_in": 8, "d_sae": 16, "architecture": "gated2"})";
  EXPECT_EQ(Sae::Load(dir).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(dir + "/cfg.json") << "not json";
  EXPECT_EQ(Sae::Load(dir).status().code(), absl::StatusCode::kInvalidArgument);
  // SAELens options the encoder would have to apply: refused, naming the field (the latents
  // would otherwise silently not be the SAE's); their neutral values load.
  for (const char* option :
       {R"("normalize_activations": "expected_average_only_in")",
        R"("normalize_activations": "batch_norm")", R"("rescale_acts_by_decoder_norm": true)"}) {
    std::ofstream(dir + "/cfg.json")
        << R"({"d_in": 8, "d_sae": 16, "architecture": "standard", )" << option << "}";
    const absl::Status s = Sae::Load(dir).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << option;
    EXPECT_NE(s.message().find(std::string(option).substr(1, 12)), std::string::npos) << s;
  }
  for (const char* option :
       {R"("normalize_activations": "none")", R"("normalize_activations": null)",
        R"("normalize_activations": "layer_norm")", R"("rescale_acts_by_decoder_norm": false)"}) {
    std::ofstream(dir + "/cfg.json")
        << R"({"d_in": 8, "d_sae": 16, "architecture": "standard", )" << option << "}";
    EXPECT_TRUE(Sae::Load(dir).ok()) << option;
  }
  EXPECT_EQ(Sae::Load(TempDir("sae_empty")).status().code(), absl::StatusCode::kNotFound);
  SaeWeights nan = RandomWeights(8, 16, 7);
  nan.W_dec[0][0] = std::nanf("");
  EXPECT_EQ(Sae::Create(Cfg(SaeArchitecture::kRelu, 8, 16), nan).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace latentd::engine
