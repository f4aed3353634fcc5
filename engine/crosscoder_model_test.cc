#include "engine/crosscoder_model.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/read_file.h"
#include "common/safetensors.h"
#include "common/test_dir.h"
#include "engine/sae.h"
#include "engine/safetensors_tensor.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

CrosscoderModelOptions Options(latentd::v1::SaeArchitecture architecture, int64_t sources = 2,
                               int64_t d_in = 8, int64_t d_sae = 32, int64_t k = 4) {
  CrosscoderModelOptions o;
  o.architecture = architecture;
  o.sources = sources;
  o.d_in = d_in;
  o.d_sae = d_sae;
  o.k = k;
  o.seed = 3;
  return o;
}

// Rows of two sources whose sizes differ 25-fold (a model diffed against one with larger
// activations), with an offset so that b_dec has something to learn.
torch::Tensor TwoScaleRows(int64_t rows, int64_t d_in, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor a = torch::randn({rows, d_in}) + 0.5;
  torch::Tensor b = 25 * (torch::randn({rows, d_in}) - 0.3);
  return torch::cat({a, b}, 1);
}

// The saved file's tensor `name` as float64 (the integers too).
torch::Tensor Saved(const SafetensorsFile& file, const std::string& name) {
  const StTensorInfo* info = file.header().Find(name);
  EXPECT_NE(info, nullptr) << name;
  if (info->dtype == StDtype::kI32) {
    return torch::tensor(static_cast<double>(*reinterpret_cast<const int32_t*>(file.data(*info))),
                         torch::kFloat64);
  }
  if (info->dtype == StDtype::kI64) {
    return torch::tensor(static_cast<double>(*reinterpret_cast<const int64_t*>(file.data(*info))),
                         torch::kFloat64);
  }
  return ReadFloatTensor(file, *info, "crosscoder")->to(torch::kFloat64);
}

