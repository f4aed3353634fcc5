#include "client/cli.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/dataset_siblings.h"
#include "client/latentctl_flags.h"
#include "client/tokenizer.h"
#include "client/vocabulary.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace latentd::client::cli {
namespace {

// Writes `text` to `path`, replacing what was there; false when it cannot.
bool WriteWhole(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  return static_cast<bool>(out);
}

}  // namespace

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = false;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string Bar(int64_t count, int64_t peak) {
  if (count <= 0) return "";
  return std::string(1 + 39 * count / std::max(peak, count), '#');
}

std::vector<int64_t> MergeBins(const google::protobuf::RepeatedField<int64_t>& bins, int merge) {
  std::vector<int64_t> merged((bins.size() + merge - 1) / merge, 0);
  for (int i = 0; i < bins.size(); ++i) merged[i / merge] += bins[i];
  return merged;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "latentctl: %s\nRun 'latentctl help' for the commands.\n", message.c_str());
  return kExitUsage;
}

int RpcError(const grpc::Status& status) {
  static const std::map<int, const char*> kNames = {
      {1, "CANCELLED"},           {2, "UNKNOWN"},
      {3, "INVALID_ARGUMENT"},    {4, "DEADLINE_EXCEEDED"},
      {5, "NOT_FOUND"},           {6, "ALREADY_EXISTS"},
      {7, "PERMISSION_DENIED"},   {8, "RESOURCE_EXHAUSTED"},
      {9, "FAILED_PRECONDITION"}, {10, "ABORTED"},
      {11, "OUT_OF_RANGE"},       {12, "UNIMPLEMENTED"},
      {13, "INTERNAL"},           {14, "UNAVAILABLE"},
      {15, "DATA_LOSS"},          {16, "UNAUTHENTICATED"}};
  auto it = kNames.find(status.error_code());
  std::fprintf(stderr, "latentctl: %s: %s\n", it != kNames.end() ? it->second : "ERROR",
               status.error_message().c_str());
  return kExitRpcError;
}

int StatusError(const absl::Status& status) {
  std::fprintf(stderr, "latentctl: %s\n", status.ToString().c_str());
  return kExitRpcError;
}

int PlotError(const absl::Status& status) {
  std::fprintf(stderr, "latentctl: --plot: %s\n", std::string(status.message()).c_str());
  return kExitRpcError;
}

std::string Time(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixSeconds(t.seconds()),
                          absl::LocalTimeZone());
}

std::string Bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return absl::StrFormat(u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
}

Client::Client() : Client(absl::GetFlag(FLAGS_server)) {}

Client::Client(const std::string& address) {
  channel_ = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  jobs_ = v1::Jobs::NewStub(channel_);
  devices_ = v1::Devices::NewStub(channel_);
  datasets_ = v1::Datasets::NewStub(channel_);
}

bool Client::LoadToken(std::string* error) {
  const std::string path = absl::GetFlag(FLAGS_token_file);
  if (path.empty()) return true;
  std::ifstream in(path);
  if (!in) {
    *error = absl::StrCat("--token_file: cannot read ", path);
    return false;
  }
  std::getline(in, token_);
  while (!token_.empty() && isspace(static_cast<unsigned char>(token_.back()))) token_.pop_back();
  return true;
}

std::unique_ptr<grpc::ClientContext> Client::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
  return context;
}

bool ParseId(const std::vector<std::string>& args, size_t i, uint64_t* id) {
  return i < args.size() && absl::SimpleAtoi(args[i], id) && *id > 0;
}

v1::JobSpec JobSpecOrEmpty(Client& client, uint64_t id) {
  v1::GetJobRequest request;
  request.set_job_id(id);
  v1::Job job;
  if (!client.jobs()->GetJob(client.Context().get(), request, &job).ok()) return v1::JobSpec();
  return job.spec();
}

bool LoadVocabFlag(std::optional<Vocabulary>* vocab, std::string* error) {
  const std::string path = absl::GetFlag(FLAGS_vocab);
  if (path.empty()) return true;
  absl::StatusOr<Vocabulary> loaded = Vocabulary::Load(path);
  if (!loaded.ok()) {
    *error = absl::StrCat("--vocab: ", loaded.status().message());
    return false;
  }
  *vocab = *std::move(loaded);
  return true;
}

absl::StatusOr<std::vector<int32_t>> TokenizeWithVocabFlag(const std::string& text) {
  const std::string path = absl::GetFlag(FLAGS_vocab);
  if (path.empty()) {
    return absl::InvalidArgumentError("needs --vocab=tokenizer.json (the model's tokenizer)");
  }
  ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::Load(path));
  return tokenizer.Encode(text, /*add_special_tokens=*/false);
}

bool WriteHtmlFlag(const std::string& path, const std::string& html) {
  if (!WriteWhole(path, html)) {
    std::fprintf(stderr, "latentctl: --html: cannot write %s\n", path.c_str());
    return false;
  }
  if (!absl::GetFlag(FLAGS_json)) std::printf("wrote %s\n", path.c_str());
  return true;
}

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<v1::DatasetInfo> GetDatasetInfo(Client& client, uint64_t id) {
  v1::GetDatasetRequest request;
  request.set_dataset_id(id);
  v1::DatasetInfo info;
  grpc::Status status = client.datasets()->GetDataset(client.Context().get(), request, &info);
  if (!status.ok()) return FromGrpc(status);
  return info;
}

absl::StatusOr<std::vector<v1::DatasetInfo>> SiblingDatasets(Client& client,
                                                             const v1::DatasetInfo& info) {
  v1::ListDatasetsResponse all;
  grpc::Status status =
      client.datasets()->ListDatasets(client.Context().get(), v1::ListDatasetsRequest(), &all);
  if (!status.ok()) return FromGrpc(status);
  return latentd::client::SiblingDatasets(info, all);
}

absl::StatusOr<std::vector<v1::DatasetInfo>> SiblingDatasets(Client& client, uint64_t id) {
  ASSIGN_OR_RETURN(const v1::DatasetInfo info, GetDatasetInfo(client, id));
  return SiblingDatasets(client, info);
}

std::string DatasetLabel(const v1::DatasetInfo& d) {
  const std::string what = absl::StrContains(d.name(), d.hook_name())
                               ? d.name()
                               : absl::StrCat(d.name(), ", ", d.hook_name());
  return absl::StrCat("dataset ", d.id(), " (", what, ")");
}

bool WriteFile(const std::filesystem::path& path, const std::string& html) {
  if (WriteWhole(path, html)) return true;
  std::fprintf(stderr, "latentctl: cannot write %s\n", path.c_str());
  return false;
}

}  // namespace latentd::client::cli
