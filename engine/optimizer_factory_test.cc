#include "engine/optimizer_factory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace latentd::engine {
namespace {

latentd::v1::OptimizerSpec Spec(const std::string& name, double lr) {
  latentd::v1::OptimizerSpec spec;
  spec.set_name(name);
  spec.set_lr(lr);
  spec.set_window(8);
  spec.set_damp(1e-3);
  spec.set_density(0.25);
  return spec;
}

void ExpectInvalidField(const latentd::v1::OptimizerSpec& spec, const std::string& field) {
  auto config = OptimizerConfigFromProto(spec);
  ASSERT_FALSE(config.ok()) << field;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(config.status().message().find("train.optimizer." + field), std::string::npos)
      << config.status();
}

TEST(OptimizerFactoryTest, BadSpecsNameTheField) {
  ExpectInvalidField(Spec("lbfgs", 0.1), "name");
  ExpectInvalidField(Spec("adam", 0), "lr");
  latentd::v1::OptimizerSpec spec = Spec("smfac", 0.1);
  spec.set_density(1.5);
  ExpectInvalidField(spec, "density");
  spec = Spec("sgd", 0.1);
  spec.set_momentum(1.0);
  ExpectInvalidField(spec, "momentum");
  spec = Spec("mfac", 0.1);
  spec.set_window(-2);
  ExpectInvalidField(spec, "window");
}

// Every optimizer the build has minimises a small ill-conditioned quadratic, and its accounting
// after the steps equals the static estimate made before allocation.
TEST(OptimizerFactoryTest, EachOptimizerDescendsAndItsEstimateEqualsItsAccounting) {
  for (const std::string name : {"sgd", "adam", "adamw", "mfac", "smfac", "lrmfac", "ggt"}) {
    SCOPED_TRACE(name);
    const bool mfac_family = name == "mfac" || name == "smfac" || name == "ggt" || name == "lrmfac";
    latentd::v1::OptimizerSpec spec = Spec(name, mfac_family ? 1.0 : 0.05);
    // M-FAC's step is F^-1 g with F = damp*I + G^T G / s: a damp near the gradient scale keeps
    // the steps of a descent method on this tiny problem.
    spec.set_damp(1.0);
    auto config = OptimizerConfigFromProto(spec);
    ASSERT_TRUE(config.ok()) << config.status();
    torch::Tensor w = torch::ones({4, 3}, torch::requires_grad());
    torch::Tensor b = torch::ones({3}, torch::requires_grad());
    const std::vector<std::vector<int64_t>> shapes = {{4, 3}, {3}};
    const OptimizerMemory estimate = EstimateOptimizerMemory(*config, shapes);
    auto optimizer = MakeOptimizer(*config, {w, b});
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    torch::Tensor scale = torch::linspace(0.2, 2.0, 12).reshape({4, 3});
    auto loss_of = [&] { return (scale * w * w).sum() + (b * b).sum(); };
    const double first = loss_of().item<double>();
    for (int step = 0; step < 30; ++step) {
      (*optimizer)->optimizer().zero_grad();
      loss_of().backward();
      ASSERT_TRUE((*optimizer)->Step().ok());
    }
    EXPECT_LT(loss_of().item<double>(), 0.5 * first);
    EXPECT_EQ((*optimizer)->Memory().total(), estimate.total());
  }
}

TEST(OptimizerFactoryTest, SparseHistoryIsAFractionOfDense) {
  latentd::v1::OptimizerSpec spec = Spec("mfac", 0.1);
  spec.set_window(64);
  const std::vector<std::vector<int64_t>> shapes = {{256, 1024}, {1024}};
  const int64_t dense = EstimateOptimizerMemory(*OptimizerConfigFromProto(spec), shapes).total();
  spec.set_name("smfac");
  spec.set_density(0.01);
  const int64_t sparse = EstimateOptimizerMemory(*OptimizerConfigFromProto(spec), shapes).total();
  EXPECT_GE(dense, DenseMfacHistoryBytes(256 * 1024 + 1024, 64));
  EXPECT_LT(sparse, dense / 10);
}

TEST(OptimizerFactoryTest, SetLrReachesEveryGroup) {
  auto config = OptimizerConfigFromProto(Spec("adam", 0.1));
  torch::Tensor w = torch::ones({2}, torch::requires_grad());
  auto optimizer = MakeOptimizer(*config, {w});
  ASSERT_TRUE(optimizer.ok());
  (*optimizer)->SetLr(0.025);
  for (auto& group : (*optimizer)->optimizer().param_groups()) {
    EXPECT_DOUBLE_EQ(group.options().get_lr(), 0.025);
  }
}

}  // namespace
}  // namespace latentd::engine