TEST(CrosscoderModelTest, TheSavedModelComputesWhatTheTrainedOneDoes) {
  // dictionary_learning's BatchTopKCrossCoder.encode / decode, written out from the saved
  // tensors, must give the latents and reconstructions of the model that was trained, whatever
  // the sources' scales (which training divides out and the file folds back in).
  CrosscoderModel model(Options(latentd::v1::BATCHTOPK));
  const torch::Tensor rows = TwoScaleRows(256, 8, 1);
  model->InitFromData(rows);
  {
    // Weights away from their start, and decoder norms that differ between the sources, so that
    // the code norm's weights matter.
    torch::NoGradGuard no_grad;
    torch::manual_seed(7);
    model->W_enc.add_(0.3 * torch::randn_like(model->W_enc));
    model->b_enc.add_(0.1 * torch::randn_like(model->b_enc));
    model->W_dec.mul_(torch::rand_like(model->W_dec) + 0.5);
    model->b_dec.add_(0.2 * torch::randn_like(model->b_dec));
  }
  model->CalibrateBatchThreshold(rows.split(64));
  const std::string dir = FreshTestDir("crosscoder_saved");
  ASSERT_TRUE(model
                  ->Save(dir, {{"blocks.1.hook_resid_post", "base", "dataset 1"},
                               {"blocks.1.hook_resid_post", "chat", "dataset 2"}})
                  .ok());

  auto file = SafetensorsFile::Read(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const torch::Tensor encoder = Saved(*file, "encoder.weight");  // [n, d, F]
  const torch::Tensor decoder = Saved(*file, "decoder.weight");  // [n, F, d]
  ASSERT_EQ(encoder.sizes().vec(), (std::vector<int64_t>{2, 8, 32}));
  ASSERT_EQ(decoder.sizes().vec(), (std::vector<int64_t>{2, 32, 8}));
  EXPECT_EQ(Saved(*file, "k").item<double>(), 4);
  EXPECT_EQ(Saved(*file, "code_normalization_id").item<double>(), 1);  // CROSSCODER
  const torch::Tensor x = rows.to(torch::kFloat64).view({-1, 2, 8});
  const torch::Tensor f =
      torch::relu(torch::einsum("bld,ldf->bf", {x, encoder}) + Saved(*file, "encoder.bias"));
  const torch::Tensor code_norm = decoder.norm(2, {2}).sum(0);
  const torch::Tensor kept = f * (f * code_norm > Saved(*file, "threshold")).to(torch::kFloat64);
  const torch::Tensor x_hat =
      torch::einsum("bf,lfd->bld", {kept, decoder}) + Saved(*file, "decoder.bias");

  torch::NoGradGuard no_grad;
  const torch::Tensor latents = model->Encode(rows).to(torch::kFloat64);
  EXPECT_TRUE((latents != 0).equal(kept != 0)) << "the file keeps other latents";
  EXPECT_TRUE(torch::allclose(latents, kept, 1e-4, 1e-4));
  const torch::Tensor decoded = model->Decode(latents.to(torch::kFloat32)).to(torch::kFloat64);
  EXPECT_TRUE(torch::allclose(decoded, x_hat.view({-1, 16}), 1e-3, 1e-3))
      << (decoded - x_hat.view({-1, 16})).abs().max();
  // The calibrated threshold fires about k latents a row on the rows it was measured on.
  const double per_row = (latents != 0).sum().item<double>() / 256.0;
  EXPECT_GT(per_row, 2.0);
  EXPECT_LT(per_row, 8.0);

  const auto config = nlohmann::json::parse(*ReadFileToString(dir + "/config.json"));
  EXPECT_EQ(config["activation_dim"], 8);
  EXPECT_EQ(config["dict_size"], 32);
  EXPECT_EQ(config["num_encoder_layers"], 2);
  EXPECT_EQ(config["k"], 4);
  EXPECT_EQ(config["code_normalization"], "CROSSCODER");
  const auto about = nlohmann::json::parse(*ReadFileToString(dir + "/latentd.json"));
  EXPECT_EQ(about["dictionary_learning_class"], "BatchTopKCrossCoder");
  EXPECT_EQ(about["sources"][1]["model_name"], "chat");
}

TEST(CrosscoderModelTest, EncodingItsHooksSideBySideAsAnSaeGivesTheCrosscodersLatents) {
  // What EXTRACT runs: Sae::Load reads the saved crosscoder as a JumpReLU SAE over the hooks
  // concatenated (threshold t / c_j), whose latents and reconstruction are the crosscoder's.
  for (const auto architecture : {latentd::v1::BATCHTOPK, latentd::v1::RELU}) {
    CrosscoderModel model(Options(architecture));
    const torch::Tensor rows = TwoScaleRows(256, 8, 4);
    model->InitFromData(rows);
    {
      torch::NoGradGuard no_grad;
      torch::manual_seed(9);
      model->W_enc.add_(0.3 * torch::randn_like(model->W_enc));
      model->W_dec.mul_(torch::rand_like(model->W_dec) + 0.5);
    }
    model->CalibrateBatchThreshold(rows.split(64));
    const std::string dir = FreshTestDir(
        absl::StrCat("crosscoder_as_sae_", latentd::v1::SaeArchitecture_Name(architecture)));
    ASSERT_TRUE(model
                    ->Save(dir, {{"blocks.0.hook_resid_post", "m", "live"},
                                 {"blocks.1.hook_resid_post", "m", "live"}})
                    .ok());
    auto sae = Sae::Load(dir);
    ASSERT_TRUE(sae.ok()) << sae.status();
    EXPECT_EQ(sae->config().crosscoder_sources, 2);
    EXPECT_EQ(sae->config().d_in, 16);
    EXPECT_EQ(sae->config().crosscoder_hooks,
              (std::vector<std::string>{"blocks.0.hook_resid_post", "blocks.1.hook_resid_post"}));
    torch::NoGradGuard no_grad;
    const torch::Tensor expected = model->Encode(rows);
    const torch::Tensor got = sae->EncodeDense(rows);
    EXPECT_TRUE((got != 0).equal(expected != 0)) << architecture;
    EXPECT_TRUE(torch::allclose(got, expected, 1e-4, 1e-4)) << architecture;
    EXPECT_TRUE(torch::allclose(sae->Predict(rows, sae->EncodeSparse(rows)),
                                model->Decode(expected), 1e-3, 1e-3))
        << architecture;
  }
}

TEST(CrosscoderModelTest, BatchTopKKeepsKLatentsARowOverTheBatch) {
  CrosscoderModel model(Options(latentd::v1::BATCHTOPK, 3, 8, 64, 5));
  const torch::Tensor rows = torch::randn({40, 24});
  model->InitFromData(rows);
  const SaeForward out = model->Forward(rows);
  EXPECT_EQ((out.latents != 0).sum().item<int64_t>(), 5 * 40);
  EXPECT_DOUBLE_EQ(out.l0, 5.0);
  // Each source's share of the fit is reported, and they add up to the whole.
  ASSERT_EQ(out.block_squared_error.size(), 3u);
  EXPECT_NEAR(out.block_squared_error[0] + out.block_squared_error[1] + out.block_squared_error[2],
              out.squared_error, 1e-3 * out.squared_error);
}

TEST(CrosscoderModelTest, ASummaryOfNoLiveLatentCountsNothing) {
  // Before calibration (or when nothing fires) no latent is live: zeros, not an error.
  CrosscoderModel model(Options(latentd::v1::BATCHTOPK));
  const latentd::v1::CrosscoderSummary summary = model->Summary();
  EXPECT_EQ(summary.live_latents(), 0);
  EXPECT_EQ(summary.exclusive_latents_size(), 2);
  EXPECT_EQ(summary.relative_norm_histogram_size(), 20);
  EXPECT_EQ(summary.shared_latents(), 0);
}

TEST(CrosscoderModelTest, ReluPaysForEachLatentByWhatItWrites) {
  CrosscoderModelOptions options = Options(latentd::v1::RELU);
  options.l1_coefficient = 0.5;
  CrosscoderModel model(options);
  const torch::Tensor rows = TwoScaleRows(32, 8, 2);
  model->InitFromData(rows);
  const SaeForward out = model->Forward(rows);
  torch::NoGradGuard no_grad;
  // Sources of different scales: each decoder norm is weighed by 1 / s_s over the mean of those.
  const torch::Tensor inverse = model->scale.to(torch::kFloat64).reciprocal();
  const torch::Tensor weights = inverse / inverse.mean();
  const torch::Tensor code = model->DecoderNorms().t().matmul(weights);
  const double penalty =
      (out.latents.to(torch::kFloat64) * code).sum(1).mean().item<double>() * 0.5;
  EXPECT_NEAR(out.loss.item<double>() - out.mse, penalty, 1e-3 * penalty);
  EXPECT_GT(penalty, 0);
}

TEST(CrosscoderModelTest, TrainingFindsEachModelsOwnFeatures) {
  // Two "models" over the same inputs: 6 features both have (in different directions), 5 only
  // the first has and 5 only the second has; each row holds 3 of the 16. A crosscoder trained on
  // the pair must give some latents to each model alone and share others: what model diffing
  // reads from it.
  constexpr int64_t d = 16, features = 16, rows = 4096;
  torch::manual_seed(11);
  const torch::Tensor first = torch::nn::functional::normalize(
      torch::randn({features, d}), torch::nn::functional::NormalizeFuncOptions().dim(1));
  torch::Tensor second = torch::nn::functional::normalize(
      torch::randn({features, d}), torch::nn::functional::NormalizeFuncOptions().dim(1));
  torch::Tensor in_first = torch::ones({features, 1}), in_second = torch::ones({features, 1});
  in_second.narrow(0, 6, 5).zero_();  // features 6..10: the first model's own
  in_first.narrow(0, 11, 5).zero_();  // features 11..15: the second's
  const torch::Tensor active =
      std::get<1>(torch::rand({rows, features}).topk(3, 1));  // 3 features a row
  const torch::Tensor codes =
      torch::zeros({rows, features}).scatter_(1, active, 1 + torch::rand({rows, 3}));
  const torch::Tensor data =
      torch::cat({codes.matmul(first * in_first), codes.matmul(second * in_second)}, 1);

  CrosscoderModel model(Options(latentd::v1::BATCHTOPK, 2, d, 32, 3));
  model->InitFromData(data.narrow(0, 0, 1024));
  torch::optim::Adam adam(model->ordered_parameters(), torch::optim::AdamOptions(3e-3));
  double first_fvu = 0, last_fvu = 0;
  for (int step = 0; step < 1500; ++step) {
    const torch::Tensor batch = data.narrow(0, (step * 256) % rows, 256);
    adam.zero_grad();
    const SaeForward out = model->Forward(batch);
    out.loss.backward();
    adam.step();
    (step == 0 ? first_fvu : last_fvu) = out.fvu;
  }
  EXPECT_LT(last_fvu, 0.2 * first_fvu) << first_fvu << " -> " << last_fvu;
  model->CalibrateBatchThreshold(data.narrow(0, 0, 2048).split(256));
  const latentd::v1::CrosscoderSummary summary = model->Summary();
  ASSERT_EQ(summary.exclusive_latents_size(), 2);
  // Each model's 5 own features, one latent each; the 6 shared ones (a feature may take two).
  EXPECT_EQ(summary.exclusive_latents(0), 5) << summary.DebugString();
  EXPECT_EQ(summary.exclusive_latents(1), 5) << summary.DebugString();
  // Which ones: their decoders lie (nearly) all in their model, largest share first.
  const torch::Tensor norms = model->DecoderNorms();
  const torch::Tensor share_1 = norms[1] / norms.sum(0);
  ASSERT_EQ(summary.own_latents_size(), 2);
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(summary.own_latents(s).latents_size(), 5);
    double previous = 2;
    for (const int32_t j : summary.own_latents(s).latents()) {
      const double share = s == 1 ? share_1[j].item<double>() : 1 - share_1[j].item<double>();
      EXPECT_GE(share, 0.9) << j;
      EXPECT_LE(share, previous) << j;
      EXPECT_GT(model->fired[j].item<float>(), 0) << j;
      previous = share;
    }
  }
  EXPECT_GE(summary.shared_latents(), 6) << summary.DebugString();
  ASSERT_EQ(summary.relative_norm_histogram_size(), 20);
  int64_t histogram = 0;
  for (const int64_t count : summary.relative_norm_histogram()) histogram += count;
  EXPECT_EQ(histogram, summary.live_latents());
  // A shared feature points different ways in the two models: the shared latents' two decoder
  // vectors are not parallel (random 16-d directions: cosine near 0).
  EXPECT_LT(std::abs(summary.shared_decoder_cosine()), 0.5) << summary.DebugString();
}

