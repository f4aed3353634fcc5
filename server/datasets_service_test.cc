#include "server/datasets_service.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/parquet_column.h"
#include "common/safetensors.h"
#include "engine/sae_config.h"
#include "gtest/gtest.h"
#include "storage/keys.h"
#include "storage/latent_explanations.h"
#include "storage/latents_on_rows.h"
#include "storage/sparse_probe.h"
#include "storage/value_codec.h"

namespace latentd::server {
namespace {

namespace fs = std::filesystem;

class DatasetsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    dir_ = fs::path(base ? base : "/tmp") / "datasets_service";
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "exports");
    auto db = storage::Db::Open((dir_ / "db").string());
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    store_ = std::make_unique<storage::ChunkStore>(db_.get());
    artifacts_ = std::make_unique<storage::ArtifactStore>(db_.get());
    DatasetsServiceOptions options;
    options.export_root = (dir_ / "exports").string();
    options.artifact_dir = (dir_ / "artifacts").string();
    options.unfinished_jobs = [this] { return unfinished_jobs_; };
    engine::ExtractEnv weights_env;
    weights_env.data_roots = {dir_.string()};
    weights_env.find_job = [this](uint64_t id) -> absl::StatusOr<latentd::v1::Job> {
      auto it = jobs_.find(id);
      if (it == jobs_.end()) return absl::NotFoundError("no such job");
      return it->second;
    };
    dataset_models_ = std::make_unique<engine::DatasetModels>(weights_env);
    options.dataset_models = dataset_models_.get();
    service_ = std::make_unique<DatasetsService>(store_.get(), artifacts_.get(), options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_GT(port, 0);
    stub_ = latentd::v1::Datasets::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                               grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown();
    server_.reset();
  }

  // A SPARSE dataset of `rows` rows, 16 latents each out of `width`.
  // Reads an AttributionGraph stream: its progress events (when `progress` is not null) and
  // the graph at its end.
  grpc::Status ReadGraph(const latentd::v1::AttributionGraphRequest& request,
                         latentd::v1::AttributionGraphResponse* graph,
                         std::vector<latentd::v1::AttributionGraphProgress>* progress) {
    grpc::ClientContext c;
    auto reader = stub_->AttributionGraph(&c, request);
    latentd::v1::AttributionGraphEvent event;
    while (reader->Read(&event)) {
      if (event.has_progress() && progress != nullptr) progress->push_back(event.progress());
      if (event.has_graph()) *graph = event.graph();
    }
    return reader->Finish();
  }

  uint64_t MakeDataset(const std::string& name, int64_t rows, int32_t width = 4096,
                       storage::ValueDtype dtype = storage::ValueDtype::kFloat16,
                       uint64_t job_id = 0, const std::string& hook_name = "") {
    storage::DatasetMeta m;
    m.name = name;
    m.job_id = job_id;
    m.hook_name = hook_name;
    m.width = width;
    m.value_dtype = dtype;
    m.k = 16;
    m.encoder = "topk";
    m.context_length = 128;
    uint64_t id = *store_->CreateDataset(m);
    auto w = store_->OpenWriter(id);
    EXPECT_TRUE(w.ok());
    std::mt19937 rng(9);
    std::vector<int64_t> indptr{0};
    std::vector<int32_t> indices, tokens;
    std::vector<float> values;
    for (int64_t r = 0; r < rows; ++r) {
      std::set<int32_t> cols;
      while (cols.size() < 16) cols.insert(static_cast<int32_t>(rng() % width));
      for (int32_t c : cols) {
        indices.push_back(c);
        values.push_back(0.5f + static_cast<float>(rng() % 1000) / 10.0f);  // never 0
      }
      indptr.push_back(static_cast<int64_t>(indices.size()));
      tokens.push_back(static_cast<int32_t>(rng() % 4096));
    }
    EXPECT_TRUE(
        (*w)->AppendSparse(rows, indptr.data(), indices.data(), values.data(), tokens.data()).ok());
    EXPECT_TRUE((*w)->Commit().ok());
    return id;
  }

  fs::path dir_;
  std::unique_ptr<storage::Db> db_;
  std::unique_ptr<storage::ChunkStore> store_;
  std::unique_ptr<storage::ArtifactStore> artifacts_;
  std::unique_ptr<DatasetsService> service_;
  std::vector<latentd::v1::Job> unfinished_jobs_;
  std::map<uint64_t, latentd::v1::Job> jobs_;  // what GetLatentWeights' reader finds
  std::unique_ptr<engine::DatasetModels> dataset_models_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<latentd::v1::Datasets::Stub> stub_;
};

TEST_F(DatasetsServiceTest, ReadRowsStreamsPiecesUnderFourMiBThatReassemble) {
  const int64_t rows = 40000;  // ~6 MB of CSR on the wire: at least two pieces
  uint64_t id = MakeDataset("big", rows);
  grpc::ClientContext ctx;
  latentd::v1::ReadRowsRequest req;
  req.set_dataset_id(id);
  auto reader = stub_->ReadRows(&ctx, req);
  latentd::v1::CsrPiece piece;
  std::vector<int32_t> indices, tokens;
  int64_t next = 0;
  int pieces = 0;
  while (reader->Read(&piece)) {
    ++pieces;
    EXPECT_LE(piece.ByteSizeLong(), DatasetsService::kMaxPieceBytes);
    EXPECT_EQ(piece.row_start(), next);
    EXPECT_EQ(piece.indptr_size(), piece.num_rows() + 1);
    EXPECT_EQ(piece.indptr(0), 0);
    EXPECT_EQ(piece.num_cols(), 4096);
    next += piece.num_rows();
    indices.insert(indices.end(), piece.indices().begin(), piece.indices().end());
    tokens.insert(tokens.end(), piece.token_ids().begin(), piece.token_ids().end());
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_GE(pieces, 2);
  EXPECT_EQ(next, rows);
  auto want = store_->ReadRows(id, 0, 0);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(indices, want->indices);
  EXPECT_EQ(tokens, want->token_ids);
}

// Little-endian words of type T from a PackedCsr byte string.
template <typename T>
std::vector<T> Words(const std::string& bytes) {
  EXPECT_EQ(bytes.size() % sizeof(T), 0u);
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

TEST_F(DatasetsServiceTest, PackedReadRowsCarryTheStoredBitsInNarrowWords) {
  struct Case {
    int32_t width;
    storage::ValueDtype dtype;
    int index_bytes;
    latentd::v1::ValueDtype wire_dtype;
  };
  for (const Case& c : {Case{4096, storage::ValueDtype::kFloat16, 2, latentd::v1::FLOAT16},
                        Case{70000, storage::ValueDtype::kBFloat16, 4, latentd::v1::BFLOAT16},
                        Case{65536, storage::ValueDtype::kFloat32, 2, latentd::v1::FLOAT32}}) {
    SCOPED_TRACE(c.width);
    const int64_t rows = 70000;  // ~5 MB packed at 2 + 2 bytes an entry: at least two pieces
    const uint64_t id = MakeDataset("packed" + std::to_string(c.width), rows, c.width, c.dtype);
    grpc::ClientContext ctx;
    latentd::v1::ReadRowsRequest req;
    req.set_dataset_id(id);
    req.set_row_start(5);
    req.set_row_count(rows - 10);
    req.set_packed(true);
    auto reader = stub_->ReadRows(&ctx, req);
    latentd::v1::CsrPiece piece;
    std::vector<int64_t> indptr{0};
    std::vector<int32_t> indices, tokens;
    std::vector<float> values;
    int64_t next = 5;
    int pieces = 0;
    while (reader->Read(&piece)) {
      ++pieces;
      EXPECT_LE(piece.ByteSizeLong(), DatasetsService::kMaxPieceBytes);
      EXPECT_EQ(piece.row_start(), next);
      EXPECT_EQ(piece.indptr_size() + piece.indices_size() + piece.values_size(), 0);
      const latentd::v1::PackedCsr& p = piece.packed();
      ASSERT_EQ(p.index_bytes(), c.index_bytes);
      ASSERT_EQ(p.value_dtype(), c.wire_dtype);
      const std::vector<int64_t> offsets = Words<int64_t>(p.indptr());
      ASSERT_EQ(static_cast<int64_t>(offsets.size()), piece.num_rows() + 1);
      EXPECT_EQ(offsets[0], 0);
      for (size_t i = 1; i < offsets.size(); ++i)
        indptr.push_back(indptr.back() + offsets[i] - offsets[i - 1]);
      if (c.index_bytes == 2) {
        for (uint16_t x : Words<uint16_t>(p.indices())) indices.push_back(x);
      } else {
        for (int32_t x : Words<int32_t>(p.indices())) indices.push_back(x);
      }
      if (c.wire_dtype == latentd::v1::FLOAT32) {
        for (float x : Words<float>(p.values())) values.push_back(x);
      } else {
        for (uint16_t x : Words<uint16_t>(p.values())) {
          values.push_back(c.wire_dtype == latentd::v1::FLOAT16 ? storage::HalfToFloat(x)
                                                                : storage::BFloat16ToFloat(x));
        }
      }
      for (int32_t t : Words<int32_t>(p.token_ids())) tokens.push_back(t);
      next += piece.num_rows();
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_GE(pieces, 2);
    EXPECT_EQ(next, rows - 5);
    auto want = store_->ReadRows(id, 5, rows - 10);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(indptr, want->indptr);
    EXPECT_EQ(indices, want->indices);
    EXPECT_EQ(values, want->values);
    EXPECT_EQ(tokens, want->token_ids);
  }
}

TEST_F(DatasetsServiceTest, BadInputCodes) {
  uint64_t id = MakeDataset("small", 300);
  {
    grpc::ClientContext ctx;
    latentd::v1::GetDatasetRequest req;
    req.set_dataset_id(id + 100);
    latentd::v1::DatasetInfo info;
    EXPECT_EQ(stub_->GetDataset(&ctx, req, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    latentd::v1::ReadRowsRequest req;
    req.set_dataset_id(id);
    req.set_row_start(250);
    req.set_row_count(51);
    auto reader = stub_->ReadRows(&ctx, req);
    latentd::v1::CsrPiece piece;
    EXPECT_FALSE(reader->Read(&piece));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::OUT_OF_RANGE);
  }
  {
    grpc::ClientContext ctx;
    latentd::v1::GetLatentRequest req;
    req.set_dataset_id(id);
    req.set_latent(4096);
    latentd::v1::GetLatentResponse resp;
    EXPECT_EQ(stub_->GetLatent(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
}

// LatentsOnRows answers what the storage functions answer, for each selection and order, with
// the fraction computed from the rows read; a request without a selection or with an unknown
// order names the field.
TEST_F(DatasetsServiceTest, LatentsOnRowsConvertsEachSelection) {
  const uint64_t id = MakeDataset("onrows", 400, 64);
  auto call = [&](const latentd::v1::LatentsOnRowsRequest& req,
                  latentd::v1::LatentsOnRowsResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->LatentsOnRows(&ctx, req, resp);
  };
  latentd::v1::LatentsOnRowsRequest req;
  req.set_dataset_id(id);
  req.set_with_latent(7);
  latentd::v1::LatentsOnRowsResponse resp;
  ASSERT_TRUE(call(req, &resp).ok());
  auto want = storage::LatentsFiringWith(*store_, id, 7, storage::LatentsOnRowsOptions());
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(resp.rows_selected(), want->rows_selected);
  EXPECT_EQ(resp.rows_read(), want->rows_read);
  ASSERT_EQ(resp.latents_size(), 20);  // the default limit
  for (int i = 0; i < resp.latents_size(); ++i) {
    EXPECT_EQ(resp.latents(i).latent(), want->latents[i].latent);
    EXPECT_EQ(resp.latents(i).count(), want->latents[i].count);
    EXPECT_DOUBLE_EQ(resp.latents(i).fraction(),
                     static_cast<double>(want->latents[i].count) / want->rows_read);
    EXPECT_EQ(resp.latents(i).lift(), want->latents[i].lift);
    EXPECT_EQ(resp.latents(i).precision(), want->latents[i].precision);
    EXPECT_EQ(resp.latents(i).f1(), want->latents[i].f1);
  }
  // By F1: the order reaches the store.
  req.set_order(latentd::v1::BY_F1);
  ASSERT_TRUE(call(req, &resp).ok());
  storage::LatentsOnRowsOptions by_f1;
  by_f1.order = storage::LatentsOnRowsOrder::kByF1;
  want = storage::LatentsFiringWith(*store_, id, 7, by_f1);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(resp.latents_size(), static_cast<int>(want->latents.size()));
  for (int i = 0; i < resp.latents_size(); ++i) {
    EXPECT_EQ(resp.latents(i).latent(), want->latents[i].latent);
    EXPECT_EQ(resp.latents(i).f1(), want->latents[i].f1);
  }
  std::vector<int32_t> first_token;
  ASSERT_TRUE(store_->ReadTokens(id, 0, 1, &first_token).ok());
  req.set_token_id(first_token[0]);  // replaces with_latent (a oneof)
  req.set_order(latentd::v1::BY_LIFT);
  req.set_limit(3);
  req.set_min_count(2);
  ASSERT_TRUE(call(req, &resp).ok());
  storage::LatentsOnRowsOptions o;
  o.order = storage::LatentsOnRowsOrder::kByLift;
  o.limit = 3;
  o.min_count = 2;
  want = storage::LatentsFiringOnToken(*store_, id, first_token[0], o);
  ASSERT_TRUE(want.ok());
  EXPECT_GE(resp.rows_selected(), 1);
  EXPECT_EQ(resp.rows_selected(), want->rows_selected);
  ASSERT_EQ(resp.latents_size(), static_cast<int>(want->latents.size()));
  for (int i = 0; i < resp.latents_size(); ++i) {
    EXPECT_EQ(resp.latents(i).latent(), want->latents[i].latent);
  }
  // Row ranges: rows [10, 40) and [300, 305), ranked by lift as asked above.
  latentd::v1::RowRange* range = req.mutable_row_ranges()->add_ranges();
  range->set_start(10);
  range->set_count(30);
  range = req.mutable_row_ranges()->add_ranges();
  range->set_start(300);
  range->set_count(5);
  ASSERT_TRUE(call(req, &resp).ok());
  want = storage::LatentsInRowSpans(*store_, id, {{10, 30}, {300, 5}}, o);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(resp.rows_selected(), 35);
  ASSERT_EQ(resp.latents_size(), static_cast<int>(want->latents.size()));
  for (int i = 0; i < resp.latents_size(); ++i) {
    EXPECT_EQ(resp.latents(i).latent(), want->latents[i].latent);
    EXPECT_EQ(resp.latents(i).lift(), want->latents[i].lift);
  }
  // Contrasted with rows [200, 260): both counts, ranked by difference.
  latentd::v1::RowRange* versus = req.mutable_versus_row_ranges()->add_ranges();
  versus->set_start(200);
  versus->set_count(60);
  req.set_order(latentd::v1::BY_DIFFERENCE);
  ASSERT_TRUE(call(req, &resp).ok());
  o.order = storage::LatentsOnRowsOrder::kByDifference;
  want = storage::ContrastRowSpans(*store_, id, {{10, 30}, {300, 5}}, {{200, 60}}, o);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(resp.versus_rows_selected(), 60);
  EXPECT_EQ(resp.versus_rows_read(), 60);
  ASSERT_EQ(resp.latents_size(), static_cast<int>(want->latents.size()));
  for (int i = 0; i < resp.latents_size(); ++i) {
    EXPECT_EQ(resp.latents(i).latent(), want->latents[i].latent);
    EXPECT_EQ(resp.latents(i).versus_count(), want->latents[i].versus_count);
    EXPECT_DOUBLE_EQ(resp.latents(i).versus_fraction(), want->latents[i].versus_count / 60.0);
    EXPECT_EQ(resp.latents(i).versus_mean(), want->latents[i].versus_mean);
  }
  req.set_with_latent(1);  // versus rows beside another selection: refused
  grpc::Status s = call(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("versus_row_ranges: only beside row_ranges"), std::string::npos);
  req.clear_versus_row_ranges();
  s = call(req, &resp);  // and the order without versus rows
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("order: by difference"), std::string::npos);
  req.set_order(latentd::v1::BY_LIFT);
  range = req.mutable_row_ranges()->add_ranges();
  range->set_start(10);
  range->set_count(30);
  range = req.mutable_row_ranges()->add_ranges();
  range->set_start(300);
  range->set_count(5);
  range->set_count(500);  // past the 400 committed rows
  s = call(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_NE(s.error_message().find("row_ranges[1]"), std::string::npos) << s.error_message();
  req.clear_row_ranges();
  s = call(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("with_latent, token_id or row_ranges"), std::string::npos);
  req.set_with_latent(1);
  req.set_order(static_cast<latentd::v1::RowLatentOrder>(9));
  s = call(req, &resp);
  EXPECT_NE(s.error_message().find("order"), std::string::npos);
  req.set_order(latentd::v1::BY_COUNT);
  req.set_max_rows(-1);
  s = call(req, &resp);
  EXPECT_NE(s.error_message().find("max_rows"), std::string::npos);
}

TEST_F(DatasetsServiceTest, ExplanationsAreStoredSearchedAndShownWithTheLatent) {
  const uint64_t id = MakeDataset("explained", 64, 64);
  latentd::v1::SetExplanationsRequest set;
  set.set_dataset_id(id);
  auto add = [&](int32_t latent, const std::string& text, std::optional<double> score) {
    latentd::v1::LatentExplanation* e = set.add_explanations();
    e->set_latent(latent);
    e->set_text(text);
    if (score) e->set_score(*score);
    e->set_source("delphi");
  };
  add(5, "French words", 0.75);
  add(9, "French cities", std::nullopt);
  add(11, "brackets", 0.5);
  latentd::v1::SetExplanationsResponse stored;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_->SetExplanations(&ctx, set, &stored);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(stored.stored(), 3);
  EXPECT_EQ(stored.explained(), 3);
  // GetLatent carries the latent's explanation, score and source; none for another latent.
  latentd::v1::GetLatentRequest get;
  get.set_dataset_id(id);
  get.set_latent(5);
  latentd::v1::GetLatentResponse latent;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetLatent(&ctx, get, &latent).ok());
  }
  ASSERT_TRUE(latent.has_explanation());
  EXPECT_EQ(latent.explanation().text(), "French words");
  EXPECT_EQ(latent.explanation().score(), 0.75);
  EXPECT_EQ(latent.explanation().source(), "delphi");
  get.set_latent(6);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetLatent(&ctx, get, &latent).ok());
  }
  EXPECT_FALSE(latent.has_explanation());
  // Search: scored first; the unscored match keeps no score.
  latentd::v1::SearchExplanationsRequest search;
  search.set_dataset_id(id);
  search.set_query("french");
  latentd::v1::SearchExplanationsResponse found;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SearchExplanations(&ctx, search, &found).ok());
  }
  EXPECT_EQ(found.explained(), 3);
  EXPECT_EQ(found.matched(), 2);
  ASSERT_EQ(found.explanations_size(), 2);
  EXPECT_EQ(found.explanations(0).latent(), 5);
  EXPECT_EQ(found.explanations(1).latent(), 9);
  EXPECT_FALSE(found.explanations(1).has_score());
  // A refused set names the entry and stores none of it.
  set.set_replace_all(true);
  set.mutable_explanations(1)->set_latent(64);
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_->SetExplanations(&ctx, set, &stored);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("explanations[1].latent: 64"), std::string::npos);
  }
  search.clear_query();
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SearchExplanations(&ctx, search, &found).ok());
  }
  EXPECT_EQ(found.matched(), 3);
  search.set_limit(-1);
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub_->SearchExplanations(&ctx, search, &found).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
}

