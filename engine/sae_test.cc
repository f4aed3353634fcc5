#include "engine/sae.h"

#include <fstream>
#include <set>

#include "engine/safetensors.h"
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
  for (const char* option : {R"("normalize_activations": "constant_norm_rescale")",
                             R"("normalize_activations": "expected_average_only_in")",
                             R"("rescale_acts_by_decoder_norm": true)"}) {
    std::ofstream(dir + "/cfg.json")
        << R"({"d_in": 8, "d_sae": 16, "architecture": "standard", )" << option << "}";
    const absl::Status s = Sae::Load(dir).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << option;
    EXPECT_NE(s.message().find(std::string(option).substr(1, 12)), std::string::npos) << s;
  }
  for (const char* option :
       {R"("normalize_activations": "none")", R"("normalize_activations": null)",
        R"("rescale_acts_by_decoder_norm": false)"}) {
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
