#include "engine/device_pool.h"

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

TEST(DevicePool, CpuSpecMakesThatManyDevices) {
  auto pool = DevicePool::Create("cpu:3");
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ((*pool)->size(), 3);
  EXPECT_EQ((*pool)->devices()[2].name, "cpu:2");
  EXPECT_EQ((*pool)->devices()[2].kind, DeviceKind::kCpu);
}

TEST(DevicePool, AutoOnACpuMachineIsOneCpuDevice) {
  auto pool = DevicePool::Create("auto");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_GE((*pool)->size(), 1);
}

TEST(DevicePool, BadSpecsAreInvalidArgumentNamingTheFlag) {
  for (const char* spec : {"cpu:0", "cpu:x", "tpu", "cuda:9"}) {
    auto pool = DevicePool::Create(spec);
    ASSERT_FALSE(pool.ok()) << spec;
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(pool.status().message().find("--devices"), absl::string_view::npos);
  }
}

TEST(DevicePool, ADeviceIsNeverGivenToTwoJobs) {
  auto pool = *DevicePool::Create("cpu:3");
  auto a = pool->TryAcquire(2, 1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->size(), 2u);
  EXPECT_FALSE(pool->TryAcquire(2, 2).has_value());  // only one left: all or nothing
  auto b = pool->TryAcquire(1, 2);
  ASSERT_TRUE(b.has_value());
  EXPECT_NE((*b)[0].index, (*a)[0].index);
  EXPECT_NE((*b)[0].index, (*a)[1].index);
  EXPECT_EQ(pool->free_count(), 0);
  pool->Release(1);
  EXPECT_EQ(pool->free_count(), 2);
  for (const DeviceStatus& s : pool->Snapshot()) {
    EXPECT_TRUE(s.held_by_job == 0 || s.held_by_job == 2);
  }
  EXPECT_FALSE(pool->TryAcquire(0, 3).has_value());
}

}  // namespace
}  // namespace latentd::engine
