// Helper of tests/python/test_export.py: writes a SPARSE (fp16) and a DENSE (fp32) dataset into a
// fresh store under argv[1], exports them (NPZ, HDF5 and delphi's latent cache, whole and partial
// ranges) and writes the store's own view of the rows (ReadRows / ReadDense) to expected.json for
// comparison.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "storage/chunk_store.h"
#include "storage/export.h"
#include "storage/sparse_rows_testing.h"

using namespace latentd::storage;  // NOLINT: a small test helper

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

nlohmann::json CsrJson(const CsrRows& r) {
  return {{"row_start", r.row_start}, {"shape", {r.num_rows, r.num_cols}},
          {"indptr", r.indptr},       {"indices", r.indices},
          {"values", r.values},       {"token_ids", r.token_ids}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string out = argv[1];
  auto db = Db::Open(out + "/db");
  if (!db.ok()) return Fail(db.status());
  ChunkStoreOptions options;
  options.chunk_rows = 64;
  ChunkStore store(db->get(), options);

  DatasetMeta sm;
  sm.name = "sparse";
  sm.model_id = "ref-gpt2";
  sm.hook_name = "blocks.2.hook_resid_post";
  sm.layer = 2;
  sm.d_in = 256;
  sm.encoder = "topk";
  sm.k = 12;
  sm.width = 300;
  sm.context_length = 50;
  auto sid = store.CreateDataset(sm);
  if (!sid.ok()) return Fail(sid.status());
  {
    auto w = store.OpenWriter(*sid);
    if (!w.ok()) return Fail(w.status());
    std::mt19937 rng(3);
    for (int commit = 0; commit < 5; ++commit) {
      const SparseRowsForTest rows = RandomSparseRows(rng, 100, 300, 12);
      if (absl::Status s = AppendAndCommit(**w, rows); !s.ok()) return Fail(s);
    }
  }
  DatasetMeta dm = sm;
  dm.name = "dense";
  dm.kind = DatasetKind::kDense;
  dm.value_dtype = ValueDtype::kFloat32;
  dm.encoder = "";
  dm.width = 8;
  auto did = store.CreateDataset(dm);
  if (!did.ok()) return Fail(did.status());
  {
    auto w = store.OpenWriter(*did);
    if (!w.ok()) return Fail(w.status());
    std::vector<float> values(40 * 8);
    std::vector<int32_t> tokens(40);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) / 3.0f - 5.0f;
    for (int i = 0; i < 40; ++i) tokens[i] = 100000 + i;
    absl::Status s = (*w)->AppendDense(40, values.data(), tokens.data());
    if (s.ok()) s = (*w)->Commit();
    if (!s.ok()) return Fail(s);
  }

  struct Job {
    uint64_t id;
    int64_t start, count;
    ExportFormat format;
    std::string file;
    int delphi_splits = 0;
    // Blocks of a few rows, and every NPZ size and offset in ZIP64 fields: the streamed writers'
    // seams, read back by the same checks.
    bool small_blocks = false;
  };
  for (const Job& j :
       std::vector<Job>{{*sid, 0, 0, ExportFormat::kNpz, "sparse_full.npz"},
                        {*sid, 0, 0, ExportFormat::kHdf5, "sparse_full.h5"},
                        {*sid, 120, 220, ExportFormat::kNpz, "sparse_part.npz"},
                        {*sid, 120, 220, ExportFormat::kHdf5, "sparse_part.h5"},
                        {*did, 0, 0, ExportFormat::kNpz, "dense.npz"},
                        {*did, 5, 30, ExportFormat::kHdf5, "dense_part.h5"},
                        {*sid, 0, 0, ExportFormat::kDelphi, "latents", 3},
                        {*sid, 100, 300, ExportFormat::kDelphi, "part"},
                        {*sid, 0, 0, ExportFormat::kNpz, "sparse_blocks.npz", 0, true},
                        {*sid, 120, 220, ExportFormat::kHdf5, "sparse_part_blocks.h5", 0, true},
                        {*did, 0, 0, ExportFormat::kNpz, "dense_blocks.npz", 0, true},
                        {*did, 5, 30, ExportFormat::kHdf5, "dense_part_blocks.h5", 0, true}}) {
    ExportOptions options;
    options.delphi_splits = j.delphi_splits;
    if (j.small_blocks) {
      options.block_values = 50;
      options.npz_zip64_from = 1;
    }
    auto r = ExportDataset(store, j.id, j.start, j.count, j.format, out + "/" + j.file, options);
    if (!r.ok()) return Fail(r.status());
  }
  auto full = store.ReadRows(*sid, 0, 0);
  if (!full.ok()) return Fail(full.status());
  std::vector<float> dense;
  std::vector<int32_t> dense_tokens;
  absl::Status s = store.ReadDense(*did, 0, 0, &dense, &dense_tokens);
  if (!s.ok()) return Fail(s);
  nlohmann::json expected = {
      {"sparse", CsrJson(*full)},
      {"dense", {{"shape", {40, 8}}, {"values", dense}, {"token_ids", dense_tokens}}},
      {"meta", {{"model_id", sm.model_id}, {"hook_name", sm.hook_name}, {"k", sm.k}}}};
  std::ofstream(out + "/expected.json") << expected.dump();
  return 0;
}
