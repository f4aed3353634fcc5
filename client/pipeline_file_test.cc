#include "client/pipeline_file.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace latentd::client {
namespace {

constexpr char kLoop[] = R"({
  "name": "l2-sae",
  "jobs": [
    {"name": "dense", "type": "EXTRACT",
     "spec": {"hookName": "blocks.2.hook_resid_post", "mode": "DENSE"}},
    {"name": "sae", "type": "TRAIN", "spec": {"steps": 300, "sae": {"dSae": 4096}},
     "bind": {"train.dataset_id": "dense:extract.dataset_id"}, "label": "sae", "priority": 2},
    {"name": "latents", "type": "EXTRACT", "spec": {"mode": "SPARSE"}, "numDevices": 2,
     "after": ["dense", 5],
     "bind": {"extract.sae.artifact_id": "sae:train.artifact_id",
              "extract.dataset_name": "9:extract.dataset_name"}}
  ]})";

TEST(ParsePipeline, ReadsJobsTheirSpecsAndReferencesByName) {
  auto jobs = ParsePipeline(kLoop);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 3u);
  const PipelineJob& dense = (*jobs)[0];
  EXPECT_EQ(dense.name, "dense");
  EXPECT_EQ(dense.request_id, "l2-sae/dense");
  EXPECT_EQ(dense.spec.extract().hook_name(), "blocks.2.hook_resid_post");
  EXPECT_TRUE(dense.after.empty());

  const PipelineJob& sae = (*jobs)[1];
  EXPECT_EQ(sae.spec.type(), latentd::v1::TRAIN);
  EXPECT_EQ(sae.spec.train().steps(), 300);
  EXPECT_EQ(sae.spec.label(), "sae");
  EXPECT_EQ(sae.spec.priority(), 2);
  EXPECT_EQ(sae.after, std::vector<int>{0});
  ASSERT_EQ(sae.bindings.size(), 1u);
  EXPECT_EQ(sae.bindings[0].job, 0);
  EXPECT_EQ(sae.bindings[0].output, "extract.dataset_id");
  EXPECT_EQ(sae.bindings[0].field, "train.dataset_id");

  // Jobs of the file by index; jobs on the daemon by id, in the spec already.
  const PipelineJob& latents = (*jobs)[2];
  EXPECT_EQ(latents.spec.num_devices(), 2);
  EXPECT_EQ(latents.after, (std::vector<int>{0, 1}));
  EXPECT_EQ(std::vector<uint64_t>(latents.spec.after_job_ids().begin(),
                                  latents.spec.after_job_ids().end()),
            (std::vector<uint64_t>{5, 9}));
  ASSERT_EQ(latents.spec.bindings_size(), 1);
  EXPECT_EQ(latents.spec.bindings(0).job_id(), 9u);

  // Resolved with the ids the daemon gave the earlier jobs.
  const latentd::v1::JobSpec resolved = ResolvedSpec(latents, {11, 12, 13});
  EXPECT_EQ(std::vector<uint64_t>(resolved.after_job_ids().begin(), resolved.after_job_ids().end()),
            (std::vector<uint64_t>{5, 9, 11, 12}));
  ASSERT_EQ(resolved.bindings_size(), 2);
  EXPECT_EQ(resolved.bindings(1).job_id(), 12u);
  EXPECT_EQ(resolved.bindings(1).output(), "train.artifact_id");
  EXPECT_EQ(resolved.bindings(1).field(), "extract.sae.artifact_id");
}

TEST(ParsePipeline, WithoutANameJobsHaveNoRequestId) {
  auto jobs = ParsePipeline(R"({"jobs": [{"name": "p", "type": "PROBE"}]})");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ((*jobs)[0].request_id, "");
  EXPECT_TRUE((*jobs)[0].spec.has_probe());
}

std::string ErrorOf(const std::string& text) {
  return std::string(ParsePipeline(text).status().message());
}

TEST(ParsePipeline, MistakesAreNamedBeforeAnythingIsSubmitted) {
  EXPECT_EQ(ErrorOf("{"), "not JSON");
  EXPECT_EQ(ErrorOf(R"({"jobs": []})"), "jobs: required, a non-empty list");
  EXPECT_EQ(ErrorOf(R"({"jobz": []})"), "jobz: unknown (name, jobs)");
  EXPECT_EQ(ErrorOf(R"({"jobs": [{"type": "PROBE"}]})"), "jobs[0].name: required, a string");
  EXPECT_EQ(
      ErrorOf(R"({"jobs": [{"name": "a", "type": "PROBE"}, {"name": "a", "type": "PROBE"}]})"),
      "jobs[1].name: \"a\" names an earlier job too");
  EXPECT_EQ(ErrorOf(R"({"jobs": [{"name": "a", "type": "SLEEP"}]})"),
            "jobs[0].type: \"SLEEP\" is not PROBE, EXTRACT, TRAIN or EXPORT");
  EXPECT_EQ(ErrorOf(R"({"jobs": [{"name": "a", "type": "PROBE", "prio": 1}]})"),
            "jobs[0].prio: unknown, or not of its type (name, type, spec, bind, after, label, "
            "priority, numDevices)");
  EXPECT_EQ(ErrorOf(R"({"jobs": [{"name": "a", "type": "TRAIN", "spec": {"stepz": 1}}]})")
                .rfind("jobs[0].spec: ", 0),
            0u);
  // A reference to a later job, or to nothing.
  EXPECT_EQ(ErrorOf(R"({"jobs": [
      {"name": "a", "type": "TRAIN", "bind": {"train.dataset_id": "b:extract.dataset_id"}},
      {"name": "b", "type": "EXTRACT"}]})"),
            "jobs[0].bind.train.dataset_id: \"b\" is no earlier job of the file and no job id");
  EXPECT_EQ(ErrorOf(R"({"jobs": [{"name": "a", "type": "TRAIN", "after": ["x"]}]})"),
            "jobs[0].after[0]: \"x\" is no earlier job of the file and no job id");
  EXPECT_EQ(ErrorOf(R"({"jobs": [{"name": "a", "type": "TRAIN",
                                  "bind": {"train.dataset_id": "dense"}}]})"),
            "jobs[0].bind.train.dataset_id: \"JOB:OUTPUT\", e.g. \"dense:extract.dataset_id\"");
}

}  // namespace
}  // namespace latentd::client
