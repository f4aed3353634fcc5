#include "storage/artifact_store.h"

#include <cstdlib>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

TEST(ArtifactStore, RegisterFindListSurviveReopen) {
  const std::string dir = FreshTestDir("artifacts");
  uint64_t first;
  {
    auto db = Db::Open(dir);
    ASSERT_TRUE(db.ok());
    ArtifactStore store(db->get());
    auto id = store.Register("sae-a", "/data/sae-a", 7);
    ASSERT_TRUE(id.ok()) << id.status();
    first = *id;
    EXPECT_EQ(store.Register("sae-a", "/x", 8).status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(store.Register("", "/x", 8).status().code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(store.Register("sae-b", "/data/sae-b", 9).ok());
  }
  auto db = Db::Open(dir);
  ASSERT_TRUE(db.ok());
  ArtifactStore store(db->get());
  auto a = store.Get(first);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->name(), "sae-a");
  EXPECT_EQ(a->path(), "/data/sae-a");
  EXPECT_EQ(a->job_id(), 7u);
  EXPECT_EQ(store.FindByName("sae-b")->job_id(), 9u);
  EXPECT_EQ(store.FindByName("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get(99).status().code(), absl::StatusCode::kNotFound);
  auto list = store.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].id(), first);
  EXPECT_GT((*list)[1].id(), first);
}

}  // namespace
}  // namespace latentd::storage