TEST(CrosscoderModelTest, TwoCopiesOfOneModelShareEveryLatentInOneDirection) {
  // Diffing a model against itself: nothing is either copy's own, and each latent writes the same
  // direction into both (the 25-fold scale of the second copy is trained out).
  torch::manual_seed(5);
  const torch::Tensor features = torch::randn({24, 8});
  const torch::Tensor codes =
      torch::relu(torch::randn({2048, 24}) - 1.0);  // about 16% of the features a row
  const torch::Tensor x = codes.matmul(features);
  const torch::Tensor data = torch::cat({x, 25 * x}, 1);
  CrosscoderModel model(Options(latentd::v1::BATCHTOPK, 2, 8, 32, 4));
  model->InitFromData(data.narrow(0, 0, 1024));
  torch::optim::Adam adam(model->ordered_parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 2000; ++step) {
    adam.zero_grad();
    model->Forward(data.narrow(0, (step * 256) % 2048, 256)).loss.backward();
    adam.step();
  }
  model->CalibrateBatchThreshold(data.split(256));
  const latentd::v1::CrosscoderSummary summary = model->Summary();
  EXPECT_GT(summary.live_latents(), 8);
  EXPECT_EQ(summary.exclusive_latents(0), 0) << summary.DebugString();
  EXPECT_EQ(summary.exclusive_latents(1), 0) << summary.DebugString();
  EXPECT_EQ(summary.shared_latents(), summary.live_latents()) << summary.DebugString();
  // (A latent's two decoders start apart and meet as fast as it fires: rare ones lag.)
  EXPECT_GT(summary.shared_decoder_cosine(), 0.8) << summary.DebugString();
}

