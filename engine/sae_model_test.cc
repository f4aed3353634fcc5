#include "engine/sae_model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <utility>
#include <vector>

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

// Components seeded with the plain job seed (the reference model draws its token embedding first
// from a generator seeded with its seed, 0 by default like TRAIN's) must not hand the SAE their
// directions: with the old init, decoder row i was token embedding i.
TEST(SaeModelTest, InitDoesNotRepeatThePlainSeedsStream) {
  for (uint64_t seed : {0ULL, 1ULL, 9ULL}) {
    SaeModelOptions o;
    o.d_in = 64;
    o.d_sae = 256;
    o.k = 8;
    o.seed = seed;
    SaeModel sae(o);
    SaeModel again(o);
    EXPECT_TRUE(torch::equal(sae->W_dec, again->W_dec)) << "init is deterministic per seed";
    auto plain_generator = at::detail::createCPUGenerator(seed);
    torch::Tensor plain = at::randn({o.d_sae, o.d_in}, plain_generator, torch::kFloat32);
    torch::Tensor cosine = (sae->W_dec * plain).sum(1) / plain.norm(2, {1});
    // Independent directions in 64 dimensions: |cos| about 0.125, rarely above 0.5.
    EXPECT_LT(cosine.abs().max().item<float>(), 0.6f) << "seed " << seed;
  }
  EXPECT_NE(SaeInitStreamSeed(0), SaeInitStreamSeed(1));
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

// A transcoder (d_out 5) encodes x without subtracting b_dec and is scored on the target: its
// prediction is z W_dec + b_dec, 5 wide, and the FVU and b_dec's sums are y's.
TEST(SaeModelTest, ATranscoderIsScoredOnItsTarget) {
  SaeModelOptions options = Options(latentd::v1::TOPK);
  options.d_out = 5;
  options.apply_b_dec_to_input = false;
  SaeModel sae(options);
  EXPECT_EQ(sae->W_dec.sizes(), (std::vector<int64_t>{32, 5}));
  EXPECT_EQ(sae->W_enc.sizes(), (std::vector<int64_t>{8, 32}));
  EXPECT_NEAR(sae->W_enc.norm(2, {0}).min().item<double>(), 1.0, 1e-5);  // unit columns
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({32, 8}), y = torch::randn({32, 5}) + 2;
  sae->InitDecoderBiasFromData(y);
  SaeForward out = sae->Forward(x, torch::Tensor(), y);
  const torch::Tensor z = sae->Encode(x);
  EXPECT_TRUE(torch::allclose(z, [&] {
    const torch::Tensor pre = torch::addmm(sae->b_enc, x, sae->W_enc);  // no b_dec
    auto top = pre.topk(4, 1);
    return torch::zeros_like(pre).scatter(1, std::get<1>(top), torch::relu(std::get<0>(top)));
  }()));
  const torch::Tensor want = torch::addmm(sae->b_dec, z, sae->W_dec);
  EXPECT_TRUE(torch::allclose(out.x_hat, want, 1e-5, 1e-5));
  const torch::Tensor err = (y - want).pow(2).sum();
  EXPECT_NEAR(out.loss.item<double>(), err.item<double>() / 32, 1e-4);
  EXPECT_NEAR(out.fvu, err.item<double>() / (y - y.mean(0)).pow(2).sum().item<double>(), 1e-5);
  EXPECT_NEAR(out.centred_squares, (y - sae->b_dec).pow(2).sum().item<double>(), 1e-3);

  // Scaled to the target: W_enc's columns shrink by mean ‖y - mean y‖ / mean ‖x‖.
  const torch::Tensor small = (torch::randn({32, 5}) * 0.01).to(torch::kFloat32);
  const double ratio = (small - small.mean(0)).norm(2, {1}).mean().item<double>() /
                       x.norm(2, {1}).mean().item<double>();
  const torch::Tensor before = sae->W_enc.detach().clone();
  sae->ScaleEncoderToTarget(x, small);
  EXPECT_TRUE(torch::allclose(sae->W_enc, before * ratio, 1e-5, 1e-7));
}

// BatchTopK keeps the k x rows largest activations of the whole batch (rows keep different
// counts); calibrated on batches, its threshold is the mean of their cutoffs, which Encode() and
// the exported SAE use.
TEST(SaeModelTest, BatchTopKKeepsTheBatchsLargestAndCalibratesItsThreshold) {
  SaeModel sae(Options(latentd::v1::BATCHTOPK));
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({16, 8});
  SaeForward out = sae->Forward(x);
  auto activations = [&](const torch::Tensor& rows) {
    return torch::relu(torch::addmm(sae->b_enc, rows - sae->b_dec, sae->W_enc)).detach();
  };
  torch::Tensor acts = activations(x);
  ASSERT_GT((acts > 0).sum().item<int64_t>(), 16 * 4);  // enough positives to keep k x rows
  const torch::Tensor kept = acts.masked_select(out.latents != 0);
  EXPECT_EQ(kept.numel(), 16 * 4);
  EXPECT_GE(kept.min().item<float>(), acts.masked_select(out.latents == 0).max().item<float>());
  EXPECT_TRUE(torch::equal(out.latents.masked_select(out.latents != 0).detach(), kept));
  EXPECT_NE((out.latents != 0).sum(1).min().item<int64_t>(),
            (out.latents != 0).sum(1).max().item<int64_t>());  // not k on every row
  EXPECT_DOUBLE_EQ(out.l0, 4.0);
  EXPECT_EQ(sae->batch_threshold.item<float>(), 0.0f);  // training leaves it alone

  // The threshold: the mean of each batch's cutoff (its k x rows-th largest activation).
  std::vector<torch::Tensor> batches = {torch::randn({16, 8}), torch::randn({16, 8}),
                                        torch::randn({16, 8})};
  double cutoffs = 0;
  for (const auto& b : batches) {
    cutoffs += std::get<0>(activations(b).flatten().sort(0, /*descending=*/true))[16 * 4 - 1]
                   .item<double>();
  }
  sae->CalibrateBatchThreshold(batches);
  const float threshold = sae->batch_threshold.item<float>();
  EXPECT_FLOAT_EQ(threshold, static_cast<float>(cutoffs / 3));

  // Inference: a JumpReLU with the threshold on every latent, no batch needed; on the batches it
  // was calibrated on it fires about k latents a row.
  torch::NoGradGuard no_grad;
  torch::Tensor pre = torch::addmm(sae->b_enc, x - sae->b_dec, sae->W_enc);
  EXPECT_TRUE(torch::equal(sae->Encode(x), pre * (pre > threshold).to(torch::kFloat32)));
  const double l0 =
      (sae->Encode(torch::cat(batches)) != 0).sum(1).to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(l0, 4.0, 1.0);
  const auto exported = sae->ExportWeights();
  ASSERT_EQ(exported.count("threshold"), 1u);
  EXPECT_TRUE(torch::equal(exported.at("threshold"), torch::full({32}, threshold)));
  ASSERT_EQ(sae->ordered_buffers().size(), 1u);  // checkpointed with the parameters
}

// Each architecture learns: a few hundred Adam steps on rows from a sparse dictionary bring the
// FVU well below where it starts.
TEST(SaeModelTest, EveryArchitectureReducesFvuUnderTraining) {
  for (auto architecture :
       {latentd::v1::TOPK, latentd::v1::RELU, latentd::v1::JUMPRELU, latentd::v1::BATCHTOPK}) {
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

// AuxK, term by term: among the dead latents, each row's aux_k largest pre-activations (ReLU'd)
// decode, without the bias, an estimate of the (detached) residual x - x_hat.
TEST(SaeModelTest, AuxKTermMatchesItsDefinition) {
  SaeModelOptions options = Options(latentd::v1::TOPK);
  options.aux_k = 3;
  options.aux_k_coefficient = 1.0 / 32;
  SaeModel sae(options);
  torch::manual_seed(5);
  torch::Tensor x = torch::randn({6, 8});
  torch::Tensor dead = torch::zeros({32}, torch::kBool);
  for (int j : {1, 4, 7, 9, 20, 31}) dead[j] = true;
  SaeForward plain = sae->Forward(x);
  SaeForward with = sae->Forward(x, dead);
  EXPECT_EQ(plain.aux_k_loss, 0);
  EXPECT_NEAR(plain.loss.item<double>(), plain.mse, 1e-5);
  torch::NoGradGuard no_grad;
  torch::Tensor pre = torch::addmm(sae->b_enc, x - sae->b_dec, sae->W_enc);
  double aux = 0;
  for (int64_t r = 0; r < 6; ++r) {
    std::vector<std::pair<float, int>> candidates;
    for (int j = 0; j < 32; ++j) {
      if (dead[j].item<bool>()) candidates.emplace_back(pre[r][j].item<float>(), j);
    }
    std::sort(candidates.rbegin(), candidates.rend());
    torch::Tensor e_hat = torch::zeros({8});
    for (int i = 0; i < 3; ++i) {
      e_hat += std::max(0.0f, candidates[i].first) * sae->W_dec[candidates[i].second];
    }
    aux += ((x[r] - plain.x_hat[r]) - e_hat).pow(2).sum().item<double>();
  }
  aux /= 6;
  EXPECT_NEAR(with.aux_k_loss, aux, 1e-4 * std::max(1.0, aux));
  // 6 dead >= aux_k: full weight 1/32.
  EXPECT_NEAR(with.loss.item<double>(), plain.mse + aux / 32, 1e-4);
  EXPECT_EQ(with.fvu, plain.fvu);  // AuxK changes the loss, not the reconstruction

  // Fewer dead latents than aux_k: all of them, weighted |D| / aux_k.
  torch::Tensor one_dead = torch::zeros({32}, torch::kBool);
  one_dead[4] = true;
  SaeForward single = sae->Forward(x, one_dead);
  double aux1 = 0;
  for (int64_t r = 0; r < 6; ++r) {
    torch::Tensor e_hat = std::max(0.0f, pre[r][4].item<float>()) * sae->W_dec[4];
    aux1 += ((x[r] - plain.x_hat[r]) - e_hat).pow(2).sum().item<double>();
  }
  aux1 /= 6;
  EXPECT_NEAR(single.aux_k_loss, aux1, 1e-4 * std::max(1.0, aux1));
  EXPECT_NEAR(single.loss.item<double>(), plain.mse + aux1 / 32 / 3, 1e-4);
}

// The residual is detached and only dead latents decode it: the AuxK term moves the decoder rows
// of dead latents, never those of live ones.
TEST(SaeModelTest, AuxKGradientReachesOnlyDeadDecoderRows) {
  SaeModelOptions options = Options(latentd::v1::TOPK);
  options.aux_k = 32;  // every dead latent with a positive pre-activation takes part
  options.aux_k_coefficient = 1.0 / 32;
  SaeModel sae(options);
  torch::manual_seed(6);
  torch::Tensor x = torch::randn({16, 8});
  torch::Tensor dead = torch::zeros({32}, torch::kBool);
  for (int j = 0; j < 32; j += 3) dead[j] = true;
  sae->Forward(x).loss.backward();
  torch::Tensor without = sae->W_dec.grad().clone();
  sae->W_dec.mutable_grad().zero_();
  for (auto& p : sae->ordered_parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  sae->Forward(x, dead).loss.backward();
  torch::Tensor changed = (sae->W_dec.grad() - without).abs().sum(1) > 1e-7;
  EXPECT_TRUE(torch::equal(changed & dead.logical_not(), torch::zeros({32}, torch::kBool)));
  EXPECT_GT((changed & dead).sum().item<int64_t>(), 0);
}

// Matryoshka: the same latents as the plain SAE, and a loss that adds the error of
// reconstructing from each inner prefix; latents beyond every inner level get the plain gradient.
TEST(SaeModelTest, MatryoshkaAddsEachPrefixsReconstructionError) {
  SaeModelOptions plain_options = Options(latentd::v1::TOPK);
  SaeModelOptions options = plain_options;
  options.matryoshka_widths = {4, 12, 32};
  SaeModel plain(plain_options), sae(options);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({24, 8});
  SaeForward p = plain->Forward(x), m = sae->Forward(x);
  EXPECT_TRUE(torch::equal(p.latents, m.latents));
  EXPECT_NEAR(m.fvu, p.fvu, 1e-5);
  EXPECT_NEAR(m.mse, p.mse, 1e-5);
  double extra = 0;
  const double variance = (x - x.mean(0, true)).pow(2).sum().item<double>();
  ASSERT_EQ(m.prefix_fvu.size(), 2u);
  for (int level = 0; level < 2; ++level) {
    const int64_t w = options.matryoshka_widths[level];
    const torch::Tensor x_hat =
        m.latents.slice(1, 0, w).matmul(sae->W_dec.slice(0, 0, w)) + sae->b_dec;
    const torch::Tensor sq = (x - x_hat).pow(2).sum(1);
    extra += sq.mean().item<double>();
    EXPECT_NEAR(m.prefix_fvu[level], sq.sum().item<double>() / variance, 1e-4);
  }
  EXPECT_NEAR(m.loss.item<double>(), p.loss.item<double>() + extra, 1e-4 * m.loss.item<double>());
  EXPECT_TRUE(p.prefix_fvu.empty());
  p.loss.backward();
  m.loss.backward();
  const torch::Tensor outer_plain = plain->W_dec.grad().slice(0, 12, 32);
  const torch::Tensor outer = sae->W_dec.grad().slice(0, 12, 32);
  EXPECT_TRUE(torch::allclose(outer, outer_plain, 1e-4, 1e-5));
  EXPECT_FALSE(torch::allclose(sae->W_dec.grad().slice(0, 0, 4), plain->W_dec.grad().slice(0, 0, 4),
                               1e-3, 1e-4));
}

// What Matryoshka is for: trained on features with a hierarchy, its first latents reconstruct on
// their own far better than a plain SAE's first latents do.
TEST(SaeModelTest, MatryoshkasFirstLevelStandsOnItsOwn) {
  auto gen = at::detail::createCPUGenerator(21);
  const torch::Tensor parents = torch::randn({8, 16}, gen, torch::kFloat);
  const torch::Tensor children = torch::randn({32, 16}, gen, torch::kFloat);
  auto rows = [&](int64_t n) {
    const torch::Tensor p_on = (torch::rand({n, 8}, gen, torch::kFloat) < 0.2).to(torch::kFloat);
    const torch::Tensor c_on = (torch::rand({n, 32}, gen, torch::kFloat) < 0.3).to(torch::kFloat) *
                               p_on.repeat_interleave(4, 1);
    return p_on.matmul(parents) + c_on.matmul(children);
  };
  const torch::Tensor eval = rows(2048);
  std::vector<double> first_level_fvu;
  for (const bool matryoshka : {false, true}) {
    SaeModelOptions options;
    options.architecture = latentd::v1::TOPK;
    options.d_in = 16;
    options.d_sae = 64;
    options.k = 3;
    options.seed = 2;
    if (matryoshka) options.matryoshka_widths = {8, 64};
    SaeModel sae(options);
    sae->InitDecoderBiasFromData(rows(1024));
    torch::optim::Adam adam(sae->ordered_parameters(), torch::optim::AdamOptions(3e-3));
    for (int step = 0; step < 600; ++step) {
      adam.zero_grad();
      sae->Forward(rows(128)).loss.backward();
      sae->RemoveParallelDecoderGrad();
      adam.step();
      sae->NormalizeDecoder();
    }
    torch::NoGradGuard no_grad;
    const torch::Tensor z = sae->Encode(eval);
    const torch::Tensor x_hat = z.slice(1, 0, 8).matmul(sae->W_dec.slice(0, 0, 8)) + sae->b_dec;
    first_level_fvu.push_back(
        ((eval - x_hat).pow(2).sum() / (eval - eval.mean(0, true)).pow(2).sum()).item<double>());
  }
  EXPECT_LT(first_level_fvu[1], 0.7 * first_level_fvu[0])
      << "plain " << first_level_fvu[0] << ", matryoshka " << first_level_fvu[1];
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
  EXPECT_EQ(options->k, 16);                 // the default 32, capped at d_sae
  EXPECT_EQ(options->aux_k, 4);              // d_in / 2
  EXPECT_EQ(options->aux_k_coefficient, 0);  // AuxK is opt-in
  config.set_aux_k(-1);
  EXPECT_NE(SaeModelOptionsFromProto(config, 8, 0).status().message().find("train.sae.aux_k"),
            std::string::npos);
  config.set_aux_k(0);
  config.set_aux_k_coefficient(-0.5);
  EXPECT_NE(
      SaeModelOptionsFromProto(config, 8, 0).status().message().find("train.sae.aux_k_coefficient"),
      std::string::npos);
  config.set_aux_k_coefficient(0.25);
  EXPECT_EQ(SaeModelOptionsFromProto(config, 8, 0)->aux_k_coefficient, 0.25);
  // Matryoshka widths: inside [1, d_sae], strictly increasing; d_sae closes the list.
  for (const std::vector<int>& bad : std::vector<std::vector<int>>{{0, 16}, {4, 17}, {8, 8}}) {
    config.clear_matryoshka_widths();
    for (int w : bad) config.add_matryoshka_widths(w);
    EXPECT_NE(SaeModelOptionsFromProto(config, 8, 0)
                  .status()
                  .message()
                  .find("train.sae.matryoshka_widths["),
              std::string::npos);
  }
  config.clear_matryoshka_widths();
  config.add_matryoshka_widths(4);
  config.add_matryoshka_widths(8);
  EXPECT_EQ(SaeModelOptionsFromProto(config, 8, 0)->matryoshka_widths,
            (std::vector<int64_t>{4, 8, 16}));
  config.clear_matryoshka_widths();
  config.set_architecture(latentd::v1::BATCHTOPK);
  config.set_k(17);
  EXPECT_NE(SaeModelOptionsFromProto(config, 8, 0).status().message().find("train.sae.k"),
            std::string::npos);
}

}  // namespace
}  // namespace latentd::engine
