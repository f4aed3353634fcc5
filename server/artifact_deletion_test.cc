#include "server/artifact_deletion.h"

#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/keys.h"

namespace latentd::server {
namespace {

namespace fs = std::filesystem;

class ArtifactDeletionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshTestDir("artifact_deletion");
    artifact_dir_ = root_ + "/artifacts";
    fs::create_directories(artifact_dir_);
    auto db = storage::Db::Open(root_ + "/db");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    artifacts_ = std::make_unique<storage::ArtifactStore>(db_.get());
  }
  // A registered artifact whose directory holds two files of 1000 and 24 bytes.
  uint64_t MakeArtifact(const std::string& name, const std::string& dir) {
    fs::create_directories(dir);
    std::ofstream(dir + "/sae_weights.safetensors") << std::string(1000, 'w');
    std::ofstream(dir + "/cfg.json") << std::string(24, 'c');
    auto id = artifacts_->Register(name, dir, 1);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }
  static latentd::v1::Job ExtractJob(uint64_t job_id, latentd::v1::JobState state) {
    latentd::v1::Job job;
    job.set_id(job_id);
    job.set_state(state);
    job.mutable_spec()->mutable_extract();
    return job;
  }

  std::string root_, artifact_dir_;
  std::unique_ptr<storage::Db> db_;
  std::unique_ptr<storage::ArtifactStore> artifacts_;
};

TEST_F(ArtifactDeletionTest, RemovesTheRecordAndTheFiles) {
  const uint64_t id = MakeArtifact("sae-1", artifact_dir_ + "/sae-1");
  const uint64_t other = MakeArtifact("sae-2", artifact_dir_ + "/sae-2");
  auto deleted = DeleteArtifact(artifacts_.get(), artifact_dir_, {}, id);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->path, artifact_dir_ + "/sae-1");
  EXPECT_EQ(deleted->bytes_freed, 1024);
  EXPECT_FALSE(fs::exists(artifact_dir_ + "/sae-1"));
  EXPECT_EQ(artifacts_->Get(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(fs::exists(artifact_dir_ + "/sae-2/cfg.json"));
  EXPECT_TRUE(artifacts_->Get(other).ok());
  EXPECT_EQ(DeleteArtifact(artifacts_.get(), artifact_dir_, {}, id).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ArtifactDeletionTest, RefusedWhileAnUnfinishedExtractNamesIt) {
  const uint64_t id = MakeArtifact("sae-1", artifact_dir_ + "/sae-1");
  latentd::v1::Job by_id = ExtractJob(7, latentd::v1::PENDING);
  by_id.mutable_spec()->mutable_extract()->mutable_sae()->set_artifact_id(id);
  latentd::v1::Job by_path = ExtractJob(8, latentd::v1::RUNNING);
  by_path.mutable_spec()->mutable_extract()->mutable_sae()->set_path(artifact_dir_ + "/./sae-1/");
  latentd::v1::Job elsewhere = ExtractJob(9, latentd::v1::RUNNING);
  elsewhere.mutable_spec()->mutable_extract()->mutable_sae()->set_path(artifact_dir_ + "/sae-10");
  // A job of several outputs names it for its second hook.
  latentd::v1::Job second_output = elsewhere;
  second_output.set_id(10);
  second_output.mutable_spec()
      ->mutable_extract()
      ->add_more_outputs()
      ->mutable_sae()
      ->set_artifact_id(id);

  for (const latentd::v1::Job& job : {by_id, by_path, second_output}) {
    auto refused = DeleteArtifact(artifacts_.get(), artifact_dir_, {elsewhere, job}, id);
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_NE(refused.status().message().find(absl::StrCat("job ", job.id())), std::string::npos)
        << refused.status();
    EXPECT_TRUE(artifacts_->Get(id).ok());
    EXPECT_TRUE(fs::exists(artifact_dir_ + "/sae-1/cfg.json"));
  }
  EXPECT_TRUE(DeleteArtifact(artifacts_.get(), artifact_dir_, {elsewhere}, id).ok());
}

// A record is data the daemon wrote, but its path is never trusted to delete outside the
// artifact dir (a symlink inside it pointing out counts as outside).
// A record that does not parse (listed as unreadable) can be deleted: refused while a job names
// its id, then removed with its name; no file is touched, since its path is unknown (an empty
// path must not become the working directory).
TEST_F(ArtifactDeletionTest, AnUnreadableRecordIsDeletedWithoutTouchingFiles) {
  const uint64_t id = MakeArtifact("damaged", artifact_dir_ + "/damaged");
  ASSERT_TRUE(
      db_->Put(storage::Family::kMeta, storage::keys::ArtifactRecord(id), "\xff\xff", true).ok());
  latentd::v1::Job job = ExtractJob(9, latentd::v1::PENDING);
  job.mutable_spec()->mutable_extract()->mutable_sae()->set_artifact_id(id);
  EXPECT_EQ(DeleteArtifact(artifacts_.get(), artifact_dir_, {job}, id).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto deleted = DeleteArtifact(artifacts_.get(), artifact_dir_, {}, id);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->path, "");
  EXPECT_EQ(deleted->bytes_freed, 0);
  EXPECT_TRUE(fs::exists(artifact_dir_ + "/damaged/cfg.json"));
  EXPECT_EQ(artifacts_->Get(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(artifacts_->List()->unreadable_size(), 0);
  EXPECT_TRUE(artifacts_->Register("damaged", artifact_dir_ + "/again", 2).ok());  // name freed
}

TEST_F(ArtifactDeletionTest, NeverRemovesFilesOutsideTheArtifactDir) {
  const std::string outside = root_ + "/user_sae";
  const uint64_t a = MakeArtifact("outside", outside);
  fs::create_directory_symlink(outside, artifact_dir_ + "/link");
  const uint64_t b = artifacts_->Register("link", artifact_dir_ + "/link", 1).value();
  const uint64_t c = artifacts_->Register("root", artifact_dir_, 1).value();
  for (uint64_t id : {a, b, c}) {
    auto deleted = DeleteArtifact(artifacts_.get(), artifact_dir_, {}, id);
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    EXPECT_EQ(deleted->bytes_freed, 0);
    EXPECT_EQ(artifacts_->Get(id).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_TRUE(fs::exists(outside + "/cfg.json"));
  EXPECT_TRUE(fs::exists(artifact_dir_));
}

}  // namespace
}  // namespace latentd::server
