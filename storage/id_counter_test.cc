#include "storage/id_counter.h"

#include "common/big_endian.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/keys.h"

namespace latentd::storage {
namespace {

const IdCounter kCounter{keys::kDatasetIdCounter, keys::kLegacyDatasetIdCounter};

std::string Id(uint64_t id) {
  std::string bytes;
  AppendBigEndian64(id, &bytes);
  return bytes;
}

// Allocates an id the way the stores do: the advance first, then the object's name key.
uint64_t Allocate(Db* db, const std::string& name_key) {
  auto allocation = IdAllocation::Read(*db, kCounter);
  EXPECT_TRUE(allocation.ok()) << allocation.status();
  rocksdb::WriteBatch batch;
  allocation->AddAdvance(*db, &batch);
  batch.Put(db->handle(Family::kMeta), name_key, Id(allocation->id()));
  EXPECT_TRUE(db->Write(&batch, /*sync=*/true).ok());
  return allocation->id();
}

TEST(IdCounter, CountsFromOne) {
  auto db = Db::Open(FreshTestDir("id_counter_new"));
  ASSERT_TRUE(db.ok());
  EXPECT_EQ(Allocate(db->get(), keys::DatasetName("a")), 1u);
  EXPECT_EQ(Allocate(db->get(), keys::DatasetName("b")), 2u);
  EXPECT_EQ(*(*db)->Get(Family::kMeta, keys::kDatasetIdCounter), Id(3));
  EXPECT_TRUE(absl::IsNotFound((*db)->Get(Family::kMeta, keys::kLegacyDatasetIdCounter).status()));
}

// A store written before the counter moved: its ids go on from the legacy key, which the first
// allocation deletes, so that afterwards the key is only what it always claimed to be, the name
// key of "ext".
TEST(IdCounter, ALegacyStoreGoesOnFromItsCounterAndFreesTheName) {
  auto db = Db::Open(FreshTestDir("id_counter_legacy"));
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE((*db)->Put(Family::kMeta, keys::kLegacyDatasetIdCounter, Id(7), true).ok());
  auto allocation = IdAllocation::Read(**db, kCounter);
  ASSERT_TRUE(allocation.ok());
  EXPECT_EQ(allocation->id(), 7u);
  EXPECT_TRUE(allocation->HoldsCounter(keys::DatasetName("ext")));
  EXPECT_FALSE(allocation->HoldsCounter(keys::DatasetName("other")));

  EXPECT_EQ(Allocate(db->get(), keys::DatasetName("ext")), 7u);
  EXPECT_EQ(*(*db)->Get(Family::kMeta, keys::DatasetName("ext")), Id(7));
  auto next = IdAllocation::Read(**db, kCounter);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->id(), 8u);
  EXPECT_FALSE(next->HoldsCounter(keys::DatasetName("ext")));  // a name now, not the counter
}

TEST(IdCounter, AMalformedCounterIsDataLoss) {
  auto db = Db::Open(FreshTestDir("id_counter_bad"));
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE((*db)->Put(Family::kMeta, keys::kDatasetIdCounter, "abc", true).ok());
  auto allocation = IdAllocation::Read(**db, kCounter);
  EXPECT_EQ(allocation.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(allocation.status().message().find("ds/i"), std::string::npos) << allocation.status();
}

}  // namespace
}  // namespace latentd::storage
