#include "engine/sae_model.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

namespace latentd::engine {
namespace {

SaeModelOptions Options(latentd::v1::SaeArchitecture architecture) {
  SaeModelOptions options;
  options.architecture = architecture;
  options.d_in = 8;
  options.d_sae = 32;
  options.k = 4;
  options.seed = 3;
  return options;
}

TEST(SaeModelTest, TopKKeepsExactlyKLargestNonNegativePreActivations) {
  SaeModel sae(Options(latentd::v1::TOPK));
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({16, 8});
  torch::Tensor z = sae->Encode(x);
  EXPECT_LE((z != 0).sum(1).max().item<int64_t>(), 4);
  EXPECT_GE(z.min().item<float>(), 0.0f);
  // Every kept latent's pre-activation is >= every dropped one's.
  torch::Tensor pre = torch::addmm(sae->b_enc, x - sae->b_dec, sae->W_enc);
  for (int64_t r = 0; r < 16; ++r) {
    torch::Tensor kept = pre[r].masked_select(z[r] != 0);
    torch::Tensor dropped = pre[r].masked_select(z[r] == 0);
    if (kept.numel() > 0) {
      EXPECT_GE(kept.min().item<float>(), dropped.max().item<float>());
    }
  }
}

TEST(SaeModelTest, InitHasUnitDecoderRowsTiedEncoderAndDataBias) {
  SaeModel sae(Options(latentd::v1::TOPK));
  EXPECT_TRUE(torch::allclose(sae->W_dec.norm(2, {1}), torch::ones({32}), 1e-5, 1e-5));
  EXPECT_TRUE(torch::equal(sae->W_enc, sae->W_dec.t()));
  torch::Tensor rows = torch::randn({64, 8}) + 3.0;
  sae->InitDecoderBiasFromData(rows);
  EXPECT_TRUE(torch::allclose(sae->b_dec, rows.mean(0)));
}

TEST(SaeModelTest, FvuAndMseMatchTheirDefinitions) {
  SaeModel sae(Options(latentd::v1::RELU));
  torch::Tensor x = torch::randn({32, 8});
  SaeForward out = sae->Forward(x);
  torch::Tensor err = (x - out.x_hat).pow(2).sum();
  EXPECT_NEAR(out.mse, err.item<double>() / 32, 1e-4);
  EXPECT_NEAR(out.fvu, err.item<double>() / (x - x.mean(0)).pow(2).sum().item<double>(), 1e-5);
  EXPECT_NEAR(out.l0, (out.latents != 0).sum().item<double>() / 32, 1e-9);
}

// Each architecture learns: a few hundred Adam steps on rows from a sparse dictionary bring the
// FVU well below where it starts.
TEST(SaeModelTest, EveryArchitectureReducesFvuUnderTraining) {
  for (auto architecture : {latentd::v1::TOPK, latentd::v1::RELU, latentd::v1::JUMPRELU}) {
    SaeModelOptions options = Options(architecture);
    options.l1_coefficient = architecture == latentd::v1::JUMPRELU ? 1e-4 : 1e-3;
    options.jumprelu_threshold = 0.05;
    options.jumprelu_bandwidth = 0.05;
    SaeModel sae(options);
    auto gen = at::detail::createCPUGenerator(11);
    torch::Tensor dictionary = at::randn({16, 8}, gen, torch::kFloat32);
    auto make_batch = [&] {
      torch::Tensor codes = at::rand({64, 16}, gen, torch::kFloat32);
      codes = codes * (at::rand({64, 16}, gen, torch::kFloat32) < 0.2);
      return codes.matmul(dictionary);
    };
    sae->InitDecoderBiasFromData(make_batch());
    torch::optim::Adam adam(sae->ordered_parameters(), torch::optim::AdamOptions(1e-2));
    const double first = sae->Forward(make_batch()).fvu;
    double last = first;
    for (int step = 0; step < 300; ++step) {
      adam.zero_grad();
      SaeForward out = sae->Forward(make_batch());
      out.loss.backward();
      sae->RemoveParallelDecoderGrad();
      adam.step();
      sae->NormalizeDecoder();
      last = out.fvu;
    }
    EXPECT_LT(last, 0.5 * first) << "architecture " << architecture;
    if (architecture != latentd::v1::RELU) {
      EXPECT_TRUE(torch::allclose(sae->W_dec.norm(2, {1}), torch::ones({32}), 1e-4, 1e-4));
    }
  }
}

TEST(SaeModelTest, OptionsFromProtoNameTheBadField) {
  latentd::v1::SaeTrainConfig config;
  EXPECT_NE(SaeModelOptionsFromProto(config, 8, 0).status().message().find("train.sae.d_sae"),
            std::string::npos);
  config.set_d_sae(16);
  config.set_k(17);
  EXPECT_NE(SaeModelOptionsFromProto(config, 8, 0).status().message().find("train.sae.k"),
            std::string::npos);
  config.set_k(0);
  auto options = SaeModelOptionsFromProto(config, 8, 0);
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->k, 16);  // the default 32, capped at d_sae
}

}  // namespace
}  // namespace latentd::engine
