#include "server/dataset_deletion.h"

#include <memory>
#include <random>

#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/sparse_rows_testing.h"

namespace latentd::server {
namespace {

using latentd::v1::Job;

class DatasetDeletionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto db = storage::Db::Open(FreshTestDir("dataset_deletion") + "/db");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    store_ = std::make_unique<storage::ChunkStore>(db_.get());
  }
  // A SPARSE dataset of 100 committed rows, written by job `job_id`.
  uint64_t MakeDataset(const std::string& name, uint64_t job_id) {
    storage::DatasetMeta meta;
    meta.name = name;
    meta.job_id = job_id;
    meta.width = 256;
    meta.value_dtype = storage::ValueDtype::kFloat16;
    meta.k = 8;
    meta.encoder = "topk";
    meta.context_length = 10;
    const uint64_t id = *store_->CreateDataset(meta);
    auto writer = store_->OpenWriter(id);
    EXPECT_TRUE(writer.ok()) << writer.status();
    std::mt19937 rng(3);
    const storage::SparseRowsForTest rows = storage::RandomSparseRows(rng, 100, 256, 8);
    EXPECT_TRUE(storage::AppendAndCommit(**writer, rows).ok());
    return id;
  }
  static Job JobOf(uint64_t id, latentd::v1::JobState state) {
    Job job;
    job.set_id(id);
    job.set_state(state);
    return job;
  }

  std::unique_ptr<storage::Db> db_;
  std::unique_ptr<storage::ChunkStore> store_;
};

TEST_F(DatasetDeletionTest, NamesEveryFieldOfASpecThatReadsTheDataset) {
  latentd::v1::JobSpec train;
  train.mutable_train()->set_dataset_id(4);
  train.mutable_train()->set_target_dataset_id(5);
  train.mutable_train()->add_crosscoder_dataset_ids(5);
  train.mutable_train()->add_crosscoder_dataset_ids(4);
  train.mutable_train()->add_cross_layer_dataset_ids(4);
  EXPECT_EQ(DatasetFieldsNaming(train, 4),
            (std::vector<std::string>{"train.dataset_id", "train.cross_layer_dataset_ids[0]",
                                      "train.crosscoder_dataset_ids[1]"}));
  EXPECT_EQ(
      DatasetFieldsNaming(train, 5),
      (std::vector<std::string>{"train.target_dataset_id", "train.crosscoder_dataset_ids[0]"}));
  EXPECT_TRUE(DatasetFieldsNaming(train, 6).empty());

  latentd::v1::JobSpec extract;
  auto* stored = extract.mutable_extract()->mutable_model()->mutable_stored();
  stored->add_dataset_ids(8);
  stored->add_dataset_ids(9);
  EXPECT_EQ(DatasetFieldsNaming(extract, 9),
            (std::vector<std::string>{"extract.model.stored.dataset_ids[1]"}));
  latentd::v1::JobSpec streamed;
  *streamed.mutable_train()->mutable_activations() = extract.extract();
  EXPECT_EQ(DatasetFieldsNaming(streamed, 8),
            (std::vector<std::string>{"train.activations.model.stored.dataset_ids[0]"}));
}

TEST_F(DatasetDeletionTest, WaitsForAJobThatReadsItThenDeletes) {
  const uint64_t id = MakeDataset("dense", /*job_id=*/1);
  Job train = JobOf(7, latentd::v1::PENDING);
  train.mutable_spec()->mutable_train()->set_dataset_id(id);
  const absl::Status refused =
      DeleteDataset(store_.get(), {JobOf(6, latentd::v1::RUNNING), train}, id);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(),
            "dataset " + std::to_string(id) +
                " (\"dense\") is train.dataset_id of job 7 (PENDING); cancel it or let it finish "
                "first");
  EXPECT_TRUE(store_->GetDataset(id).ok());  // untouched

  EXPECT_TRUE(DeleteDataset(store_.get(), {JobOf(6, latentd::v1::RUNNING)}, id).ok());
  EXPECT_EQ(store_->GetDataset(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(DeleteDataset(store_.get(), {}, id).code(), absl::StatusCode::kNotFound);
}

// An interrupted EXTRACT job (PENDING again after a restart) resumes its dataset at the
// watermark, and a job continuing a failed one takes its datasets over: deleting the dataset
// would lose the committed rows either job builds on.
TEST_F(DatasetDeletionTest, WaitsForTheJobThatWritesItOrContinuesIt) {
  const uint64_t id = MakeDataset("latents", /*job_id=*/3);
  Job writer = JobOf(3, latentd::v1::PENDING);
  writer.mutable_spec()->mutable_extract();
  absl::Status refused = DeleteDataset(store_.get(), {writer}, id);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("is being written by job 3 (PENDING)"), std::string::npos)
      << refused;

  Job continuation = JobOf(9, latentd::v1::PENDING);
  continuation.mutable_spec()->mutable_extract()->set_resume_from_job_id(3);
  refused = DeleteDataset(store_.get(), {continuation}, id);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("belongs to job 3, whose datasets are continued by job 9"),
            std::string::npos)
      << refused;

  // Another job's continuation is not in the way.
  Job other = JobOf(10, latentd::v1::PENDING);
  other.mutable_spec()->mutable_extract()->set_resume_from_job_id(4);
  EXPECT_TRUE(DeleteDataset(store_.get(), {other}, id).ok());
}

}  // namespace
}  // namespace latentd::server
