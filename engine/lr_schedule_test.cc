#include "engine/lr_schedule.h"

#include <gtest/gtest.h>

namespace latentd::engine {
namespace {

LrScheduleOptions Make(latentd::v1::LrScheduleKind kind, int64_t warmup, int64_t total,
                       double final_fraction = 0.0) {
  latentd::v1::LrSchedule proto;
  proto.set_kind(kind);
  proto.set_warmup_steps(warmup);
  proto.set_final_lr_fraction(final_fraction);
  auto options = LrScheduleFromProto(proto, 0.5, total);
  EXPECT_TRUE(options.ok()) << options.status();
  return *options;
}

TEST(LrScheduleTest, ConstantIsBaseAfterWarmupAndRampsDuringIt) {
  LrScheduleOptions options = Make(latentd::v1::CONSTANT, 4, 100);
  EXPECT_DOUBLE_EQ(LrAt(options, 0), 0.125);
  EXPECT_DOUBLE_EQ(LrAt(options, 3), 0.5);
  EXPECT_DOUBLE_EQ(LrAt(options, 50), 0.5);
}

TEST(LrScheduleTest, LinearAndCosineEndAtFinalFraction) {
  for (auto kind : {latentd::v1::LINEAR, latentd::v1::COSINE}) {
    LrScheduleOptions options = Make(kind, 10, 110, 0.1);
    EXPECT_DOUBLE_EQ(LrAt(options, 10), 0.5);
    EXPECT_NEAR(LrAt(options, 109), 0.05, 1e-12);
    double previous = LrAt(options, 10);
    for (int64_t step = 11; step < 110; ++step) {
      EXPECT_LE(LrAt(options, step), previous + 1e-15);
      previous = LrAt(options, step);
    }
  }
  // Cosine sits above linear in the first half of the decay.
  EXPECT_GT(LrAt(Make(latentd::v1::COSINE, 0, 101), 25),
            LrAt(Make(latentd::v1::LINEAR, 0, 101), 25));
}

TEST(LrScheduleTest, StepDecaysByGammaEveryStepSize) {
  latentd::v1::LrSchedule proto;
  proto.set_kind(latentd::v1::STEP);
  proto.set_step_size(10);
  proto.set_gamma(0.5);
  auto options = LrScheduleFromProto(proto, 1.0, 100);
  ASSERT_TRUE(options.ok());
  EXPECT_DOUBLE_EQ(LrAt(*options, 9), 1.0);
  EXPECT_DOUBLE_EQ(LrAt(*options, 10), 0.5);
  EXPECT_DOUBLE_EQ(LrAt(*options, 25), 0.25);
}

TEST(LrScheduleTest, BadFieldsAreNamed) {
  latentd::v1::LrSchedule proto;
  proto.set_warmup_steps(-1);
  auto options = LrScheduleFromProto(proto, 1.0, 10);
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("train.schedule.warmup_steps"), std::string::npos);
  proto.set_warmup_steps(0);
  proto.set_gamma(2.0);
  EXPECT_NE(LrScheduleFromProto(proto, 1.0, 10).status().message().find("train.schedule.gamma"),
            std::string::npos);
}

}  // namespace
}  // namespace latentd::engine
