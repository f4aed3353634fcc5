#include "engine/job_continuation.h"

#include <map>

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

using latentd::v1::Job;

class JobContinuationTest : public ::testing::Test {
 protected:
  void Add(uint64_t id, latentd::v1::JobState state, bool train) {
    Job& job = jobs_[id];
    job.set_id(id);
    job.set_state(state);
    if (train) {
      job.mutable_spec()->mutable_train()->set_steps(10);
    } else {
      job.mutable_spec()->mutable_extract()->set_hook_name("blocks.1.hook_resid_post");
    }
  }
  FindJob Finder() {
    return [this](uint64_t id) -> absl::StatusOr<Job> {
      auto it = jobs_.find(id);
      if (it == jobs_.end()) return absl::NotFoundError("no such job");
      return it->second;
    };
  }
  std::map<uint64_t, Job> jobs_;
};

TEST_F(JobContinuationTest, OnlyAFailedOrCancelledJobOfTheSameKindCanBeContinued) {
  Add(1, latentd::v1::FAILED, true);
  Add(2, latentd::v1::CANCELLED, true);
  Add(3, latentd::v1::RUNNING, true);
  Add(4, latentd::v1::SUCCEEDED, true);
  Add(5, latentd::v1::CANCELLED, false);
  const auto kTrain = latentd::v1::JobSpec::kTrain;
  EXPECT_TRUE(FindContinuableJob(Finder(), 1, kTrain, "f").ok());
  EXPECT_EQ(FindContinuableJob(Finder(), 2, kTrain, "f")->id(), 2u);
  for (uint64_t id : {3, 4}) {
    auto s = FindContinuableJob(Finder(), id, kTrain, "train.resume_from_job_id").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("train.resume_from_job_id"), std::string::npos) << s;
  }
  EXPECT_EQ(FindContinuableJob(Finder(), 5, kTrain, "f").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindContinuableJob(Finder(), 9, kTrain, "f").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(FindContinuableJob(nullptr, 1, kTrain, "f").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobContinuationTest, SpecsMayDifferOnlyInTheAllowedFields) {
  latentd::v1::TrainSpec theirs, mine;
  theirs.set_steps(100);
  theirs.mutable_sae()->set_d_sae(64);
  mine = theirs;
  mine.set_steps(200);
  auto clear_steps = [](latentd::v1::TrainSpec* s) { s->clear_steps(); };
  EXPECT_TRUE(CheckSameSpecBut<latentd::v1::TrainSpec>(theirs, mine, clear_steps, 7, "f", "").ok());
  mine.mutable_sae()->set_d_sae(128);
  absl::Status s = CheckSameSpecBut<latentd::v1::TrainSpec>(theirs, mine, clear_steps, 7,
                                                            "train.resume_from_job_id", "hint");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("job 7"), std::string::npos) << s;
  EXPECT_NE(s.message().find("sae.d_sae: 64 -> 128"), std::string::npos) << s;
  EXPECT_NE(s.message().find("; hint"), std::string::npos) << s;
}

}  // namespace
}  // namespace latentd::engine
