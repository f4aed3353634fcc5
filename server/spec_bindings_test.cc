#include "server/spec_bindings.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace latentd::server {
namespace {

using latentd::v1::JobResult;
using latentd::v1::JobSpec;
using latentd::v1::JobType;

// Jobs 1 and 2 are EXTRACT jobs, 3 a TRAIN job; others do not exist.
std::optional<JobType> TypeOf(uint64_t id) {
  if (id == 1 || id == 2) return latentd::v1::EXTRACT;
  if (id == 3) return latentd::v1::TRAIN;
  return std::nullopt;
}

std::map<uint64_t, JobResult> Results() {
  std::map<uint64_t, JobResult> results;
  results[1].mutable_extract()->set_dataset_id(7);
  results[1].mutable_extract()->add_more_outputs()->set_dataset_id(8);
  results[1].mutable_extract()->set_bytes_per_token(84.5);
  results[2].mutable_extract()->set_dataset_id(9);
  results[3].mutable_train()->set_artifact_id(4);
  results[3].mutable_train()->set_artifact_path("/data/artifacts/sae-3");
  return results;
}

JobSpec Spec(JobType type, std::vector<uint64_t> after,
             std::vector<latentd::v1::SpecBinding> bindings) {
  JobSpec spec;
  spec.set_type(type);
  if (type == latentd::v1::TRAIN) spec.mutable_train();
  if (type == latentd::v1::EXTRACT) spec.mutable_extract();
  for (uint64_t id : after) spec.add_after_job_ids(id);
  for (const auto& b : bindings) *spec.add_bindings() = b;
  return spec;
}

latentd::v1::SpecBinding Bind(uint64_t job, const std::string& output, const std::string& field) {
  latentd::v1::SpecBinding b;
  b.set_job_id(job);
  b.set_output(output);
  b.set_field(field);
  return b;
}

TEST(SpecBindings, FillTheLoopExtractTrainExtract) {
  // TRAIN on job 1's dataset; then EXTRACT with the SAE job 3 trained, replacing a path.
  JobSpec train =
      Spec(latentd::v1::TRAIN, {1}, {Bind(1, "extract.dataset_id", "train.dataset_id")});
  ASSERT_TRUE(CheckBindings(train, TypeOf).ok()) << CheckBindings(train, TypeOf);
  std::vector<std::string> applied;
  auto bound = ApplyBindings(train, Results(), &applied);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(bound->train().dataset_id(), 7u);
  EXPECT_EQ(applied, std::vector<std::string>{"train.dataset_id = 7 (job 1's extract.dataset_id)"});
  // The bindings stay in the spec, as submitted.
  EXPECT_EQ(bound->bindings_size(), 1);

  JobSpec extract =
      Spec(latentd::v1::EXTRACT, {3}, {Bind(3, "train.artifact_id", "extract.sae.artifact_id")});
  extract.mutable_extract()->mutable_sae()->set_path("/placeholder");
  ASSERT_TRUE(CheckBindings(extract, TypeOf).ok());
  bound = ApplyBindings(extract, Results());
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(bound->extract().sae().artifact_id(), 4u);
  EXPECT_FALSE(bound->extract().sae().has_path());  // a oneof sibling
}

TEST(SpecBindings, TakeJsonNamesListElementsAndAppendToLists) {
  // Model diffing: a crosscoder over two EXTRACT jobs' datasets, plus an element of a result list.
  JobSpec train = Spec(latentd::v1::TRAIN, {1, 2},
                       {Bind(1, "extract.dataset_id", "train.crosscoderDatasetIds"),
                        Bind(2, "extract.datasetId", "train.crosscoder_dataset_ids"),
                        Bind(1, "extract.moreOutputs.0.datasetId", "train.target_dataset_id"),
                        Bind(1, "extract.dataset_id", "train.artifact_name")});
  ASSERT_TRUE(CheckBindings(train, TypeOf).ok()) << CheckBindings(train, TypeOf);
  std::vector<std::string> applied;
  auto bound = ApplyBindings(train, Results(), &applied);
  ASSERT_TRUE(bound.ok()) << bound.status();
  // The log speaks proto names, whatever the spelling.
  EXPECT_EQ(applied[2], "train.target_dataset_id = 8 (job 1's extract.more_outputs.0.dataset_id)");
  EXPECT_EQ(std::vector<uint64_t>(bound->train().crosscoder_dataset_ids().begin(),
                                  bound->train().crosscoder_dataset_ids().end()),
            (std::vector<uint64_t>{7, 9}));
  EXPECT_EQ(bound->train().target_dataset_id(), 8u);
  EXPECT_EQ(bound->train().artifact_name(), "7");  // an integer into a string: decimal

  // An element of a list in the spec is set in place; it must exist.
  JobSpec extract = Spec(latentd::v1::EXTRACT, {3},
                         {Bind(3, "train.artifact_id", "extract.more_outputs.1.sae.artifact_id")});
  extract.mutable_extract()->add_more_outputs();
  extract.mutable_extract()->add_more_outputs();
  bound = ApplyBindings(extract, Results());
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(bound->extract().more_outputs(1).sae().artifact_id(), 4u);
  EXPECT_FALSE(bound->extract().more_outputs(0).has_sae());
  extract.mutable_extract()->mutable_more_outputs()->RemoveLast();
  auto missing = ApplyBindings(extract, Results());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message(),
            "spec.bindings[0].field: \"extract.more_outputs.1.sae.artifact_id\": the spec's "
            "more_outputs has 1 elements, no 1");
}

