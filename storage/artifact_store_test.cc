#include "storage/artifact_store.h"

#include <cstdlib>

#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/keys.h"

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
    EXPECT_EQ(store.Register("sae-a", "/data/sae-a", 8).status().code(),
              absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(*store.Register("sae-a", "/data/sae-a", 7), first);  // a resumed job registers again
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
  ASSERT_EQ(list->artifacts_size(), 2);
  EXPECT_EQ(list->artifacts(0).id(), first);
  EXPECT_GT(list->artifacts(1).id(), first);
  EXPECT_EQ(list->unreadable_size(), 0);
}

TEST(ArtifactStore, DeleteFreesTheNameAndKeepsTheIdsUnique) {
  auto db = Db::Open(FreshTestDir("artifacts_delete"));
  ASSERT_TRUE(db.ok());
  ArtifactStore store(db->get());
  const uint64_t a = *store.Register("sae", "/data/sae", 1);
  const uint64_t b = *store.Register("other", "/data/other", 2);
  auto deleted = store.Delete(a);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->path(), "/data/sae");
  EXPECT_EQ(store.Get(a).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.FindByName("sae").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Delete(a).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.List()->artifacts_size(), 1);
  EXPECT_EQ(store.FindByName("other")->id(), b);
  // The name is free again; the new record gets a new id, so a job naming the old id cannot
  // silently load the new SAE.
  auto again = store.Register("sae", "/data/sae", 3);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(*again, b);
}

// A record that does not parse is listed as unreadable; the others list as usual.
TEST(ArtifactStore, ADamagedRecordDoesNotHideTheOthers) {
  auto db = Db::Open(FreshTestDir("artifacts_damaged"));
  ASSERT_TRUE(db.ok());
  ArtifactStore store(db->get());
  const uint64_t a = *store.Register("a", "/data/a", 1);
  const uint64_t b = *store.Register("b", "/data/b", 2);
  ASSERT_TRUE((*db)->Put(Family::kMeta, keys::ArtifactRecord(a), "\xff\xff\xff", true).ok());
  auto list = store.List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->artifacts_size(), 1);
  EXPECT_EQ(list->artifacts(0).id(), b);
  ASSERT_EQ(list->unreadable_size(), 1);
  EXPECT_EQ(list->unreadable(0).artifact_id(), a);
  EXPECT_EQ(store.Get(a).status().code(), absl::StatusCode::kDataLoss);
}

// Names are free text: "ext" once made the name key ("art/n" + name) the id counter's key
// ("art/next"), so the name resolved to a later artifact and deleting it reset the counter,
// reusing the ids of live artifacts.
TEST(ArtifactStore, ANameLikeACounterKeyIsAnOrdinaryName) {
  auto db = Db::Open(FreshTestDir("artifacts_ext"));
  ASSERT_TRUE(db.ok());
  ArtifactStore store(db->get());
  const uint64_t ext = *store.Register("ext", "/data/ext", 1);
  const uint64_t b = *store.Register("b", "/data/b", 2);
  EXPECT_EQ(store.FindByName("ext")->id(), ext);
  EXPECT_EQ(store.FindByName("ext")->path(), "/data/ext");
  ASSERT_TRUE(store.Delete(ext).ok());
  const uint64_t c = *store.Register("c", "/data/c", 3);
  EXPECT_GT(c, b);
  EXPECT_EQ(store.Get(b)->path(), "/data/b");
  EXPECT_EQ(store.FindByName("ext").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace latentd::storage
