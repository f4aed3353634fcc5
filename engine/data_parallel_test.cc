#include "engine/data_parallel.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"

namespace latentd::engine {
namespace {

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

TEST(DataParallelTest, ParsesHostPort) {
  auto v4 = ParseHostPort("10.0.0.7:29500");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->host, "10.0.0.7");
  EXPECT_EQ(v4->port, 29500);
  auto v6 = ParseHostPort("[fe80::1]:1");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "fe80::1");
  EXPECT_EQ(v6->port, 1);
  for (const char* bad : {"", "host", "host:", ":29500", "host:0", "host:65536", "host:12a",
                          "fe80::1:29500", "[fe80::1]29500", "host:999999"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseHostPort(bad).status())) << bad;
  }
}

TEST(DataParallelTest, TheRouteToLoopbackIsLoopback) {
  auto local = LocalAddressTowards({"127.0.0.1", 29500});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
  EXPECT_FALSE(LocalAddressTowards({"no-such-host.invalid", 29500}).ok());
}

// Two ranks meet through a TCPStore (rank 0 hosts it), check that they agree, form a Gloo group
// and broadcast rank 0's bytes; a disagreement is reported to both with both values.
TEST(DataParallelTest, RanksMeetThroughATcpStoreAndBroadcast) {
  const int port = FreePort();
  absl::Status agreed[2], differ[2];
  std::string received[2];
  auto rank = [&](int r) {
    auto store = NewTcpStore("127.0.0.1", port, 2, r == 0, 30);
    ASSERT_TRUE(store.ok()) << store.status();
    agreed[r] = CheckRanksAgree(**store, r, 2, "the run", "CPU, 64 rows");
    differ[r] = CheckRanksAgree(**store, r, 2, "the data", r == 0 ? "64 rows" : "65 rows");
    auto sync = JoinProcessGroup(*store, {.rank = r, .world_size = 2});
    ASSERT_TRUE(sync.ok()) << sync.status();
    std::string bytes = r == 0 ? std::string(1 << 20, 'x') + "end" : "stale";
    ASSERT_TRUE((*sync)->BroadcastBytes(&bytes, c10::kCPU).ok());
    received[r] = bytes;
    std::string empty = r == 0 ? "" : "stale";
    ASSERT_TRUE((*sync)->BroadcastBytes(&empty, c10::kCPU).ok());
    EXPECT_EQ(empty, "");
    std::vector<torch::Tensor> gathered;
    ASSERT_TRUE((*sync)->AllGather(torch::full({3}, 10.0f + r), &gathered).ok());
    ASSERT_EQ(gathered.size(), 2u);
    for (int from = 0; from < 2; ++from) {
      EXPECT_TRUE(gathered[from].equal(torch::full({3}, 10.0f + from))) << r << " " << from;
    }
  };
  std::thread t1(rank, 1);
  std::thread t0(rank, 0);
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(agreed[r].ok()) << agreed[r];
    EXPECT_TRUE(absl::IsFailedPrecondition(differ[r])) << differ[r];
    EXPECT_NE(differ[r].message().find("disagree on the data: rank 0 has 64 rows; rank 1 has 65"),
              std::string::npos)
        << differ[r];
    EXPECT_EQ(received[r].size(), (1u << 20) + 3);
    EXPECT_EQ(received[r].substr(received[r].size() - 3), "end");
  }
}

TEST(DataParallelTest, RanksWhosePeersNeverComeTimeOut) {
  const int port = FreePort();
  auto master = NewTcpStore("127.0.0.1", port, 2, true, 1);
  ASSERT_TRUE(master.ok()) << master.status();
  absl::Status alone = CheckRanksAgree(**master, 0, 2, "the run", "x");
  EXPECT_TRUE(absl::IsUnavailable(alone)) << alone;
  EXPECT_NE(alone.message().find("rank 0 of 2: no word from rank 1 on the run within 1 s"),
            std::string::npos)
      << alone;
  // A rank whose master never comes gives up connecting after the timeout.
  const absl::Time begin = absl::Now();
  auto orphan = NewTcpStore("127.0.0.1", FreePort(), 2, false, 1);
  EXPECT_TRUE(absl::IsUnavailable(orphan.status())) << orphan.status();
  EXPECT_GE(absl::Now() - begin, absl::Seconds(1));
}

