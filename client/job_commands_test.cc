#include "client/job_commands.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/latentctl_flags.h"
#include "gtest/gtest.h"

namespace latentd::client::cli {
namespace {

// Each test sets the flags it needs; the saver puts them back.
class SpecFromFlagsTest : public ::testing::Test {
 protected:
  std::string WriteSpec(const std::string& name, const std::string& json) {
    const std::filesystem::path path =
        std::filesystem::path(::testing::TempDir()) / (name + std::to_string(getpid()) + ".json");
    std::ofstream(path) << json;
    return path.string();
  }
  absl::FlagSaver restore_flags_;
};

TEST_F(SpecFromFlagsTest, TakesTheTypesSpecWithTheType) {
  absl::SetFlag(&FLAGS_type, "EXTRACT");
  absl::SetFlag(&FLAGS_spec, WriteSpec("extract", R"({"hookName": "blocks.2.hook_resid_post",
                                                      "commitRows": 4096})"));
  absl::SetFlag(&FLAGS_priority, 3);
  absl::SetFlag(&FLAGS_label, "sweep-a");
  absl::StatusOr<v1::JobSpec> spec = SpecFromFlags();
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->type(), v1::EXTRACT);
  EXPECT_EQ(spec->extract().hook_name(), "blocks.2.hook_resid_post");
  EXPECT_EQ(spec->extract().commit_rows(), 4096);
  EXPECT_EQ(spec->priority(), 3);
  EXPECT_EQ(spec->label(), "sweep-a");
}

TEST_F(SpecFromFlagsTest, TakesAWholeJobSpecAndTheCallersDefaultType) {
  absl::SetFlag(&FLAGS_spec,
                WriteSpec("whole", R"({"type": "TRAIN", "numDevices": 2, "train": {"seed": 7}})"));
  absl::StatusOr<v1::JobSpec> spec = SpecFromFlags();
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->type(), v1::TRAIN);
  EXPECT_EQ(spec->num_devices(), 2);
  EXPECT_EQ(spec->train().seed(), 7u);

  absl::SetFlag(&FLAGS_spec, "");
  spec = SpecFromFlags("EXPORT");  // `export --job` without --type
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->type(), v1::EXPORT);
}

TEST_F(SpecFromFlagsTest, AfterJobsAndBindsBecomeDependencies) {
  absl::SetFlag(&FLAGS_type, "TRAIN");
  absl::SetFlag(&FLAGS_after_jobs, "3,4");
  absl::SetFlag(&FLAGS_bind, "train.dataset_id=5:extract.dataset_id");
  absl::StatusOr<v1::JobSpec> spec = SpecFromFlags();
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->bindings_size(), 1);
  EXPECT_EQ(spec->bindings(0).field(), "train.dataset_id");
  EXPECT_EQ(spec->bindings(0).job_id(), 5u);
  EXPECT_EQ(spec->bindings(0).output(), "extract.dataset_id");
  // A bound job is waited for as well.
  EXPECT_EQ(std::vector<uint64_t>(spec->after_job_ids().begin(), spec->after_job_ids().end()),
            (std::vector<uint64_t>{3, 4, 5}));
}

TEST_F(SpecFromFlagsTest, BadFlagsAreNamed) {
  const auto error_of = [] { return std::string(SpecFromFlags().status().message()); };
  absl::SetFlag(&FLAGS_type, "EXTRCT");
  EXPECT_EQ(error_of(), "--type: 'EXTRCT' is not PROBE, EXTRACT, TRAIN or EXPORT");
  absl::SetFlag(&FLAGS_type, "TRAIN");
  absl::SetFlag(&FLAGS_after_jobs, "3,x");
  EXPECT_EQ(error_of(), "--after_jobs: 'x' is not a job id");
  absl::SetFlag(&FLAGS_after_jobs, "0");
  EXPECT_EQ(error_of(), "--after_jobs: '0' is not a job id");
  absl::SetFlag(&FLAGS_after_jobs, "");
  for (const char* bind : {"train.dataset_id=5", "=5:extract.dataset_id",
                           "train.dataset_id=five:extract.dataset_id", "train.dataset_id=5:"}) {
    absl::SetFlag(&FLAGS_bind, bind);
    EXPECT_EQ(error_of(), absl::StrCat("--bind: '", bind,
                                       "' is not FIELD=JOB:OUTPUT "
                                       "(train.dataset_id=5:extract.dataset_id)"));
  }
  absl::SetFlag(&FLAGS_bind, "");
  absl::SetFlag(&FLAGS_spec, "/nonexistent/spec.json");
  EXPECT_EQ(error_of(), "--spec: cannot read /nonexistent/spec.json");
  absl::SetFlag(&FLAGS_spec, WriteSpec("bad", R"({"hookNme": 1})"));
  EXPECT_TRUE(absl::StartsWith(error_of(), absl::StrCat("--spec: ", absl::GetFlag(FLAGS_spec),
                                                        " is neither a JobSpec nor a TRAIN spec")))
      << error_of();
}

}  // namespace
}  // namespace latentd::client::cli