TEST_F(DatasetsServiceTest, ExplanationsCopyToADatasetOfTheSameSae) {
  const auto make = [&](const std::string& name, const std::string& sae_weight_hash) {
    storage::DatasetMeta m;
    m.name = name;
    m.width = 64;
    m.value_dtype = storage::ValueDtype::kFloat16;
    m.k = 16;
    m.encoder = "topk";
    m.sae_weight_hash = sae_weight_hash;
    return *store_->CreateDataset(m);
  };
  const uint64_t first = make("first tokens", "crc32c:0badcafe:4096");
  const uint64_t more = make("more tokens", "crc32c:0badcafe:4096");
  const uint64_t other = make("another sae", "crc32c:12345678:4096");
  auto call = [&](const latentd::v1::SetExplanationsRequest& req,
                  latentd::v1::SetExplanationsResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->SetExplanations(&ctx, req, resp);
  };
  latentd::v1::SetExplanationsRequest set;
  set.set_dataset_id(first);
  for (int32_t latent : {4, 8}) {
    latentd::v1::LatentExplanation* e = set.add_explanations();
    e->set_latent(latent);
    e->set_text(absl::StrCat("latent ", latent));
  }
  latentd::v1::SetExplanationsResponse stored;
  ASSERT_TRUE(call(set, &stored).ok());
  set.clear_explanations();
  set.set_dataset_id(more);
  set.set_from_dataset_id(first);
  grpc::Status s = call(set, &stored);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(stored.stored(), 2);
  EXPECT_EQ(stored.explained(), 2);
  EXPECT_EQ(storage::GetExplanation(*store_, more, 8)->value().text, "latent 8");
  // Refused: another SAE (both named), a missing source, explanations given too.
  set.set_dataset_id(other);
  s = call(set, &stored);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("crc32c:12345678:4096"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("crc32c:0badcafe:4096"), std::string::npos) << s.error_message();
  set.set_from_dataset_id(first + 100);
  EXPECT_EQ(call(set, &stored).error_code(), grpc::StatusCode::NOT_FOUND);
  set.set_dataset_id(more);
  set.set_from_dataset_id(first);
  set.add_explanations()->set_text("x");
  s = call(set, &stored);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("from_dataset_id"), std::string::npos) << s.error_message();
}

