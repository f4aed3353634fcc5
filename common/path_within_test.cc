#include "common/path_within.h"

#include "gtest/gtest.h"

namespace latentd {
namespace {

TEST(PathIsWithin, ComparesWholeComponents) {
  EXPECT_TRUE(PathIsWithin("/data/a", "/data/a"));
  EXPECT_TRUE(PathIsWithin("/data/a/x/y.npy", "/data/a"));
  EXPECT_TRUE(PathIsWithin("/data/a/x", "/data/a/"));
  EXPECT_TRUE(PathIsWithin("/data/a/", "/data/a"));
  EXPECT_TRUE(PathIsWithin("/anything", "/"));
  EXPECT_FALSE(PathIsWithin("/data/ab", "/data/a"));
  EXPECT_FALSE(PathIsWithin("/data", "/data/a"));
  EXPECT_FALSE(PathIsWithin("/data/a/../b", "/data/a"));  // lexically normalised first
  EXPECT_FALSE(PathIsWithin("/data/a", ""));
  EXPECT_FALSE(PathIsWithin("", "/data/a"));
}

}  // namespace
}  // namespace latentd
