#include "client/cli.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "client/latentctl_flags.h"
#include "gtest/gtest.h"

namespace latentd::client::cli {
namespace {

TEST(Bytes, PicksTheLargestUnitBelow1024) {
  EXPECT_EQ(Bytes(0), "0 B");
  EXPECT_EQ(Bytes(1023), "1023 B");
  EXPECT_EQ(Bytes(1536), "1.50 KiB");
  EXPECT_EQ(Bytes(3.5 * 1024 * 1024 * 1024), "3.50 GiB");
  EXPECT_EQ(Bytes(2048.0 * 1024 * 1024 * 1024 * 1024), "2048.00 TiB");
}

TEST(Bar, IsOneToFortyMarksAndNoneForZero) {
  EXPECT_EQ(Bar(0, 100), "");
  EXPECT_EQ(Bar(1, 100), "#");
  EXPECT_EQ(Bar(100, 100), std::string(40, '#'));
  EXPECT_EQ(Bar(50, 100), std::string(20, '#'));
  EXPECT_EQ(Bar(3, 0), std::string(40, '#'));  // a count past the peak fills the bar, no more
}

TEST(MergeBins, SumsGroupsAndKeepsAShortLastGroup) {
  google::protobuf::RepeatedField<int64_t> bins;
  for (int64_t b : {1, 2, 3, 4, 5}) bins.Add(b);
  EXPECT_EQ(MergeBins(bins, 2), (std::vector<int64_t>{3, 7, 5}));
  EXPECT_EQ(MergeBins(bins, 1), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(MergeBins(bins, 8), (std::vector<int64_t>{15}));
}

TEST(ParseId, TakesPositiveNumbersOnly) {
  const std::vector<std::string> args = {"get", "17", "0", "x", "-3"};
  uint64_t id = 0;
  EXPECT_TRUE(ParseId(args, 1, &id));
  EXPECT_EQ(id, 17u);
  EXPECT_FALSE(ParseId(args, 2, &id));
  EXPECT_FALSE(ParseId(args, 3, &id));
  EXPECT_FALSE(ParseId(args, 4, &id));
  EXPECT_FALSE(ParseId(args, 5, &id));  // missing
}

TEST(FromGrpc, KeepsCodeAndMessage) {
  const absl::Status status = FromGrpc(grpc::Status(grpc::StatusCode::NOT_FOUND, "no dataset 9"));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "no dataset 9");
  EXPECT_TRUE(FromGrpc(grpc::Status::OK).ok());
}

// A failure from a helper reads as a failed call does: the code's name, then the message.
TEST(StatusError, PrintsLikeRpcErrorAndExitsAsOne) {
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RpcError(grpc::Status(grpc::StatusCode::NOT_FOUND, "dataset 9 not found")),
            kExitRpcError);
  const std::string from_call = ::testing::internal::GetCapturedStderr();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(StatusError(absl::NotFoundError("dataset 9 not found")), kExitRpcError);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), from_call);
  EXPECT_EQ(from_call, "latentctl: NOT_FOUND: dataset 9 not found\n");
}

TEST(Time, UnsetIsADash) { EXPECT_EQ(Time(google::protobuf::Timestamp()), "-"); }

TEST(DatasetLabel, AddsTheHookUnlessTheNameCarriesIt) {
  v1::DatasetInfo d;
  d.set_id(4);
  d.set_hook_name("blocks.6.hook_resid_post");
  d.set_name("x1-blocks.6.hook_resid_post");
  EXPECT_EQ(DatasetLabel(d), "dataset 4 (x1-blocks.6.hook_resid_post)");
  d.set_name("chat");
  EXPECT_EQ(DatasetLabel(d), "dataset 4 (chat, blocks.6.hook_resid_post)");
}

TEST(Words, ReadsLittleEndianWordsAndDropsATrailingPart) {
  const std::string bytes("\x01\x00\x00\x00\xff\xff\xff\xff\x07", 9);
  EXPECT_EQ(Words<uint32_t>(bytes), (std::vector<uint32_t>{1u, 0xffffffffu}));
  EXPECT_TRUE(Words<float>("").empty());
}

class WithTempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
            std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(WithTempDir, LatentPagesBesideFindsTheDashboardPagesNextToThePage) {
  ASSERT_TRUE(WriteFile(dir_ / LatentPageName(5), "<html></html>"));
  ASSERT_TRUE(WriteFile(dir_ / LatentPageName(9), "<html></html>"));
  const std::vector<int32_t> latents = {3, 5, 9};
  const std::set<int32_t> pages =
      LatentPagesBeside((dir_ / "prompt.html").string(), latents, [](int32_t j) { return j; });
  EXPECT_EQ(pages, (std::set<int32_t>{5, 9}));
}

TEST_F(WithTempDir, WriteFileAndWriteHtmlFlagSayFalseWhenTheyCannotWrite) {
  absl::FlagSaver restore_flags;
  absl::SetFlag(&FLAGS_json, true);  // no "wrote PATH" line in the test's output
  const std::filesystem::path page = dir_ / "page.html";
  EXPECT_TRUE(WriteHtmlFlag(page.string(), "<p>hi</p>"));
  std::ifstream in(page);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "<p>hi</p>");
  EXPECT_FALSE(WriteHtmlFlag((dir_ / "missing" / "page.html").string(), "x"));
  EXPECT_FALSE(WriteFile(dir_ / "missing" / "page.html", "x"));
}

TEST_F(WithTempDir, LoadTokenNamesAnUnreadableFileAndTakesNoneAsNoToken) {
  absl::FlagSaver restore_flags;
  Client client("127.0.0.1:1");
  std::string error;
  absl::SetFlag(&FLAGS_token_file, (dir_ / "absent").string());
  EXPECT_FALSE(client.LoadToken(&error));
  EXPECT_EQ(error, "--token_file: cannot read " + (dir_ / "absent").string());
  std::ofstream(dir_ / "token") << "s3cret \n";
  absl::SetFlag(&FLAGS_token_file, (dir_ / "token").string());
  EXPECT_TRUE(client.LoadToken(&error));
  absl::SetFlag(&FLAGS_token_file, "");
  EXPECT_TRUE(client.LoadToken(&error));  // no file: calls go without a token
}

}  // namespace
}  // namespace latentd::client::cli
