// extract_tool: runs one EXTRACT spec outside the daemon, into a chunk store, then dumps the
// stored rows as .npy files (for the Python parity test and for inspecting a run by hand).
//
//   extract_tool --spec=spec.json --data_root=DIR --db=DIR [--devices=N] [--job_id=N]
//                [--out=DIR]
//
// spec.json is an ExtractSpec in protobuf JSON. With --out, writes indptr.npy (int64),
// indices.npy (int32), values.npy (float32) for SPARSE datasets or dense.npy (float32,
// rows x width) for DENSE ones, and token_ids.npy (int32); prints the ExtractResult as JSON.
#include <google/protobuf/util/json_util.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/npy_header.h"
#include "engine/extract_job.h"
#include "storage/chunk_store.h"
#include "storage/db.h"

namespace {

using latentd::engine::DeviceKind;
using latentd::engine::DeviceRef;

class ToolContext : public latentd::engine::JobContext {
 public:
  ToolContext(uint64_t id, int devices) : id_(id) {
    for (int i = 0; i < devices; ++i) {
      devices_.push_back({DeviceKind::kCpu, i, absl::StrCat("cpu:", i), 0});
    }
  }
  uint64_t job_id() const override { return id_; }
  int attempt() const override { return 1; }
  const std::vector<DeviceRef>& devices() const override { return devices_; }
  bool cancel_requested() const override { return false; }
  void ReportProgress(int64_t done, int64_t total, const std::string&) override {
    std::fprintf(stderr, "progress %lld/%lld\n", static_cast<long long>(done),
                 static_cast<long long>(total));
  }
  void ReportTelemetry(const latentd::v1::Telemetry&) override {}
  void Log(latentd::v1::LogLine::Level, const std::string& text) override {
    std::fprintf(stderr, "%s\n", text.c_str());
  }

 private:
  uint64_t id_;
  std::vector<DeviceRef> devices_;
};

template <typename T>
bool WriteNpy(const std::string& path, const char* descr, const std::vector<int64_t>& shape,
              const T* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::ofstream out(path, std::ios::binary);
  out << latentd::NpyHeader(descr, shape);
  out.write(reinterpret_cast<const char*>(data), n * sizeof(T));
  return static_cast<bool>(out);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "extract_tool: %s\n", s.ToString().c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec_path, root, db_path, out;
  int devices = 1;
  uint64_t job_id = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      std::string f = absl::StrCat(flag, "=");
      return absl::StartsWith(a, f) ? argv[i] + f.size() : nullptr;
    };
    if (const char* v = value("--spec"))
      spec_path = v;
    else if (const char* v = value("--data_root"))
      root = v;
    else if (const char* v = value("--db"))
      db_path = v;
    else if (const char* v = value("--out"))
      out = v;
    else if (const char* v = value("--devices"))
      devices = std::atoi(v);
    else if (const char* v = value("--job_id"))
      job_id = std::strtoull(v, nullptr, 10);
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (spec_path.empty() || root.empty() || db_path.empty()) {
    std::fprintf(stderr,
                 "usage: extract_tool --spec=F --data_root=D --db=D [--out=D] [--devices=N]\n");
    return 2;
  }
  std::ifstream in(spec_path);
  std::stringstream text;
  text << in.rdbuf();
  latentd::v1::ExtractSpec spec;
  auto parsed = google::protobuf::util::JsonStringToMessage(text.str(), &spec);
  if (!parsed.ok()) {
    std::fprintf(stderr, "extract_tool: bad spec JSON: %s\n", parsed.ToString().c_str());
    return 2;
  }
  latentd::engine::ExtractEnv env;
  env.data_roots = {root};
  if (auto s = latentd::engine::ValidateExtractSpec(spec, env); !s.ok()) return Fail(s);
  auto db = latentd::storage::Db::Open(db_path);
  if (!db.ok()) return Fail(db.status());
  latentd::storage::ChunkStore store(db->get());
  env.store = &store;
  ToolContext ctx(job_id, devices);
  auto result = latentd::engine::RunExtract(spec, env, &ctx);
  if (!result.ok()) return Fail(result.status());
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(*result, &json);
  std::printf("%s\n", json.c_str());
  if (out.empty()) return 0;
  auto record = store.GetRecord(result->dataset_id());
  if (!record.ok()) return Fail(record.status());
  if (record->meta.kind == latentd::storage::DatasetKind::kSparse) {
    auto rows = store.ReadRows(result->dataset_id(), 0, 0);
    if (!rows.ok()) return Fail(rows.status());
    WriteNpy(out + "/indptr.npy", "<i8", {static_cast<int64_t>(rows->indptr.size())},
             rows->indptr.data());
    WriteNpy(out + "/indices.npy", "<i4", {static_cast<int64_t>(rows->indices.size())},
             rows->indices.data());
    WriteNpy(out + "/values.npy", "<f4", {static_cast<int64_t>(rows->values.size())},
             rows->values.data());
    WriteNpy(out + "/token_ids.npy", "<i4", {static_cast<int64_t>(rows->token_ids.size())},
             rows->token_ids.data());
  } else {
    std::vector<float> values;
    std::vector<int32_t> tokens;
    auto s = store.ReadDense(result->dataset_id(), 0, record->rows_committed, &values, &tokens);
    if (!s.ok()) return Fail(s);
    WriteNpy(out + "/dense.npy", "<f4", {record->rows_committed, record->meta.width},
             values.data());
    WriteNpy(out + "/token_ids.npy", "<i4", {static_cast<int64_t>(tokens.size())}, tokens.data());
  }
  return 0;
}
