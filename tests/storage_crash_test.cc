// A child writes a dataset and is killed with SIGKILL at random points (20 runs). After each kill
// the reopened store must hold a committed prefix equal to the uninterrupted run's rows, every
// checksum valid; a resumed writer must reach exactly the uninterrupted final content
// (rows, statistics, top-N, postings).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "tests/storage_crash_rows.h"

namespace latentd::storage {
namespace {

const char* kWriter = "tests/storage_crash_writer";

// mode: "resident" or "wide" (see storage_crash_writer.cc).
pid_t Spawn(const std::string& dir, const char* mode) {
  pid_t pid = fork();
  if (pid == 0) {
    execl(kWriter, kWriter, dir.c_str(), mode, static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int RunToEnd(const std::string& dir, const char* mode) {
  int status = 0;
  waitpid(Spawn(dir, mode), &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Everything a reader can observe of the dataset, as one comparable string.
struct Content {
  int64_t rows = 0;
  ReconstructionFit fit;
  CsrRows csr;
  std::vector<std::string> stats, top, postings;
};

Content ReadContent(const std::string& dir, bool with_index) {
  Content c;
  auto db = Db::Open(dir);
  EXPECT_TRUE(db.ok()) << db.status();
  if (!db.ok()) return c;
  ChunkStore store(db->get());
  auto id = store.FindDataset("crash");
  if (!id.ok()) return c;  // killed before the dataset existed: the empty prefix
  auto info = store.GetDataset(*id);
  EXPECT_TRUE(info.ok()) << info.status();
  c.rows = info->rows_committed();
  auto fit = store.GetReconstructionFit(*id);
  EXPECT_TRUE(fit.ok()) << fit.status();
  if (fit.ok()) c.fit = *std::move(fit);
  auto csr = store.ReadRows(*id, 0, 0);  // verifies every chunk's checksum
  EXPECT_TRUE(csr.ok()) << csr.status();
  if (csr.ok()) c.csr = *std::move(csr);
  if (!with_index) return c;
  for (int32_t l = 0; l < tests::kCrashWidth; ++l) {
    auto st = store.GetLatentStats(*id, l);
    EXPECT_TRUE(st.ok());
    c.stats.push_back(st->Encode());
    auto top = store.TopActivations(*id, l, 0, 4, 4);
    EXPECT_TRUE(top.ok()) << top.status();
    std::string t;
    for (const auto& e : *top) {
      t += std::to_string(e.row) + ":" + std::to_string(e.value) + ":" +
           std::to_string(e.context_token_ids.size()) + ",";
    }
    c.top.push_back(t);
    std::vector<int64_t> rows;
    std::vector<float> values;
    EXPECT_TRUE(store.LatentPostings(*id, l, &rows, &values).ok());
    std::string p;
    for (size_t i = 0; i < rows.size(); ++i) {
      p += std::to_string(rows[i]) + "=" + std::to_string(values[i]) + ",";
    }
    c.postings.push_back(p);
  }
  return c;
}

// Both writers: with every latent's statistics and top-N list resident, and without (commits
// of operands only, blocks folded back from the store by the writer thread).
class StorageCrash : public ::testing::TestWithParam<const char*> {};

TEST_P(StorageCrash, KilledWriterLeavesCommittedPrefixAndResumesToSameContent) {
  const char* mode = GetParam();
  const std::string ref_dir = FreshTestDir(std::string("crash_ref_") + mode);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(RunToEnd(ref_dir, mode), 0);
  const auto full_run = std::chrono::steady_clock::now() - t0;
  Content ref = ReadContent(ref_dir, true);
  ASSERT_EQ(ref.rows, tests::kCrashRows);

  std::mt19937 rng(12345);
  // Kill points are drawn at random between a delay known to come too early (the writer had
  // committed nothing: process start and opening the store take most of a run) and one known to
  // come too late (it had finished), and each outcome narrows that bracket: the kills home in
  // on the stretch where commits happen, however short it is next to the start-up, and on a
  // machine whose speed comes and goes a bracket that closed up is widened again.
  const int64_t full_run_us =
      std::chrono::duration_cast<std::chrono::microseconds>(full_run).count();
  int64_t too_early_us = 0, too_late_us = full_run_us;
  int interrupted = 0;
  for (int run = 0; run < 20; ++run) {
    const std::string dir = FreshTestDir("crash_" + std::string(mode) + std::to_string(run));
    pid_t pid = Spawn(dir, mode);
    const int64_t delay_us =
        too_early_us +
        static_cast<int64_t>(rng() % std::max<int64_t>(too_late_us - too_early_us, 1));
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    Content prefix = ReadContent(dir, false);
    if (prefix.rows > 0 && prefix.rows < tests::kCrashRows) ++interrupted;
    if (prefix.rows == 0) {
      too_early_us = delay_us;
      if (too_late_us <= too_early_us)
        too_late_us = std::min(2 * too_early_us + 1, 8 * full_run_us);
    }
    if (prefix.rows == tests::kCrashRows) {
      too_late_us = delay_us;
      if (too_early_us >= too_late_us) too_early_us = too_late_us / 2;
    }
    ASSERT_EQ(prefix.rows % tests::kCrashCommitRows, 0) << "run " << run;
    ASSERT_EQ(prefix.csr.num_rows, prefix.rows);
    const int64_t nnz = ref.csr.indptr[prefix.rows];
    ASSERT_EQ(prefix.csr.indptr, std::vector<int64_t>(ref.csr.indptr.begin(),
                                                      ref.csr.indptr.begin() + prefix.rows + 1));
    ASSERT_EQ(prefix.csr.indices,
              std::vector<int32_t>(ref.csr.indices.begin(), ref.csr.indices.begin() + nnz));
    ASSERT_EQ(prefix.csr.values,
              std::vector<float>(ref.csr.values.begin(), ref.csr.values.begin() + nnz));
    ASSERT_EQ(prefix.csr.token_ids, std::vector<int32_t>(ref.csr.token_ids.begin(),
                                                         ref.csr.token_ids.begin() + prefix.rows));
    // The reconstruction totals are exactly those of the committed rows (the sums of rows that
    // died with the writer are not in them).
    const ReconstructionFit want_fit = tests::MakeCrashSums(0, prefix.rows);
    ASSERT_EQ(prefix.fit.rows, prefix.rows) << "run " << run;
    ASSERT_EQ(prefix.fit.squared_error, want_fit.squared_error) << "run " << run;
    ASSERT_EQ(prefix.fit.sum_squares, want_fit.sum_squares) << "run " << run;
    if (prefix.rows > 0) ASSERT_EQ(prefix.fit.sum_x, want_fit.sum_x) << "run " << run;

    ASSERT_EQ(RunToEnd(dir, mode), 0) << "run " << run;  // resume at the watermark
    Content full = ReadContent(dir, true);
    ASSERT_EQ(full.rows, ref.rows);
    EXPECT_EQ(full.csr.indptr, ref.csr.indptr);
    EXPECT_EQ(full.csr.indices, ref.csr.indices);
    EXPECT_EQ(full.csr.values, ref.csr.values);
    EXPECT_EQ(full.csr.token_ids, ref.csr.token_ids);
    EXPECT_EQ(full.stats, ref.stats) << "run " << run;
    EXPECT_EQ(full.top, ref.top) << "run " << run;
    EXPECT_EQ(full.postings, ref.postings) << "run " << run;
    EXPECT_EQ(full.fit.rows, tests::kCrashRows) << "run " << run;
    EXPECT_EQ(full.fit.squared_error, ref.fit.squared_error) << "run " << run;
    EXPECT_EQ(full.fit.sum_x, ref.fit.sum_x) << "run " << run;
    std::system(("rm -rf '" + dir + "'").c_str());
    std::printf("run %d: killed at %lld committed rows\n", run,
                static_cast<long long>(prefix.rows));
  }
  EXPECT_GT(interrupted, 0);
}

INSTANTIATE_TEST_SUITE_P(Writers, StorageCrash, ::testing::Values("resident", "wide"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace latentd::storage
