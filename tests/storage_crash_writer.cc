// Child process of storage_crash_test: writes (or resumes) dataset "crash" in the database at
// argv[1], committing every kCrashCommitRows rows, then marks it complete. The parent kills it
// with SIGKILL at random points. argv[2] "wide" runs the writer without resident per-latent
// state (as datasets wider than ChunkStoreOptions::resident_latent_state_max_width get).
#include <cstdio>
#include <string>

#include "storage/chunk_store.h"
#include "tests/storage_crash_rows.h"

using latentd::storage::ChunkStore;
using latentd::storage::DatasetMeta;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s DB_DIR resident|wide\n", argv[0]);
    return 2;
  }
  auto db = latentd::storage::Db::Open(argv[1]);
  if (!db.ok()) {
    std::fprintf(stderr, "%s\n", db.status().ToString().c_str());
    return 1;
  }
  latentd::storage::ChunkStoreOptions options;
  options.sparse_chunk_rows = 32;  // several chunks per commit
  options.latent_slices = 8;
  if (std::string(argv[2]) == "wide") options.resident_latent_state_max_width = 0;
  ChunkStore store(db->get(), options);
  auto id = store.FindDataset("crash");
  if (!id.ok()) {
    DatasetMeta meta;
    meta.name = "crash";
    meta.width = latentd::tests::kCrashWidth;
    meta.context_length = 64;
    meta.top_n = 16;
    meta.encoder = "relu";
    id = store.CreateDataset(meta);
  }
  if (!id.ok()) {
    std::fprintf(stderr, "%s\n", id.status().ToString().c_str());
    return 1;
  }
  auto record = store.GetRecord(*id);
  if (record.ok() && record->complete) return 0;  // killed after finishing: nothing to resume
  auto writer = store.OpenWriter(*id);
  if (!writer.ok()) {
    std::fprintf(stderr, "%s\n", writer.status().ToString().c_str());
    return 1;
  }
  // CommitAsync: a kill may land while a batch is being written in the background.
  for (int64_t at = (*writer)->rows_committed(); at < latentd::tests::kCrashRows;
       at += latentd::tests::kCrashCommitRows) {
    auto rows = latentd::tests::MakeCrashRows(at, latentd::tests::kCrashCommitRows);
    absl::Status s =
        (*writer)->AppendSparse(latentd::tests::kCrashCommitRows, rows.indptr.data(),
                                rows.indices.data(), rows.values.data(), rows.tokens.data());
    if (s.ok()) {
      s = (*writer)->AddReconstructionSums(
          latentd::tests::MakeCrashSums(at, latentd::tests::kCrashCommitRows));
    }
    if (s.ok()) s = (*writer)->CommitAsync();  // as EXTRACT commits: the next rows overlap
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  absl::Status s = (*writer)->MarkComplete();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