TEST(CrosscoderModelTest, OptionsRefuseWhatCrosscodersDoNotHave) {
  latentd::v1::SaeTrainConfig config;
  config.set_d_sae(64);
  auto options = CrosscoderModelOptionsFromProto(config, 2, 16, 0);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->architecture, latentd::v1::BATCHTOPK);
  EXPECT_EQ(options->RowWidth(), 32);
  auto refused = [](latentd::v1::SaeTrainConfig c, const std::string& field) {
    auto status = CrosscoderModelOptionsFromProto(c, 2, 16, 0).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(status.message().find("train.sae." + field), std::string::npos) << status;
  };
  latentd::v1::SaeTrainConfig c = config;
  c.set_architecture(latentd::v1::TOPK);
  refused(c, "architecture");
  c = config;
  c.set_architecture(latentd::v1::JUMPRELU);
  refused(c, "architecture");
  c = config;
  c.set_aux_k_coefficient(0.03);
  refused(c, "aux_k_coefficient");
  c = config;
  c.add_matryoshka_widths(16);
  refused(c, "matryoshka_widths");
  c = config;
  c.set_apply_b_dec_to_input(true);
  refused(c, "apply_b_dec_to_input");
  c = config;
  c.set_d_sae(0);
  refused(c, "d_sae");
}

}  // namespace
}  // namespace latentd::engine