// Waiting ranks can be cancelled: the job holding them was cancelled, or its launcher gave up.
TEST(DataParallelTest, WaitingRanksCanBeCancelled) {
  std::atomic<bool> cancel{false};
  auto cancelled = [&] { return cancel.load(); };
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    cancel = true;
  });
  const absl::Time begin = absl::Now();
  auto orphan = NewTcpStore("127.0.0.1", FreePort(), 2, false, 60, cancelled);
  EXPECT_TRUE(absl::IsCancelled(orphan.status())) << orphan.status();
  auto master = NewTcpStore("127.0.0.1", FreePort(), 2, true, 60);
  ASSERT_TRUE(master.ok()) << master.status();
  absl::Status alone = CheckRanksAgree(**master, 0, 2, "the run", "x", cancelled);
  EXPECT_TRUE(absl::IsCancelled(alone)) << alone;
  EXPECT_LT(absl::Now() - begin, absl::Seconds(10));
  canceller.join();
}

// A rank that connects before its master listens waits for it (nodes' jobs start in any order).
TEST(DataParallelTest, ARankThatComesBeforeItsMasterWaitsForIt) {
  const int port = FreePort();
  absl::Status agreed[2];
  std::thread early([&] {
    auto store = NewTcpStore("127.0.0.1", port, 2, false, 30);
    agreed[1] = store.ok() ? CheckRanksAgree(**store, 1, 2, "the run", "x") : store.status();
  });
  absl::SleepFor(absl::Milliseconds(300));
  auto master = NewTcpStore("127.0.0.1", port, 2, true, 30);
  ASSERT_TRUE(master.ok()) << master.status();
  agreed[0] = CheckRanksAgree(**master, 0, 2, "the run", "x");
  early.join();
  EXPECT_TRUE(agreed[0].ok()) << agreed[0];
  EXPECT_TRUE(agreed[1].ok()) << agreed[1];
}

// A rank's view of the store that answers its reads late (a slow network, a busy node).
class SlowReads : public c10d::Store {
 public:
  explicit SlowReads(c10::intrusive_ptr<c10d::Store> store)
      : c10d::Store(store->getTimeout()), store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    store_->set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    absl::SleepFor(absl::Milliseconds(300));
    return store_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override { return store_->add(key, value); }
  bool deleteKey(const std::string& key) override { return store_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override {
    absl::SleepFor(absl::Milliseconds(300));
    return store_->check(keys);
  }
  int64_t getNumKeys() override { return store_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    store_->wait(keys, t);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// Rank 0's node hosts the store and closes it as soon as its job fails: a disagreement must
// still reach a rank that reads slowly as a disagreement, not as a broken connection.
TEST(DataParallelTest, TheMasterWaitsUntilEveryRankHasReadTheVerdict) {
  const int port = FreePort();
  auto master = NewTcpStore("127.0.0.1", port, 2, true, 30);
  ASSERT_TRUE(master.ok()) << master.status();
  absl::Status differ[2];
  std::thread slow([&] {
    auto store = NewTcpStore("127.0.0.1", port, 2, false, 30);
    if (!store.ok()) {
      differ[1] = store.status();
      return;
    }
    SlowReads view(*store);
    differ[1] = CheckRanksAgree(view, 1, 2, "the data", "65 rows");
  });
  differ[0] = CheckRanksAgree(**master, 0, 2, "the data", "64 rows");
  master->reset();  // the node's job ends: its store goes
  slow.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsFailedPrecondition(differ[r])) << r << ": " << differ[r];
  }
}

}  // namespace
}  // namespace latentd::engine
