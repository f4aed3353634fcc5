#include "engine/clt_model.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/hook_name.h"
#include "engine/sae.h"

namespace latentd::engine {
namespace {

constexpr int64_t kLayers = 3;
constexpr int64_t kDin = 6;
constexpr int64_t kDsae = 10;
constexpr int64_t kDout = 5;

CltModelOptions Options(latentd::v1::SaeArchitecture architecture) {
  CltModelOptions o;
  o.architecture = architecture;
  o.layers = kLayers;
  o.d_in = kDin;
  o.d_sae = kDsae;
  o.d_out = kDout;
  o.k = 3;
  o.l1_coefficient = 0.25;
  o.jumprelu_threshold = 0.2;
  o.seed = 7;
  return o;
}

// Rows of kLayers inputs then kLayers targets, and a model whose biases are not zero.
torch::Tensor Rows(int64_t n, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn({n, kLayers * (kDin + kDout)}, gen, torch::kFloat32);
}

void PerturbBiases(CltModelImpl& clt) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(99);
  for (int64_t l = 0; l < kLayers; ++l) {
    clt.b_enc[l].copy_(0.3 * at::randn({kDsae}, gen, torch::kFloat32));
    clt.b_dec[l].copy_(at::randn({kDout}, gen, torch::kFloat32));
  }
}

TEST(CltModelTest, EachLayerIsPredictedFromItsOwnAndEveryEarlierLayersLatents) {
  CltModel clt(Options(latentd::v1::RELU));
  PerturbBiases(*clt);
  const torch::Tensor rows = Rows(8, 1);
  const SaeForward forward = clt->Forward(rows);
  // The formula, a latent and a layer at a time, in float64.
  const torch::Tensor r = rows.to(torch::kFloat64);
  std::vector<torch::Tensor> z;
  for (int64_t l = 0; l < kLayers; ++l) {
    const torch::Tensor x = r.narrow(1, l * kDin, kDin);
    z.push_back(torch::relu(x.matmul(clt->W_enc[l].detach().to(torch::kFloat64)) +
                            clt->b_enc[l].detach().to(torch::kFloat64)));
  }
  double squared_error = 0;
  double sparsity = 0;
  for (int64_t L = 0; L < kLayers; ++L) {
    torch::Tensor y_hat = clt->b_dec[L].detach().to(torch::kFloat64).expand({8, kDout}).clone();
    for (int64_t l = 0; l <= L; ++l) {
      for (int64_t j = 0; j < kDsae; ++j) {
        const torch::Tensor decoder = clt->W_dec[l].detach().to(torch::kFloat64)[j][L - l];
        y_hat += z[l].select(1, j).unsqueeze(1) * decoder.unsqueeze(0);
      }
    }
    const torch::Tensor y = r.narrow(1, kLayers * kDin + L * kDout, kDout);
    EXPECT_TRUE(torch::allclose(
        forward.x_hat.detach().narrow(1, L * kDout, kDout).to(torch::kFloat64), y_hat, 1e-5, 1e-5))
        << "layer " << L;
    squared_error += (y - y_hat).pow(2).sum().item<double>();
    // Each block's own share, for its FVU.
    const double block_error = (y - y_hat).pow(2).sum().item<double>();
    EXPECT_NEAR(forward.block_squared_error[L], block_error, 1e-4 * block_error) << "layer " << L;
    const double block_centred =
        (y - clt->b_dec[L].detach().to(torch::kFloat64)).pow(2).sum().item<double>();
    EXPECT_NEAR(forward.block_centred_squares[L], block_centred, 1e-4 * block_centred);
  }
  EXPECT_EQ(forward.block_squared_error.size(), static_cast<size_t>(kLayers));
  for (int64_t l = 0; l < kLayers; ++l) {
    // ReLU's L1 weighs a latent by the norm of everything it writes, every later layer included.
    const torch::Tensor norms =
        clt->W_dec[l].detach().to(torch::kFloat64).reshape({kDsae, -1}).norm(2, {1});
    sparsity += (z[l] * norms).sum().item<double>() / 8;
  }
  EXPECT_NEAR(forward.squared_error, squared_error, 1e-4 * squared_error);
  EXPECT_NEAR(forward.loss.item<double>(), squared_error / 8 + 0.25 * sparsity,
              1e-4 * forward.loss.item<double>());
  EXPECT_EQ(forward.latents.size(1), kLayers * kDsae);
  // The loss reaches every parameter: each layer's decoder into each later layer.
  forward.loss.backward();
  for (int64_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(clt->W_dec[l].grad().defined());
    for (int64_t t = 0; t < kLayers - l; ++t) {
      EXPECT_GT(clt->W_dec[l].grad().select(1, t).abs().sum().item<double>(), 0)
          << "layer " << l << " into " << l + t;
    }
  }
}

TEST(CltModelTest, BatchTopKKeepsKARowOfEachLayerAndCalibratesEachLayersThreshold) {
  CltModel clt(Options(latentd::v1::BATCHTOPK));
  PerturbBiases(*clt);
  const torch::Tensor rows = Rows(16, 2);
  const SaeForward forward = clt->Forward(rows);
  for (int64_t l = 0; l < kLayers; ++l) {
    const torch::Tensor layer = forward.latents.narrow(1, l * kDsae, kDsae);
    EXPECT_EQ((layer != 0).sum().item<int64_t>(), 3 * 16) << "layer " << l;
  }
  EXPECT_DOUBLE_EQ(forward.l0, 3.0);
  clt->CalibrateBatchThresholds({rows});
  for (int64_t l = 0; l < kLayers; ++l) {
    const double threshold = clt->batch_threshold[l].item<double>();
    const torch::Tensor pre =
        rows.narrow(1, l * kDin, kDin).matmul(clt->W_enc[l].detach()) + clt->b_enc[l].detach();
    // The smallest value the batch kept: at it the layer fires k a row (and that one does not).
    const torch::Tensor kept = std::get<0>(torch::relu(pre).flatten().topk(3 * 16));
    EXPECT_FLOAT_EQ(threshold, kept.min().item<float>()) << "layer " << l;
    const torch::Tensor latents = clt->Encode(rows)[l];
    EXPECT_EQ((latents != 0).sum().item<int64_t>(), 3 * 16 - 1) << "layer " << l;
  }
}

TEST(CltModelTest, DecoderRowsStayUnitNormOverEverythingALatentWrites) {
  CltModel clt(Options(latentd::v1::JUMPRELU));
  const SaeForward forward = clt->Forward(Rows(8, 3));
  forward.loss.backward();
  clt->RemoveParallelDecoderGrad();
  for (int64_t l = 0; l < kLayers; ++l) {
    const torch::Tensor w = clt->W_dec[l].detach().reshape({kDsae, -1});
    const torch::Tensor g = clt->W_dec[l].grad().reshape({kDsae, -1});
    EXPECT_NEAR((w * g).sum(1).abs().max().item<double>(), 0, 1e-6) << "layer " << l;
    torch::NoGradGuard no_grad;
    clt->W_dec[l].mul_(1.5);
  }
  clt->NormalizeDecoder();
  for (int64_t l = 0; l < kLayers; ++l) {
    const torch::Tensor norms = clt->W_dec[l].detach().reshape({kDsae, -1}).norm(2, {1});
    EXPECT_TRUE(torch::allclose(norms, torch::ones({kDsae}), 1e-5, 1e-5)) << "layer " << l;
  }
}

// What EXTRACT loads from the saved release computes what the model does: each layer's latents
// (Sae::Load picks the layer by the hook's block) and each layer's prediction from the decoders
// of every layer up to it (LoadCrossLayerDecoder).
void ExpectReleaseComputesTheModel(latentd::v1::SaeArchitecture architecture) {
  SCOPED_TRACE(latentd::v1::SaeArchitecture_Name(architecture));
  CltModel clt(Options(architecture));
  // Hooks of unlike scales, which the model trains at one scale and the release reads as they are.
  auto unlike_rows = [](uint64_t seed) {
    torch::Tensor rows = Rows(32, seed);
    rows.narrow(1, 0, kLayers * kDin).mul_(5);
    for (int64_t L = 0; L < kLayers; ++L) {
      rows.narrow(1, kLayers * kDin + L * kDout, kDout).mul_(0.02 * (L + 1));
    }
    return rows;
  };
  const torch::Tensor rows = unlike_rows(4);
  clt->InitFromData(rows);
  EXPECT_NEAR(clt->output_scale[2].item<double>() * 3, clt->output_scale[0].item<double>(),
              0.2 * clt->output_scale[0].item<double>());
  EXPECT_GT(clt->output_scale[0].item<double>(), 10);
  EXPECT_LT(clt->input_scale[0].item<double>(), 0.5);
  PerturbBiases(*clt);
  // Thresholds from other rows: a value of `rows` exactly at its threshold would fire or not
  // by the rounding of the folded weights.
  if (architecture == latentd::v1::BATCHTOPK) clt->CalibrateBatchThresholds({unlike_rows(5)});
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/clt_",
                                       latentd::v1::SaeArchitecture_Name(architecture));
  ASSERT_TRUE(clt->Save(dir, {"ln2.hook_normalized", "hook_mlp_out", "reference"}).ok());
  std::ifstream yaml(dir + "/config.yaml");
  std::stringstream text;
  text << yaml.rdbuf();
  EXPECT_NE(text.str().find("model_kind: cross_layer_transcoder"), std::string::npos);
  EXPECT_NE(text.str().find(architecture == latentd::v1::RELU ? "activation: relu"
                                                              : "activation: jumprelu"),
            std::string::npos);

  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> latents = clt->Encode(rows);
  const torch::Tensor prediction = clt->Decode(latents);
  std::vector<torch::Tensor> loaded_latents;
  for (int64_t L = 0; L < kLayers; ++L) {
    auto hook = ParseHookName(absl::StrCat("blocks.", L, ".ln2.hook_normalized"));
    ASSERT_TRUE(hook.ok());
    auto sae = Sae::Load(dir, *hook);
    ASSERT_TRUE(sae.ok()) << sae.status();
    EXPECT_EQ(sae->config().hook_name_out, absl::StrCat("blocks.", L, ".hook_mlp_out"));
    EXPECT_EQ(sae->config().d_sae, kDsae);
    const torch::Tensor x = rows.narrow(1, L * kDin, kDin);
    loaded_latents.push_back(sae->EncodeDense(x));
    EXPECT_TRUE(torch::allclose(loaded_latents.back(), latents[L], 1e-5, 1e-5)) << "layer " << L;
    EXPECT_GT((latents[L] != 0).sum().item<int64_t>(), 0) << "layer " << L;
    torch::Tensor y_hat = sae->weights().b_dec.unsqueeze(0).expand({32, kDout}).clone();
    for (int64_t l = 0; l <= L; ++l) {
      auto decoder = LoadCrossLayerDecoder(dir, static_cast<int>(l), static_cast<int>(L));
      ASSERT_TRUE(decoder.ok()) << decoder.status();
      y_hat += loaded_latents[l].matmul(*decoder);
    }
    EXPECT_TRUE(torch::allclose(y_hat, prediction.narrow(1, L * kDout, kDout), 1e-4, 1e-4))
        << "layer " << L;
  }
}