// The error CheckBindings gives for `spec`.
std::string CheckError(const JobSpec& spec) {
  return std::string(CheckBindings(spec, TypeOf).message());
}

TEST(SpecBindings, SchemaErrorsNameTheBindingAndWhatIsWrong) {
  EXPECT_EQ(CheckBindings(Spec(latentd::v1::TRAIN, {1, 5}, {}), TypeOf).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(CheckError(Spec(latentd::v1::TRAIN, {1, 5}, {})),
            "spec.after_job_ids[1]: job 5 not found");
  EXPECT_EQ(CheckError(
                Spec(latentd::v1::TRAIN, {1}, {Bind(2, "extract.dataset_id", "train.dataset_id")})),
            "spec.bindings[0].job_id: job 2 is not one of after_job_ids (a job is bound only to "
            "jobs it waits for)");
  EXPECT_EQ(
      CheckError(Spec(latentd::v1::TRAIN, {1}, {Bind(1, "extract.dataset", "train.dataset_id")})),
      "spec.bindings[0].output: \"extract.dataset\": ExtractResult has no field \"dataset\"");
  EXPECT_EQ(CheckError(
                Spec(latentd::v1::TRAIN, {3}, {Bind(3, "extract.dataset_id", "train.dataset_id")})),
            "spec.bindings[0].output: job 3 is a TRAIN job: its outputs start with \"train.\"");
  EXPECT_EQ(
      CheckError(Spec(latentd::v1::TRAIN, {1}, {Bind(1, "extract.fit", "train.dataset_id")})),
      "spec.bindings[0].output: \"extract.fit\" is a message (SaeFit); name one of its values");
  EXPECT_EQ(CheckError(Spec(latentd::v1::TRAIN, {1},
                            {Bind(1, "extract.more_outputs.dataset_id", "train.dataset_id")})),
            "spec.bindings[0].output: \"extract.more_outputs.dataset_id\": more_outputs is a "
            "list: name an element (more_outputs.0)");
  EXPECT_EQ(CheckError(Spec(latentd::v1::TRAIN, {1}, {Bind(1, "extract.dataset_id", "priority")})),
            "spec.bindings[0].field: a binding fills this job's own train spec: \"train.<field>\"");
  EXPECT_EQ(CheckError(Spec(latentd::v1::TRAIN, {1},
                            {Bind(1, "extract.dataset_id", "extract.sae.artifact_id")})),
            "spec.bindings[0].field: a binding fills this job's own train spec: \"train.<field>\"");
  EXPECT_EQ(CheckError(Spec(latentd::v1::TRAIN, {1},
                            {Bind(1, "extract.bytes_per_token", "train.dataset_id")})),
            "spec.bindings[0]: extract.bytes_per_token is a double, train.dataset_id a uint64");
  EXPECT_EQ(CheckError(Spec(latentd::v1::TRAIN, {1, 2},
                            {Bind(1, "extract.dataset_id", "train.dataset_id"),
                             Bind(2, "extract.dataset_id", "train.datasetId")})),
            "spec.bindings[1].field: train.datasetId is bound twice");
  EXPECT_EQ(CheckError(Spec(latentd::v1::TRAIN, {1},
                            {Bind(1, "extract.dataset_id", "train.dataset_id.x")})),
            "spec.bindings[0].field: \"train.dataset_id.x\": dataset_id is a value, it has no "
            "\"x\"");
  JobSpec many = Spec(latentd::v1::TRAIN, {}, {});
  for (int i = 0; i < kMaxAfterJobs + 1; ++i) many.add_after_job_ids(1);
  EXPECT_EQ(CheckError(many), "spec.after_job_ids: at most 64 jobs, got 65");
}

TEST(SpecBindings, ValueErrorsAtApplyNameTheBinding) {
  // A result list shorter than the index.
  JobSpec train = Spec(latentd::v1::TRAIN, {2},
                       {Bind(2, "extract.more_outputs.0.dataset_id", "train.dataset_id")});
  ASSERT_TRUE(CheckBindings(train, TypeOf).ok());
  auto bound = ApplyBindings(train, Results());
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bound.status().message(),
            "spec.bindings[0].output: job 2's \"extract.more_outputs.0.dataset_id\": more_outputs "
            "has 0 elements, no 0");
  // A string that is no integer into an integer field.
  JobSpec extract =
      Spec(latentd::v1::EXTRACT, {3}, {Bind(3, "train.artifact_path", "extract.sae.artifact_id")});
  ASSERT_TRUE(CheckBindings(extract, TypeOf).ok());
  bound = ApplyBindings(extract, Results());
  EXPECT_EQ(bound.status().message(),
            "spec.bindings[0].field: \"extract.sae.artifact_id\": \"/data/artifacts/sae-3\" is not "
            "an integer");
  // No result for a bound job.
  bound = ApplyBindings(
      Spec(latentd::v1::TRAIN, {1}, {Bind(1, "extract.dataset_id", "train.dataset_id")}), {});
  EXPECT_EQ(bound.status().message(),
            "spec.bindings[0]: no result of job 1 to take extract.dataset_id from");
}

}  // namespace
}  // namespace latentd::server
