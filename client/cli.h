// What every latentctl command shares: the daemon's stubs with the bearer token, the exit codes,
// how errors are reported, number and time formatting, and the flags several commands read
// (--vocab, --html). The commands themselves live in job_commands.h, dataset_commands.h and
// model_commands.h; latentctl.cc parses the flags and picks one.
//
// Each command is `int Command(Client&, const std::vector<std::string>& args)`, args[0] being the
// command's name; it prints to stdout (with --json: one protobuf JSON object per response line)
// and returns the process's exit status: 0, kExitRpcError after printing the call's code and
// message to stderr, kExitUsage after printing the usage error.
#ifndef LATENTD_CLIENT_CLI_H_
#define LATENTD_CLIENT_CLI_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/latent_view.h"
#include "client/vocabulary.h"
#include "google/protobuf/message.h"
#include "google/protobuf/repeated_field.h"
#include "google/protobuf/timestamp.pb.h"
#include "proto/latentd/v1/datasets.grpc.pb.h"
#include "proto/latentd/v1/devices.grpc.pb.h"
#include "proto/latentd/v1/jobs.grpc.pb.h"

namespace latentd::client::cli {

// Exit statuses: an RPC failed (its code and message on stderr); the command line was wrong;
// `watch` (and `pipeline --watch`, `train-nodes`): a job ended other than SUCCEEDED.
constexpr int kExitRpcError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitJobNotSucceeded = 3;

// The daemon at --server (or `address`): one channel, a stub per service, and the bearer token
// of --token_file added to every call's context.
class Client {
 public:
  Client();
  explicit Client(const std::string& address);

  // Reads the token file once; an unreadable file is a usage error reported by the caller.
  bool LoadToken(std::string* error);

  // A context for one call, carrying the token if there is one.
  std::unique_ptr<grpc::ClientContext> Context() const;

  v1::Jobs::Stub* jobs() { return jobs_.get(); }
  v1::Devices::Stub* devices() { return devices_.get(); }
  v1::Datasets::Stub* datasets() { return datasets_.get(); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Jobs::Stub> jobs_;
  std::unique_ptr<v1::Devices::Stub> devices_;
  std::unique_ptr<v1::Datasets::Stub> datasets_;
  std::string token_;
};

// `message` in the protobuf JSON mapping (camelCase names), on one line.
std::string Json(const google::protobuf::Message& message);

// A terminal bar for `count` against the largest count shown, `peak`: 1 to 40 '#' (40 at the
// peak or past it), none for 0.
std::string Bar(int64_t count, int64_t peak);

// Histogram bins summed `merge` at a time (the last group may hold fewer), so that a long
// histogram fits a few terminal lines.
std::vector<int64_t> MergeBins(const google::protobuf::RepeatedField<int64_t>& bins, int merge);

// Prints a usage error (with a pointer to `latentctl help`); returns kExitUsage.
int Usage(const std::string& message);

// Prints a failed call's code name and message; returns kExitRpcError.
int RpcError(const grpc::Status& status);
// The same for a failure a helper below returned (GetDatasetInfo, SiblingDatasets: their calls'
// statuses, FromGrpc).
int StatusError(const absl::Status& status);
// Prints why a --plot file was not written ("latentctl: --plot: ..."); returns kExitRpcError.
int PlotError(const absl::Status& status);

// `t` in local time, "-" for an unset timestamp.
std::string Time(const google::protobuf::Timestamp& t);

// `bytes` in B, KiB, MiB, GiB or TiB.
std::string Bytes(double bytes);

// args[i] as an id; false when it is missing or not a positive number.
bool ParseId(const std::vector<std::string>& args, size_t i, uint64_t* id);

// A failed call's status as an absl::Status (the codes are the same numbers).
absl::Status FromGrpc(const grpc::Status& status);

// The spec of job `id`, or an empty one when it cannot be read (the caller then labels generically;
// the call that follows reports the error).
v1::JobSpec JobSpecOrEmpty(Client& client, uint64_t id);

// Dataset `id`'s record (GetDataset).
absl::StatusOr<v1::DatasetInfo> GetDatasetInfo(Client& client, uint64_t id);

// The datasets `info` is compared with (client/dataset_siblings.h), from the daemon's list.
absl::StatusOr<std::vector<v1::DatasetInfo>> SiblingDatasets(Client& client,
                                                             const v1::DatasetInfo& info);

// The same for dataset `id`, read first.
absl::StatusOr<std::vector<v1::DatasetInfo>> SiblingDatasets(Client& client, uint64_t id);

// "dataset D (name)" for a heading, the hook added unless the name (a more_outputs default)
// ends in it already.
std::string DatasetLabel(const v1::DatasetInfo& d);

// The vocabulary --vocab names, if any; false (with *error) for a file it cannot use.
bool LoadVocabFlag(std::optional<Vocabulary>* vocab, std::string* error);

// `text`'s ids under the tokenizer.json --vocab names, without special tokens.
absl::StatusOr<std::vector<int32_t>> TokenizeWithVocabFlag(const std::string& text);

// Writes `html` to `path`, saying on stderr when it cannot.
bool WriteFile(const std::filesystem::path& path, const std::string& html);

// Writes `html` to the --html path; false, after saying so, when it cannot. Prints "wrote PATH"
// unless --json.
bool WriteHtmlFlag(const std::string& path, const std::string& html);

// The little-endian words of a packed byte string (the service's packed arrays).
template <typename T>
std::vector<T> Words(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// Of `latents`, those whose dashboard pages (LatentPageName) lie beside the --html page at
// `path`: their numbers on the page become links.
template <typename Latents, typename LatentOf>
std::set<int32_t> LatentPagesBeside(const std::string& path, const Latents& latents,
                                    LatentOf latent_of) {
  std::set<int32_t> pages;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (const auto& l : latents) {
    if (std::filesystem::exists((dir.empty() ? "." : dir) / LatentPageName(latent_of(l)))) {
      pages.insert(latent_of(l));
    }
  }
  return pages;
}

}  // namespace latentd::client::cli

#endif  // LATENTD_CLIENT_CLI_H_