TEST(CltModelTest, TheSavedCircuitTracerReleaseComputesWhatTheModelDoes) {
  ExpectReleaseComputesTheModel(latentd::v1::RELU);
  ExpectReleaseComputesTheModel(latentd::v1::JUMPRELU);
  ExpectReleaseComputesTheModel(latentd::v1::BATCHTOPK);
}

TEST(CltModelTest, OptionsRefuseWhatACrossLayerTranscoderDoesNotHave) {
  latentd::v1::SaeTrainConfig config;
  config.set_cross_layers(2);
  config.set_d_sae(64);
  auto options = CltModelOptionsFromProto(config, 16, 16, 0);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->architecture, latentd::v1::BATCHTOPK);  // unset
  EXPECT_EQ(options->layers, 2);
  EXPECT_EQ(options->RowWidth(), 64);
  auto refused = [&](latentd::v1::SaeTrainConfig bad, const std::string& field) {
    const absl::Status status = CltModelOptionsFromProto(bad, 16, 16, 0).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(status.message().find(field), std::string::npos) << status;
  };
  latentd::v1::SaeTrainConfig bad = config;
  bad.set_architecture(latentd::v1::TOPK);
  refused(bad, "train.sae.architecture");
  bad = config;
  bad.add_matryoshka_widths(32);
  refused(bad, "train.sae.matryoshka_widths");
  bad = config;
  bad.set_skip_connection(true);
  refused(bad, "train.sae.skip_connection");
  bad = config;
  bad.set_aux_k_coefficient(0.03);
  refused(bad, "train.sae.aux_k_coefficient");
  bad = config;
  bad.set_d_sae(0);
  refused(bad, "train.sae.d_sae");
  EXPECT_EQ(CltParameterShapes(*options).size(), 8u);
}

}  // namespace
}  // namespace latentd::engine