TEST_F(DatasetsServiceTest, ProjectRowsConvertsTheRequestAndTheAnswer) {
  // 40 rows of 4 values, sequences of 8; row r is (r, 1, 0, 0) but row 13, which points
  // against the first axis.
  storage::DatasetMeta m;
  m.name = "hidden";
  m.kind = storage::DatasetKind::kDense;
  m.value_dtype = storage::ValueDtype::kFloat32;
  m.width = 4;
  m.context_length = 8;
  const uint64_t id = *store_->CreateDataset(m);
  std::vector<float> values(40 * 4, 0.0f);
  std::vector<int32_t> tokens(40);
  for (int r = 0; r < 40; ++r) {
    values[r * 4] = r == 13 ? -100.0f : static_cast<float>(r);
    values[r * 4 + 1] = 1.0f;
    tokens[r] = 500 + r;
  }
  {
    auto w = store_->OpenWriter(id);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendDense(40, values.data(), tokens.data()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  auto call = [&](const latentd::v1::ProjectRowsRequest& req,
                  latentd::v1::ProjectRowsResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->ProjectRows(&ctx, req, resp);
  };
  latentd::v1::ProjectRowsRequest req;
  req.set_dataset_id(id);
  for (float v : {2.0f, 0.0f, 0.0f, 0.0f}) req.add_direction(v);
  req.set_top_n(2);
  req.set_context_before(3);
  req.set_context_after(1);
  req.set_bins(4);
  latentd::v1::ProjectRowsResponse resp;
  grpc::Status s = call(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.rows(), 40);
  EXPECT_FLOAT_EQ(resp.max(), 78.0f);
  EXPECT_FLOAT_EQ(resp.min(), -200.0f);
  EXPECT_EQ(resp.histogram_size(), 4);
  EXPECT_EQ(std::accumulate(resp.histogram().begin(), resp.histogram().end(), int64_t{0}), 40);
  ASSERT_EQ(resp.largest_size(), 2);
  EXPECT_EQ(resp.largest(0).row(), 39);
  EXPECT_EQ(resp.largest(1).row(), 38);
  const latentd::v1::TopActivation& low = resp.smallest(0);
  EXPECT_EQ(low.row(), 13);
  EXPECT_FLOAT_EQ(low.value(), -200.0f);
  EXPECT_EQ(low.token_id(), 513);
  EXPECT_EQ(low.context_start_row(), 10);
  EXPECT_EQ(std::vector<int32_t>(low.context_token_ids().begin(), low.context_token_ids().end()),
            (std::vector<int32_t>{510, 511, 512, 513, 514}));
  EXPECT_FLOAT_EQ(low.context_values(3), -200.0f);
  EXPECT_FLOAT_EQ(low.context_values(0), 20.0f);
  // Cosine: every row but 13 and 0 points the same way by a little.
  req.set_measure(latentd::v1::PROJECTION_COSINE);
  ASSERT_TRUE(call(req, &resp).ok());
  EXPECT_NEAR(resp.smallest(0).value(), -100.0 / std::sqrt(100.0 * 100 + 1), 1e-6);
  // Refused: an unknown measure, an option out of range, an answer too large, a SPARSE dataset.
  req.set_measure(static_cast<latentd::v1::ProjectionMeasure>(7));
  s = call(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("measure"), std::string::npos);
  req.set_measure(latentd::v1::PROJECTION_DOT);
  req.set_top_n(5000);
  s = call(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("top_n"), std::string::npos);
  req.set_top_n(1000);
  req.set_context_before(1024);
  req.set_context_after(1024);
  m.name = "long";
  m.context_length = 0;
  req.set_dataset_id(*store_->CreateDataset(m));
  {
    auto w = store_->OpenWriter(req.dataset_id());
    ASSERT_TRUE(w.ok());
    std::vector<float> many(4096 * 4, 1.0f);
    std::vector<int32_t> ids(4096, 1);
    ASSERT_TRUE((*w)->AppendDense(4096, many.data(), ids.data()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  s = call(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("ProjectRows would return up to 2000 context windows"),
            std::string::npos)
      << s.error_message();
  req.set_dataset_id(MakeDataset("latents", 8, 64));
  req.set_top_n(2);
  EXPECT_EQ(call(req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(DatasetsServiceTest, SparseProbeConvertsTheRequestAndTheAnswer) {
  const uint64_t id = MakeDataset("probe", 1024, 64);  // 8 sequences of 128 rows
  auto call = [&](const latentd::v1::SparseProbeRequest& req,
                  latentd::v1::SparseProbeResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->SparseProbe(&ctx, req, resp);
  };
  latentd::v1::SparseProbeRequest req;
  req.set_dataset_id(id);
  const std::vector<storage::RowSpan> positives = {{0, 128}, {256, 128}, {512, 256}};
  const std::vector<storage::RowSpan> negatives = {{128, 128}, {384, 128}, {768, 256}};
  for (const storage::RowSpan& s : positives) {
    latentd::v1::RowRange* r = req.mutable_row_ranges()->add_ranges();
    r->set_start(s.start);
    r->set_count(s.count);
  }
  for (const storage::RowSpan& s : negatives) {
    latentd::v1::RowRange* r = req.mutable_versus_row_ranges()->add_ranges();
    r->set_start(s.start);
    r->set_count(s.count);
  }
  // Every field given reaches the store; what it answers comes back whole.
  req.add_ks(3);
  req.add_ks(1);
  req.set_test_fraction(0.5);
  req.set_seed(4);
  req.set_l2(2.5);
  req.set_pool(latentd::v1::POOL_MAX);
  req.set_select(latentd::v1::SELECT_BY_MEAN);
  req.set_balanced(true);
  latentd::v1::SparseProbeResponse resp;
  grpc::Status s = call(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  storage::SparseProbeOptions o;
  o.ks = {3, 1};
  o.test_fraction = 0.5;
  o.seed = 4;
  o.l2 = 2.5;
  o.pool = storage::ProbePool::kMax;
  o.select = storage::ProbeSelect::kByMean;
  o.balanced = true;
  auto want = storage::SparseProbe(*store_, id, positives, negatives, o);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(std::vector<int32_t>(resp.latents().begin(), resp.latents().end()), want->latents);
  ASSERT_EQ(resp.fits_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(resp.fits(i).k(), want->fits[i].k);
    EXPECT_EQ(resp.fits(i).train_accuracy(), want->fits[i].train_accuracy);
    EXPECT_EQ(resp.fits(i).test_accuracy(), want->fits[i].test_accuracy);
    EXPECT_EQ(resp.fits(i).test_precision(), want->fits[i].test_precision);
    EXPECT_EQ(resp.fits(i).test_recall(), want->fits[i].test_recall);
    EXPECT_EQ(resp.fits(i).test_f1(), want->fits[i].test_f1);
    EXPECT_EQ(resp.fits(i).test_balanced_accuracy(), want->fits[i].test_balanced_accuracy);
    EXPECT_EQ(std::vector<double>(resp.fits(i).weights().begin(), resp.fits(i).weights().end()),
              want->fits[i].weights);
    EXPECT_EQ(resp.fits(i).intercept(), want->fits[i].intercept);
  }
  // Pooled: 4 sequences a class, 2 held out each, a range per sequence.
  EXPECT_EQ(resp.train_positive(), 2);
  EXPECT_EQ(resp.test_positive(), 2);
  EXPECT_EQ(resp.train_negative(), 2);
  EXPECT_EQ(resp.test_negative(), 2);
  EXPECT_EQ(resp.rows_read(), 1024);
  ASSERT_EQ(resp.test_row_ranges().ranges_size(), 2);
  ASSERT_EQ(resp.test_versus_row_ranges().ranges_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(resp.test_row_ranges().ranges(i).start(), want->test_positives[i].start);
    EXPECT_EQ(resp.test_versus_row_ranges().ranges(i).start(), want->test_negatives[i].start);
    EXPECT_EQ(resp.test_versus_row_ranges().ranges(i).count(), 128);
  }
  // Zeros take the defaults: k 1, 2, 5, 10, 20 over rows, a quarter of the ranges held out.
  latentd::v1::SparseProbeRequest defaults = req;
  defaults.clear_ks();
  defaults.clear_test_fraction();
  defaults.clear_l2();
  defaults.clear_pool();
  defaults.clear_select();
  ASSERT_TRUE(call(defaults, &resp).ok());
  ASSERT_EQ(resp.fits_size(), 5);
  EXPECT_EQ(resp.fits(4).k(), 20);
  EXPECT_EQ(resp.train_positive() + resp.test_positive(), 512);
  EXPECT_EQ(resp.test_row_ranges().ranges_size(), 1);  // round(0.25 * 3)
  // balanced reaches the store: with 384 positive rows against 512, weighing the classes moves
  // the boundary, and the answer is the store's weighed one.
  latentd::v1::SparseProbeRequest rare = defaults;
  rare.mutable_row_ranges()->mutable_ranges(2)->set_count(128);
  rare.set_balanced(true);
  ASSERT_TRUE(call(rare, &resp).ok());
  storage::SparseProbeOptions rare_options;
  rare_options.seed = 4;
  rare_options.balanced = true;
  const std::vector<storage::RowSpan> few = {{0, 128}, {256, 128}, {512, 128}};
  auto weighed = storage::SparseProbe(*store_, id, few, negatives, rare_options);
  rare_options.balanced = false;
  auto unweighed = storage::SparseProbe(*store_, id, few, negatives, rare_options);
  ASSERT_TRUE(weighed.ok() && unweighed.ok());
  EXPECT_NE(weighed->fits[0].intercept, unweighed->fits[0].intercept);
  EXPECT_EQ(resp.fits(0).intercept(), weighed->fits[0].intercept);
  // The store's refusals keep their codes and say what is wrong.
  defaults.set_max_rows(1000);
  s = call(defaults, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("1024 rows, more than max_rows 1000"), std::string::npos);
  req.set_pool(static_cast<latentd::v1::ProbePool>(7));
  s = call(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("pool: unknown value 7"), std::string::npos);
  req.set_pool(latentd::v1::POOL_MEAN);
  req.mutable_row_ranges()->mutable_ranges(0)->set_count(100);
  s = call(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("row_ranges[0]: rows [0, 0 + 100) are not whole sequences"),
            std::string::npos);
}

TEST_F(DatasetsServiceTest, ListLatentsRanksFromTheStoredStatistics) {
  const int32_t width = 512;
  const int64_t rows = 100;  // 1600 firings over 512 latents: some dead, counts with ties
  const uint64_t id = MakeDataset("overview", rows, width);
  std::vector<std::pair<int64_t, int32_t>> by_count;  // (-count, latent): MOST_FREQUENT order
  int64_t dead = 0;
  for (int32_t l = 0; l < width; ++l) {
    const int64_t count = store_->GetLatentStats(id, l)->firing_count;
    by_count.emplace_back(-count, l);
    dead += count == 0;
  }
  std::sort(by_count.begin(), by_count.end());
  ASSERT_GT(dead, 0);

  latentd::v1::ListLatentsRequest req;
  req.set_dataset_id(id);
  req.set_order(latentd::v1::MOST_FREQUENT);
  req.set_limit(10);
  req.set_offset(5);
  latentd::v1::ListLatentsResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->ListLatents(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(resp.rows(), rows);
  EXPECT_EQ(resp.d_sae(), width);
  EXPECT_EQ(resp.dead_latents(), dead);
  EXPECT_EQ(resp.matching(), width);
  EXPECT_EQ(resp.log10_density_histogram_size(), 50);  // the default bins
  int64_t live = 0;
  for (int64_t c : resp.log10_density_histogram()) live += c;
  EXPECT_EQ(live, width - dead);
  EXPECT_DOUBLE_EQ(resp.log10_density_min(), -2.0);
  ASSERT_EQ(resp.latents_size(), 10);
  for (int i = 0; i < 10; ++i) {
    const latentd::v1::LatentSummary& got = resp.latents(i);
    EXPECT_EQ(got.latent(), by_count[5 + i].second) << i;
    auto stats = store_->GetLatentStats(id, got.latent());
    EXPECT_EQ(got.firing_count(), stats->firing_count);
    EXPECT_DOUBLE_EQ(got.density(), stats->firing_count / 100.0);
    EXPECT_DOUBLE_EQ(got.mean(), stats->mean());
    EXPECT_EQ(got.max(), stats->max);
  }

  // max_firing_count set to 0 lists the dead latents; unset it means no bound.
  req.Clear();
  req.set_dataset_id(id);
  req.set_max_firing_count(0);
  req.set_limit(width);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->ListLatents(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(resp.matching(), dead);
  ASSERT_EQ(resp.latents_size(), dead);
  for (const auto& l : resp.latents()) EXPECT_EQ(l.firing_count(), 0);
  EXPECT_EQ(store_->GetDataset(id)->dead_latents(), dead);
  req.clear_max_firing_count();
  req.clear_limit();
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->ListLatents(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(resp.matching(), width);
  EXPECT_EQ(resp.latents_size(), 100);  // the default page

  auto code = [&](const latentd::v1::ListLatentsRequest& r, std::string* message) {
    grpc::ClientContext ctx;
    latentd::v1::ListLatentsResponse ignored;
    grpc::Status s = stub_->ListLatents(&ctx, r, &ignored);
    *message = s.error_message();
    return s.error_code();
  };
  std::string message;
  req.set_order(static_cast<latentd::v1::LatentOrder>(42));
  EXPECT_EQ(code(req, &message), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(message.find("order"), std::string::npos) << message;
  req.set_order(latentd::v1::BY_LATENT);
  req.set_limit(1 << 20);
  EXPECT_EQ(code(req, &message), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(message.find("limit"), std::string::npos) << message;
  req.clear_limit();
  req.set_dataset_id(id + 1000);
  EXPECT_EQ(code(req, &message), grpc::StatusCode::NOT_FOUND);
}

TEST_F(DatasetsServiceTest, GetLatentDistinctSequencesGivesOneRowPerSequence) {
  // 16 of 64 latents a row: latent 5 fires on about a quarter of each 128-row sequence.
  const uint64_t id = MakeDataset("distinct", 3000, 64);
  latentd::v1::GetLatentRequest req;
  req.set_dataset_id(id);
  req.set_latent(5);
  req.set_top_n(100);  // above the 64 the dataset stores per latent
  req.set_context_before(4);
  req.set_context_after(2);
  latentd::v1::GetLatentResponse plain, distinct;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetLatent(&ctx, req, &plain).ok());
  }
  req.set_distinct_sequences(true);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetLatent(&ctx, req, &distinct).ok());
  }
  EXPECT_EQ(plain.top_size(), 64);  // capped by the stored top-N list
  std::set<int64_t> sequences;
  for (const auto& t : plain.top()) sequences.insert(t.row() / 128);
  EXPECT_LT(sequences.size(), 64u) << "rows of one sequence repeat in the plain list";
  // 3000 rows = 24 sequences (the last partial), each with firings of latent 5.
  ASSERT_EQ(distinct.top_size(), 24);
  sequences.clear();
  for (const auto& t : distinct.top()) sequences.insert(t.row() / 128);
  EXPECT_EQ(sequences.size(), 24u);
  EXPECT_EQ(distinct.top(0).row(), plain.top(0).row());
  auto want = store_->TopSequences(id, 5, 100, 4, 2);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int i = 0; i < distinct.top_size(); ++i) {
    EXPECT_EQ(distinct.top(i).row(), (*want)[i].row);
    EXPECT_EQ(distinct.top(i).value(), (*want)[i].value);
    EXPECT_EQ(distinct.top(i).context_token_ids_size(),
              static_cast<int>((*want)[i].context_token_ids.size()));
    EXPECT_EQ(std::vector<float>(distinct.top(i).context_values().begin(),
                                 distinct.top(i).context_values().end()),
              (*want)[i].context_values);
  }
  EXPECT_EQ(distinct.statistics().firing_count(), plain.statistics().firing_count());

  // Silent windows: the store's, reproducible by seed; out of range INVALID_ARGUMENT naming the
  // field; they count in the answer's bound.
  req.set_distinct_sequences(false);
  req.set_top_n(3);
  req.set_silent_samples(6);
  req.set_silent_seed(11);
  latentd::v1::GetLatentResponse quiet;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetLatent(&ctx, req, &quiet).ok());
  }
  auto silent = store_->SilentSamples(id, 5, 6, 4, 2, 11);
  ASSERT_TRUE(silent.ok()) << silent.status();
  ASSERT_EQ(quiet.silent_size(), static_cast<int>(silent->size()));
  ASSERT_GT(quiet.silent_size(), 0);
  for (int i = 0; i < quiet.silent_size(); ++i) {
    EXPECT_EQ(quiet.silent(i).row(), (*silent)[i].row);
    EXPECT_EQ(quiet.silent(i).context_token_ids_size(),
              static_cast<int>((*silent)[i].context_token_ids.size()));
    for (float v : quiet.silent(i).context_values()) EXPECT_EQ(v, 0.0f);
  }
  for (int32_t bad : {-1, 1001}) {
    req.set_silent_samples(bad);
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->GetLatent(&ctx, req, &quiet);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("silent_samples"), std::string::npos) << s.error_message();
  }
}

// The bound GetLatent checks up front is one the client can receive: an answer just inside it
// (8020 windows of 41 tokens, every token with its value) arrives under gRPC's default 4 MiB
// receive limit, and one window more per interval is refused.
TEST_F(DatasetsServiceTest, TheLargestAdmittedLatentAnswerReachesTheClient) {
  const uint64_t id = MakeDataset("big", 40000, /*width=*/16);  // every latent on every row
  latentd::v1::GetLatentRequest req;
  req.set_dataset_id(id);
  req.set_latent(2);
  req.set_intervals(500);
  req.set_interval_samples(16);
  latentd::v1::GetLatentResponse resp;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->GetLatent(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  int64_t windows = resp.top_size(), tokens = 0, values = 0;
  auto count = [&](const latentd::v1::TopActivation& t) {
    tokens += t.context_token_ids_size();
    values += t.context_values_size();
  };
  for (const auto& t : resp.top()) count(t);
  for (const auto& interval : resp.intervals()) {
    windows += interval.samples_size();
    for (const auto& t : interval.samples()) count(t);
  }
  EXPECT_GT(windows, 7000);
  EXPECT_EQ(values, tokens);
  EXPECT_GT(tokens, windows * 30);  // windows near a sequence start are clipped
  // The up-front bound holds for the real answer, and the answer is large.
  EXPECT_LE(resp.ByteSizeLong(), windows * (64 + 41 * 9) + 500 * 32);
  EXPECT_GT(resp.ByteSizeLong(), 3u << 19);
  req.set_interval_samples(17);
  {
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->GetLatent(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(s.error_message().find("8520 context windows of up to 41 tokens"), std::string::npos)
        << s.error_message();
  }
  // Silent windows count too: 8020 + 600 is over.
  req.set_interval_samples(16);
  req.set_silent_samples(600);
  grpc::ClientContext ctx;
  const grpc::Status s = stub_->GetLatent(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("8620 context windows"), std::string::npos) << s.error_message();
}

TEST_F(DatasetsServiceTest, GetLatentListDeleteAndArtifacts) {
  uint64_t id = MakeDataset("g", 1000);
  latentd::v1::GetLatentRequest req;
  req.set_dataset_id(id);
  req.set_latent(7);
  req.set_top_n(5);
  latentd::v1::GetLatentResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetLatent(&ctx, req, &resp).ok());
  }
  auto stats = store_->GetLatentStats(id, 7);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(resp.statistics().firing_count(), stats->firing_count);
  EXPECT_EQ(resp.statistics().histogram_size(), 50);
  EXPECT_NEAR(resp.statistics().density(), stats->firing_count / 1000.0, 1e-12);
  ASSERT_EQ(resp.top_size(), std::min<int64_t>(5, stats->firing_count));
  for (int i = 0; i + 1 < resp.top_size(); ++i) {
    EXPECT_GE(resp.top(i).value(), resp.top(i + 1).value());
  }
  if (resp.top_size() > 0) {
    const auto& t = resp.top(0);
    EXPECT_EQ(t.context_start_row(), std::max<int64_t>(t.row() / 128 * 128, t.row() - 32));
    EXPECT_LE(t.context_token_ids_size(), 41);
    // The latent's value on every token of the window, its own row's the top value.
    ASSERT_EQ(t.context_values_size(), t.context_token_ids_size());
    EXPECT_EQ(t.context_values(t.row() - t.context_start_row()), t.value());
    auto top = store_->TopActivations(id, 7, 1, 32, 8);
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_EQ(std::vector<float>(t.context_values().begin(), t.context_values().end()),
              top->front().context_values);
  }
  {
    // The tokens it fires on: what the storage function counts, with the fraction of its
    // firings; a bad count names the field.
    latentd::v1::GetLatentRequest tokens_req = req;
    tokens_req.set_top_tokens(3);
    latentd::v1::GetLatentResponse tokens_resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetLatent(&ctx, tokens_req, &tokens_resp).ok());
    auto want = storage::TokensLatentFiresOn(*store_, id, 7, 3);
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(tokens_resp.top_tokens_size(), static_cast<int>(want->tokens.size()));
    ASSERT_GT(tokens_resp.top_tokens_size(), 0);
    for (int i = 0; i < tokens_resp.top_tokens_size(); ++i) {
      EXPECT_EQ(tokens_resp.top_tokens(i).token_id(), want->tokens[i].token_id);
      EXPECT_EQ(tokens_resp.top_tokens(i).count(), want->tokens[i].count);
      EXPECT_DOUBLE_EQ(tokens_resp.top_tokens(i).fraction(),
                       static_cast<double>(want->tokens[i].count) / stats->firing_count);
    }
    // Where in its 128-row sequences it fires: the storage function's bins.
    latentd::v1::GetLatentRequest positions_req = req;
    positions_req.set_positions(true);
    grpc::ClientContext positions_ctx;
    ASSERT_TRUE(stub_->GetLatent(&positions_ctx, positions_req, &tokens_resp).ok());
    auto placed = storage::PositionsLatentFiresAt(*store_, id, 7);
    ASSERT_TRUE(placed.ok());
    EXPECT_EQ(std::vector<int64_t>(tokens_resp.position_histogram().begin(),
                                   tokens_resp.position_histogram().end()),
              placed->counts);
    EXPECT_EQ(tokens_resp.position_bin_width(), 1);
    EXPECT_EQ(tokens_resp.position_histogram_size(), 128);
    tokens_req.set_top_tokens(-2);
    grpc::ClientContext bad_ctx;
    const grpc::Status bad = stub_->GetLatent(&bad_ctx, tokens_req, &tokens_resp);
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(bad.error_message().find("top_tokens"), std::string::npos);
  }
  EXPECT_EQ(resp.intervals_size(), 0);  // only on request
  {
    // Interval samples: the counts add up to the firings, samples lie in their interval.
    req.set_intervals(4);
    grpc::ClientContext ctx;
    latentd::v1::GetLatentResponse with;
    ASSERT_TRUE(stub_->GetLatent(&ctx, req, &with).ok());
    ASSERT_GT(stats->firing_count, 0);
    ASSERT_EQ(with.intervals_size(), 4);
    int64_t counted = 0;
    for (const auto& interval : with.intervals()) {
      counted += interval.count();
      EXPECT_EQ(interval.samples_size(), std::min<int64_t>(5, interval.count()));
      for (const auto& sample : interval.samples()) {
        EXPECT_GE(sample.value(), interval.low());
        EXPECT_LE(sample.value(), interval.high());
        EXPECT_EQ(sample.context_start_row(),
                  std::max<int64_t>(sample.row() / 128 * 128, sample.row() - 32));
      }
    }
    EXPECT_EQ(counted, stats->firing_count);
    EXPECT_EQ(with.intervals(3).high(), resp.statistics().max());
    req.set_intervals(-1);
    grpc::ClientContext bad_ctx;
    EXPECT_EQ(stub_->GetLatent(&bad_ctx, req, &with).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
    req.set_intervals(0);
  }
  artifacts_->Register("sae", "/models/sae", 3).IgnoreError();
  {
    grpc::ClientContext ctx;
    latentd::v1::ListArtifactsResponse list;
    ASSERT_TRUE(stub_->ListArtifacts(&ctx, {}, &list).ok());
    ASSERT_EQ(list.artifacts_size(), 1);
    EXPECT_EQ(list.artifacts(0).path(), "/models/sae");
  }
  {
    grpc::ClientContext ctx;
    latentd::v1::ListDatasetsResponse list;
    ASSERT_TRUE(stub_->ListDatasets(&ctx, {}, &list).ok());
    ASSERT_EQ(list.datasets_size(), 1);
    EXPECT_EQ(list.datasets(0).rows_committed(), 1000);
    EXPECT_EQ(list.datasets(0).nnz(), 16000);
  }
  {
    grpc::ClientContext ctx;
    latentd::v1::DeleteDatasetRequest del;
    del.set_dataset_id(id);
    latentd::v1::DeleteDatasetResponse out;
    ASSERT_TRUE(stub_->DeleteDataset(&ctx, del, &out).ok());
  }
  grpc::ClientContext ctx;
  latentd::v1::DatasetInfo info;
  latentd::v1::GetDatasetRequest get;
  get.set_dataset_id(id);
  EXPECT_EQ(stub_->GetDataset(&ctx, get, &info).error_code(), grpc::StatusCode::NOT_FOUND);
}

// A dataset with damaged metadata (here its SAE-fit totals) comes back among the unreadable with
// its name and error, the others as usual, and DeleteDataset removes it.
TEST_F(DatasetsServiceTest, ListDatasetsReportsADamagedDatasetWithoutHidingTheOthers) {
  const uint64_t good = MakeDataset("good", 100);
  const uint64_t damaged = MakeDataset("damaged", 100);
  ASSERT_TRUE(db_->Put(storage::Family::kMeta, storage::keys::Fit(damaged), "junk", true).ok());
  {
    grpc::ClientContext ctx;
    latentd::v1::ListDatasetsResponse list;
    ASSERT_TRUE(stub_->ListDatasets(&ctx, {}, &list).ok());
    ASSERT_EQ(list.datasets_size(), 1);
    EXPECT_EQ(list.datasets(0).id(), good);
    ASSERT_EQ(list.unreadable_size(), 1);
    EXPECT_EQ(list.unreadable(0).dataset_id(), damaged);
    EXPECT_EQ(list.unreadable(0).name(), "damaged");
    EXPECT_NE(list.unreadable(0).error().find("DATA_LOSS: dataset " + std::to_string(damaged)),
              std::string::npos)
        << list.unreadable(0).error();
  }
  {
    grpc::ClientContext ctx;
    latentd::v1::DeleteDatasetRequest del;
    del.set_dataset_id(damaged);
    latentd::v1::DeleteDatasetResponse out;
    ASSERT_TRUE(stub_->DeleteDataset(&ctx, del, &out).ok());
  }
  grpc::ClientContext ctx;
  latentd::v1::ListDatasetsResponse list;
  ASSERT_TRUE(stub_->ListDatasets(&ctx, {}, &list).ok());
  EXPECT_EQ(list.datasets_size(), 1);
  EXPECT_EQ(list.unreadable_size(), 0);
}

TEST_F(DatasetsServiceTest, DeleteArtifactWaitsForItsJobsThenRemovesItsFiles) {
  const fs::path sae_dir = dir_ / "artifacts" / "sae-4";
  fs::create_directories(sae_dir);
  std::ofstream(sae_dir / "cfg.json") << std::string(100, 'c');
  const uint64_t id = *artifacts_->Register("sae-4", sae_dir.string(), 4);
  latentd::v1::Job job;
  job.set_id(12);
  job.set_state(latentd::v1::PENDING);
  job.mutable_spec()->mutable_extract()->mutable_sae()->set_artifact_id(id);
  unfinished_jobs_ = {job};
  auto call = [&](latentd::v1::DeleteArtifactResponse* out) {
    grpc::ClientContext ctx;
    latentd::v1::DeleteArtifactRequest request;
    request.set_artifact_id(id);
    return stub_->DeleteArtifact(&ctx, request, out);
  };
  latentd::v1::DeleteArtifactResponse out;
  grpc::Status refused = call(&out);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("job 12"), std::string::npos) << refused.error_message();
  EXPECT_TRUE(fs::exists(sae_dir / "cfg.json"));

  unfinished_jobs_.clear();  // the job finished
  ASSERT_TRUE(call(&out).ok());
  EXPECT_EQ(out.path(), sae_dir.string());
  EXPECT_EQ(out.bytes_freed(), 100);
  EXPECT_FALSE(fs::exists(sae_dir));
  EXPECT_EQ(call(&out).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(DatasetsServiceTest, DeleteDatasetWaitsForTheJobsThatReadIt) {
  const uint64_t id = MakeDataset("to-train-on", 50);
  latentd::v1::Job job;
  job.set_id(21);
  job.set_state(latentd::v1::PENDING);
  job.mutable_spec()->mutable_train()->add_crosscoder_dataset_ids(id);
  unfinished_jobs_ = {job};
  auto call = [&] {
    grpc::ClientContext ctx;
    latentd::v1::DeleteDatasetRequest request;
    request.set_dataset_id(id);
    latentd::v1::DeleteDatasetResponse out;
    return stub_->DeleteDataset(&ctx, request, &out);
  };
  grpc::Status refused = call();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("train.crosscoder_dataset_ids[0] of job 21 (PENDING)"),
            std::string::npos)
      << refused.error_message();
  EXPECT_TRUE(store_->GetDataset(id).ok());

  unfinished_jobs_.clear();  // the job finished
  EXPECT_TRUE(call().ok());
  EXPECT_EQ(call().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(DatasetsServiceTest, ExportStaysInsideTheExportRoot) {
  uint64_t id = MakeDataset("e", 200);
  fs::create_directories(dir_ / "outside");
  fs::create_symlink(dir_ / "outside", dir_ / "exports" / "escape");
  auto call = [&](const std::string& path, latentd::v1::ExportDatasetResponse* resp) {
    grpc::ClientContext ctx;
    latentd::v1::ExportDatasetRequest req;
    req.set_dataset_id(id);
    req.set_path(path);
    req.set_format(latentd::v1::HDF5);
    return stub_->ExportDataset(&ctx, req, resp).error_code();
  };
  latentd::v1::ExportDatasetResponse resp;
  ASSERT_EQ(call("sub/dir/e.h5", &resp), grpc::StatusCode::OK);
  EXPECT_TRUE(fs::exists(resp.path()));
  EXPECT_EQ(resp.rows(), 200);
  EXPECT_EQ(resp.nnz(), 3200);
  EXPECT_GT(resp.bytes(), 0);
  EXPECT_EQ(call((dir_ / "exports" / "abs.h5").string(), &resp), grpc::StatusCode::OK);
  EXPECT_EQ(call("../outside/x.h5", &resp), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(call("sub/../../x.h5", &resp), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(call("escape/x.h5", &resp), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(call("/tmp/x.h5", &resp), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(call(".", &resp), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_FALSE(fs::exists(dir_ / "outside" / "x.h5"));
}

TEST_F(DatasetsServiceTest, ExportAsADelphiCacheWritesTheHooksModule) {
  const uint64_t id = MakeDataset("dl", 256, 4096, storage::ValueDtype::kFloat16, 0,
                                  "blocks.3.hook_resid_post");  // 2 sequences of 128
  auto call = [&](latentd::v1::ExportFormat format, int splits,
                  latentd::v1::ExportDatasetResponse* resp) {
    grpc::ClientContext ctx;
    latentd::v1::ExportDatasetRequest req;
    req.set_dataset_id(id);
    req.set_path("cache");
    req.set_format(format);
    req.set_delphi_splits(splits);
    return stub_->ExportDataset(&ctx, req, resp);
  };
  latentd::v1::ExportDatasetResponse resp;
  ASSERT_TRUE(call(latentd::v1::EXPORT_FORMAT_DELPHI, 4, &resp).ok());
  EXPECT_EQ(resp.path(), (dir_ / "exports" / "cache" / "blocks.3.hook_resid_post").string());
  EXPECT_EQ(resp.rows(), 256);
  EXPECT_EQ(resp.nnz(), 256 * 16);
  int64_t bytes = 0;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(resp.path())) {
    names.push_back(entry.path().filename().string());
    bytes += static_cast<int64_t>(fs::file_size(entry.path()));
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"0_1023.safetensors", "1024_2047.safetensors",
                                             "2048_3071.safetensors", "3072_4095.safetensors",
                                             "config.json"}));
  EXPECT_EQ(resp.bytes(), bytes);
  grpc::Status refused = call(latentd::v1::HDF5, 4, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), "delphi_splits: given only with format EXPORT_FORMAT_DELPHI");
}

TEST_F(DatasetsServiceTest, ExportAsParquetWritesARowARow) {
  const uint64_t id = MakeDataset("p", 200);
  grpc::ClientContext ctx;
  latentd::v1::ExportDatasetRequest req;
  req.set_dataset_id(id);
  req.set_path("p.parquet");
  req.set_format(latentd::v1::EXPORT_FORMAT_PARQUET);
  latentd::v1::ExportDatasetResponse resp;
  ASSERT_TRUE(stub_->ExportDataset(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.rows(), 200);
  auto latents = ParquetColumn::Open(resp.path(), "latents");
  ASSERT_TRUE(latents.ok()) << latents.status();
  EXPECT_EQ((*latents)->num_rows(), 200);
  EXPECT_EQ((*latents)->num_values(), resp.nnz());
}

// Every Datasets RPC with hostile field values (extremes of each integer type, off-by-one
// around the dataset's bounds, unknown ids, paths that try to leave the export root, NUL bytes):
// each call ends with OK or a client-error code, never INTERNAL, UNKNOWN or a dead server, and
// nothing is written outside the export root.
// An SAE over a 4-wide residual stream whose latent j points at angle j / 100 in its first plane:
// the nearest directions of latent j are j - 1 and j + 1 (equal cosines), then j - 2 and j + 2.
// With relu_bias > 0 it is a ReLU SAE whose every latent fires on every token (b_enc beyond any
// pre-activation's negative part).
void WritePlaneSae(const std::string& dir, int32_t d_sae, float relu_bias = 0.0f) {
  std::vector<float> W_dec(d_sae * 4, 0.0f), W_enc(4 * d_sae, 0.0f), b_enc(d_sae, relu_bias),
      b_dec(4, 0.0f);
  for (int32_t j = 0; j < d_sae; ++j) {
    W_dec[j * 4] = std::cos(j / 100.0f);
    W_dec[j * 4 + 1] = std::sin(j / 100.0f);
    W_enc[j] = W_dec[j * 4];  // W_enc = W_dec^T
    W_enc[d_sae + j] = W_dec[j * 4 + 1];
  }
  fs::create_directories(dir);
  using latentd::StDtype;
  ASSERT_TRUE(WriteSafetensors(dir + "/sae_weights.safetensors",
                               {{"W_enc", StDtype::kF32, {4, d_sae}, W_enc.data()},
                                {"b_enc", StDtype::kF32, {d_sae}, b_enc.data()},
                                {"W_dec", StDtype::kF32, {d_sae, 4}, W_dec.data()},
                                {"b_dec", StDtype::kF32, {4}, b_dec.data()}})
                  .ok());
  engine::SaeConfig cfg;
  cfg.d_in = 4;
  cfg.d_sae = d_sae;
  cfg.architecture =
      relu_bias > 0 ? engine::SaeArchitecture::kRelu : engine::SaeArchitecture::kTopK;
  cfg.k = relu_bias > 0 ? 0 : 16;
  std::ofstream(dir + "/cfg.json") << engine::SaeConfigToJson(cfg);
}

// The plane SAE a test job names (WritePlaneSae's arguments) and its model's context.
struct PlaneSae {
  std::string name = "sae";  // its directory under the test's
  int32_t d_sae = 512;
  float relu_bias = 0.0f;
  int32_t context_length = 0;  // 0: the reference model's default
};

// Records EXTRACT job `id` of a 4-wide reference model (vocabulary 16) with a plane SAE, for the
// calls that read a dataset's SAE and model.
void AddPlaneSaeJob(const fs::path& dir, uint64_t id, std::map<uint64_t, latentd::v1::Job>* jobs,
                    const PlaneSae& sae = {}) {
  WritePlaneSae((dir / sae.name).string(), sae.d_sae, sae.relu_bias);
  latentd::v1::Job job;
  job.set_id(id);
  latentd::v1::ExtractSpec* spec = job.mutable_spec()->mutable_extract();
  latentd::v1::ReferenceModelSpec* model = spec->mutable_model()->mutable_reference();
  model->set_d_model(4);
  model->set_n_heads(1);
  model->set_n_layers(1);
  model->set_vocab_size(16);
  model->set_context_length(sae.context_length);
  spec->set_hook_name("blocks.0.hook_resid_post");
  spec->mutable_sae()->set_path((dir / sae.name).string());
  (*jobs)[id] = job;
}

TEST_F(DatasetsServiceTest, GetLatentWeightsAnswersFromTheDatasetsSaeAndModel) {
  AddPlaneSaeJob(dir_, 41, &jobs_);
  const uint64_t id = MakeDataset("weights", 64, 512, storage::ValueDtype::kFloat16, 41);

  grpc::ClientContext ctx;
  latentd::v1::GetLatentWeightsRequest req;
  req.set_dataset_id(id);
  req.set_latent(100);
  req.set_top_n(4);
  latentd::v1::GetLatentWeightsResponse resp;
  grpc::Status s = stub_->GetLatentWeights(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.latent(), 100);
  EXPECT_NEAR(resp.decoder_norm(), 1.0, 1e-6);
  EXPECT_NEAR(resp.encoder_norm(), 1.0, 1e-6);
  EXPECT_NEAR(resp.encoder_decoder_cosine(), 1.0, 1e-6);
  ASSERT_EQ(resp.neighbors_size(), 4);
  const int expected[] = {99, 101, 98, 102};  // equal cosines go by latent index
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(resp.neighbors(r).latent(), expected[r]);
    EXPECT_NEAR(resp.neighbors(r).cosine(), std::cos((r / 2 + 1) / 100.0), 1e-5);
  }
  EXPECT_EQ(resp.logits_source(), "embed.W_E (tied)");
  EXPECT_EQ(resp.logits_unavailable(), "");
  ASSERT_EQ(resp.positive_logits_size(), 4);
  ASSERT_EQ(resp.negative_logits_size(), 4);
  for (int r = 1; r < 4; ++r) {
    EXPECT_GE(resp.positive_logits(r - 1).logit(), resp.positive_logits(r).logit());
    EXPECT_LE(resp.negative_logits(r - 1).logit(), resp.negative_logits(r).logit());
  }
  EXPECT_GT(resp.positive_logits(0).logit(), resp.negative_logits(0).logit());

  auto code = [&](uint64_t dataset, int32_t latent, int32_t top_n) {
    grpc::ClientContext c;
    latentd::v1::GetLatentWeightsRequest r;
    r.set_dataset_id(dataset);
    r.set_latent(latent);
    r.set_top_n(top_n);
    latentd::v1::GetLatentWeightsResponse out;
    return stub_->GetLatentWeights(&c, r, &out).error_code();
  };
  EXPECT_EQ(code(id, 512, 4), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(id, -1, 4), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(id, 0, 1001), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(999, 0, 4), grpc::StatusCode::NOT_FOUND);
  // A dataset whose job record is gone, and a DENSE dataset.
  const uint64_t orphan = MakeDataset("orphan", 8, 512, storage::ValueDtype::kFloat16, 77);
  EXPECT_EQ(code(orphan, 0, 4), grpc::StatusCode::FAILED_PRECONDITION);
  storage::DatasetMeta dense;
  dense.name = "dense";
  dense.kind = storage::DatasetKind::kDense;
  dense.width = 4;
  dense.job_id = 41;
  auto dense_id = store_->CreateDataset(dense);
  ASSERT_TRUE(dense_id.ok()) << dense_id.status();
  EXPECT_EQ(code(*dense_id, 0, 4), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(DatasetsServiceTest, EncodePromptConvertsTokensAndTopLatents) {
  AddPlaneSaeJob(dir_, 43, &jobs_);
  const uint64_t id = MakeDataset("prompt", 16, 512, storage::ValueDtype::kFloat16, 43);
  grpc::ClientContext ctx;
  latentd::v1::EncodePromptRequest req;
  req.set_dataset_id(id);
  for (int32_t t : {3, 1, 4, 1, 5}) req.add_token_ids(t);
  req.set_latents_per_token(4);
  req.set_top_latents(6);
  latentd::v1::EncodePromptResponse resp;
  grpc::Status s = stub_->EncodePrompt(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.bos_prepended());
  ASSERT_EQ(resp.tokens_size(), 5);
  std::map<int32_t, float> max_value;
  for (int r = 0; r < 5; ++r) {
    const latentd::v1::PromptToken& t = resp.tokens(r);
    EXPECT_EQ(t.token_id(), req.token_ids(r));
    EXPECT_GT(t.active(), 0);
    EXPECT_LE(t.active(), 16);  // the plane SAE's k
    ASSERT_EQ(t.latents_size(), std::min(t.active(), 4));
    ASSERT_EQ(t.values_size(), t.latents_size());
    for (int e = 0; e < t.latents_size(); ++e) {
      EXPECT_GT(t.values(e), 0.0f);
      if (e > 0) {
        EXPECT_GE(t.values(e - 1), t.values(e));
      }
      max_value[t.latents(e)] = std::max(max_value[t.latents(e)], t.values(e));
    }
  }
  ASSERT_GT(resp.top_latents_size(), 0);
  EXPECT_LE(resp.top_latents_size(), 6);
  // The prompt's best latent is the best latent of the token it names.
  const latentd::v1::PromptLatent& best = resp.top_latents(0);
  EXPECT_EQ(resp.tokens(best.position()).latents(0), best.latent());
  EXPECT_EQ(resp.tokens(best.position()).values(0), best.max_value());
  for (int i = 1; i < resp.top_latents_size(); ++i) {
    EXPECT_GE(resp.top_latents(i - 1).max_value(), resp.top_latents(i).max_value());
  }

  auto code = [&](uint64_t dataset, std::vector<int32_t> ids) {
    grpc::ClientContext c;
    latentd::v1::EncodePromptRequest r;
    r.set_dataset_id(dataset);
    for (int32_t t : ids) r.add_token_ids(t);
    latentd::v1::EncodePromptResponse out;
    return stub_->EncodePrompt(&c, r, &out);
  };
  EXPECT_EQ(code(id, {}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = code(id, {1, 16});  // the model's vocabulary is 16
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("token_ids[1]"), std::string::npos) << s.error_message();
  EXPECT_EQ(code(id, {-1}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(999, {1}).error_code(), grpc::StatusCode::NOT_FOUND);
  storage::DatasetMeta dense;
  dense.name = "dense-prompt";
  dense.kind = storage::DatasetKind::kDense;
  dense.width = 4;
  dense.job_id = 43;
  auto dense_id = store_->CreateDataset(dense);
  ASSERT_TRUE(dense_id.ok());
  EXPECT_EQ(code(*dense_id, {1}).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(DatasetsServiceTest, SteerPromptConvertsBothRunsAndTheModes) {
  AddPlaneSaeJob(dir_, 43, &jobs_);
  const uint64_t id = MakeDataset("steer", 16, 512, storage::ValueDtype::kFloat16, 43);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  grpc::ClientContext encode_ctx;
  latentd::v1::EncodePromptRequest encode;
  encode.set_dataset_id(id);
  for (int32_t t : prompt) encode.add_token_ids(t);
  latentd::v1::EncodePromptResponse encoded;
  ASSERT_TRUE(stub_->EncodePrompt(&encode_ctx, encode, &encoded).ok());
  const int32_t strongest = encoded.tokens(4).latents(0);

  auto steer = [&](latentd::v1::LatentIntervention::Mode mode, float value,
                   latentd::v1::SteerPromptResponse* out) {
    grpc::ClientContext c;
    latentd::v1::SteerPromptRequest r;
    r.set_dataset_id(id);
    for (int32_t t : prompt) r.add_token_ids(t);
    latentd::v1::LatentIntervention* in = r.add_interventions();
    in->set_latent(strongest);
    in->set_mode(mode);
    in->set_value(value);
    r.set_new_tokens(3);
    r.set_top_tokens(4);
    r.add_sweep(value);  // the given value again: the steered run
    r.add_sweep(1.0f);
    return stub_->SteerPrompt(&c, r, out);
  };
  latentd::v1::SteerPromptResponse same, ablated;
  grpc::Status s = steer(latentd::v1::LatentIntervention::SCALE, 1.0f, &same);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(same.bos_prepended());
  ASSERT_EQ(same.prompt_size(), 5);
  for (const latentd::v1::SteeredRun* run : {&same.clean(), &same.steered()}) {
    EXPECT_EQ(run->generated_size(), 3);
    EXPECT_EQ(run->next_size(), 4);
    EXPECT_EQ(run->token_losses_size(), 4);
    EXPECT_GT(run->mean_loss(), 0);
  }
  EXPECT_EQ(same.clean().generated(0), same.steered().generated(0));
  EXPECT_NEAR(same.kl_divergence(), 0, 1e-6);
  ASSERT_EQ(same.latent_values_size(), 1);
  EXPECT_EQ(same.latent_values(0).latent(), strongest);
  ASSERT_EQ(same.latent_values(0).values_size(), 5);
  EXPECT_EQ(same.latent_values(0).values(4), encoded.tokens(4).values(0));
  ASSERT_EQ(same.sweep_size(), 2);
  EXPECT_EQ(same.sweep(0).value(), 1.0f);
  EXPECT_EQ(same.sweep(0).run().generated_size(), 3);
  EXPECT_EQ(same.sweep(0).run().generated(0), same.steered().generated(0));
  EXPECT_NEAR(same.sweep(0).kl_divergence(), same.kl_divergence(), 1e-9);

  s = steer(latentd::v1::LatentIntervention::SET, 0.0f, &ablated);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_GT(ablated.kl_divergence(), 0);
  ASSERT_EQ(ablated.sweep_size(), 2);
  EXPECT_NEAR(ablated.sweep(0).kl_divergence(), ablated.kl_divergence(),  // set 0 again
              1e-6 * ablated.kl_divergence());
  EXPECT_NE(ablated.sweep(1).kl_divergence(), ablated.kl_divergence());  // set 1
  EXPECT_EQ(ablated.clean().mean_loss(), same.clean().mean_loss());
  ASSERT_GT(ablated.most_increased_size() + ablated.most_decreased_size(), 0);
  for (const latentd::v1::NextTokenChange& c : ablated.most_increased()) {
    EXPECT_GT(c.steered_probability(), c.clean_probability());
  }

  s = steer(latentd::v1::LatentIntervention::MODE_UNSPECIFIED, 0.0f, &ablated);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("interventions[0].mode: MODE_UNSPECIFIED"), std::string::npos)
      << s.error_message();
  grpc::ClientContext c;
  latentd::v1::SteerPromptRequest none;
  none.set_dataset_id(id);
  none.add_token_ids(1);
  s = stub_->SteerPrompt(&c, none, &ablated);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("interventions"), std::string::npos) << s.error_message();
}

TEST_F(DatasetsServiceTest, AttributePromptConvertsEntriesAndTotals) {
  AddPlaneSaeJob(dir_, 43, &jobs_);
  const uint64_t id = MakeDataset("attribute", 16, 512, storage::ValueDtype::kFloat16, 43);
  auto attribute = [&](std::optional<int32_t> target, std::optional<int32_t> contrast,
                       latentd::v1::AttributePromptResponse* out) {
    grpc::ClientContext c;
    latentd::v1::AttributePromptRequest r;
    r.set_dataset_id(id);
    for (int32_t t : {3, 1, 4, 1, 5}) r.add_token_ids(t);
    if (target) r.set_target_token_id(*target);
    if (contrast) r.set_contrast_token_id(*contrast);
    r.set_top(6);
    return stub_->AttributePrompt(&c, r, out);
  };
  latentd::v1::AttributePromptResponse own, contrasted;
  grpc::Status s = attribute(std::nullopt, std::nullopt, &own);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(own.prompt_size(), 5);
  EXPECT_FALSE(own.has_contrast_token_id());
  EXPECT_LT(own.metric(), 0);  // a log-probability
  EXPECT_EQ(own.top_entries_size(), 6);
  EXPECT_EQ(own.top_latents_size(), 6);
  ASSERT_EQ(own.latent_attribution_by_position_size(), 5);
  ASSERT_EQ(own.error_attribution_by_position_size(), 5);
  double sum = 0;
  for (double a : own.latent_attribution_by_position()) sum += a;
  EXPECT_NEAR(sum, own.latent_attribution(), 1e-9);
  for (const latentd::v1::LatentAttribution& e : own.top_entries()) {
    EXPECT_GE(e.position(), 0);
    EXPECT_LT(e.position(), 5);
    EXPECT_GT(e.activation(), 0);
  }
  s = attribute(own.target_token_id(), (own.target_token_id() + 1) % 16, &contrasted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(contrasted.has_contrast_token_id());
  EXPECT_EQ(contrasted.contrast_token_id(), (own.target_token_id() + 1) % 16);
  EXPECT_NE(contrasted.metric(), own.metric());
  s = attribute(16, std::nullopt, &own);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("target_token_id: 16"), std::string::npos) << s.error_message();

  // A latent of the same SAE as the target (its own hook: the write comes first): the metric is
  // its value there, echoed with the answer. An unknown dataset is named.
  const latentd::v1::LatentAttribution& strongest = contrasted.top_entries(0);
  auto to_latent = [&](uint64_t dataset, int32_t latent, int32_t position,
                       latentd::v1::AttributePromptResponse* out) {
    grpc::ClientContext c;
    latentd::v1::AttributePromptRequest r;
    r.set_dataset_id(id);
    for (int32_t t : {3, 1, 4, 1, 5}) r.add_token_ids(t);
    r.mutable_target_latent()->set_dataset_id(dataset);
    r.mutable_target_latent()->set_latent(latent);
    r.mutable_target_latent()->set_position(position);
    return stub_->AttributePrompt(&c, r, out);
  };
  latentd::v1::AttributePromptResponse driven;
  s = to_latent(id, strongest.latent(), strongest.position(), &driven);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NEAR(driven.metric(), strongest.activation(), 1e-3);
  EXPECT_EQ(driven.target_latent().latent(), strongest.latent());
  EXPECT_EQ(driven.target_latent().dataset_id(), id);
  s = to_latent(id + 1000, 0, 0, &driven);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("target_latent.dataset_id"), std::string::npos)
      << s.error_message();
}

// The attribution graph through gRPC: over one hook, the output's parents are the prediction's
// strongest entries (AttributePrompt's), with the hook's error node; bad requests name fields.
TEST_F(DatasetsServiceTest, AttributionGraphConvertsNodesAndEdges) {
  AddPlaneSaeJob(dir_, 45, &jobs_);
  const uint64_t id =
      MakeDataset("graph", 16, 512, storage::ValueDtype::kFloat16, 45, "blocks.0.hook_resid_post");
  std::vector<latentd::v1::AttributionGraphProgress> progress;
  auto graph = [&](std::vector<uint64_t> ids, uint64_t output,
                   latentd::v1::AttributionGraphResponse* out) {
    latentd::v1::AttributionGraphRequest r;
    for (uint64_t d : ids) r.add_dataset_ids(d);
    r.set_output_dataset_id(output);
    for (int32_t t : {3, 1, 4, 1, 5}) r.add_token_ids(t);
    r.set_per_hook(2);
    return ReadGraph(r, out, &progress);
  };
  latentd::v1::AttributionGraphResponse got;
  grpc::Status s = graph({id}, 0, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // A progress event after the hook's pass, then the graph.
  ASSERT_EQ(progress.size(), 1u);
  EXPECT_EQ(progress[0].hooks_done(), 1);
  EXPECT_EQ(progress[0].hooks(), 1);
  EXPECT_EQ(progress[0].passes(), 1);
  EXPECT_EQ(progress[0].hook_name(), "blocks.0.hook_resid_post");
  ASSERT_EQ(got.hooks_size(), 1);
  EXPECT_EQ(got.hooks(0).dataset_id(), id);
  // The output's whole share reaches the only hook: kept, error and dropped add up to 1.
  const latentd::v1::GraphHook& hook = got.hooks(0);
  EXPECT_EQ(hook.kept_nodes(), 2);
  EXPECT_GT(hook.kept_importance(), 0);
  EXPECT_NEAR(hook.kept_importance() + hook.error_importance() + hook.dropped_importance(), 1,
              1e-9);
  ASSERT_EQ(got.nodes_size(), 4);  // the output, two latents, the error node
  EXPECT_EQ(got.nodes(0).hook(), 1);
  EXPECT_EQ(got.nodes(0).position(), 4);
  EXPECT_FLOAT_EQ(got.nodes(0).activation(), static_cast<float>(got.output().metric()));
  EXPECT_EQ(got.nodes(3).latent(), -1);
  grpc::ClientContext c;
  latentd::v1::AttributePromptRequest r;
  r.set_dataset_id(id);
  for (int32_t t : {3, 1, 4, 1, 5}) r.add_token_ids(t);
  r.set_top(20);
  latentd::v1::AttributePromptResponse plain;
  ASSERT_TRUE(stub_->AttributePrompt(&c, r, &plain).ok());
  EXPECT_EQ(got.output().metric(), plain.metric());
  for (int k = 0; k < 2; ++k) {  // the two strongest entries, each with its edge to the output
    EXPECT_EQ(got.nodes(1 + k).latent(), plain.top_entries(k).latent()) << k;
    EXPECT_EQ(got.nodes(1 + k).position(), plain.top_entries(k).position()) << k;
    EXPECT_EQ(got.edges(k).from_node(), 1 + k);
    EXPECT_EQ(got.edges(k).to_node(), 0);
    EXPECT_DOUBLE_EQ(got.edges(k).attribution(), plain.top_entries(k).attribution());
  }
  for (const auto& [ids, output, code, says] :
       std::vector<std::tuple<std::vector<uint64_t>, uint64_t, grpc::StatusCode, std::string>>{
           {{}, 0, grpc::StatusCode::INVALID_ARGUMENT, "dataset_ids: 0"},
           {{id, id}, 0, grpc::StatusCode::INVALID_ARGUMENT, "dataset_ids[1]"},
           {{id}, id + 1, grpc::StatusCode::INVALID_ARGUMENT, "output_dataset_id"},
           {{id + 99}, 0, grpc::StatusCode::NOT_FOUND, "dataset_ids[0]"}}) {
    latentd::v1::AttributionGraphResponse refused;
    s = graph(ids, output, &refused);
    EXPECT_EQ(s.error_code(), code) << says << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(says), std::string::npos) << s.error_message();
  }
  // A latent as the graph's metric: its value is the output's, the target echoed.
  latentd::v1::AttributionGraphRequest to_latent;
  to_latent.add_dataset_ids(id);
  for (int32_t t : {3, 1, 4, 1, 5}) to_latent.add_token_ids(t);
  to_latent.mutable_target_latent()->set_dataset_id(id);
  to_latent.mutable_target_latent()->set_latent(plain.top_entries(0).latent());
  to_latent.mutable_target_latent()->set_position(plain.top_entries(0).position());
  latentd::v1::AttributionGraphResponse of_latent;
  s = ReadGraph(to_latent, &of_latent, nullptr);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(of_latent.output().target_latent().latent(), plain.top_entries(0).latent());
  EXPECT_NEAR(of_latent.nodes(0).activation(), plain.top_entries(0).activation(), 1e-3);

  // A floor on importance no latent reaches keeps the output and the hook's error node alone;
  // one outside [0, 1] is refused.
  latentd::v1::AttributionGraphRequest floored = to_latent;
  floored.clear_target_latent();
  floored.set_min_importance(1.0);
  latentd::v1::AttributionGraphResponse pruned;
  s = ReadGraph(floored, &pruned, nullptr);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(pruned.nodes_size(), 2);
  EXPECT_EQ(pruned.nodes(1).latent(), -1);
  floored.set_min_importance(2.0);
  s = ReadGraph(floored, &pruned, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("min_importance: 2"), std::string::npos) << s.error_message();
  floored.set_min_importance(0);
  floored.set_node_threshold(-0.2);
  s = ReadGraph(floored, &pruned, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("node_threshold: -0.2"), std::string::npos) << s.error_message();
  // A model to run named where no dataset is a crosscoder over several models.
  floored.set_node_threshold(0);
  floored.set_crosscoder_source(1);
  s = ReadGraph(floored, &pruned, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("crosscoder_source: none of the graph's datasets"),
            std::string::npos)
      << s.error_message();

  // Hostile sizes: per_hook out of range, too many datasets, a metric field out of range.
  for (const auto& [per_hook, datasets, target, says] :
       std::vector<std::tuple<int32_t, int, int32_t, std::string>>{
           {-1, 1, 0, "per_hook: -1"},
           {65, 1, 0, "per_hook: 65"},
           {INT32_MAX, 1, 0, "per_hook"},
           {2, 65, 0, "dataset_ids: 65"},
           {2, 1, INT32_MAX, "target_token_id"}}) {
    latentd::v1::AttributionGraphRequest r;
    for (int d = 0; d < datasets; ++d) r.add_dataset_ids(id + d);
    for (int32_t t : {3, 1, 4}) r.add_token_ids(t);
    r.set_per_hook(per_hook);
    if (target != 0) r.set_target_token_id(target);
    latentd::v1::AttributionGraphResponse refused;
    s = ReadGraph(r, &refused, nullptr);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << says << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(says), std::string::npos) << s.error_message();
  }
}

TEST_F(DatasetsServiceTest, AnEncodedPromptTooLargeToReceiveIsRefusedWithTheNumbers) {
  // 4096 latents that all fire on each of 1024 tokens: 1000 of them a token is about 6 MB.
  AddPlaneSaeJob(dir_, 44, &jobs_,
                 {"dense_sae", 4096, /*relu_bias=*/1e3f, /*context_length=*/1024});
  const uint64_t id = MakeDataset("all-firing", 16, 4096, storage::ValueDtype::kFloat16, 44);
  auto encode = [&](int tokens, int per_token, latentd::v1::EncodePromptResponse* out) {
    grpc::ClientContext c;
    latentd::v1::EncodePromptRequest r;
    r.set_dataset_id(id);
    for (int t = 0; t < tokens; ++t) r.add_token_ids(t % 16);
    r.set_latents_per_token(per_token);
    return stub_->EncodePrompt(&c, r, out);
  };
  latentd::v1::EncodePromptResponse out;
  grpc::Status s = encode(1024, 1000, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("for 1024 tokens, above the 3670016"), std::string::npos)
      << s.error_message();
  // Fewer latents a token: answered, each token saying all 4096 fire.
  s = encode(1024, 10, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(out.tokens_size(), 1024);
  EXPECT_EQ(out.tokens(0).active(), 4096);
  EXPECT_EQ(out.tokens(0).latents_size(), 10);
}

// Every firing of `latent` in rows [start, start + count) through ReadLatentFirings, and the
// number of pieces they came in.
struct Firings {
  std::vector<int64_t> rows;
  std::vector<float> values;
  std::vector<int32_t> token_ids;  // with token_ids
  int pieces = 0;
};
Firings ReadFirings(latentd::v1::Datasets::Stub* stub, uint64_t id, int32_t latent,
                    int64_t start = 0, int64_t count = 0, grpc::Status* status = nullptr,
                    bool token_ids = false) {
  grpc::ClientContext ctx;
  latentd::v1::ReadLatentFiringsRequest req;
  req.set_dataset_id(id);
  req.set_latent(latent);
  req.set_row_start(start);
  req.set_row_count(count);
  req.set_token_ids(token_ids);
  auto reader = stub->ReadLatentFirings(&ctx, req);
  Firings out;
  latentd::v1::LatentFiringsPiece piece;
  while (reader->Read(&piece)) {
    ++out.pieces;
    EXPECT_EQ(piece.rows().size() / 8, piece.values().size() / 4);
    EXPECT_LE(piece.rows().size() / 8, token_ids ? size_t{196608} : size_t{1} << 18);
    const size_t n = piece.rows().size() / 8;
    const size_t at = out.rows.size();
    out.rows.resize(at + n);
    out.values.resize(at + n);
    std::memcpy(out.rows.data() + at, piece.rows().data(), n * 8);
    std::memcpy(out.values.data() + at, piece.values().data(), n * 4);
    EXPECT_EQ(piece.token_ids().size(), token_ids ? n * 4 : 0);
    if (token_ids) {
      out.token_ids.resize(at + n);
      std::memcpy(out.token_ids.data() + at, piece.token_ids().data(), n * 4);
    }
  }
  const grpc::Status s = reader->Finish();
  if (status != nullptr) *status = s;
  return out;
}

TEST_F(DatasetsServiceTest, ReadLatentFiringsStreamsEveryFiringInRowOrder) {
  // 16 latents, all firing on each of 300000 rows: 300000 firings each, more than one piece.
  const uint64_t id = MakeDataset("firings", 300000, 16);
  auto all = store_->ReadRows(id, 0, 0);
  ASSERT_TRUE(all.ok());
  for (int32_t latent : {0, 9}) {
    std::vector<int64_t> want_rows;
    std::vector<float> want_values;
    for (int64_t r = 0; r < 300000; ++r) {
      for (int64_t i = all->indptr[r]; i < all->indptr[r + 1]; ++i) {
        if (all->indices[i] != latent) continue;
        want_rows.push_back(r);
        want_values.push_back(all->values[i]);
      }
    }
    grpc::Status s;
    Firings got = ReadFirings(stub_.get(), id, latent, 0, 0, &s);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(got.pieces, 2);  // 262144 + 37856
    EXPECT_EQ(got.rows, want_rows);
    EXPECT_EQ(got.values, want_values);
    // A range, across a commit and a store read window.
    got = ReadFirings(stub_.get(), id, latent, 1000, 5000, &s);
    ASSERT_TRUE(s.ok()) << s.error_message();
    std::vector<int64_t> want_range;
    for (int64_t r : want_rows) {
      if (r >= 1000 && r < 6000) want_range.push_back(r);
    }
    EXPECT_EQ(got.rows, want_range);
  }
  // A latent of a sparser dataset: only its rows.
  const uint64_t sparse = MakeDataset("sparse-firings", 500, 512);
  auto rows = store_->ReadRows(sparse, 0, 0);
  std::vector<int64_t> want;
  for (int64_t r = 0; r < 500; ++r) {
    for (int64_t i = rows->indptr[r]; i < rows->indptr[r + 1]; ++i) {
      if (rows->indices[i] == 77) want.push_back(r);
    }
  }
  EXPECT_EQ(ReadFirings(stub_.get(), sparse, 77).rows, want);
  // With each firing row's token id (spans of rows far apart and close together).
  grpc::Status with_tokens;
  const Firings tokens = ReadFirings(stub_.get(), sparse, 77, 0, 0, &with_tokens, true);
  ASSERT_TRUE(with_tokens.ok()) << with_tokens.error_message();
  ASSERT_EQ(tokens.rows, want);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(tokens.token_ids[i], rows->token_ids[want[i]]) << "row " << want[i];
  }
  const Firings dense_tokens = ReadFirings(stub_.get(), id, 3, 0, 0, &with_tokens, true);
  ASSERT_TRUE(with_tokens.ok()) << with_tokens.error_message();
  ASSERT_EQ(dense_tokens.token_ids.size(), size_t{300000});
  EXPECT_EQ(dense_tokens.pieces, 2);                  // 196608 + 103392
  EXPECT_EQ(dense_tokens.token_ids, all->token_ids);  // latent 3 fires on every row

  grpc::Status s;
  ReadFirings(stub_.get(), sparse, 512, 0, 0, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  ReadFirings(stub_.get(), sparse, 3, 400, 101, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  ReadFirings(stub_.get(), sparse, 3, 0, -1, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  ReadFirings(stub_.get(), 999, 3, 0, 0, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
}

TEST_F(DatasetsServiceTest, CompareSaesMatchesEachLatentToTheNearestDirection) {
  AddPlaneSaeJob(dir_, 45, &jobs_);                   // 512 latents at angles j / 100
  AddPlaneSaeJob(dir_, 46, &jobs_, {"sae256", 256});  // the first 256 of those angles
  const uint64_t a = MakeDataset("plane-512", 16, 512, storage::ValueDtype::kFloat16, 45);
  const uint64_t b = MakeDataset("plane-256", 16, 256, storage::ValueDtype::kFloat16, 46);
  grpc::ClientContext ctx;
  latentd::v1::CompareSaesRequest req;
  req.set_dataset_id(a);
  req.set_other_dataset_id(b);
  req.set_bins(10);
  latentd::v1::CompareSaesResponse resp;
  grpc::Status s = stub_->CompareSaes(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.compared(), 512);
  ASSERT_EQ(resp.latents().size(), 512 * 4);
  std::vector<int32_t> latents(512), best(512);
  std::vector<float> cosines(512);
  std::memcpy(latents.data(), resp.latents().data(), 512 * 4);
  std::memcpy(best.data(), resp.best_latents().data(), 512 * 4);
  std::memcpy(cosines.data(), resp.best_cosines().data(), 512 * 4);
  double sum = 0;
  for (int j = 0; j < 512; ++j) {
    EXPECT_EQ(latents[j], j);
    // Its own angle when B has it, else the nearest of B's (round the circle: 5.11 rad lies
    // nearer 0 than 2.55).
    int want = 0;
    for (int k = 1; k < 256; ++k) {
      if (std::cos((j - k) / 100.0) > std::cos((j - want) / 100.0) + 1e-9) want = k;
    }
    EXPECT_EQ(best[j], want) << "latent " << j;
    EXPECT_NEAR(cosines[j], std::cos((j - want) / 100.0), 1e-5);
    sum += cosines[j];
  }
  EXPECT_NEAR(resp.mean_best_cosine(), sum / 512, 1e-6);
  ASSERT_EQ(resp.histogram_size(), 10);
  EXPECT_GE(resp.histogram(9), 256);  // the shared angles: cosine 1

  auto code = [&](uint64_t first, uint64_t second, int32_t sample) {
    grpc::ClientContext c;
    latentd::v1::CompareSaesRequest r;
    r.set_dataset_id(first);
    r.set_other_dataset_id(second);
    r.set_sample(sample);
    latentd::v1::CompareSaesResponse out;
    return stub_->CompareSaes(&c, r, &out).error_code();
  };
  EXPECT_EQ(code(b, a, 16), grpc::StatusCode::OK);
  EXPECT_EQ(code(a, 999, 0), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(code(a, b, -1), grpc::StatusCode::INVALID_ARGUMENT);
}

// Latent scaling fits a model-diffing crosscoder's latents in the stored activations (the
// engine's and the end-to-end tests fit one); anything else is refused for what it is.
TEST_F(DatasetsServiceTest, LatentScalingIsRefusedForWhatIsNotAModelDiffingCrosscoder) {
  AddPlaneSaeJob(dir_, 45, &jobs_);
  const uint64_t plane = MakeDataset("plane-scaled", 16, 512, storage::ValueDtype::kFloat16, 45);
  auto scale = [&](uint64_t dataset, std::optional<int32_t> source,
                   std::optional<int32_t> baseline) {
    grpc::ClientContext ctx;
    latentd::v1::LatentScalingRequest req;
    req.set_dataset_id(dataset);
    if (source) req.set_source(*source);
    if (baseline) req.set_baseline(*baseline);
    latentd::v1::LatentScalingResponse resp;
    return stub_->LatentScaling(&ctx, req, &resp);
  };
  grpc::Status s = scale(plane, std::nullopt, std::nullopt);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find(
                absl::StrCat("dataset ", plane, "'s SAE is not a crosscoder: latent scaling fits")),
            std::string::npos)
      << s.error_message();
  // (Before any field: the fields are checked against the crosscoder's sources.)
  s = scale(plane, -2, std::nullopt);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_EQ(scale(999, std::nullopt, std::nullopt).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(DatasetsServiceTest, HostileRequestsGetClientErrorsNeverACrash) {
  AddPlaneSaeJob(dir_, 42, &jobs_);  // GetLatentWeights reads real weights
  const uint64_t id = MakeDataset("hostile", 300, 512, storage::ValueDtype::kFloat16, 42);
  std::mt19937_64 rng(17);
  auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  const std::vector<int64_t> ints{0,         1,         -1,        2,         299,          300,
                                  301,       511,       512,       513,       4096,         1 << 20,
                                  INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, INT64_MAX - 1};
  auto int32_of = [&]() { return static_cast<int32_t>(pick(ints)); };
  auto dataset = [&]() -> uint64_t {
    return pick({static_cast<int64_t>(id), static_cast<int64_t>(id), 0, 999, -1});
  };
  const std::set<grpc::StatusCode> allowed{grpc::StatusCode::OK,
                                           grpc::StatusCode::INVALID_ARGUMENT,
                                           grpc::StatusCode::NOT_FOUND,
                                           grpc::StatusCode::OUT_OF_RANGE,
                                           grpc::StatusCode::FAILED_PRECONDITION,
                                           grpc::StatusCode::PERMISSION_DENIED,
                                           grpc::StatusCode::RESOURCE_EXHAUSTED};
  const std::vector<std::string> paths{"",
                                       "/",
                                       ".",
                                       "..",
                                       "../x.npz",
                                       "a/../../x.npz",
                                       "/etc/passwd",
                                       std::string("a\0b.npz", 7),
                                       std::string(5000, 'a'),
                                       "ok.npz",
                                       "dir/ok.h5",
                                       (dir_ / "exports" / ".." / "x.npz").string()};
  std::map<grpc::StatusCode, int> seen;
  int weights_answered = 0, prompts_answered = 0;
  for (int i = 0; i < 720; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::Status status;
    std::string what;
    switch (i % 9) {
      case 0: {
        latentd::v1::ReadRowsRequest req;
        req.set_dataset_id(dataset());
        req.set_row_start(pick(ints));
        req.set_row_count(pick(ints));
        req.set_packed(rng() & 1);
        what = req.ShortDebugString();
        auto reader = stub_->ReadRows(&ctx, req);
        latentd::v1::CsrPiece piece;
        int64_t rows = 0;
        while (reader->Read(&piece)) rows += piece.num_rows();
        status = reader->Finish();
        if (status.ok()) {
          EXPECT_LE(rows, 300) << what;
        }
        break;
      }
      case 1: {
        latentd::v1::GetLatentRequest req;
        req.set_dataset_id(dataset());
        req.set_latent(int32_of());
        req.set_top_n(int32_of());
        req.set_context_before(int32_of());
        req.set_context_after(int32_of());
        req.set_intervals(rng() % 3 ? 0 : int32_of());
        req.set_interval_samples(int32_of());
        req.set_distinct_sequences(rng() & 1);
        req.set_top_tokens(rng() % 2 ? 0 : int32_of());
        req.set_positions(rng() & 1);
        what = req.ShortDebugString();
        latentd::v1::GetLatentResponse resp;
        status = stub_->GetLatent(&ctx, req, &resp);
        if (status.ok()) {
          EXPECT_LE(resp.top_tokens_size(), 1000) << what;
          for (const auto& t : resp.top()) {
            EXPECT_LE(t.context_token_ids_size(), 128) << what;  // one sequence at most
          }
        }
        break;
      }
      case 2: {
        latentd::v1::ExportDatasetRequest req;
        req.set_dataset_id(dataset());
        req.set_path(paths[rng() % paths.size()]);
        req.set_format(static_cast<latentd::v1::ExportFormat>(pick({0, 1, 2, 3, -7})));
        req.set_row_start(pick(ints));
        req.set_row_count(pick(ints));
        what = req.ShortDebugString();
        latentd::v1::ExportDatasetResponse resp;
        status = stub_->ExportDataset(&ctx, req, &resp);
        break;
      }
      case 3: {
        latentd::v1::GetDatasetRequest req;
        req.set_dataset_id(dataset());
        what = req.ShortDebugString();
        latentd::v1::DatasetInfo info;
        status = stub_->GetDataset(&ctx, req, &info);
        break;
      }
      case 4: {
        latentd::v1::ListLatentsRequest req;
        req.set_dataset_id(dataset());
        req.set_order(static_cast<latentd::v1::LatentOrder>(pick({0, 1, 2, 3, 4, 5, 6, -1})));
        req.set_limit(int32_of());
        req.set_offset(pick(ints));
        req.set_min_firing_count(rng() % 2 ? 0 : pick(ints));
        if (rng() % 2) req.set_max_firing_count(pick(ints));
        req.set_density_bins(int32_of());
        what = req.ShortDebugString();
        latentd::v1::ListLatentsResponse resp;
        status = stub_->ListLatents(&ctx, req, &resp);
        if (status.ok()) {
          EXPECT_LE(resp.latents_size(), 512) << what;
          EXPECT_LE(resp.log10_density_histogram_size(), 1000) << what;
        }
        break;
      }
      case 5: {
        latentd::v1::LatentsOnRowsRequest req;
        req.set_dataset_id(dataset());
        switch (rng() % 3) {
          case 0:
            req.set_with_latent(int32_of());
            break;
          case 1:
            req.set_token_id(int32_of());
            break;
          default:
            break;  // neither
        }
        req.set_order(static_cast<latentd::v1::RowLatentOrder>(pick({0, 1, 2, 3, -1})));
        req.set_limit(int32_of());
        req.set_max_rows(pick(ints));
        req.set_min_count(pick(ints));
        what = req.ShortDebugString();
        latentd::v1::LatentsOnRowsResponse resp;
        status = stub_->LatentsOnRows(&ctx, req, &resp);
        if (status.ok()) {
          EXPECT_LE(resp.rows_read(), 300) << what;
          EXPECT_LE(resp.latents_size(), 512) << what;
        }
        break;
      }
      case 6: {
        latentd::v1::GetLatentWeightsRequest req;
        req.set_dataset_id(dataset());
        req.set_latent(int32_of());
        req.set_top_n(int32_of());
        req.set_unembedding(pick({0, 0, 1}) ? paths[rng() % paths.size()] : "");
        what = req.ShortDebugString();
        latentd::v1::GetLatentWeightsResponse resp;
        status = stub_->GetLatentWeights(&ctx, req, &resp);
        if (status.ok()) {
          ++weights_answered;
          EXPECT_LE(resp.neighbors_size(), 511) << what;
          EXPECT_LE(resp.positive_logits_size(), 16) << what;
        }
        break;
      }
      case 7: {
        const int64_t n = pick({0, 1, 2, 127, 128, 129, 5000});
        if (rng() % 3 == 1) {  // steered: hostile interventions, generation, sweep
          latentd::v1::SteerPromptRequest req;
          req.set_dataset_id(dataset());
          for (int64_t t = 0; t < n; ++t) req.add_token_ids(static_cast<int32_t>(pick(ints)) % 17);
          for (int64_t k = pick({0, 1, 2, 65}); k > 0; --k) {
            latentd::v1::LatentIntervention* in = req.add_interventions();
            in->set_latent(int32_of());
            in->set_mode(static_cast<latentd::v1::LatentIntervention::Mode>(pick({0, 1, 2, 3, 7})));
            in->set_value(static_cast<float>(pick({0, 1, -3, 1 << 20})) *
                          (rng() % 5 == 0 ? std::numeric_limits<float>::infinity() : 1.0f));
            if (rng() % 2) in->add_positions(int32_of());
          }
          req.set_new_tokens(static_cast<int32_t>(pick({0, 1, 3, 256, 257, -1, INT32_MAX})));
          req.set_temperature(static_cast<float>(pick({0, 1, -1})));
          for (int64_t k = pick({0, 2, 17}); k > 0; --k) req.add_sweep(static_cast<float>(k));
          req.set_top_tokens(int32_of());
          what = absl::StrCat("SteerPrompt of ", n,
                              " tokens: ", req.ShortDebugString().substr(0, 300));
          latentd::v1::SteerPromptResponse resp;
          status = stub_->SteerPrompt(&ctx, req, &resp);
          if (status.ok()) {
            EXPECT_EQ(resp.prompt_size(), n) << what;
            EXPECT_EQ(resp.steered().generated_size(), req.new_tokens()) << what;
          }
          break;
        }
        if (rng() % 2 == 0) {  // attributed
          latentd::v1::AttributePromptRequest req;
          req.set_dataset_id(dataset());
          for (int64_t t = 0; t < n; ++t) req.add_token_ids(static_cast<int32_t>(pick(ints)) % 17);
          if (rng() % 2) req.set_target_token_id(int32_of());
          if (rng() % 2) req.set_contrast_token_id(int32_of());
          if (i % 4 == 3) {  // latent to latent (its fields from i: the draws stay as they were)
            const int32_t hostile[] = {-1, 0, 1, 511, 512, INT32_MAX, INT32_MIN};
            latentd::v1::AttributionTarget* t = req.mutable_target_latent();
            t->set_dataset_id((i / 4) % 3 == 0 ? id : (i / 4) % 3 == 1 ? id + 7 : UINT64_MAX);
            t->set_latent(hostile[(i / 8) % 7]);
            t->set_position(hostile[(i / 3) % 7]);
          }
          req.set_top(int32_of());
          const int32_t ablates[] = {0, 1, 64, 65, -1, INT32_MAX};  // from i: draws unchanged
          req.set_ablate(ablates[(i / 5) % 6]);
          what = absl::StrCat("AttributePrompt of ", n,
                              " tokens: ", req.ShortDebugString().substr(0, 300));
          latentd::v1::AttributePromptResponse resp;
          status = stub_->AttributePrompt(&ctx, req, &resp);
          if (status.ok()) {
            EXPECT_EQ(resp.prompt_size(), n) << what;
            EXPECT_LE(resp.top_entries_size(), 1000) << what;
            int checked = 0;
            for (const auto& e : resp.top_entries()) checked += e.has_ablated_change();
            EXPECT_EQ(checked, std::min(req.ablate(), resp.top_entries_size())) << what;
          } else if (req.ablate() < 0 || req.ablate() > 64) {
            // Refused for what it is (or for another field), never as a memory estimate.
            EXPECT_NE(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << what;
          }
          break;
        }
        latentd::v1::EncodePromptRequest req;
        req.set_dataset_id(dataset());
        for (int64_t t = 0; t < n; ++t) req.add_token_ids(static_cast<int32_t>(pick(ints)) % 17);
        req.set_latents_per_token(int32_of());
        req.set_top_latents(int32_of());
        what = absl::StrCat("EncodePrompt of ", n, " tokens, ", req.latents_per_token(), " / ",
                            req.top_latents());
        latentd::v1::EncodePromptResponse resp;
        status = stub_->EncodePrompt(&ctx, req, &resp);
        if (status.ok()) {
          ++prompts_answered;
          EXPECT_EQ(resp.tokens_size(), n) << what;
          EXPECT_LE(resp.top_latents_size(), 1000) << what;
        }
        break;
      }
      case 8: {
        const uint64_t dataset_id = dataset();
        const int32_t latent = int32_of();
        const int64_t start = pick(ints), count = pick(ints);
        what = absl::StrCat("ReadLatentFirings ", dataset_id, " latent ", latent, " rows ", start,
                            " + ", count);
        Firings got = ReadFirings(stub_.get(), dataset_id, latent, start, count, &status);
        for (int64_t r : got.rows) ASSERT_TRUE(r >= 0 && r < 300) << what;
        EXPECT_TRUE(std::is_sorted(got.rows.begin(), got.rows.end())) << what;
        break;
      }
    }
    ++seen[status.error_code()];
    ASSERT_TRUE(allowed.count(status.error_code()))
        << what << " -> " << status.error_code() << " " << status.error_message();
  }
  {
    // An answer too large to carry is refused up front, with the numbers.
    grpc::ClientContext ctx;
    latentd::v1::GetLatentRequest req;
    req.set_dataset_id(id);
    req.set_latent(3);
    req.set_intervals(1000);
    req.set_interval_samples(1000);
    latentd::v1::GetLatentResponse resp;
    const grpc::Status s = stub_->GetLatent(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(s.error_message().find("1000020 context windows of up to 41 tokens"),
              std::string::npos)
        << s.error_message();
    // Counts whose token product passes 2^63 (undefined before the check divided).
    grpc::ClientContext huge_ctx;
    req.set_intervals(INT32_MAX);
    req.set_interval_samples(INT32_MAX);
    req.set_context_before(INT32_MAX);
    EXPECT_EQ(stub_->GetLatent(&huge_ctx, req, &resp).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // Nothing escaped the export root (beside it: the store and the SAE); the dataset is intact.
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(name == "db" || name == "exports" || name == "sae") << name;
  }
  EXPECT_EQ(store_->GetRecord(id)->rows_committed, 300);
  EXPECT_GT(seen[grpc::StatusCode::OK], 10);
  EXPECT_GT(weights_answered, 0);  // the weights were read, not only the requests refused
  EXPECT_GT(prompts_answered, 0);
  EXPECT_GT(seen[grpc::StatusCode::INVALID_ARGUMENT] + seen[grpc::StatusCode::OUT_OF_RANGE], 50);
}

}  // namespace
}  // namespace latentd::server
