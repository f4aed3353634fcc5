// latentctl: the command-line client of latentd.
//
//   latentctl [--server=HOST:PORT] [--token_file=F] [--json] COMMAND [ARGS]
//
// Commands: submit, get, list, watch, cancel, delete-job, telemetry, devices, datasets, dataset,
// rows, latent, latents, export, delete-dataset, artifacts, delete-artifact. `latentctl help` lists
// them with their flags. With --json every response is printed in the protobuf JSON mapping, one
// object per line (streams: one per message). Exit status: 0 on success; 1 on an RPC error
// (the gRPC code and message go to stderr); 2 on a usage error; `watch` returns 3 when the job
// ends other than SUCCEEDED.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/dataset_siblings.h"
#include "client/latent_view.h"
#include "client/pipeline_file.h"
#include "client/steer_view.h"
#include "client/telemetry_plot.h"
#include "client/tokenize_files.h"
#include "client/tokenizer.h"
#include "client/vocabulary.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/time_util.h"
#include "proto/latentd/v1/datasets.grpc.pb.h"
#include "proto/latentd/v1/devices.grpc.pb.h"
#include "proto/latentd/v1/jobs.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "latentd address");
ABSL_FLAG(std::string, token_file, "", "file holding the bearer token");
ABSL_FLAG(bool, json, false, "print responses in the protobuf JSON mapping");
ABSL_FLAG(std::string, type, "", "submit: PROBE, EXTRACT or TRAIN");
ABSL_FLAG(std::string, spec, "", "submit: JSON file with a JobSpec or the type's spec");
ABSL_FLAG(std::string, request_id, "",
          "submit: idempotency key (the same key returns the same job)");
ABSL_FLAG(int, num_devices, 0, "submit: devices the job needs (default: the spec's, else 1)");
ABSL_FLAG(int, priority, 0, "submit: higher runs first");
ABSL_FLAG(std::string, label, "", "submit: a label shown by list; list: only jobs with this label");
ABSL_FLAG(std::string, state, "", "list: only jobs in this state");
ABSL_FLAG(int, page_size, 50, "list: jobs per page");
ABSL_FLAG(bool, all, false, "list: follow page tokens to the end");
ABSL_FLAG(int64_t, after, 0, "watch: resume after this event sequence number");
ABSL_FLAG(std::string, after_jobs, "",
          "submit: comma-separated jobs that must succeed before this one starts (a pipeline)");
ABSL_FLAG(bool, watch, false, "pipeline, export --job: follow the jobs until they end");
ABSL_FLAG(bool, job, false,
          "export: submit an EXPORT job (progress on watch, cancel, pipelines) instead of "
          "waiting for the export");
ABSL_FLAG(std::string, bind, "",
          "submit: FIELD=JOB:OUTPUT[,...]: fill a field of this spec from a job's result when it "
          "starts, e.g. train.dataset_id=5:extract.dataset_id (JOB joins --after_jobs)");
ABSL_FLAG(int64_t, start, 0, "rows/export/firings: first row");
ABSL_FLAG(int64_t, count, 0, "rows/export/firings: number of rows (0: to the end; rows: 10)");
ABSL_FLAG(int, top, 20, "latent, dashboard: top activations to show");
ABSL_FLAG(int, before, 32, "latent, dashboard: context tokens before");
ABSL_FLAG(int, after_tokens, 8, "latent, dashboard: context tokens after");
ABSL_FLAG(int, intervals, 0,
          "latent, dashboard: also sample rows from this many equal intervals of the value range");
ABSL_FLAG(int, interval_samples, 5, "latent, dashboard: rows per interval (with --intervals)");
ABSL_FLAG(int, tokens, 0,
          "latent: also the tokens the latent fires on most, this many (dashboard: default 10)");
ABSL_FLAG(bool, positions, false,
          "latent: also where in its sequences the latent fires (dashboard: always, when the "
          "dataset has sequences)");
ABSL_FLAG(bool, distinct, false,
          "latent, dashboard: top sequences (one row each, its maximum) instead of top rows");
ABSL_FLAG(std::string, vocab, "",
          "latent, rows, token, dashboard, weights, prompt: show tokens as text, decoded with this "
          "tokenizer.json, "
          "vocab.json, JSON list "
          "or one-token-a-line file");
ABSL_FLAG(std::string, html, "",
          "latent, prompt, steer, attribute: also write an HTML page here (prompt: the prompt "
          "shaded by each top latent; steer: the loss change per token, both runs' predictions "
          "and continuations, a sweep's KL plot; attribute: the prompt shaded by position and "
          "by each top latent); latent: statistics, histogram, every example's tokens "
          "shaded by the latent's value on them");
ABSL_FLAG(int, per_hook, 4, "graph: latents kept per hook (at most 64)");
ABSL_FLAG(int, ablate, 0,
          "attribute: also take each of the top N entries (at most 64) out of a run of its own "
          "and measure the metric's change beside its first-order credit; graph: N > 0 does so "
          "for the output's kept parents");
ABSL_FLAG(std::string, dot, "", "graph: also write the graph as Graphviz DOT here");
ABSL_FLAG(double, min_importance, 0,
          "graph: keep no node carrying less than this share of the output (0 to 1)");
ABSL_FLAG(double, node_threshold, 0,
          "graph: each hook keeps the fewest nodes (at most --per_hook) carrying this share of "
          "what its latents carry, e.g. 0.8 (0 or 1: --per_hook alone)");
ABSL_FLAG(std::string, node_links, "",
          "graph: link each latent of the --html page (and the --dot file) to its page, this "
          "pattern with {dataset} and {latent} replaced, e.g. board-{dataset}/latent-{latent}.html "
          "for the pages `latentctl dashboard` writes");
ABSL_FLAG(bool, node_pages, false,
          "graph: with --html=F.html, also write each latent's page (as a dashboard's) to "
          "F-pages/DATASET/latent-J.html and link its node there");
ABSL_FLAG(int, node_tokens, 3,
          "graph: label each latent with the tokens it fires on most over its dataset, this "
          "many (0: no labels)");
ABSL_FLAG(std::string, layers, "",
          "graph: the datasets of the graph's hooks, comma-separated, in any order (the forward's "
          "is used; default: the dataset's suite up to its hook, one dataset per hook)");
ABSL_FLAG(std::string, target_latent, "",
          "attribute: DATASET:LATENT@POSITION: explain that latent's value at that prompt position "
          "(an SAE on a later hook of the same model) instead of the next token: which latents "
          "upstream drive it");
ABSL_FLAG(std::string, unembedding, "",
          "weights, latent --html, dashboard: the TorchScript model's unembedding parameter "
          "(default: lm_head.weight and the other usual names)");
ABSL_FLAG(std::string, format, "npz", "export: npz, hdf5, parquet or delphi");
ABSL_FLAG(int32_t, splits, 0,
          "export --format=delphi: files per hook, each a range of latents (0: delphi's 5)");
ABSL_FLAG(bool, dry_run, false,
          "submit, pipeline, export --job: check the spec as a submit does and print what its job "
          "would do (tokens and "
          "rows, model, each dataset's hook and how its SAE is read, disk and memory) without "
          "creating it");
ABSL_FLAG(std::string, plot, "",
          "telemetry: write a PNG of loss and memory against steps here; latents: a PNG of the "
          "log10 feature-density histogram; scaling: a PNG of each latent's two ratios");
ABSL_FLAG(std::string, order, "latent",
          "latents, dashboard: latent, frequent, rare (dead first), max or mean (ties by latent "
          "index)");
ABSL_FLAG(int, limit, 20,
          "latents, dashboard, cofiring, token: latents to show; weights: neighbours and logits; "
          "prompt: top latents over the prompt; compare: the latents matched worst; scaling: "
          "own latents fitted when none is named");
ABSL_FLAG(int64_t, sample, 0,
          "compare: compare this many of the first SAE's latents, evenly spread (0: all)");
ABSL_FLAG(int64_t, offset, 0, "latents, dashboard: skip this many in the order");
ABSL_FLAG(int64_t, min_count, 0,
          "latents: only latents firing at least this often; cofiring/token: at least this "
          "often on the rows read (default 1)");
ABSL_FLAG(int32_t, silent, 0,
          "latent, dashboard, examples: also this many windows where the latent never fires, "
          "drawn at random (reproducibly), to read its examples against");
ABSL_FLAG(bool, all_hooks, false,
          "prompt, attribute: also through the other hooks (and SAEs) of the dataset's EXTRACT "
          "job, and "
          "other jobs' over the same tokens and model (a suite extracted a job per layer)");
ABSL_FLAG(uint64_t, in_dataset, 0,
          "cofiring/token: count the latents of this dataset on the selected rows (another "
          "output of the same EXTRACT job, or a dataset over the same tokens)");
ABSL_FLAG(std::string, rank, "count",
          "cofiring/token: count (firings on the rows) or lift (their rate there over the "
          "latent's density)");
ABSL_FLAG(int64_t, max_rows, 0,
          "cofiring/token: count at most this many of the selected rows (from chunks spread "
          "over the dataset; default 2048); scaling: firing rows fitted per latent (default "
          "16384)");
ABSL_FLAG(std::string, text, "",
          "prompt: the prompt as text, tokenized with --vocab=tokenizer.json (instead of token "
          "ids)");
ABSL_FLAG(std::string, out, "", "tokenize: the .npy token stream to write");
ABSL_FLAG(std::string, separator, "",
          "tokenize: a token appended after each document (an id, or its text: \"<|endoftext|>\")");
ABSL_FLAG(bool, special_tokens, true,
          "tokenize: add the tokenizer's special tokens around each document (the BOS of Llama "
          "and Gemma), as tokenizer(text) does");
ABSL_FLAG(std::string, field, "text",
          "tokenize: the field of each .jsonl line, or the column of a .parquet file, holding the "
          "text");
ABSL_FLAG(int, threads, 0, "tokenize: threads that tokenize (0: one per core)");
ABSL_FLAG(std::string, nodes, "",
          "train-nodes: the latentd nodes to train on, HOST:PORT,HOST:PORT,... (the first hosts "
          "rank 0)");
ABSL_FLAG(std::string, node_devices, "",
          "train-nodes: devices per node, N,N,... in --nodes' order (default: --num_devices, "
          "else the spec's, on every node)");
ABSL_FLAG(std::string, dataset, "",
          "train-nodes: the DENSE dataset by name, looked up on each node (its id may differ "
          "from node to node); default: the spec's dataset_id everywhere");
ABSL_FLAG(std::string, rendezvous, "",
          "train-nodes: HOST:PORT where rank 0's node hosts the TCPStore (default: the first "
          "node's host, port 29500)");
ABSL_FLAG(std::string, intervene, "",
          "steer: LATENT:set=V, LATENT:add=V or LATENT:scale=V, each optionally @P+P+... "
          "(positions; default every position), comma-separated");
ABSL_FLAG(std::string, more_interventions, "",
          "steer: latents of other datasets of the same model changed in the same steered run, "
          "DATASET=ITEMS;DATASET=ITEMS with --intervene's ITEMS, e.g. 3=40:set=0@3;4=12:add=4");
ABSL_FLAG(int, new_tokens, 20, "steer: tokens each run generates after the prompt");
ABSL_FLAG(float, temperature, 0, "steer: 0 greedy; > 0 sampled (the same draws for both runs)");
ABSL_FLAG(uint64_t, seed, 0, "steer: the sampling seed");
ABSL_FLAG(std::string, sweep, "",
          "steer: values of the first --intervene item, comma-separated: a run for each");
ABSL_FLAG(int, crosscoder_source, -1,
          "steer, attribute, graph: for a crosscoder over several models (model diffing), the "
          "model to steer or credit: its source, 0 for the first of the datasets it was trained "
          "on (the others run beside it; a graph's other datasets are that model's); scaling: the "
          "model the latents are said to be specific to "
          "(default: the last)");
ABSL_FLAG(double, min_share, -1,
          "scaling: with no latents named, those whose block in --crosscoder_source's model holds "
          "at least this share of the decoder norm (default 0.9: its own)");
ABSL_FLAG(int, baseline, -1,
          "scaling: the model compared with --crosscoder_source's (default: source 0, or 1 when "
          "that is 0)");
ABSL_FLAG(std::string, target, "",
          "attribute: the next token explained (an id, or its text with --vocab; default: the "
          "model's most likely)");
ABSL_FLAG(std::string, contrast, "",
          "attribute: explain logit(target) - logit(this token) instead of log p(target)");
ABSL_FLAG(int64_t, max_count, -1,
          "latents: only latents firing at most this often (-1: no bound; 0: the dead ones)");

namespace latentd::client {
namespace {

namespace v1 = ::latentd::v1;
using google::protobuf::util::TimeUtil;

constexpr int kExitRpcError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitJobNotSucceeded = 3;

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = false;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

// A terminal bar for `count` against the largest count shown, `peak`: 1 to 40 '#', none for 0.
std::string Bar(int64_t count, int64_t peak) {
  return std::string(count > 0 ? 1 + 40 * count / std::max<int64_t>(peak, 1) : 0, '#');
}

// Histogram bins summed `merge` at a time (the last group may hold fewer), so that a long
// histogram fits a few terminal lines.
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

class Client {
 public:
  Client() : Client(absl::GetFlag(FLAGS_server)) {}
  explicit Client(const std::string& address) {
    channel_ = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    jobs_ = v1::Jobs::NewStub(channel_);
    devices_ = v1::Devices::NewStub(channel_);
    datasets_ = v1::Datasets::NewStub(channel_);
  }

  // Reads the token file once; an unreadable file is a usage error reported by the caller.
  bool LoadToken(std::string* error) {
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

  std::unique_ptr<grpc::ClientContext> Context() const {
    auto context = std::make_unique<grpc::ClientContext>();
    if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
    return context;
  }

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

void PrintJobLine(const v1::Job& job) {
  std::string progress = "-";
  if (job.progress().units_total() > 0) {
    progress = absl::StrFormat("%d/%d %s", job.progress().units_done(),
                               job.progress().units_total(), job.progress().unit());
  } else if (job.state() == v1::PENDING && !job.spec().after_job_ids().empty()) {
    progress = absl::StrCat("after ", absl::StrJoin(job.spec().after_job_ids(), ","));
  }
  std::printf(
      "%-6llu %-8s %-11s %-14s %-20s %s\n", static_cast<unsigned long long>(job.id()),
      v1::JobType_Name(job.type()).c_str(), v1::JobState_Name(job.state()).c_str(),
      job.reason() == v1::JOB_REASON_UNSPECIFIED ? "-" : v1::JobReason_Name(job.reason()).c_str(),
      progress.c_str(), job.spec().label().c_str());
}

// How well an EXTRACT output's SAE reconstructs its hook (nothing for DENSE outputs).
void PrintFit(const v1::SaeFit& fit) {
  if (fit.rows() == 0) return;
  // A transcoder's fit is its prediction of another hook.
  const std::string against =
      fit.predicted_hook().empty() ? "" : absl::StrCat(" of ", fit.predicted_hook());
  std::printf("  sae fit  explained variance%s %.4f, mse %.4g, cosine %.4f (over %lld rows)\n",
              against.c_str(), fit.explained_variance(), fit.mse(), fit.cosine_similarity(),
              static_cast<long long>(fit.rows()));
}

void PrintDownstreamLoss(const v1::DownstreamLoss& d) {
  if (d.predictions() == 0) return;
  const std::string recovered =
      d.recovered_unreliable()
          ? absl::StrFormat("recovered not meaningful (zeroing the hook changes the loss by %+.4f)",
                            d.zero_ablated() - d.clean())
          : absl::StrFormat("%.1f%% recovered", 100 * d.recovered());
  std::printf(
      "  loss     next-token cross-entropy %.4f, with the SAE %.4f (%+.4f), zero-ablated %.4f: "
      "%s (over %lld predictions)\n",
      d.clean(), d.with_sae(), d.with_sae() - d.clean(), d.zero_ablated(), recovered.c_str(),
      static_cast<long long>(d.predictions()));
  if (d.with_layers_replaced() != 0) {
    std::printf(
        "           with every layer up to it replaced at once (a cross-layer transcoder's "
        "replacement model) %.4f (%+.4f)\n",
        d.with_layers_replaced(), d.with_layers_replaced() - d.clean());
  }
}

// What a trained model's per-part FVUs (TrainTelemetry.block_fvu) are about: a crosscoder's
// sources, a cross-layer transcoder's blocks.
std::string FvuPartName(const v1::JobSpec& spec) {
  const v1::TrainSpec& train = spec.train();
  return train.crosscoder_dataset_ids_size() > 0 || train.crosscoder_hooks_size() > 0 ? "source"
                                                                                      : "block";
}

// A crosscoder's split of its latents between its sources (TrainResult.crosscoder).
void PrintCrosscoderSummary(const v1::CrosscoderSummary& summary) {
  std::vector<std::string> own;
  for (int s = 0; s < summary.exclusive_latents_size(); ++s) {
    own.push_back(absl::StrFormat("%d source %d's own", summary.exclusive_latents(s), s));
  }
  std::printf("latents    %lld live: %s, %lld shared",
              static_cast<long long>(summary.live_latents()), absl::StrJoin(own, ", ").c_str(),
              static_cast<long long>(summary.shared_latents()));
  if (summary.relative_norm_histogram_size() > 0 && summary.shared_latents() > 0) {
    std::printf(" (their decoders' cosine %.2f)", summary.shared_decoder_cosine());
  }
  std::printf("\n");
  // The first of each source's own latents, the ones to look at first (largest share first).
  constexpr int kShown = 12;
  for (int s = 0; s < summary.own_latents_size(); ++s) {
    const auto& own_latents = summary.own_latents(s).latents();
    if (own_latents.empty()) continue;
    std::vector<int32_t> shown(own_latents.begin(),
                               own_latents.begin() + std::min(kShown, own_latents.size()));
    std::printf("own        source %d: %s%s\n", s, absl::StrJoin(shown, " ").c_str(),
                summary.exclusive_latents(s) > static_cast<int64_t>(shown.size())
                    ? absl::StrFormat(" ... (%d in all)", summary.exclusive_latents(s)).c_str()
                    : "");
  }
  if (summary.relative_norm_histogram_size() == 0) return;
  // Lindsey et al.'s histogram as a sparkline: 0 (source 0's own) .. 0.5 (shared) .. 1.
  static const char* const kBars[] = {" ",      "\u2581", "\u2582", "\u2583", "\u2584",
                                      "\u2585", "\u2586", "\u2587", "\u2588"};
  int64_t most = 1;
  for (const int64_t count : summary.relative_norm_histogram()) most = std::max(most, count);
  std::string bars;
  for (const int64_t count : summary.relative_norm_histogram()) {
    bars += kBars[count == 0 ? 0 : 1 + count * 7 / most];  // the peak: the full block
  }
  std::printf("relative   decoder norm  0 |%s| 1   (0: source 0's own, 1: source 1's; peak %lld)\n",
              bars.c_str(), static_cast<long long>(most));
}

// One line of a telemetry sample: "train step 50 loss ..." or "extract 4096/8192 rows ...".
std::string DescribeTelemetry(const v1::Telemetry& t, const std::string& part) {
  std::string text;
  if (t.has_train()) {
    const auto& s = t.train();
    absl::StrAppendFormat(
        &text, "train step %d loss %.5g fvu %.4f L0 %.1f opt-state %s (dense M-FAC %s) rss %s",
        s.step(), s.loss(), s.fvu(), s.l0(), Bytes(s.optimizer_state_total_bytes()),
        Bytes(s.dense_mfac_history_bytes()), Bytes(s.process_rss_bytes()));
    for (int i = 0; i < s.prefix_fvu_size() && i < s.prefix_widths_size(); ++i) {
      absl::StrAppendFormat(&text, " fvu@%d %.4f", s.prefix_widths(i), s.prefix_fvu(i));
    }
    if (s.block_fvu_size() > 0) {
      std::vector<std::string> blocks;
      for (const double fvu : s.block_fvu()) blocks.push_back(absl::StrFormat("%.3f", fvu));
      absl::StrAppend(&text, " ", part, "s ", absl::StrJoin(blocks, "/"));
    }
  } else if (t.has_extract()) {
    const auto& s = t.extract();
    absl::StrAppendFormat(&text, "extract %d/%d rows %.0f tok/s committed %s (%.1f B/token) mem %s",
                          s.rows_done(), s.rows_total(), s.tokens_per_second(),
                          Bytes(s.bytes_committed()), s.bytes_per_token(),
                          Bytes(s.device_memory_bytes()));
    if (s.explained_variance() != 0) {
      absl::StrAppendFormat(&text, " sae explained variance %.4f", s.explained_variance());
    }
  } else {
    text = "telemetry";
  }
  return text;
}

void PrintJob(const v1::Job& job) {
  std::printf("job        %llu\n", static_cast<unsigned long long>(job.id()));
  std::printf("type       %s\n", v1::JobType_Name(job.type()).c_str());
  std::printf("state      %s%s\n", v1::JobState_Name(job.state()).c_str(),
              job.reason() == v1::JOB_REASON_UNSPECIFIED
                  ? ""
                  : absl::StrCat(" (", v1::JobReason_Name(job.reason()), ")").c_str());
  if (!job.message().empty()) std::printf("message    %s\n", job.message().c_str());
  if (!job.spec().label().empty()) std::printf("label      %s\n", job.spec().label().c_str());
  if (!job.spec().after_job_ids().empty()) {
    std::printf("after      jobs %s\n", absl::StrJoin(job.spec().after_job_ids(), ", ").c_str());
  }
  for (const v1::SpecBinding& b : job.spec().bindings()) {
    std::printf("binds      %s <- job %llu's %s\n", b.field().c_str(),
                static_cast<unsigned long long>(b.job_id()), b.output().c_str());
  }
  std::printf("created    %s\n", Time(job.created()).c_str());
  std::printf("started    %s\n", Time(job.started()).c_str());
  std::printf("finished   %s\n", Time(job.finished()).c_str());
  std::printf("attempts   %d\n", job.attempts());
  if (job.devices_size() > 0) {
    std::printf("devices    %s\n", absl::StrJoin(job.devices(), ",").c_str());
  }
  if (job.progress().units_total() > 0) {
    std::printf("progress   %lld/%lld %s (%.1f/s)\n",
                static_cast<long long>(job.progress().units_done()),
                static_cast<long long>(job.progress().units_total()), job.progress().unit().c_str(),
                job.progress().rate());
  }
  if (job.has_latest_telemetry()) {
    std::printf("telemetry  %s\n",
                DescribeTelemetry(job.latest_telemetry(), FvuPartName(job.spec())).c_str());
  }
  const v1::JobResult& r = job.result();
  if (r.has_export_()) {
    std::printf("wrote      %s (%lld rows, %lld nonzeros, %s)\n", r.export_().path().c_str(),
                static_cast<long long>(r.export_().rows()),
                static_cast<long long>(r.export_().nnz()), Bytes(r.export_().bytes()).c_str());
  } else if (r.has_probe()) {
    for (const auto& d : r.probe().devices()) {
      std::printf("probe      %-8s matmul %8.1f GFLOP/s   copy %7.2f GB/s\n", d.device().c_str(),
                  d.matmul_gflops(), d.memory_bandwidth_gbps());
    }
  } else if (r.has_extract()) {
    std::printf("dataset    %llu (%lld rows, %lld nonzeros, %.1f B/token, %.0f tokens/s)\n",
                static_cast<unsigned long long>(r.extract().dataset_id()),
                static_cast<long long>(r.extract().rows()),
                static_cast<long long>(r.extract().nnz()), r.extract().bytes_per_token(),
                r.extract().tokens_per_second());
    PrintFit(r.extract().fit());
    PrintDownstreamLoss(r.extract().downstream_loss());
    for (const v1::ExtractOutputResult& more : r.extract().more_outputs()) {
      std::printf("dataset    %llu %s <- %s (%lld rows, %lld nonzeros, %.1f B/token)\n",
                  static_cast<unsigned long long>(more.dataset_id()), more.dataset_name().c_str(),
                  more.hook_name().c_str(), static_cast<long long>(more.rows()),
                  static_cast<long long>(more.nnz()), more.bytes_per_token());
      PrintFit(more.fit());
      PrintDownstreamLoss(more.downstream_loss());
    }
  } else if (r.has_train()) {
    std::printf("artifact   %llu at %s\n", static_cast<unsigned long long>(r.train().artifact_id()),
                r.train().artifact_path().c_str());
    std::printf("final      loss %.6g  fvu %.4f  L0 %.1f  after %lld steps\n",
                r.train().final_loss(), r.train().final_fvu(), r.train().final_l0(),
                static_cast<long long>(r.train().steps()));
    if (r.train().final_prefix_fvu_size() > 0) {
      // Matryoshka: the widths are the spec's (d_sae, the last level, is the line above).
      const auto& widths = job.spec().train().sae().matryoshka_widths();
      std::vector<std::string> levels;
      for (int i = 0; i < r.train().final_prefix_fvu_size(); ++i) {
        levels.push_back(absl::StrFormat("%.4f from the first %s", r.train().final_prefix_fvu(i),
                                         i < widths.size() ? absl::StrCat(widths[i]) : "?"));
      }
      std::printf("levels     fvu %s latents\n", absl::StrJoin(levels, ", ").c_str());
    }
    if (r.train().final_block_fvu_size() > 0) {  // a cross-layer transcoder or a crosscoder
      std::vector<std::string> blocks;
      for (int b = 0; b < r.train().final_block_fvu_size(); ++b) {
        blocks.push_back(absl::StrFormat("%d: %.4f", b, r.train().final_block_fvu(b)));
      }
      std::printf("%-10s fvu %s\n", (FvuPartName(job.spec()) + "s").c_str(),
                  absl::StrJoin(blocks, ", ").c_str());
    }
    if (r.train().has_crosscoder()) PrintCrosscoderSummary(r.train().crosscoder());
    std::printf("optimizer  peak state %s\n",
                Bytes(r.train().peak_optimizer_state_bytes()).c_str());
  }
}

bool ParseId(const std::vector<std::string>& args, size_t i, uint64_t* id) {
  return i < args.size() && absl::SimpleAtoi(args[i], id) && *id > 0;
}

// The job spec of --spec (a whole JobSpec, or the spec of --type) with --type, --num_devices,
// --priority and --label applied; the usage error as text otherwise.
absl::StatusOr<v1::JobSpec> SpecFromFlags(const std::string& default_type = "") {
  v1::JobSpec spec;
  const std::string spec_file = absl::GetFlag(FLAGS_spec);
  const std::string type =
      absl::GetFlag(FLAGS_type).empty() ? default_type : absl::GetFlag(FLAGS_type);
  if (!spec_file.empty()) {
    std::ifstream in(spec_file);
    if (!in) return absl::InvalidArgumentError(absl::StrCat("--spec: cannot read ", spec_file));
    std::stringstream text;
    text << in.rdbuf();
    // The file may hold a whole JobSpec or just the type's spec.
    if (!google::protobuf::util::JsonStringToMessage(text.str(), &spec).ok()) {
      spec.Clear();
      v1::JobType parsed = v1::PROBE;
      if (!type.empty() && !v1::JobType_Parse(type, &parsed)) parsed = v1::JOB_TYPE_UNSPECIFIED;
      google::protobuf::Message* inner = MutableTypeSpec(&spec, parsed);
      if (inner == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("--type: '", type, "' is not PROBE, EXTRACT, TRAIN or EXPORT"));
      }
      auto status = google::protobuf::util::JsonStringToMessage(text.str(), inner);
      if (!status.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--spec: ", spec_file, " is neither a JobSpec nor a ",
                         type.empty() ? "PROBE" : type, " spec: ", status.ToString()));
      }
    }
  }
  if (!type.empty()) {
    v1::JobType parsed;
    if (!v1::JobType_Parse(type, &parsed) || parsed == v1::JOB_TYPE_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("--type: '", type, "' is not PROBE, EXTRACT, TRAIN or EXPORT"));
    }
    spec.set_type(parsed);
  }
  for (absl::string_view id :
       absl::StrSplit(absl::GetFlag(FLAGS_after_jobs), ',', absl::SkipEmpty())) {
    uint64_t parsed = 0;
    if (!absl::SimpleAtoi(id, &parsed) || parsed == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--after_jobs: '", id, "' is not a job id"));
    }
    spec.add_after_job_ids(parsed);
  }
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_bind), ',', absl::SkipEmpty())) {
    // FIELD=JOB:OUTPUT
    const std::vector<absl::string_view> field_rest = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::vector<absl::string_view> job_output =
        field_rest.size() == 2 ? absl::StrSplit(field_rest[1], absl::MaxSplits(':', 1))
                               : std::vector<absl::string_view>();
    uint64_t job = 0;
    if (job_output.size() != 2 || field_rest[0].empty() || job_output[1].empty() ||
        !absl::SimpleAtoi(job_output[0], &job) || job == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--bind: '", item, "' is not FIELD=JOB:OUTPUT (train.dataset_id=5:extract.dataset_id)"));
    }
    v1::SpecBinding* binding = spec.add_bindings();
    binding->set_job_id(job);
    binding->set_output(std::string(job_output[1]));
    binding->set_field(std::string(field_rest[0]));
    AddAfterJob(&spec, job);
  }
  if (absl::GetFlag(FLAGS_num_devices) != 0) spec.set_num_devices(absl::GetFlag(FLAGS_num_devices));
  if (absl::GetFlag(FLAGS_priority) != 0) spec.set_priority(absl::GetFlag(FLAGS_priority));
  if (!absl::GetFlag(FLAGS_label).empty()) spec.set_label(absl::GetFlag(FLAGS_label));
  return spec;
}

int Submit(Client& client) {
  v1::SubmitJobRequest request;
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  absl::StatusOr<v1::JobSpec> spec = SpecFromFlags();
  if (!spec.ok()) return Usage(std::string(spec.status().message()));
  if (spec->type() == v1::JOB_TYPE_UNSPECIFIED) return Usage("submit needs --type");
  *request.mutable_spec() = *std::move(spec);
  if (absl::GetFlag(FLAGS_dry_run)) {
    v1::JobPlan plan;
    grpc::Status status = client.jobs()->PlanJob(client.Context().get(), request, &plan);
    if (!status.ok()) return RpcError(status);
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", Json(plan).c_str());
    } else {
      for (const std::string& line : plan.lines()) std::printf("%s\n", line.c_str());
    }
    return 0;
  }
  v1::Job job;
  grpc::Status status = client.jobs()->SubmitJob(client.Context().get(), request, &job);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(job).c_str());
  } else {
    std::printf("%llu\n", static_cast<unsigned long long>(job.id()));
  }
  return 0;
}

// latentctl pipeline FILE.json: submits a pipeline file's jobs in order (client/pipeline_file.h);
// with --watch, follows them to their ends.
int Pipeline(Client& client, const std::vector<std::string>& args) {
  if (args.size() != 2) return Usage("pipeline needs one FILE.json");
  std::ifstream in(args[1]);
  if (!in) return Usage(absl::StrCat("pipeline: cannot read ", args[1]));
  std::stringstream text;
  text << in.rdbuf();
  auto jobs = ParsePipeline(text.str());
  if (!jobs.ok()) return Usage(absl::StrCat(args[1], ": ", jobs.status().message()));
  const bool dry_run = absl::GetFlag(FLAGS_dry_run);
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < jobs->size(); ++i) {
    const PipelineJob& job = (*jobs)[i];
    std::vector<std::string> after;
    for (int index : job.after) after.push_back((*jobs)[index].name);
    for (uint64_t id : job.spec.after_job_ids()) after.push_back(absl::StrCat("job ", id));
    const std::string waits =
        after.empty() ? "" : absl::StrCat(", after ", absl::StrJoin(after, ", "));
    if (dry_run) {
      std::printf("%s (%s%s)\n", job.name.c_str(), v1::JobType_Name(job.spec.type()).c_str(),
                  waits.c_str());
      if (!job.bindings.empty()) {
        // The values it takes do not exist yet: the daemon checks it when the file is submitted.
        for (const auto& b : job.bindings) {
          std::printf("  %s from %s's %s\n", b.field.c_str(), (*jobs)[b.job].name.c_str(),
                      b.output.c_str());
        }
        continue;
      }
      v1::SubmitJobRequest request;
      *request.mutable_spec() = job.spec;
      v1::JobPlan plan;
      grpc::Status status = client.jobs()->PlanJob(client.Context().get(), request, &plan);
      if (!status.ok()) {
        std::fprintf(stderr, "latentctl: pipeline job %s:\n", job.name.c_str());
        return RpcError(status);
      }
      for (const std::string& line : plan.lines()) std::printf("  %s\n", line.c_str());
      continue;
    }
    v1::SubmitJobRequest request;
    request.set_request_id(job.request_id);
    *request.mutable_spec() = ResolvedSpec(job, ids);
    v1::Job made;
    grpc::Status status = client.jobs()->SubmitJob(client.Context().get(), request, &made);
    if (!status.ok()) {
      std::fprintf(stderr, "latentctl: pipeline job %s was refused%s\n", job.name.c_str(),
                   ids.empty() ? ""
                               : "; the jobs before it stay submitted (with a pipeline "
                                 "name, running the file again finds them, not new ones)");
      return RpcError(status);
    }
    ids.push_back(made.id());
    std::printf("%-16s job %llu (%s%s)\n", job.name.c_str(),
                static_cast<unsigned long long>(made.id()), v1::JobType_Name(made.type()).c_str(),
                waits.c_str());
    std::fflush(stdout);
  }
  if (dry_run || !absl::GetFlag(FLAGS_watch)) return 0;
  // Followed in file order: a job's ending never comes before the ending of those it waits for.
  bool all_succeeded = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    v1::WatchJobRequest request;
    request.set_job_id(ids[i]);
    auto context = client.Context();
    auto reader = client.jobs()->WatchJob(context.get(), request);
    v1::JobEvent event;
    v1::StateChange last;
    while (reader->Read(&event)) {
      if (event.has_state()) last = event.state();
    }
    if (grpc::Status status = reader->Finish(); !status.ok()) return RpcError(status);
    all_succeeded = all_succeeded && last.state() == v1::SUCCEEDED;
    std::printf("%-16s job %llu %s%s%s\n", (*jobs)[i].name.c_str(),
                static_cast<unsigned long long>(ids[i]), v1::JobState_Name(last.state()).c_str(),
                last.reason() == v1::JOB_REASON_UNSPECIFIED
                    ? ""
                    : absl::StrCat(" (", v1::JobReason_Name(last.reason()), ")").c_str(),
                last.state() == v1::SUCCEEDED ? "" : absl::StrCat(": ", last.message()).c_str());
    std::fflush(stdout);
  }
  return all_succeeded ? 0 : kExitJobNotSucceeded;
}

int Get(Client& client, const std::vector<std::string>& args) {
  v1::GetJobRequest request;
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("get needs a job id");
  request.set_job_id(id);
  v1::Job job;
  grpc::Status status = client.jobs()->GetJob(client.Context().get(), request, &job);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(job).c_str());
  } else {
    PrintJob(job);
  }
  return 0;
}

int List(Client& client) {
  v1::ListJobsRequest request;
  request.set_page_size(absl::GetFlag(FLAGS_page_size));
  if (const std::string state = absl::GetFlag(FLAGS_state); !state.empty()) {
    v1::JobState parsed;
    if (!v1::JobState_Parse(state, &parsed))
      return Usage(absl::StrCat("--state: unknown '", state, "'"));
    request.set_state(parsed);
  }
  if (const std::string type = absl::GetFlag(FLAGS_type); !type.empty()) {
    v1::JobType parsed;
    if (!v1::JobType_Parse(type, &parsed))
      return Usage(absl::StrCat("--type: unknown '", type, "'"));
    request.set_type(parsed);
  }
  request.set_label(absl::GetFlag(FLAGS_label));
  if (!absl::GetFlag(FLAGS_json)) {
    std::printf("%-6s %-8s %-11s %-14s %-20s %s\n", "ID", "TYPE", "STATE", "REASON", "PROGRESS",
                "LABEL");
  }
  while (true) {
    v1::ListJobsResponse response;
    grpc::Status status = client.jobs()->ListJobs(client.Context().get(), request, &response);
    if (!status.ok()) return RpcError(status);
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", Json(response).c_str());
    } else {
      for (const auto& job : response.jobs()) PrintJobLine(job);
    }
    if (!absl::GetFlag(FLAGS_all) || response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  return 0;
}

// `part`: what TrainTelemetry.block_fvu's entries are (FvuPartName).
std::string DescribeEvent(const v1::JobEvent& event, const std::string& part = "block") {
  std::string text = absl::StrFormat("#%-4d ", event.sequence());
  if (event.has_state()) {
    absl::StrAppend(&text, "state ", v1::JobState_Name(event.state().state()));
    if (event.state().reason() != v1::JOB_REASON_UNSPECIFIED) {
      absl::StrAppend(&text, " (", v1::JobReason_Name(event.state().reason()), ")");
    }
    if (!event.state().message().empty()) absl::StrAppend(&text, ": ", event.state().message());
  } else if (event.has_progress()) {
    const auto& p = event.progress();
    double pct = p.units_total() > 0 ? 100.0 * p.units_done() / p.units_total() : 0;
    absl::StrAppendFormat(&text, "progress %d/%d %s (%.1f%%, %.1f %s/s)", p.units_done(),
                          p.units_total(), p.unit(), pct, p.rate(), p.unit());
  } else if (event.has_log()) {
    absl::StrAppend(&text, v1::LogLine::Level_Name(event.log().level()), " ", event.log().text());
  } else if (event.has_telemetry()) {
    absl::StrAppend(&text, DescribeTelemetry(event.telemetry(), part));
  }
  return text;
}

// The spec of job `id`, or an empty one when it cannot be read (the caller then labels generically;
// the call that follows reports the error).
v1::JobSpec JobSpecOrEmpty(Client& client, uint64_t id) {
  v1::GetJobRequest request;
  request.set_job_id(id);
  v1::Job job;
  if (!client.jobs()->GetJob(client.Context().get(), request, &job).ok()) return v1::JobSpec();
  return job.spec();
}

int Watch(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("watch needs a job id");
  const bool json = absl::GetFlag(FLAGS_json);
  const bool live = !json && isatty(STDOUT_FILENO);
  v1::WatchJobRequest request;
  request.set_job_id(id);
  request.set_after_sequence(absl::GetFlag(FLAGS_after));
  const std::string part = FvuPartName(JobSpecOrEmpty(client, id));
  auto context = client.Context();
  auto reader = client.jobs()->WatchJob(context.get(), request);
  v1::JobEvent event;
  v1::JobState last_state = v1::JOB_STATE_UNSPECIFIED;
  bool progress_line_open = false;
  while (reader->Read(&event)) {
    if (event.has_state()) last_state = event.state().state();
    if (json) {
      std::printf("%s\n", Json(event).c_str());
    } else if (live && event.has_progress()) {
      // On a terminal progress redraws one line instead of scrolling.
      std::printf("\r\033[K%s", DescribeEvent(event, part).c_str());
      progress_line_open = true;
    } else {
      if (progress_line_open) std::printf("\n");
      progress_line_open = false;
      std::printf("%s\n", DescribeEvent(event, part).c_str());
    }
    std::fflush(stdout);
  }
  if (progress_line_open) std::printf("\n");
  grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcError(status);
  return last_state == v1::SUCCEEDED ? 0 : kExitJobNotSucceeded;
}

int DeleteJob(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("delete-job needs a job id");
  v1::DeleteJobRequest request;
  request.set_job_id(id);
  v1::DeleteJobResponse response;
  grpc::Status status = client.jobs()->DeleteJob(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (!absl::GetFlag(FLAGS_json)) {
    std::printf("deleted job %llu\n", static_cast<unsigned long long>(id));
  }
  return 0;
}

int Cancel(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("cancel needs a job id");
  v1::CancelJobRequest request;
  request.set_job_id(id);
  v1::Job job;
  grpc::Status status = client.jobs()->CancelJob(client.Context().get(), request, &job);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(job).c_str());
  } else {
    std::printf("job %llu: %s\n", static_cast<unsigned long long>(job.id()),
                v1::JobState_Name(job.state()).c_str());
  }
  return 0;
}

int Devices(Client& client) {
  v1::ListDevicesResponse response;
  grpc::Status status =
      client.devices()->ListDevices(client.Context().get(), v1::ListDevicesRequest(), &response);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  std::printf("%-8s %-12s %-12s %-8s %s\n", "DEVICE", "MEM TOTAL", "MEM USED", "JOB",
              "DESCRIPTION");
  for (const auto& d : response.devices()) {
    std::printf("%-8s %-12s %-12s %-8s %s\n", d.name().c_str(),
                Bytes(d.memory_total_bytes()).c_str(), Bytes(d.memory_used_bytes()).c_str(),
                d.held_by_job() == 0 ? "-" : absl::StrCat(d.held_by_job()).c_str(),
                d.description().c_str());
  }
  return 0;
}

// One line of the datasets table, the name column `name_width` wide.
void PrintDatasetLine(const v1::DatasetInfo& d, int name_width) {
  // The SAE's explained variance on the rows, where it was measured.
  const std::string fit =
      d.fit().rows() > 0 ? absl::StrFormat("%.4f", d.fit().explained_variance()) : "-";
  // Which encoder made the latents: "topk 32", "jumprelu", "relu"; "-" for hidden states.
  // "tc " before a transcoder's (its hook is what it reads; GetDataset has what it predicts).
  const std::string encoder =
      d.encoder().empty() ? "-"
                          : absl::StrCat(d.hook_name_out().empty() ? "" : "tc ", d.encoder(),
                                         d.encoder() == "topk" ? absl::StrCat(" ", d.k()) : "");
  std::printf("%-5llu %-*s %-7s %-28s %-9s %-6d %-10lld %-9.5f %-8lld %-8s %s\n",
              static_cast<unsigned long long>(d.id()), name_width, d.name().c_str(),
              d.kind() == v1::DENSE_ACTIVATIONS ? "DENSE" : "SPARSE", d.hook_name().c_str(),
              encoder.c_str(), d.d_sae(), static_cast<long long>(d.rows_committed()), d.density(),
              static_cast<long long>(d.dead_latents()), fit.c_str(),
              Bytes(d.bytes_on_disk()).c_str());
}

int Datasets(Client& client) {
  v1::ListDatasetsResponse response;
  grpc::Status status =
      client.datasets()->ListDatasets(client.Context().get(), v1::ListDatasetsRequest(), &response);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  // As wide as the longest name (those of more_outputs carry their hook).
  int name_width = 24;
  for (const auto& d : response.datasets()) {
    name_width = std::max(name_width, static_cast<int>(d.name().size()));
  }
  std::printf("%-5s %-*s %-7s %-28s %-9s %-6s %-10s %-9s %-8s %-8s %s\n", "ID", name_width, "NAME",
              "KIND", "HOOK", "ENCODER", "WIDTH", "ROWS", "DENSITY", "DEAD", "SAE EV", "ON DISK");
  for (const auto& d : response.datasets()) PrintDatasetLine(d, name_width);
  if (response.unreadable_size() > 0) {
    std::printf("\nunreadable (damaged metadata; `latentctl delete-dataset ID` removes one):\n");
    for (const auto& u : response.unreadable()) {
      std::printf("%-5llu %-*s %s\n", static_cast<unsigned long long>(u.dataset_id()), name_width,
                  u.name().empty() ? "?" : u.name().c_str(), u.error().c_str());
    }
  }
  return 0;
}

int Dataset(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("dataset needs a dataset id");
  v1::GetDatasetRequest request;
  request.set_dataset_id(id);
  v1::DatasetInfo info;
  grpc::Status status = client.datasets()->GetDataset(client.Context().get(), request, &info);
  if (!status.ok()) return RpcError(status);
  // The JSON mapping is already the most complete human view of a dataset's metadata.
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = !absl::GetFlag(FLAGS_json);
  options.always_print_primitive_fields = !absl::GetFlag(FLAGS_json);
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(info, &out, options);
  std::printf("%s\n", out.c_str());
  return 0;
}

// The vocabulary --vocab names, if any; false (with *error) for a file it cannot use.
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

// `text`'s ids under the tokenizer.json --vocab names, without special tokens.
absl::StatusOr<std::vector<int32_t>> TokenizeWithVocabFlag(const std::string& text) {
  const std::string path = absl::GetFlag(FLAGS_vocab);
  if (path.empty()) {
    return absl::InvalidArgumentError("needs --vocab=tokenizer.json (the model's tokenizer)");
  }
  ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::Load(path));
  return tokenizer.Encode(text, /*add_special_tokens=*/false);
}

// latentctl tokenize FILE... --vocab=tokenizer.json --out=tokens.npy: text -> a token stream.
int Tokenize(const std::vector<std::string>& args) {
  const std::string out = absl::GetFlag(FLAGS_out);
  const std::string path = absl::GetFlag(FLAGS_vocab);
  if (args.size() < 2 || out.empty() || path.empty()) {
    return Usage("tokenize needs input files, --vocab=tokenizer.json and --out=FILE.npy");
  }
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(path);
  if (!tokenizer.ok()) return Usage(absl::StrCat("--vocab: ", tokenizer.status().message()));
  TokenizeOptions options;
  options.out_path = out;
  options.add_special_tokens = absl::GetFlag(FLAGS_special_tokens);
  options.text_field = absl::GetFlag(FLAGS_field);
  options.threads = absl::GetFlag(FLAGS_threads);
  if (const std::string separator = absl::GetFlag(FLAGS_separator); !separator.empty()) {
    int32_t id;
    std::optional<int32_t> found = absl::SimpleAtoi(separator, &id) ? std::optional<int32_t>(id)
                                                                    : tokenizer->TokenId(separator);
    if (!found) {
      return Usage(absl::StrCat("--separator: \"", separator, "\" is not a token of ", path));
    }
    options.separator = found;
  }
  const auto mb = [](int64_t bytes) { return static_cast<double>(bytes) / 1e6; };
  options.progress = [&mb](const TokenizeProgress& p) {
    std::fprintf(stderr,
                 "tokenize: %.1f of %.1f MB read, %lld documents, %lld tokens, %.2f MB/s of text\n",
                 mb(p.bytes_read), mb(p.bytes_total), static_cast<long long>(p.documents),
                 static_cast<long long>(p.tokens), mb(p.text_bytes) / std::max(p.seconds, 1e-9));
  };
  const std::vector<std::string> inputs(args.begin() + 1, args.end());
  absl::StatusOr<TokenizeProgress> done = TokenizeFiles(*tokenizer, inputs, options);
  if (!done.ok()) {
    std::fprintf(stderr, "latentctl: %s\n", done.status().ToString().c_str());
    return done.status().code() == absl::StatusCode::kInvalidArgument ||
                   done.status().code() == absl::StatusCode::kNotFound
               ? kExitUsage
               : kExitRpcError;
  }
  std::printf(
      "wrote %s: %lld tokens (%s) from %lld documents, %.1f MB of text in %.1f s (%.2f MB/s, "
      "%.2f bytes a token)\n",
      out.c_str(), static_cast<long long>(done->tokens), done->dtype.c_str(),
      static_cast<long long>(done->documents), mb(done->text_bytes), done->seconds,
      mb(done->text_bytes) / std::max(done->seconds, 1e-9),
      static_cast<double>(done->text_bytes) / std::max<int64_t>(done->tokens, 1));
  return 0;
}

// What a `COMMAND ID J` command (latent, firings, weights) works on: the dataset, the latent
// and the --vocab vocabulary.
struct LatentArgs {
  uint64_t id = 0;
  int32_t latent = -1;
  std::optional<Vocabulary> vocab;
};

// false, with *error the message to show, for missing or malformed arguments or --vocab.
bool ParseLatentArgs(const std::vector<std::string>& args, LatentArgs* out, std::string* error) {
  if (!ParseId(args, 1, &out->id) || args.size() < 3 || !absl::SimpleAtoi(args[2], &out->latent)) {
    *error = absl::StrCat(args[0], " needs a dataset id and a latent index");
    return false;
  }
  return LoadVocabFlag(&out->vocab, error);
}

// The little-endian words of a packed byte string (the service's packed arrays).
template <typename T>
std::vector<T> Words(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// Writes `html` to the --html path; false, after saying so, when it cannot. Prints "wrote PATH"
// unless --json.
bool WriteHtmlFlag(const std::string& path, const std::string& html) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << html;
  out.close();
  if (!out) {
    std::fprintf(stderr, "latentctl: --html: cannot write %s\n", path.c_str());
    return false;
  }
  if (!absl::GetFlag(FLAGS_json)) std::printf("wrote %s\n", path.c_str());
  return true;
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

// Every firing of one latent (ReadLatentFirings) in --start/--count: "row value" lines (with
// --vocab also the row's token), or with --json {"rows": [...], "values": [...]}; a count line
// on stderr.
int Firings(Client& client, const std::vector<std::string>& args) {
  LatentArgs parsed;
  if (std::string error; !ParseLatentArgs(args, &parsed, &error)) return Usage(error);
  const uint64_t id = parsed.id;
  const int32_t latent = parsed.latent;
  const std::optional<Vocabulary>& vocab = parsed.vocab;
  v1::ReadLatentFiringsRequest request;
  request.set_token_ids(vocab.has_value());
  request.set_dataset_id(id);
  request.set_latent(latent);
  request.set_row_start(absl::GetFlag(FLAGS_start));
  request.set_row_count(absl::GetFlag(FLAGS_count));
  auto context = client.Context();
  auto reader = client.datasets()->ReadLatentFirings(context.get(), request);
  v1::LatentFiringsPiece piece;
  const bool json = absl::GetFlag(FLAGS_json);
  std::string rows_json, values_json;
  int64_t total = 0;
  while (reader->Read(&piece)) {
    const std::vector<int64_t> rows = Words<int64_t>(piece.rows());
    const std::vector<float> values = Words<float>(piece.values());
    const std::vector<int32_t> tokens = Words<int32_t>(piece.token_ids());
    for (size_t i = 0; i < rows.size(); ++i) {
      if (json) {
        absl::StrAppend(&rows_json, total + i > 0 ? "," : "", rows[i]);
        absl::StrAppendFormat(&values_json, "%s%.9g", total + i > 0 ? "," : "", values[i]);
      } else if (vocab) {
        std::printf("%lld %.6g %s\n", static_cast<long long>(rows[i]), values[i],
                    TokenCell(tokens[i], vocab).c_str());
      } else {
        std::printf("%lld %.6g\n", static_cast<long long>(rows[i]), values[i]);
      }
    }
    total += static_cast<int64_t>(rows.size());
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcError(status);
  if (json)
    std::printf("{\"rows\": [%s], \"values\": [%s]}\n", rows_json.c_str(), values_json.c_str());
  std::fprintf(stderr, "latent %d: %lld firings\n", latent, static_cast<long long>(total));
  return 0;
}

int Rows(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("rows needs a dataset id");
  std::optional<Vocabulary> vocab;
  if (std::string error; !LoadVocabFlag(&vocab, &error)) return Usage(error);
  v1::ReadRowsRequest request;
  request.set_dataset_id(id);
  request.set_row_start(absl::GetFlag(FLAGS_start));
  request.set_row_count(absl::GetFlag(FLAGS_count) == 0 ? 10 : absl::GetFlag(FLAGS_count));
  auto context = client.Context();
  auto reader = client.datasets()->ReadRows(context.get(), request);
  v1::CsrPiece piece;
  while (reader->Read(&piece)) {
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", Json(piece).c_str());
      continue;
    }
    for (int64_t r = 0; r < piece.num_rows(); ++r) {
      const int32_t token = r < piece.token_ids_size() ? piece.token_ids(r) : -1;
      std::string line = absl::StrFormat("row %-8d token %-6d", piece.row_start() + r, token);
      if (vocab) absl::StrAppendFormat(&line, " %-12s", TokenCell(token, vocab));
      for (int64_t i = piece.indptr(r); i < piece.indptr(r + 1); ++i) {
        absl::StrAppendFormat(&line, " %d:%.3g", piece.indices(i), piece.values(i));
      }
      std::printf("%s\n", line.c_str());
    }
  }
  grpc::Status status = reader->Finish();
  return status.ok() ? 0 : RpcError(status);
}

// GetLatent of latent `latent` as the flags ask (--top, --before, --after_tokens, --intervals,
// --interval_samples, --distinct).
v1::GetLatentRequest LatentRequest(uint64_t id, int32_t latent) {
  v1::GetLatentRequest request;
  request.set_dataset_id(id);
  request.set_latent(latent);
  request.set_top_n(absl::GetFlag(FLAGS_top));
  request.set_context_before(absl::GetFlag(FLAGS_before));
  request.set_context_after(absl::GetFlag(FLAGS_after_tokens));
  request.set_intervals(absl::GetFlag(FLAGS_intervals));
  request.set_interval_samples(absl::GetFlag(FLAGS_interval_samples));
  request.set_distinct_sequences(absl::GetFlag(FLAGS_distinct));
  request.set_top_tokens(absl::GetFlag(FLAGS_tokens));
  request.set_positions(absl::GetFlag(FLAGS_positions));
  request.set_silent_samples(absl::GetFlag(FLAGS_silent));
  return request;
}

// GetLatentWeights of latent J with top_n neighbours and logits, --unembedding as the flag says.
v1::GetLatentWeightsRequest WeightsRequest(uint64_t id, int32_t latent, int top_n) {
  v1::GetLatentWeightsRequest request;
  request.set_dataset_id(id);
  request.set_latent(latent);
  request.set_top_n(top_n);
  request.set_unembedding(absl::GetFlag(FLAGS_unembedding));
  return request;
}

// GetLatentWeights with `top_n` (and --unembedding) for a page's weights section: true with
// *response filled, or false after saying once on stderr why the pages go without one (e.g. the
// dataset's job record was deleted); *warned keeps it to once.
bool PageWeights(Client& client, uint64_t id, int32_t latent, int top_n,
                 v1::GetLatentWeightsResponse* response, bool* warned) {
  const v1::GetLatentWeightsRequest request = WeightsRequest(id, latent, top_n);
  const grpc::Status status =
      client.datasets()->GetLatentWeights(client.Context().get(), request, response);
  if (status.ok()) return true;
  if (!*warned) {
    std::fprintf(stderr, "latentctl: pages without a weights section: %s\n",
                 status.error_message().c_str());
    *warned = true;
  }
  return false;
}

// What a latent's weights say: its nearest decoder directions and the tokens its decoder
// direction raises and lowers most (GetLatentWeights).
int Weights(Client& client, const std::vector<std::string>& args) {
  LatentArgs parsed;
  if (std::string error; !ParseLatentArgs(args, &parsed, &error)) return Usage(error);
  const uint64_t id = parsed.id;
  const int32_t latent = parsed.latent;
  const std::optional<Vocabulary>& vocab = parsed.vocab;
  const v1::GetLatentWeightsRequest request =
      WeightsRequest(id, latent, absl::GetFlag(FLAGS_limit));
  v1::GetLatentWeightsResponse response;
  grpc::Status status =
      client.datasets()->GetLatentWeights(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  std::printf("dataset %llu latent %d: |W_dec| %.4g, |W_enc| %.4g, cos(W_enc, W_dec) %.3f\n",
              static_cast<unsigned long long>(id), latent, response.decoder_norm(),
              response.encoder_norm(), response.encoder_decoder_cosine());
  if (response.decoder_norm_by_layer_size() > 0) {
    std::printf("a cross-layer transcoder's latent: |W_dec| into layer");
    for (const v1::LayerDecoderNorm& d : response.decoder_norm_by_layer()) {
      std::printf(" %d: %.4g%s", d.layer(), d.norm(),
                  &d == &*response.decoder_norm_by_layer().rbegin() ? "" : ",");
    }
    std::printf(" (the logits sum them)\n");
  }
  if (response.decoder_by_source_size() > 0) {
    std::printf("a crosscoder's latent, its decoder in each source:\n");
    for (const std::string& line : DescribeDecoderBySource(response)) {
      std::printf("  %s\n", line.c_str());
    }
  }
  auto token = [&](int32_t t) { return TokenCell(t, vocab); };
  // One logit table, raised and lowered tokens side by side; `whose` heads it ("source 1: ").
  auto print_logits = [&](const std::string& whose, const std::string& source,
                          const google::protobuf::RepeatedPtrField<v1::TokenLogit>& positive,
                          const google::protobuf::RepeatedPtrField<v1::TokenLogit>& negative,
                          const std::string& unavailable) {
    if (positive.empty()) {
      std::printf("%sno logits: %s\n", whose.c_str(), unavailable.c_str());
      return;
    }
    std::printf("%sdirect logits through %s:\n%-24s %-9s  %-24s %s\n", whose.c_str(),
                source.c_str(), "RAISES", "LOGIT", "LOWERS", "LOGIT");
    for (int i = 0; i < std::max(positive.size(), negative.size()); ++i) {
      std::string left(34, ' '), right;
      if (i < positive.size()) {
        left = absl::StrFormat("%-24s %-+9.4f", token(positive[i].token_id()), positive[i].logit());
      }
      if (i < negative.size()) {
        right = absl::StrFormat("%-24s %+.4f", token(negative[i].token_id()), negative[i].logit());
      }
      std::printf("%s  %s\n", left.c_str(), right.c_str());
    }
  };
  if (response.decoder_by_source_size() > 0) {
    for (int s = 0; s < response.decoder_by_source_size(); ++s) {
      const v1::SourceDecoder& d = response.decoder_by_source(s);
      print_logits(absl::StrFormat("source %d: ", s), d.logits_source(), d.positive_logits(),
                   d.negative_logits(), d.logits_unavailable());
    }
  } else {
    print_logits("", response.logits_source(), response.positive_logits(),
                 response.negative_logits(), response.logits_unavailable());
  }
  std::printf("nearest decoder directions:\n%-8s %s\n", "LATENT", "COSINE");
  for (const v1::LatentNeighbor& n : response.neighbors()) {
    std::printf("%-8d %.4f\n", n.latent(), n.cosine());
  }
  return 0;
}

// A failed call's status as an absl::Status (the codes are the same numbers).
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

// The datasets `info` is compared with (client/dataset_siblings.h), from the daemon's list.
absl::StatusOr<std::vector<v1::DatasetInfo>> SiblingDatasets(Client& client,
                                                             const v1::DatasetInfo& info) {
  v1::ListDatasetsResponse all;
  grpc::Status status =
      client.datasets()->ListDatasets(client.Context().get(), v1::ListDatasetsRequest(), &all);
  if (!status.ok()) return FromGrpc(status);
  return latentd::client::SiblingDatasets(info, all);
}

// The same for dataset `id`, read first.
absl::StatusOr<std::vector<v1::DatasetInfo>> SiblingDatasets(Client& client, uint64_t id) {
  ASSIGN_OR_RETURN(const v1::DatasetInfo info, GetDatasetInfo(client, id));
  return SiblingDatasets(client, info);
}

// The suite a query over dataset `id` runs beside (attribute --all_hooks, a graph without
// --layers): its siblings; with --crosscoder_source=S for a crosscoder over stored datasets
// (model diffing), those of source S's stored dataset instead, the SAEs of the model that runs
// over the same rows (the diff itself records no model).
absl::StatusOr<std::vector<v1::DatasetInfo>> SuiteOf(Client& client, uint64_t id) {
  ASSIGN_OR_RETURN(const v1::DatasetInfo info, GetDatasetInfo(client, id));
  const int source = absl::GetFlag(FLAGS_crosscoder_source);
  if (source < 0) return SiblingDatasets(client, info);
  const v1::JobSpec spec = JobSpecOrEmpty(client, info.job_id());
  const v1::StoredActivationsSpec& stored = spec.extract().model().stored();
  if (source >= stored.dataset_ids_size()) {
    return SiblingDatasets(client, info);  // (out of range: the daemon's answer names it)
  }
  ASSIGN_OR_RETURN(const v1::DatasetInfo of_source,
                   GetDatasetInfo(client, stored.dataset_ids(source)));
  return SiblingDatasets(client, of_source);
}

// "dataset D (name)" for a heading, the hook added unless the name (a more_outputs default)
// ends in it already.
std::string DatasetLabel(const v1::DatasetInfo& d) {
  const std::string what = absl::StrContains(d.name(), d.hook_name())
                               ? d.name()
                               : absl::StrCat(d.name(), ", ", d.hook_name());
  return absl::StrCat("dataset ", d.id(), " (", what, ")");
}

// A prompt's tokens, each with its largest latents (EncodePrompt), as a table.
void PrintPromptTokens(uint64_t id, const v1::EncodePromptResponse& response,
                       const std::optional<Vocabulary>& vocab) {
  std::printf("dataset %llu: %d tokens%s\n%-4s %-18s %-7s %s\n",
              static_cast<unsigned long long>(id), response.tokens_size(),
              response.bos_prepended() ? " (BOS prepended, as the dataset's spec did)" : "", "POS",
              "TOKEN", "ACTIVE", "LARGEST LATENTS (value)");
  for (int r = 0; r < response.tokens_size(); ++r) {
    const v1::PromptToken& t = response.tokens(r);
    std::string latents;
    for (int e = 0; e < std::min(t.latents_size(), 5); ++e) {
      absl::StrAppendFormat(&latents, "%s%d %.3g", e > 0 ? ", " : "", t.latents(e), t.values(e));
    }
    std::printf("%-4d %-18s %-7d %s\n", r, TokenCell(t.token_id(), vocab).c_str(), t.active(),
                latents.c_str());
  }
}

// Which latents fire on a prompt (EncodePrompt): `prompt ID T1 T2 ...`, each token an id or,
// with --vocab, the text of one vocabulary entry.
// The prompt of `prompt` and `steer`: --text tokenized with --vocab, or args[2...] each a token
// id or, with --vocab, the text of one vocabulary entry. false with the usage error.
bool PromptTokenIds(const std::vector<std::string>& args, const std::optional<Vocabulary>& vocab,
                    google::protobuf::RepeatedField<int32_t>* out, std::string* error) {
  const std::string text = absl::GetFlag(FLAGS_text);
  if ((args.size() < 3) == text.empty()) {
    *error = absl::StrCat(args[0],
                          " needs a dataset id and either tokens (ids, or texts with --vocab) or "
                          "--text");
    return false;
  }
  if (!text.empty()) {
    // No special tokens: the daemon prepends BOS itself when the dataset's job did.
    absl::StatusOr<std::vector<int32_t>> ids = TokenizeWithVocabFlag(text);
    if (!ids.ok()) {
      *error = absl::StrCat("--text: ", ids.status().message());
      return false;
    }
    out->Add(ids->begin(), ids->end());
  }
  for (size_t i = 2; i < args.size(); ++i) {
    int32_t token = 0;
    if (!absl::SimpleAtoi(args[i], &token)) {
      if (!vocab) {
        *error = absl::StrCat(args[0], ": '", args[i], "' is not a token id");
        return false;
      }
      const std::vector<int32_t> ids = vocab->Find(args[i]);
      if (ids.size() != 1) {
        *error = absl::StrCat("token '", args[i], "': ", ids.size(),
                              " tokens of the vocabulary are exactly that text");
        return false;
      }
      token = ids[0];
    }
    out->Add(token);
  }
  return true;
}

int Prompt(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) {
    return Usage(
        "prompt needs a dataset id and either tokens (ids, or texts with --vocab) or --text");
  }
  std::optional<Vocabulary> vocab;
  if (std::string error; !LoadVocabFlag(&vocab, &error)) return Usage(error);
  v1::EncodePromptRequest request;
  request.set_dataset_id(id);
  if (std::string error; !PromptTokenIds(args, vocab, request.mutable_token_ids(), &error)) {
    return Usage(error);
  }
  const std::string html = absl::GetFlag(FLAGS_html);
  // The page shades the prompt by each top latent, so it needs every active latent per token.
  request.set_latents_per_token(html.empty() ? 5 : 1000);
  request.set_top_latents(absl::GetFlag(FLAGS_limit));
  v1::EncodePromptResponse response;
  grpc::Status status = client.datasets()->EncodePrompt(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (!html.empty()) {
    // Latent numbers link to the pages of a dashboard the page is written into.
    const std::set<int32_t> pages = LatentPagesBeside(
        html, response.top_latents(), [](const v1::PromptLatent& l) { return l.latent(); });
    if (!WriteHtmlFlag(html, PromptHtml(response, {id, vocab ? &*vocab : nullptr, &pages}))) {
      return kExitRpcError;
    }
  }
  const bool json = absl::GetFlag(FLAGS_json);  // one JSON document a line, a line a dataset
  auto print_top = [json](const v1::EncodePromptResponse& r) {
    if (json) {
      std::printf("%s\n", Json(r).c_str());
      return;
    }
    std::printf("%-8s %-10s %-4s %s\n", "LATENT", "MAX", "POS", "TOKENS");
    for (const v1::PromptLatent& l : r.top_latents()) {
      std::printf("%-8d %-10.4g %-4d %d\n", l.latent(), l.max_value(), l.position(), l.positions());
    }
  };
  if (json) {
    print_top(response);
  } else {
    PrintPromptTokens(id, response, vocab);
    std::printf("top latents over the prompt:\n");
    print_top(response);
  }
  if (!absl::GetFlag(FLAGS_all_hooks)) return 0;
  // The same prompt through the other hooks (and SAEs) of the dataset's job.
  auto siblings = SiblingDatasets(client, id);
  if (!siblings.ok()) {
    std::fprintf(stderr, "latentctl: %s\n", siblings.status().ToString().c_str());
    return kExitRpcError;
  }
  for (const v1::DatasetInfo& d : *siblings) {
    request.set_dataset_id(d.id());
    v1::EncodePromptResponse other;
    status = client.datasets()->EncodePrompt(client.Context().get(), request, &other);
    if (!status.ok()) return RpcError(status);
    if (!json) std::printf("%s: top latents over the prompt:\n", DatasetLabel(d).c_str());
    print_top(other);
  }
  return 0;
}

// A prompt run with latents changed (SteerPrompt) beside the model as it is:
// `steer ID T1 T2 ... --intervene=17:add=8[,...] [--new_tokens=N]`.
int Steer(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) {
    return Usage("steer needs a dataset id, the prompt (tokens or --text) and --intervene");
  }
  std::optional<Vocabulary> vocab;
  if (std::string error; !LoadVocabFlag(&vocab, &error)) return Usage(error);
  v1::SteerPromptRequest request;
  request.set_dataset_id(id);
  if (std::string error; !PromptTokenIds(args, vocab, request.mutable_token_ids(), &error)) {
    return Usage(error);
  }
  auto interventions = ParseInterventions(absl::GetFlag(FLAGS_intervene));
  if (!interventions.ok()) return Usage(std::string(interventions.status().message()));
  request.mutable_interventions()->Assign(interventions->begin(), interventions->end());
  auto more = ParseMoreInterventions(absl::GetFlag(FLAGS_more_interventions));
  if (!more.ok()) return Usage(std::string(more.status().message()));
  request.mutable_more_interventions()->Assign(more->begin(), more->end());
  request.set_new_tokens(absl::GetFlag(FLAGS_new_tokens));
  request.set_temperature(absl::GetFlag(FLAGS_temperature));
  request.set_seed(absl::GetFlag(FLAGS_seed));
  request.set_top_tokens(absl::GetFlag(FLAGS_limit));
  if (const int source = absl::GetFlag(FLAGS_crosscoder_source); source >= 0) {
    request.set_crosscoder_source(source);
  }
  for (absl::string_view v : absl::StrSplit(absl::GetFlag(FLAGS_sweep), ',', absl::SkipEmpty())) {
    float value = 0;
    if (!absl::SimpleAtof(v, &value))
      return Usage(absl::StrCat("--sweep: '", v, "' is not a number"));
    request.add_sweep(value);
  }
  v1::SteerPromptResponse response;
  grpc::Status status = client.datasets()->SteerPrompt(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (const std::string html = absl::GetFlag(FLAGS_html); !html.empty()) {
    const std::set<int32_t> pages = LatentPagesBeside(
        html, response.latent_values(), [](const v1::LatentValues& l) { return l.latent(); });
    if (!WriteHtmlFlag(html,
                       SteeringHtml(request, response, {id, vocab ? &*vocab : nullptr, &pages}))) {
      return kExitRpcError;
    }
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
  } else {
    std::printf("%s", DescribeSteering(id, request, response, vocab).c_str());
  }
  return 0;
}

// --target / --contrast: a token id, or with --vocab the text of one vocabulary entry.
bool TokenFlag(const std::string& flag, const std::string& value,
               const std::optional<Vocabulary>& vocab, int32_t* id, std::string* error) {
  if (absl::SimpleAtoi(value, id)) return true;
  if (!vocab) {
    *error = absl::StrCat("--", flag, ": '", value, "' is not a token id (with --vocab: its text)");
    return false;
  }
  const std::vector<int32_t> ids = vocab->Find(value);
  if (ids.size() != 1) {
    *error = absl::StrCat("--", flag, ": ", ids.size(), " tokens of the vocabulary are exactly '",
                          value, "'");
    return false;
  }
  *id = ids[0];
  return true;
}

// Which latents drive the prediction after a prompt (AttributePrompt):
// `attribute ID T1 T2 ... [--target=T [--contrast=T]] [--limit=N]`.
// With --crosscoder_source, the line that says which model a model-diffing crosscoder's
// attribution ran (the answer does not repeat the request); else "".
std::string CrosscoderSourceLine() {
  const int source = absl::GetFlag(FLAGS_crosscoder_source);
  if (source < 0) return "";
  return absl::StrFormat(
      "run by the crosscoder's source %d's model, the other models beside it for its latents' "
      "values\n",
      source);
}

// The prompt (tokens or --text) and the metric (--target, --contrast, --target_latent) of an
// attribute or graph command; false with *error (a usage message) when a flag is wrong.
bool AttributionRequestFlags(const std::vector<std::string>& args,
                             const std::optional<Vocabulary>& vocab,
                             v1::AttributePromptRequest* request, std::string* error) {
  if (!PromptTokenIds(args, vocab, request->mutable_token_ids(), error)) return false;
  for (const auto& [flag, value] : {std::pair{"target", absl::GetFlag(FLAGS_target)},
                                    std::pair{"contrast", absl::GetFlag(FLAGS_contrast)}}) {
    if (value.empty()) continue;
    int32_t token = 0;
    if (!TokenFlag(flag, value, vocab, &token, error)) return false;
    std::string(flag) == "target" ? request->set_target_token_id(token)
                                  : request->set_contrast_token_id(token);
  }
  if (const std::string flag = absl::GetFlag(FLAGS_target_latent); !flag.empty()) {
    auto target = ParseTargetLatent(flag);
    if (!target.ok()) {
      *error = std::string(target.status().message());
      return false;
    }
    *request->mutable_target_latent() = *target;
  }
  return true;
}

int Attribute(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) {
    return Usage("attribute needs a dataset id and the prompt (tokens or --text)");
  }
  std::optional<Vocabulary> vocab;
  if (std::string error; !LoadVocabFlag(&vocab, &error)) return Usage(error);
  v1::AttributePromptRequest request;
  request.set_dataset_id(id);
  if (std::string error; !AttributionRequestFlags(args, vocab, &request, &error)) {
    return Usage(error);
  }
  const int limit = absl::GetFlag(FLAGS_limit);
  const std::string html = absl::GetFlag(FLAGS_html);
  // The page shades each listed latent's entries: it asks for as many entries as may be.
  constexpr int kMostEntries = 1000;  // AttributePromptRequest.top's bound
  request.set_top(html.empty() ? limit : std::max(limit, kMostEntries));
  request.set_ablate(absl::GetFlag(FLAGS_ablate));
  if (const int source = absl::GetFlag(FLAGS_crosscoder_source); source >= 0) {
    request.set_crosscoder_source(source);
  }
  v1::AttributePromptResponse response;
  grpc::Status status =
      client.datasets()->AttributePrompt(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  auto keep = [](auto* list, int n) {
    if (list->size() > n) list->DeleteSubrange(n, list->size() - n);
  };
  keep(response.mutable_top_latents(), limit);
  if (!html.empty()) {
    const std::set<int32_t> pages = LatentPagesBeside(
        html, response.top_latents(), [](const v1::LatentAttribution& l) { return l.latent(); });
    if (!WriteHtmlFlag(html, AttributionHtml(response, {id, vocab ? &*vocab : nullptr, &pages}))) {
      return kExitRpcError;
    }
  }
  keep(response.mutable_top_entries(), limit);
  const bool json = absl::GetFlag(FLAGS_json);
  if (json) {
    std::printf("%s\n", Json(response).c_str());
  } else {
    std::printf("%s%s", CrosscoderSourceLine().c_str(),
                DescribeAttribution(id, response, vocab).c_str());
  }
  if (!absl::GetFlag(FLAGS_all_hooks)) return 0;
  // The same prediction at every other hook of the suite: where its latents carry it, and
  // where the SAE's error does.
  auto siblings = SuiteOf(client, id);
  if (!siblings.ok()) {
    std::fprintf(stderr, "latentctl: %s\n", siblings.status().ToString().c_str());
    return kExitRpcError;
  }
  request.set_top(limit);
  request.clear_crosscoder_source();  // the suite's SAEs are the running model's own
  const bool to_latent = request.has_target_latent();
  // The same prediction everywhere (or the same latent, from every hook before it).
  if (!to_latent) request.set_target_token_id(response.target_token_id());
  if (!json) std::printf("\nthe same metric at the other hooks:\n");
  for (const v1::DatasetInfo& d : *siblings) {
    if (to_latent && d.id() == request.target_latent().dataset_id()) continue;
    request.set_dataset_id(d.id());
    v1::AttributePromptResponse other;
    status = client.datasets()->AttributePrompt(client.Context().get(), request, &other);
    if (to_latent && status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      // A hook the forward computes after the target's: its latents cannot drive it.
      if (!json) std::printf("  %s: after the target\n", DatasetLabel(d).c_str());
      continue;
    }
    if (!status.ok()) return RpcError(status);
    if (json) {
      std::printf("%s\n", Json(other).c_str());
      continue;
    }
    std::vector<std::string> top;
    for (const v1::LatentAttribution& l : other.top_latents()) {
      top.push_back(absl::StrFormat("%d %+.3g", l.latent(), l.attribution()));
    }
    std::printf("  %s: latents %+.4f, error %+.4f; top %s\n", DatasetLabel(d).c_str(),
                other.latent_attribution(), other.error_attribution(),
                absl::StrJoin(top, ", ").c_str());
  }
  return 0;
}

// An attribution graph of a prompt over an SAE suite (Datasets.AttributionGraph): over the
// --layers datasets, else dataset `id` and the other datasets of its suite (SiblingDatasets)
// up to its hook; printed, and with --html drawn.
// Writes `html` to `path`, saying on stderr when it cannot.
bool WriteFile(const std::filesystem::path& path, const std::string& html) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << html;
  out.close();
  if (!out) std::fprintf(stderr, "latentctl: cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

// Dataset `info`'s page for `latent` as a dashboard shows it (statistics, examples, where in
// its sequences it fires, what fires with it here and in `siblings`, its weights), written to
// dir/LatentPageName(latent) with `page`'s links; the tokens it fires on most land in
// *top_tokens. After one weights query fails (*weights_warned) the pages go without weights.
// 0, or the exit code of what failed (said on stderr).
int WriteLatentPage(Client& client, const v1::DatasetInfo& info,
                    const std::vector<v1::DatasetInfo>& siblings, int32_t latent,
                    const std::filesystem::path& dir, LatentPageOptions page, bool* weights_warned,
                    std::vector<v1::TokenCount>* top_tokens) {
  const uint64_t id = info.id();
  v1::GetLatentRequest request = LatentRequest(id, latent);
  if (request.top_tokens() == 0) request.set_top_tokens(10);
  request.set_positions(info.context_length() > 0);
  v1::GetLatentResponse response;
  grpc::Status status = client.datasets()->GetLatent(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  v1::LatentsOnRowsRequest cofiring_request;
  cofiring_request.set_dataset_id(id);
  cofiring_request.set_with_latent(latent);
  cofiring_request.set_limit(10);
  v1::LatentsOnRowsResponse cofiring;
  status = client.datasets()->LatentsOnRows(client.Context().get(), cofiring_request, &cofiring);
  if (!status.ok()) return RpcError(status);
  page.cofiring = &cofiring;
  std::vector<v1::LatentsOnRowsResponse> elsewhere(siblings.size());
  for (size_t s = 0; s < siblings.size(); ++s) {
    cofiring_request.set_in_dataset_id(siblings[s].id());
    status =
        client.datasets()->LatentsOnRows(client.Context().get(), cofiring_request, &elsewhere[s]);
    if (!status.ok()) return RpcError(status);
    page.cofiring_elsewhere.push_back({DatasetLabel(siblings[s]), &elsewhere[s]});
  }
  v1::GetLatentWeightsResponse weights;
  if (!*weights_warned && PageWeights(client, id, latent, 10, &weights, weights_warned)) {
    page.weights = &weights;
  }
  if (!WriteFile(dir / LatentPageName(latent), LatentHtml(response, page))) return kExitRpcError;
  top_tokens->assign(response.top_tokens().begin(), response.top_tokens().end());
  return 0;
}

// Each latent node's page (WriteLatentPage) in F-pages/DATASET/ beside the graph's page F.html,
// each linking back to it and to the pages of the graph's other latents of its dataset: the
// link pattern for the graph's nodes (relative to its page) in *pattern. 0, or the exit code of
// what failed (said on stderr).
int WriteGraphNodePages(Client& client, const v1::AttributionGraphResponse& graph,
                        const std::string& html, const std::optional<Vocabulary>& vocab,
                        std::string* pattern) {
  const std::filesystem::path page(html);
  const std::string folder = absl::StrCat(page.stem().string(), "-pages");
  std::map<uint64_t, std::set<int32_t>> latents;  // by dataset
  for (int n = 1; n < graph.nodes_size(); ++n) {
    if (const auto latent = GraphNodeLatent(graph, n))
      latents[latent->first].insert(latent->second);
  }
  size_t total = 0, done = 0;
  for (const auto& [dataset, of_it] : latents) total += of_it.size();
  const bool progress = isatty(fileno(stderr));
  bool weights_warned = false;
  for (const auto& [dataset, of_it] : latents) {
    v1::GetDatasetRequest request;
    request.set_dataset_id(dataset);
    v1::DatasetInfo info;
    if (grpc::Status s = client.datasets()->GetDataset(client.Context().get(), request, &info);
        !s.ok()) {
      return RpcError(s);
    }
    auto siblings = SiblingDatasets(client, info);
    if (!siblings.ok()) {
      std::fprintf(stderr, "latentctl: %s\n", siblings.status().ToString().c_str());
      return kExitRpcError;
    }
    const std::filesystem::path dir = page.parent_path() / folder / std::to_string(dataset);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      std::fprintf(stderr, "latentctl: %s: %s\n", dir.c_str(), ec.message().c_str());
      return kExitRpcError;
    }
    for (const int32_t latent : of_it) {
      LatentPageOptions options{dataset, vocab ? &*vocab : nullptr, absl::GetFlag(FLAGS_distinct)};
      options.linked_latents = &of_it;
      options.back_href = absl::StrCat("../../", page.filename().string());
      options.back_text = "the attribution graph";
      std::vector<v1::TokenCount> top_tokens;
      if (const int failed = WriteLatentPage(client, info, *siblings, latent, dir, options,
                                             &weights_warned, &top_tokens);
          failed != 0) {
        return failed;
      }
      if (progress) std::fprintf(stderr, "\rnode pages: %zu/%zu", ++done, total);
    }
  }
  if (progress && total > 0) std::fprintf(stderr, "\n");
  *pattern = absl::StrCat(folder, "/{dataset}/latent-{latent}.html");
  return 0;
}

// Each latent node of `graph` labelled with the `count` tokens it fires on most over its dataset
// (GetLatent's top_tokens), e.g. "\" Paris\" 41%, \" France\" 12%". A latent the store cannot
// answer for goes unlabelled, said once on stderr: the graph stands without labels.
GraphNodeLabels TopTokenLabels(Client& client, const v1::AttributionGraphResponse& graph, int count,
                               const std::optional<Vocabulary>& vocab) {
  GraphNodeLabels labels;
  bool warned = false;
  for (int n = 1; n < graph.nodes_size(); ++n) {
    const auto latent = GraphNodeLatent(graph, n);
    if (!latent || labels.count(*latent) > 0) continue;
    const std::pair<uint64_t, int32_t> key = *latent;
    v1::GetLatentRequest request;
    request.set_dataset_id(key.first);
    request.set_latent(key.second);
    request.set_top_n(1);
    request.set_top_tokens(count);
    v1::GetLatentResponse response;
    grpc::Status status = client.datasets()->GetLatent(client.Context().get(), request, &response);
    if (!status.ok()) {
      if (!warned) {
        std::fprintf(stderr, "latentctl: no token labels for latent %d of dataset %lu: %s\n",
                     key.second, static_cast<unsigned long>(key.first),
                     status.error_message().c_str());
      }
      warned = true;
      continue;
    }
    std::vector<std::string> tokens;
    for (const v1::TokenCount& t : response.top_tokens()) {
      tokens.push_back(
          absl::StrFormat("%s %.0f%%", TokenCell(t.token_id(), vocab), 100 * t.fraction()));
    }
    labels[key] = absl::StrJoin(tokens, ", ");
  }
  return labels;
}

int Graph(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) {
    return Usage("graph needs a dataset id (the suite's latest hook) and the prompt");
  }
  std::optional<Vocabulary> vocab;
  if (std::string error; !LoadVocabFlag(&vocab, &error)) return Usage(error);
  v1::AttributePromptRequest metric;
  if (std::string error; !AttributionRequestFlags(args, vocab, &metric, &error)) {
    return Usage(error);
  }
  v1::AttributionGraphRequest request;
  request.mutable_token_ids()->Swap(metric.mutable_token_ids());
  if (metric.has_target_token_id()) request.set_target_token_id(metric.target_token_id());
  if (metric.has_contrast_token_id()) request.set_contrast_token_id(metric.contrast_token_id());
  if (metric.has_target_latent()) *request.mutable_target_latent() = metric.target_latent();
  request.set_per_hook(absl::GetFlag(FLAGS_per_hook));
  request.set_min_importance(absl::GetFlag(FLAGS_min_importance));
  request.set_node_threshold(absl::GetFlag(FLAGS_node_threshold));
  request.set_ablate(absl::GetFlag(FLAGS_ablate) > 0);
  if (const int source = absl::GetFlag(FLAGS_crosscoder_source); source >= 0) {
    request.set_crosscoder_source(source);
  }
  const int node_tokens = absl::GetFlag(FLAGS_node_tokens);
  if (node_tokens < 0 || node_tokens > 1000) {
    return Usage(absl::StrCat("--node_tokens: ", node_tokens, " outside [0, 1000]"));
  }
  std::string links = absl::GetFlag(FLAGS_node_links);
  if (!links.empty() && !absl::StrContains(links, "{latent}")) {
    return Usage(absl::StrCat("--node_links: \"", links,
                              "\" names no {latent}: every node would link to one page"));
  }
  const std::string html = absl::GetFlag(FLAGS_html);
  const bool node_pages = absl::GetFlag(FLAGS_node_pages);
  if (node_pages && html.empty()) return Usage("--node_pages: the pages hang off --html's page");
  if (node_pages && !links.empty()) {
    return Usage("--node_pages links the nodes to the pages it writes: no --node_links with it");
  }
  if (const std::string flag = absl::GetFlag(FLAGS_layers); !flag.empty()) {
    for (absl::string_view item : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
      uint64_t dataset = 0;
      if (!absl::SimpleAtoi(item, &dataset)) {
        return Usage(absl::StrCat("--layers: '", item, "' is not a dataset id"));
      }
      request.add_dataset_ids(dataset);
    }
  } else {
    auto suite = SuiteOf(client, id);
    if (!suite.ok()) {
      std::fprintf(stderr, "latentctl: %s\n", suite.status().ToString().c_str());
      return kExitRpcError;
    }
    request.add_dataset_ids(id);
    for (const v1::DatasetInfo& d : *suite) request.add_dataset_ids(d.id());
    request.set_output_dataset_id(id);
  }
  const bool json = absl::GetFlag(FLAGS_json);
  std::unique_ptr<grpc::ClientContext> context = client.Context();
  auto stream = client.datasets()->AttributionGraph(context.get(), request);
  v1::AttributionGraphEvent event;
  v1::AttributionGraphResponse response;
  while (stream->Read(&event)) {
    if (event.has_graph()) response = event.graph();
    if (event.has_progress() && !json) {
      const v1::AttributionGraphProgress& p = event.progress();
      std::fprintf(stderr, "graph: %d of %d hooks (%s done), %d passes\n", p.hooks_done(),
                   p.hooks(), p.hook_name().c_str(), p.passes());
    }
  }
  if (grpc::Status status = stream->Finish(); !status.ok()) return RpcError(status);
  const GraphNodeLabels labels = node_tokens > 0 && !json
                                     ? TopTokenLabels(client, response, node_tokens, vocab)
                                     : GraphNodeLabels();
  if (node_pages) {
    if (const int failed = WriteGraphNodePages(client, response, html, vocab, &links);
        failed != 0) {
      return failed;
    }
  }
  if (!html.empty()) {
    if (!WriteHtmlFlag(html,
                       AttributionGraphHtml(response, vocab ? &*vocab : nullptr, &labels, links))) {
      return kExitRpcError;
    }
  }
  if (const std::string dot = absl::GetFlag(FLAGS_dot); !dot.empty()) {
    std::ofstream file(dot, std::ios::binary | std::ios::trunc);
    file << AttributionGraphDot(response, vocab, &labels, links);
    file.close();
    if (!file) {
      std::fprintf(stderr, "latentctl: --dot: cannot write %s\n", dot.c_str());
      return kExitRpcError;
    }
    if (!json) std::printf("wrote %s\n", dot.c_str());
  }
  if (json) {
    std::printf("%s\n", Json(response).c_str());
  } else {
    std::printf("%s%s", CrosscoderSourceLine().c_str(),
                DescribeAttributionGraph(response, vocab, &labels).c_str());
  }
  return 0;
}

// How far two datasets' SAEs learned the same directions (CompareSaes): the mean best cosine,
// its histogram, and the --limit latents of the first SAE the second matches worst.
int Compare(Client& client, const std::vector<std::string>& args) {
  uint64_t id, other;
  if (!ParseId(args, 1, &id) || !ParseId(args, 2, &other)) {
    return Usage("compare needs two dataset ids");
  }
  v1::CompareSaesRequest request;
  request.set_dataset_id(id);
  request.set_other_dataset_id(other);
  request.set_sample(absl::GetFlag(FLAGS_sample));
  v1::CompareSaesResponse response;
  grpc::Status status = client.datasets()->CompareSaes(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  const std::vector<int32_t> latents = Words<int32_t>(response.latents());
  const std::vector<int32_t> best = Words<int32_t>(response.best_latents());
  const std::vector<float> cosines = Words<float>(response.best_cosines());
  const size_t n = latents.size();
  std::printf(
      "dataset %llu's SAE against dataset %llu's: %zu latents compared, mean best decoder "
      "cosine %.4f\nbest cosine:\n",
      static_cast<unsigned long long>(id), static_cast<unsigned long long>(other), n,
      response.mean_best_cosine());
  const int bins = response.histogram_size();
  const int64_t peak =
      bins > 0 ? *std::max_element(response.histogram().begin(), response.histogram().end()) : 0;
  for (int b = 0; b < bins; ++b) {
    std::printf("  [%+.2f, %+.2f%c %-41s %lld\n", -1.0 + 2.0 * b / bins,
                -1.0 + 2.0 * (b + 1) / bins, b + 1 == bins ? ']' : ')',
                Bar(response.histogram(b), peak).c_str(),
                static_cast<long long>(response.histogram(b)));
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  const size_t shown = std::min(n, static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_limit))));
  std::partial_sort(order.begin(), order.begin() + shown, order.end(), [&](size_t a, size_t b) {
    return cosines[a] != cosines[b] ? cosines[a] < cosines[b] : latents[a] < latents[b];
  });
  std::printf("matched worst (the first SAE's directions the second lacks):\n%-8s %-8s %s\n",
              "LATENT", "NEAREST", "COSINE");
  for (size_t i = 0; i < shown; ++i) {
    std::printf("%-8d %-8d %.4f\n", latents[order[i]], best[order[i]], cosines[order[i]]);
  }
  return 0;
}

// Latent scaling (LatentScaling) of a model-diffing crosscoder's latents: per latent how much
// of its direction the baseline model carries, in its error and through its other latents,
// against the source model (nu near 0: the source's own; near 1: an artifact of sparsity).
int Scaling(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("scaling needs a dataset id");
  v1::LatentScalingRequest request;
  request.set_dataset_id(id);
  for (size_t i = 2; i < args.size(); ++i) {
    int32_t latent;
    if (!absl::SimpleAtoi(args[i], &latent)) {
      return Usage(absl::StrCat("scaling: '", args[i], "' is not a latent index"));
    }
    request.add_latents(latent);
  }
  if (absl::GetFlag(FLAGS_crosscoder_source) >= 0) {
    request.set_source(absl::GetFlag(FLAGS_crosscoder_source));
  }
  if (absl::GetFlag(FLAGS_baseline) >= 0) request.set_baseline(absl::GetFlag(FLAGS_baseline));
  request.set_max_rows(absl::GetFlag(FLAGS_max_rows));
  if (request.latents().empty()) request.set_limit(absl::GetFlag(FLAGS_limit));
  if (absl::GetFlag(FLAGS_min_share) >= 0) request.set_min_share(absl::GetFlag(FLAGS_min_share));
  v1::LatentScalingResponse response;
  grpc::Status status =
      client.datasets()->LatentScaling(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  const int s = response.source(), b = response.baseline();
  std::printf(
      "dataset %llu: latent scaling of source %d's latents against source %d (%lld rows read)\n"
      "  nu_err = beta_err(%d) / beta_err(%d): what source %d's error holds of the latent's "
      "direction\n"
      "  nu_rec = beta_rec(%d) / beta_rec(%d): what source %d's other latents reconstruct of it\n"
      "  both near 0: source %d's own; near 1: source %d carries it too (a sparsity artifact)\n",
      static_cast<unsigned long long>(id), s, b, static_cast<long long>(response.rows_read()), b, s,
      b, b, s, b, s, b);
  std::printf("%-8s %-6s %-8s %-8s %-8s %-12s %-12s %-12s %s\n", "LATENT", "SHARE", "ROWS",
              "NU_ERR", "NU_REC", absl::StrCat("B_ERR(", s, ")").c_str(),
              absl::StrCat("B_ERR(", b, ")").c_str(), absl::StrCat("B_REC(", s, ")").c_str(),
              absl::StrCat("B_REC(", b, ")").c_str());
  for (const v1::LatentScale& l : response.latents()) {
    std::printf("%-8d %-6.3f %-8lld %-8.3f %-8.3f %-12.4g %-12.4g %-12.4g %.4g\n", l.latent(),
                l.share(), static_cast<long long>(l.rows()), l.error_ratio(),
                l.reconstruction_ratio(), l.beta_error_source(), l.beta_error_baseline(),
                l.beta_reconstruction_source(), l.beta_reconstruction_baseline());
  }
  if (response.latents().empty()) {
    std::printf(
        "(no latent: none of source %d's that fire holds the share asked of its decoder norm; "
        "--min_share=0.6 reaches those leaning to it)\n",
        s);
  }
  if (const std::string plot = absl::GetFlag(FLAGS_plot); !plot.empty()) {
    absl::Status written =
        WriteLatentScalingPlot(response, absl::StrCat("dataset ", id, ": latent scaling"), plot);
    if (!written.ok()) {
      std::fprintf(stderr, "latentctl: --plot: %s\n", std::string(written.message()).c_str());
      return kExitRpcError;
    }
    std::printf("wrote %s\n", plot.c_str());
  }
  return 0;
}

int Latent(Client& client, const std::vector<std::string>& args) {
  LatentArgs parsed;
  if (std::string error; !ParseLatentArgs(args, &parsed, &error)) return Usage(error);
  const uint64_t id = parsed.id;
  const int32_t latent = parsed.latent;
  const std::optional<Vocabulary>& vocab = parsed.vocab;
  const Vocabulary* decoder = vocab ? &*vocab : nullptr;
  const v1::GetLatentRequest request = LatentRequest(id, latent);
  v1::GetLatentResponse response;
  grpc::Status status = client.datasets()->GetLatent(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (const std::string html = absl::GetFlag(FLAGS_html); !html.empty()) {
    LatentPageOptions page{id, decoder, absl::GetFlag(FLAGS_distinct)};
    v1::GetLatentWeightsResponse weights;
    bool warned = false;
    if (PageWeights(client, id, latent, 10, &weights, &warned)) page.weights = &weights;
    if (!WriteHtmlFlag(html, LatentHtml(response, page))) return kExitRpcError;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  const auto& s = response.statistics();
  std::printf("latent %d: fires %lld times (density %.5f), mean %.4g, std %.4g, max %.4g\n",
              s.latent(), static_cast<long long>(s.firing_count()), s.density(), s.mean(),
              s.stddev(), s.max());
  if (s.histogram_size() > 0) {
    const int64_t peak = *std::max_element(s.histogram().begin(), s.histogram().end());
    std::printf("histogram of nonzero values [%.3g, %.3g]:\n", s.histogram_min(),
                s.histogram_max());
    const double width = (s.histogram_max() - s.histogram_min()) / s.histogram_size();
    for (int b = 0; b < s.histogram_size(); ++b) {
      if (s.histogram(b) == 0) continue;
      std::printf("  %8.3g %s %lld\n", s.histogram_min() + width * b,
                  Bar(s.histogram(b), peak).c_str(), static_cast<long long>(s.histogram(b)));
    }
  }
  auto print_row = [&](const v1::TopActivation& t) {
    std::printf("  row %-9lld value %-9.4g token %-6d %s\n", static_cast<long long>(t.row()),
                t.value(), t.token_id(), ContextLine(t, decoder).c_str());
  };
  if (const int bins = response.position_histogram_size(); bins > 0) {
    // At most 16 lines: neighbouring bins merged.
    const int merge = (bins + 15) / 16;
    const int64_t width = response.position_bin_width();
    const std::vector<int64_t> merged = MergeBins(response.position_histogram(), merge);
    const int64_t peak = *std::max_element(merged.begin(), merged.end());
    std::printf("where in its sequences it fires (positions):\n");
    for (size_t m = 0; m < merged.size(); ++m) {
      std::printf("  [%5lld, %5lld) %-41s %lld\n", static_cast<long long>(m * merge * width),
                  static_cast<long long>(std::min<int64_t>((m + 1) * merge, bins) * width),
                  Bar(merged[m], peak).c_str(), static_cast<long long>(merged[m]));
    }
  }
  if (response.top_tokens_size() > 0) std::printf("fires most on tokens:\n");
  for (const v1::TokenCount& t : response.top_tokens()) {
    const std::string text =
        decoder ? absl::StrCat("\"", decoder->Display(t.token_id()), "\"") : "";
    std::printf("  token %-7d %-16s %-8lld %5.1f%%  mean %.4g\n", t.token_id(), text.c_str(),
                static_cast<long long>(t.count()), 100 * t.fraction(), t.mean());
  }
  std::printf(absl::GetFlag(FLAGS_distinct) ? "top sequences (each at its largest value):\n"
                                            : "top activations:\n");
  for (const auto& t : response.top()) print_row(t);
  for (int i = 0; i < response.intervals_size(); ++i) {
    const auto& interval = response.intervals(i);
    const bool last = i + 1 == response.intervals_size();  // includes its high end
    std::printf("interval [%.4g, %.4g%c: %lld firings\n", interval.low(), interval.high(),
                last ? ']' : ')', static_cast<long long>(interval.count()));
    for (const auto& t : interval.samples()) print_row(t);
  }
  if (response.silent_size() > 0) std::printf("silent windows (it fires nowhere in them):\n");
  for (const auto& t : response.silent()) print_row(t);
  return 0;
}

// The latents firing on a set of rows (LatentsOnRows): `cofiring ID J` (the rows where J fires)
// or `token ID T` (the rows holding token T: an id, or with --vocab the token's text).
int OnRows(Client& client, const std::vector<std::string>& args, bool by_token) {
  const char* what = by_token ? "token" : "cofiring";
  uint64_t id;
  if (!ParseId(args, 1, &id) || args.size() < 3) {
    return Usage(absl::StrCat(what, " needs a dataset id and a ",
                              by_token ? "token (id, or text with --vocab)" : "latent index"));
  }
  std::optional<Vocabulary> vocab;
  if (std::string error; !LoadVocabFlag(&vocab, &error)) return Usage(error);
  v1::LatentsOnRowsRequest request;
  request.set_dataset_id(id);
  int32_t selector = 0;
  if (!absl::SimpleAtoi(args[2], &selector)) {
    if (!by_token || !vocab)
      return Usage(absl::StrCat(what, ": '", args[2], "' is not an integer"));
    const std::vector<int32_t> ids = vocab->Find(args[2]);
    if (ids.size() != 1) {
      return Usage(absl::StrCat("token '", args[2], "': ", ids.size(),
                                " tokens of the vocabulary are exactly that text"));
    }
    selector = ids[0];
  }
  if (by_token) {
    request.set_token_id(selector);
  } else {
    request.set_with_latent(selector);
  }
  const std::string rank = absl::GetFlag(FLAGS_rank);
  if (rank != "count" && rank != "lift") return Usage("--rank: use count or lift");
  request.set_order(rank == "lift" ? v1::BY_LIFT : v1::BY_COUNT);
  request.set_limit(absl::GetFlag(FLAGS_limit));
  request.set_max_rows(absl::GetFlag(FLAGS_max_rows));
  request.set_min_count(absl::GetFlag(FLAGS_min_count));
  request.set_in_dataset_id(absl::GetFlag(FLAGS_in_dataset));
  v1::LatentsOnRowsResponse response;
  grpc::Status status =
      client.datasets()->LatentsOnRows(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  const std::string selection =
      by_token ? absl::StrCat("of token ", selector,
                              vocab ? absl::StrCat(" \"", vocab->Display(selector), "\"") : "")
               : absl::StrCat("where latent ", selector, " fires");
  const uint64_t counted = request.in_dataset_id() != 0 ? request.in_dataset_id() : id;
  std::printf("dataset %llu: latents on the %lld rows %s%s (%lld read)\n",
              static_cast<unsigned long long>(counted),
              static_cast<long long>(response.rows_selected()), selection.c_str(),
              counted != id ? absl::StrCat(" in dataset ", id).c_str() : "",
              static_cast<long long>(response.rows_read()));
  std::printf("%-8s %-9s %-9s %-10s %s\n", "LATENT", "COUNT", "FRACTION", "MEAN", "LIFT");
  for (const v1::RowLatent& l : response.latents()) {
    std::printf("%-8d %-9lld %-9.4f %-10.4g %.4g\n", l.latent(), static_cast<long long>(l.count()),
                l.fraction(), l.mean(), l.lift());
  }
  return 0;
}

// The SAE at a glance: a page of its latents in the order asked, the dead count, and the log10
// feature-density histogram as a PNG with --plot.
// ListLatents as the flags ask (--order, --limit, --offset, --min_count, --max_count); false,
// with *error, for an unknown order.
bool LatentListRequest(uint64_t id, v1::ListLatentsRequest* request, std::string* error) {
  static const std::map<std::string, v1::LatentOrder> kOrders = {{"latent", v1::BY_LATENT},
                                                                 {"frequent", v1::MOST_FREQUENT},
                                                                 {"rare", v1::LEAST_FREQUENT},
                                                                 {"max", v1::HIGHEST_MAX},
                                                                 {"mean", v1::HIGHEST_MEAN}};
  const auto order = kOrders.find(absl::GetFlag(FLAGS_order));
  if (order == kOrders.end()) {
    *error = absl::StrCat("--order=", absl::GetFlag(FLAGS_order),
                          ": use latent, frequent, rare, max or mean");
    return false;
  }
  request->set_dataset_id(id);
  request->set_order(order->second);
  request->set_limit(absl::GetFlag(FLAGS_limit));
  request->set_offset(absl::GetFlag(FLAGS_offset));
  request->set_min_firing_count(absl::GetFlag(FLAGS_min_count));
  if (absl::GetFlag(FLAGS_max_count) >= 0) {
    request->set_max_firing_count(absl::GetFlag(FLAGS_max_count));
  }
  return true;
}

int Latents(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("latents needs a dataset id");
  v1::ListLatentsRequest request;
  if (std::string error; !LatentListRequest(id, &request, &error)) return Usage(error);
  v1::ListLatentsResponse response;
  grpc::Status status = client.datasets()->ListLatents(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  const bool json = absl::GetFlag(FLAGS_json);
  if (json) {
    std::printf("%s\n", Json(response).c_str());
  } else {
    std::printf("dataset %llu: %lld rows, %d latents, %lld dead (%.2f%%); %lld match\n",
                static_cast<unsigned long long>(id), static_cast<long long>(response.rows()),
                response.d_sae(), static_cast<long long>(response.dead_latents()),
                response.d_sae() > 0 ? 100.0 * response.dead_latents() / response.d_sae() : 0.0,
                static_cast<long long>(response.matching()));
    // How well the SAE reconstructs the rows, where the dataset keeps it.
    v1::GetDatasetRequest info_request;
    info_request.set_dataset_id(id);
    v1::DatasetInfo info;
    if (client.datasets()->GetDataset(client.Context().get(), info_request, &info).ok()) {
      PrintFit(info.fit());
    }
    // The log10 density histogram in the terminal: the 50 bins merged five at a time (exact:
    // merged bins keep equal widths), each line [low, high) in log10(firings / rows).
    const auto& bins = response.log10_density_histogram();
    if (!bins.empty()) {
      constexpr int kMerge = 5;
      const double width = -response.log10_density_min() / bins.size();
      const std::vector<int64_t> merged = MergeBins(bins, kMerge);
      const int64_t peak = *std::max_element(merged.begin(), merged.end());
      std::printf("log10 density of the latents that fired:\n");
      for (size_t m = 0; m < merged.size(); ++m) {
        const double low = response.log10_density_min() + width * kMerge * m;
        const double high = std::min(0.0, low + width * kMerge);
        std::printf("  [%6.2f, %6.2f%c %-41s %lld\n", low, high, m + 1 == merged.size() ? ']' : ')',
                    Bar(merged[m], peak).c_str(), static_cast<long long>(merged[m]));
      }
    }
    std::printf("%-8s %-10s %-10s %-10s %s\n", "LATENT", "FIRINGS", "DENSITY", "MEAN", "MAX");
    for (const v1::LatentSummary& l : response.latents()) {
      std::printf("%-8d %-10lld %-10.4g %-10.4g %.4g\n", l.latent(),
                  static_cast<long long>(l.firing_count()), l.density(), l.mean(), l.max());
    }
  }
  if (const std::string plot = absl::GetFlag(FLAGS_plot); !plot.empty()) {
    absl::Status s = WriteDensityHistogramPlot(
        response, absl::StrCat("dataset ", id, ": feature density"), plot);
    if (!s.ok()) {
      std::fprintf(stderr, "latentctl: --plot: %s\n", std::string(s.message()).c_str());
      return kExitRpcError;
    }
    if (!json) std::printf("wrote %s\n", plot.c_str());
  }
  return 0;
}

int Export(Client& client, const std::vector<std::string>& args) {
  const bool as_job = absl::GetFlag(FLAGS_job);
  uint64_t id = 0;
  // "-": an EXPORT job's --bind fills export.dataset_id (the dataset a job it waits for makes).
  const bool bound_id = as_job && args.size() > 1 && args[1] == "-";
  if ((!bound_id && !ParseId(args, 1, &id)) || args.size() < 3) {
    return Usage("export needs a dataset id (with --job, '-' for one --bind fills) and a path");
  }
  v1::ExportDatasetRequest request;
  request.set_dataset_id(id);
  request.set_path(args[2]);
  const std::string format = absl::GetFlag(FLAGS_format);
  if (absl::GetFlag(FLAGS_splits) != 0 && format != "delphi") {
    return Usage("--splits: only with --format=delphi");
  }
  if (format == "npz") {
    request.set_format(v1::NPZ);
  } else if (format == "hdf5" || format == "h5") {
    request.set_format(v1::HDF5);
  } else if (format == "parquet") {
    request.set_format(v1::EXPORT_FORMAT_PARQUET);
  } else if (format == "delphi") {
    request.set_format(v1::EXPORT_FORMAT_DELPHI);
    request.set_delphi_splits(absl::GetFlag(FLAGS_splits));
  } else {
    return Usage(absl::StrCat("--format: '", format, "' is not npz, hdf5, parquet or delphi"));
  }
  request.set_row_start(absl::GetFlag(FLAGS_start));
  request.set_row_count(absl::GetFlag(FLAGS_count));
  if (as_job) {
    // The same request as an EXPORT job: progress on `latentctl watch`, CancelJob, pipelines.
    absl::StatusOr<v1::JobSpec> spec = SpecFromFlags("EXPORT");
    if (!spec.ok()) return Usage(std::string(spec.status().message()));
    if (spec->type() != v1::EXPORT) return Usage("export --job: --type must be EXPORT");
    *spec->mutable_export_() = request;
    v1::SubmitJobRequest submit;
    submit.set_request_id(absl::GetFlag(FLAGS_request_id));
    *submit.mutable_spec() = *std::move(spec);
    if (absl::GetFlag(FLAGS_dry_run)) {
      v1::JobPlan plan;
      grpc::Status status = client.jobs()->PlanJob(client.Context().get(), submit, &plan);
      if (!status.ok()) return RpcError(status);
      for (const std::string& line : plan.lines()) std::printf("%s\n", line.c_str());
      return 0;
    }
    v1::Job job;
    grpc::Status status = client.jobs()->SubmitJob(client.Context().get(), submit, &job);
    if (!status.ok()) return RpcError(status);
    if (absl::GetFlag(FLAGS_watch)) return Watch(client, {"watch", std::to_string(job.id())});
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", Json(job).c_str());
    } else {
      std::printf("%llu\n", static_cast<unsigned long long>(job.id()));
    }
    return 0;
  }
  v1::ExportDatasetResponse response;
  grpc::Status status =
      client.datasets()->ExportDataset(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
  } else {
    std::printf("wrote %s: %lld rows, %lld nonzeros, %s\n", response.path().c_str(),
                static_cast<long long>(response.rows()), static_cast<long long>(response.nnz()),
                Bytes(response.bytes()).c_str());
  }
  return 0;
}

int DeleteDataset(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("delete-dataset needs a dataset id");
  v1::DeleteDatasetRequest request;
  request.set_dataset_id(id);
  v1::DeleteDatasetResponse response;
  grpc::Status status =
      client.datasets()->DeleteDataset(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (!absl::GetFlag(FLAGS_json))
    std::printf("deleted dataset %llu\n", static_cast<unsigned long long>(id));
  return 0;
}

int Artifacts(Client& client) {
  v1::ListArtifactsResponse response;
  grpc::Status status = client.datasets()->ListArtifacts(client.Context().get(),
                                                         v1::ListArtifactsRequest(), &response);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  std::printf("%-5s %-24s %-6s %s\n", "ID", "NAME", "JOB", "PATH");
  for (const auto& a : response.artifacts()) {
    std::printf("%-5llu %-24s %-6llu %s\n", static_cast<unsigned long long>(a.id()),
                a.name().c_str(), static_cast<unsigned long long>(a.job_id()), a.path().c_str());
  }
  for (const auto& u : response.unreadable()) {
    std::printf("%-5llu unreadable: %s (`latentctl delete-artifact %llu` removes the record)\n",
                static_cast<unsigned long long>(u.artifact_id()), u.error().c_str(),
                static_cast<unsigned long long>(u.artifact_id()));
  }
  return 0;
}

int DeleteArtifact(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("delete-artifact needs an artifact id");
  v1::DeleteArtifactRequest request;
  request.set_artifact_id(id);
  v1::DeleteArtifactResponse response;
  grpc::Status status =
      client.datasets()->DeleteArtifact(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
  } else {
    std::printf("deleted artifact %llu (%s, %s freed)\n", static_cast<unsigned long long>(id),
                response.path().c_str(), Bytes(response.bytes_freed()).c_str());
  }
  return 0;
}

// Reads every telemetry sample of a job (it may have ended) and prints a table, optionally a plot.
int Telemetry(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("telemetry needs a job id");
  v1::WatchJobRequest request;
  request.set_job_id(id);
  const std::string part = FvuPartName(JobSpecOrEmpty(client, id));
  auto context = client.Context();
  // A job that is still running keeps the stream open; the table then shows what came so far
  // once the job ends. Deadline-free on purpose: telemetry of a long job is worth the wait.
  auto reader = client.jobs()->WatchJob(context.get(), request);
  std::vector<v1::TrainTelemetry> samples;
  v1::JobEvent event;
  const bool json = absl::GetFlag(FLAGS_json);
  while (reader->Read(&event)) {
    if (!event.has_telemetry()) continue;
    if (json) std::printf("%s\n", Json(event.telemetry()).c_str());
    if (event.telemetry().has_train()) samples.push_back(event.telemetry().train());
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcError(status);
  if (!json) {
    // The AuxK column only for jobs that train with it (TopK and BatchTopK SAEs with
    // aux_k_coefficient > 0).
    const bool aux_k = std::any_of(samples.begin(), samples.end(),
                                   [](const v1::TrainTelemetry& s) { return s.aux_k_loss() > 0; });
    // Matryoshka SAEs: one column of FVUs, a level's prefix each ("FVU@64/256"); cross-layer
    // transcoders: a block's each ("FVU@B0/B1/B2"); crosscoders: a source's ("FVU@S0/S1").
    std::string levels_header;
    int levels_width = 0;  // "0.1234/0.5678": 7 characters a level
    for (const auto& s : samples) {
      if (s.prefix_widths_size() > 0) {
        levels_header = absl::StrCat("FVU@", absl::StrJoin(s.prefix_widths(), "/"));
        levels_width = std::max<int>(levels_header.size(), 7 * s.prefix_widths_size() - 1);
        break;
      }
      if (s.block_fvu_size() > 0) {
        std::vector<std::string> blocks;
        const char* letter = part == "source" ? "S" : "B";
        for (int b = 0; b < s.block_fvu_size(); ++b) blocks.push_back(absl::StrCat(letter, b));
        levels_header = absl::StrCat("FVU@", absl::StrJoin(blocks, "/"));
        levels_width = std::max<int>(levels_header.size(), 7 * s.block_fvu_size() - 1);
        break;
      }
    }
    std::printf(
        "%-7s %-11s %-8s %-7s %-6s %s%s%-10s %-12s %-12s %-12s %s\n", "STEP", "LOSS", "FVU", "L0",
        "DEAD", aux_k ? "AUXK        " : "",
        levels_header.empty() ? "" : absl::StrFormat("%-*s ", levels_width, levels_header).c_str(),
        "ROWS/S", "OPT STATE", "DENSE MFAC", "PARAMS", "RSS");
    for (const auto& s : samples) {
      const std::string aux = aux_k ? absl::StrFormat("%-11.5g ", s.aux_k_loss()) : "";
      std::string levels;
      if (!levels_header.empty()) {
        std::vector<std::string> fvus;
        for (const double v : s.prefix_fvu()) fvus.push_back(absl::StrFormat("%.4f", v));
        for (const double v : s.block_fvu()) fvus.push_back(absl::StrFormat("%.4f", v));
        levels = absl::StrFormat("%-*s ", levels_width, absl::StrJoin(fvus, "/"));
      }
      std::printf("%-7lld %-11.5g %-8.4f %-7.1f %-6lld %s%s%-10.0f %-12s %-12s %-12s %s\n",
                  static_cast<long long>(s.step()), s.loss(), s.fvu(), s.l0(),
                  static_cast<long long>(s.dead_latents()), aux.c_str(), levels.c_str(),
                  s.rows_per_second(), Bytes(s.optimizer_state_total_bytes()).c_str(),
                  Bytes(s.dense_mfac_history_bytes()).c_str(), Bytes(s.parameter_bytes()).c_str(),
                  Bytes(s.process_rss_bytes()).c_str());
    }
  }
  if (const std::string plot = absl::GetFlag(FLAGS_plot); !plot.empty()) {
    absl::Status s = WriteTelemetryPlot(samples, absl::StrCat("job ", id), plot, part);
    if (!s.ok()) {
      std::fprintf(stderr, "latentctl: --plot: %s\n", std::string(s.message()).c_str());
      return kExitRpcError;
    }
    if (!json) std::printf("wrote %s\n", plot.c_str());
  }
  return 0;
}

// Writes a static dashboard of an SAE into a directory: index.html (summary, density histogram,
// the listed latents) and one page per listed latent (statistics, histogram, examples shaded
// by value, interval samples, the latents it fires with), every page linking to the others.
int Dashboard(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id) || args.size() < 3) {
    return Usage("dashboard needs a dataset id and a directory");
  }
  const std::filesystem::path dir = args[2];
  std::optional<Vocabulary> vocab;
  if (std::string error; !LoadVocabFlag(&vocab, &error)) return Usage(error);
  v1::ListLatentsRequest list;
  if (std::string error; !LatentListRequest(id, &list, &error)) return Usage(error);
  v1::ListLatentsResponse overview;
  grpc::Status status = client.datasets()->ListLatents(client.Context().get(), list, &overview);
  if (!status.ok()) return RpcError(status);
  v1::GetDatasetRequest info_request;
  info_request.set_dataset_id(id);
  v1::DatasetInfo info;  // its context length: position histograms need sequences
  status = client.datasets()->GetDataset(client.Context().get(), info_request, &info);
  if (!status.ok()) return RpcError(status);
  // The other datasets of the same rows from the same job: each page says which of their
  // latents fire where its latent fires.
  auto found_siblings = SiblingDatasets(client, info);
  if (!found_siblings.ok()) {
    std::fprintf(stderr, "latentctl: %s\n", found_siblings.status().ToString().c_str());
    return kExitRpcError;
  }
  const std::vector<v1::DatasetInfo>& siblings = *found_siblings;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "latentctl: %s: %s\n", dir.c_str(), ec.message().c_str());
    return kExitRpcError;
  }
  const int total = overview.latents_size();
  std::map<int32_t, std::vector<v1::TokenCount>> top_tokens;  // for the index
  std::set<int32_t> with_pages;
  for (const v1::LatentSummary& l : overview.latents()) with_pages.insert(l.latent());
  const bool progress = isatty(fileno(stderr));  // a counter rewritten in place
  bool weights_warned = false;                   // after one failure the pages go without weights
  for (int i = 0; i < total; ++i) {
    const int32_t latent = overview.latents(i).latent();
    LatentPageOptions page{id, vocab ? &*vocab : nullptr, absl::GetFlag(FLAGS_distinct)};
    page.in_dashboard = true;
    page.linked_latents = &with_pages;
    if (const int failed = WriteLatentPage(client, info, siblings, latent, dir, page,
                                           &weights_warned, &top_tokens[latent]);
        failed != 0) {
      return failed;
    }
    if (progress) std::fprintf(stderr, "\rlatent pages: %d/%d", i + 1, total);
  }
  if (progress && total > 0) std::fprintf(stderr, "\n");
  IndexPageOptions index{id,
                         absl::StrCat(total, " latents by --order=", absl::GetFlag(FLAGS_order),
                                      ", from offset ", list.offset()),
                         /*link_pages=*/true,
                         &top_tokens,
                         vocab ? &*vocab : nullptr,
                         &info.fit()};
  if (!WriteFile(dir / "index.html", LatentIndexHtml(overview, index))) return kExitRpcError;
  std::printf("wrote %s with %d latent pages\n", (dir / "index.html").c_str(), total);
  return 0;
}

// One JSON line per latent (LatentExamplesJson) for auto-interpretation: the latents the
// list flags choose (as `dashboard`), each with its top examples, interval samples and silent
// windows as --top, --intervals and --silent ask, written to a local file.
int Examples(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id) || args.size() < 3) {
    return Usage("examples needs a dataset id and an output file");
  }
  std::optional<Vocabulary> vocab;
  if (std::string error; !LoadVocabFlag(&vocab, &error)) return Usage(error);
  v1::ListLatentsRequest list;
  if (std::string error; !LatentListRequest(id, &list, &error)) return Usage(error);
  v1::ListLatentsResponse overview;
  grpc::Status status = client.datasets()->ListLatents(client.Context().get(), list, &overview);
  if (!status.ok()) return RpcError(status);
  std::ofstream out(args[2], std::ios::binary | std::ios::trunc);
  if (!out) return Usage(absl::StrCat("cannot write ", args[2]));
  const bool progress = isatty(fileno(stderr));
  int written = 0;
  for (const v1::LatentSummary& l : overview.latents()) {
    v1::GetLatentResponse response;
    status = client.datasets()->GetLatent(client.Context().get(), LatentRequest(id, l.latent()),
                                          &response);
    if (!status.ok()) return RpcError(status);
    out << LatentExamplesJson(response, id, vocab ? &*vocab : nullptr) << '\n';
    ++written;
    if (progress) std::fprintf(stderr, "\rlatents: %d/%d", written, overview.latents_size());
  }
  if (progress && overview.latents_size() > 0) std::fprintf(stderr, "\n");
  out.close();
  if (!out) {
    std::fprintf(stderr, "latentctl: writing %s failed\n", args[2].c_str());
    return kExitRpcError;
  }
  std::printf("wrote %s: %d latents\n", args[2].c_str(), written);
  return 0;
}

constexpr char kHelp[] = R"(latentctl [--server=HOST:PORT] [--token_file=F] [--json] COMMAND
jobs:
  submit --type=PROBE|EXTRACT|TRAIN|EXPORT [--spec=FILE.json] [--request_id=ID]
         [--num_devices=N] [--priority=P] [--label=L]     prints the job id
         [--after_jobs=ID,...]   start only once these jobs have succeeded (a pipeline)
         [--bind=FIELD=ID:OUTPUT,...]   take a value of a job's result when this one starts:
                                 --bind=train.dataset_id=5:extract.dataset_id
         [--dry_run]             instead: the checks, and what the job would do, no job
  pipeline FILE.json [--dry_run] [--watch]
                                 submits an experiment's jobs from one file, each waiting for
                                 and taking values from jobs before it by name ("bind":
                                 {"train.dataset_id": "dense:extract.dataset_id"}); --watch
                                 follows them to their ends (exit 3 unless all SUCCEEDED)
  get ID                         one job
  list [--state=S] [--type=T] [--label=L] [--page_size=N] [--all]   newest first
  watch ID [--after=SEQ]         events until the job ends (exit 3 unless it SUCCEEDED)
  cancel ID
  delete-job ID                  forget a finished job (record, events, a TRAIN checkpoint)
  telemetry ID [--plot=FILE.png] training telemetry as a table (and a plot)
  train-nodes --nodes=H:P,H:P,... --spec=train.json [--dataset=NAME] [--rendezvous=H:P]
              [--num_devices=N | --node_devices=N,N,...]
                                 one TRAIN run over several latentd nodes (N devices each, or
                                 each node its own count): submits it to each with its ranks
                                 (and its id of dataset NAME), follows rank 0's progress,
                                 prints every node's result
text:
  tokenize FILE... --vocab=tokenizer.json --out=TOKENS.npy [--separator=TOKEN]
           [--special_tokens=false] [--field=text] [--threads=N]
                                 text -> the token stream an EXTRACT job reads: each .jsonl
                                 line's "text" (--field; also .jsonl.zst, .json.gz: the Pile,
                                 C4, Dolma as downloaded), each row of a .parquet or .arrow
                                 file's "text" column (FineWeb and the Hub's other text
                                 datasets; datasets' save_to_disk) or each other file is a
                                 document,
                                 tokenized as Hugging Face's tokenizer(text) does (BPE
                                 tokenizer.json files: GPT-2, Llama, Mistral, Gemma, Qwen2,
                                 Pythia), with TOKEN (id or text) after each
  devices                        devices and who holds them
datasets:
  datasets                       list
  dataset ID                     metadata and summary
  rows ID [--start=R] [--count=N] [--vocab=F]  CSR rows with token ids (--vocab: and text)
  latent ID J [--top=N] [--before=B] [--after_tokens=A] [--intervals=I [--interval_samples=S]]
              [--silent=N] [--distinct] [--tokens=N] [--positions] [--vocab=tokenizer.json]
              [--html=FILE.html]
                                 statistics, top activations (--distinct: one per sequence),
                                 interval samples, the N tokens it fires on most, where in
                                 its sequences it fires, N windows where it is silent; --vocab
                                 shows text, --html a page where each token is shaded by the
                                 latent's value on it
  firings ID J [--start=R] [--count=N] [--vocab=F]
                                 every row where latent J fires, with its value (and with
                                 --vocab its token; latent-major: reads the latent's runs only)
  latents ID [--order=latent|frequent|rare|max|mean] [--limit=N] [--offset=N]
             [--min_count=C] [--max_count=C] [--plot=FILE.png]
                                 the SAE at a glance: latents ranked, dead count, density plot
  dashboard ID DIR [--order=...] [--limit=N] [--offset=N] [--min_count=C] [--max_count=C]
                 [--vocab=F] [--top=N] [--intervals=I] [--silent=N] [--distinct]
                                 a static HTML dashboard: DIR/index.html (density histogram,
                                 the listed latents and their top tokens) and a page per
                                 latent (examples shaded by value, interval samples, tokens,
                                 positions, the latents it fires with (and those of the
                                 job's other hooks' datasets), its direct logits and decoder
                                 neighbours)
  examples ID FILE.jsonl [--order=...] [--limit=N] [--offset=N] [--top=N] [--intervals=I]
                        [--silent=N] [--distinct] [--before=B] [--after_tokens=A] [--vocab=F]
                                 one JSON line per latent (stats, top examples, interval
                                 samples, silent windows; token ids, values and with --vocab
                                 each token's text): the input of auto-interpretation
  weights ID J [--limit=N] [--vocab=F] [--unembedding=NAME]
                                 from the SAE and model that made the dataset: the tokens the
                                 latent's decoder direction raises and lowers most (direct
                                 logits) and the latents with the nearest decoder directions
  prompt ID T1 T2 ... [--vocab=F] [--limit=N] [--html=FILE.html] [--all_hooks]
  prompt ID --text="..." --vocab=tokenizer.json [...]
                                 the latents a new prompt gets from the dataset's model and
                                 SAE: each token's largest, and the prompt's N top latents
                                 (tokens: ids, or with --vocab each one's text; --text: the
                                 prompt as text, tokenized as the model's tokenizer does); --html: a
                                 page shading the prompt by each top latent (written into a
                                 dashboard directory, latents link to their pages);
                                 --all_hooks: also each other hook of the dataset's job
                                 (and of other jobs over the same tokens and model)
  steer ID T1 T2 ... --intervene=J:set=V|J:add=V|J:scale=V[@P+P...][,...] [--new_tokens=N]
        [--temperature=T --seed=S] [--sweep=V,V,...] [--limit=N] [--vocab=F] [--html=FILE.html]
        [--crosscoder_source=S]
  steer ID --text="..." --vocab=tokenizer.json --intervene=... [...]
                                 the prompt through the dataset's model with latents changed
                                 where the SAE's decoder writes (set 0: ablate; add: steer
                                 along the decoder direction; scale), beside the model as it
                                 is: the next token's N top predictions of both, the KL and
                                 the tokens that rose and fell most, the prompt's loss, and
                                 both runs continued N tokens (default 20); --sweep: a run
                                 for each value of the first intervention, a line each;
                                 --html: a page shading the prompt by the loss change, the
                                 runs side by side, the sweep's KL plotted against the value;
                                 --crosscoder_source=S: a model-diffing crosscoder's latents
                                 changed in model S (0: the first dataset's) along the
                                 direction it learned for that model, the other models run
                                 beside it for their values
  attribute ID T1 T2 ... [--target=T [--contrast=T] | --target_latent=D:J@P] [--limit=N]
            [--ablate=N] [--vocab=F] [--html=FILE.html] [--all_hooks] [--crosscoder_source=S]
  attribute ID --text="..." --vocab=tokenizer.json [...]
                                 which latents, where in the prompt, drive the prediction of
                                 the next token (log p(T), or logit(T) - logit(contrast)):
                                 attribution patching through the SAE, one forward and one
                                 backward pass; each latent's first-order effect, the SAE
                                 error term's, per position, and the top N; --html: a page
                                 shading the prompt by position and by each top latent;
                                 --all_hooks: a line per other hook of the suite;
                                 --target_latent=D:J@P: explain latent J of dataset D (a
                                 later hook of the same model) at position P instead: the
                                 edges of a sparse feature circuit; --ablate=N: the top N
                                 entries each taken out of a run, the change measured;
                                 --crosscoder_source=S: a model-diffing crosscoder's latents
                                 credited in model S's prediction (with --target_latent: in
                                 model S's later latent)
  graph ID T1 T2 ... [--target=T [--contrast=T] | --target_latent=D:J@P] [--per_hook=N]
        [--min_importance=F] [--node_threshold=F] [--node_tokens=N] [--ablate=1] [--dot=FILE.dot]
        [--layers=D,D,...] [--vocab=F] [--html=FILE.html] [--node_links=PATTERN]
        [--crosscoder_source=S]
  graph ID --text="..." --vocab=tokenizer.json [...]
                                 an attribution graph over the SAE suite up to dataset ID's
                                 hook: the N latents (at their positions) that drive the
                                 prediction most, then per earlier hook the N that drive
                                 those, with each hook's SAE error and how much of what
                                 reaches the hook its nodes carry; each latent labelled with
                                 the tokens it fires on most; --html draws it, each latent
                                 a link with --node_links=board-{dataset}/latent-{latent}.html;
                                 --crosscoder_source=S with a model-diffing crosscoder: model
                                 S runs it, the other layers S's SAEs (without --layers, those
                                 over the same rows)
  compare ID OTHER [--sample=N] [--limit=N]
                                 how far two datasets' SAEs learned the same directions: each
                                 latent's nearest decoder direction in the other SAE (mean,
                                 histogram), and the N matched worst
  scaling ID [J ...] [--crosscoder_source=S] [--baseline=B] [--max_rows=R] [--limit=N]
          [--min_share=F] [--plot=FILE.png]
                                 latent scaling of a model-diffing crosscoder's latents (J, or
                                 source S's own that fire, at most N): how much of each one's
                                 direction model B carries in its error and its other latents
                                 against model S; near 0 S's own, near 1 a sparsity artifact
  cofiring ID J [--rank=count|lift] [--limit=N] [--max_rows=R] [--min_count=C] [--in_dataset=D]
                                 the latents that fire on the rows where latent J fires (with
                                 --in_dataset: D's latents, e.g. another layer of the same job)
  token ID T [--vocab=F] [--rank=count|lift] [--limit=N] [--max_rows=R] [--min_count=C]
                                 the latents that fire on token T (an id, or its text with --vocab)
  export ID PATH [--format=npz|hdf5|parquet|delphi] [--start=R] [--count=N] [--splits=S]
         [--job [--watch|--dry_run] [--after_jobs=..] [--bind=export.dataset_id=JOB:extract.dataset_id]]
                                 server-side, under the export root (parquet: a row a row,
                                 latents and values as lists, for pandas / polars / DuckDB;
                                 delphi: PATH is a latent cache directory for EleutherAI's
                                 delphi, the dataset its module PATH/<hook>, S files of it);
                                 streamed in bounded memory; Ctrl-C stops it. --job: run it as
                                 an EXPORT job (prints its id; progress with watch; ID '-' when
                                 --bind names the dataset a job it waits for makes)
  delete-dataset ID
  artifacts                      trained SAEs
  delete-artifact ID             its record and files (refused while an unfinished job uses it)
)";

bool Finished(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

// One TRAIN spec over several nodes (docs/TRAIN.md, "Several latentd nodes"): node i gets the
// ranks after node i-1's, the same rendezvous and run id, and with --dataset its own id of the
// named dataset. Then follows the jobs until all have ended, showing rank 0's progress.
int TrainNodes() {
  const std::vector<std::string> nodes =
      absl::StrSplit(absl::GetFlag(FLAGS_nodes), ',', absl::SkipEmpty());
  if (nodes.empty()) return Usage("train-nodes needs --nodes=HOST:PORT,HOST:PORT,...");
  if (absl::GetFlag(FLAGS_spec).empty()) return Usage("train-nodes needs --spec=TRAIN.json");
  absl::StatusOr<v1::JobSpec> spec = SpecFromFlags("TRAIN");
  if (!spec.ok()) return Usage(std::string(spec.status().message()));
  if (spec->type() != v1::TRAIN) {
    return Usage("train-nodes: --spec must be a TRAIN spec");
  }
  // Node i holds ranks first_rank[i] .. first_rank[i] + devices[i] - 1.
  std::vector<int> devices(nodes.size(), std::max(spec->num_devices(), 1));
  if (const std::string counts = absl::GetFlag(FLAGS_node_devices); !counts.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(counts, ',');
    if (parts.size() != nodes.size()) {
      return Usage(absl::StrCat("--node_devices names ", parts.size(), " counts for ", nodes.size(),
                                " nodes"));
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!absl::SimpleAtoi(parts[i], &devices[i]) || devices[i] < 1) {
        return Usage(absl::StrCat("--node_devices: \"", parts[i], "\" is not a device count"));
      }
    }
  }
  std::vector<int> first_rank(nodes.size(), 0);
  for (size_t i = 1; i < nodes.size(); ++i) first_rank[i] = first_rank[i - 1] + devices[i - 1];
  std::string rendezvous = absl::GetFlag(FLAGS_rendezvous);
  if (rendezvous.empty()) {
    const std::string& first = nodes[0];
    const size_t colon = first.rfind(':');
    rendezvous =
        absl::StrCat(colon == std::string::npos ? first : first.substr(0, colon), ":29500");
  }
  v1::TrainRendezvous* meeting = spec->mutable_train()->mutable_rendezvous();
  meeting->set_address(rendezvous);
  meeting->set_world_size(first_rank.back() + devices.back());
  // A fresh key prefix per launch, so a store that outlived an earlier run is never read.
  if (meeting->run_id().empty())
    meeting->set_run_id(absl::StrCat("train-", absl::ToUnixMicros(absl::Now())));

  std::vector<std::unique_ptr<Client>> clients;
  std::vector<uint64_t> jobs;
  auto cancel_submitted = [&] {
    for (size_t i = 0; i < jobs.size(); ++i) {
      v1::CancelJobRequest request;
      request.set_job_id(jobs[i]);
      v1::Job ignored;
      (void)clients[i]->jobs()->CancelJob(clients[i]->Context().get(), request, &ignored);
    }
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    clients.push_back(std::make_unique<Client>(nodes[i]));
    Client& client = *clients.back();
    std::string error;
    if (!client.LoadToken(&error)) return Usage(error);
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *spec;
    request.mutable_spec()->set_num_devices(devices[i]);
    v1::TrainSpec* train = request.mutable_spec()->mutable_train();
    train->mutable_rendezvous()->set_rank_offset(first_rank[i]);
    if (const std::string name = absl::GetFlag(FLAGS_dataset); !name.empty()) {
      v1::ListDatasetsResponse listed;
      grpc::Status status = client.datasets()->ListDatasets(client.Context().get(),
                                                            v1::ListDatasetsRequest(), &listed);
      if (!status.ok()) {
        cancel_submitted();
        std::fprintf(stderr, "latentctl: node %s:\n", nodes[i].c_str());
        return RpcError(status);
      }
      auto found = std::find_if(listed.datasets().begin(), listed.datasets().end(),
                                [&](const v1::DatasetInfo& d) { return d.name() == name; });
      if (found == listed.datasets().end()) {
        cancel_submitted();
        std::fprintf(stderr, "latentctl: NOT_FOUND: node %s has no dataset named \"%s\"\n",
                     nodes[i].c_str(), name.c_str());
        return kExitRpcError;
      }
      train->set_dataset_id(found->id());
    }
    v1::Job job;
    grpc::Status status = client.jobs()->SubmitJob(client.Context().get(), request, &job);
    if (!status.ok()) {
      cancel_submitted();
      std::fprintf(stderr,
                   "latentctl: node %s refused the job (%zu submitted before it are "
                   "cancelled):\n",
                   nodes[i].c_str(), jobs.size());
      return RpcError(status);
    }
    jobs.push_back(job.id());
    std::printf("node %s: job %llu, ranks %d..%d of %d, dataset %llu\n", nodes[i].c_str(),
                static_cast<unsigned long long>(job.id()), first_rank[i],
                first_rank[i] + devices[i] - 1, meeting->world_size(),
                static_cast<unsigned long long>(train->dataset_id()));
  }
  std::printf("rendezvous %s, run %s\n", rendezvous.c_str(), meeting->run_id().c_str());
  std::fflush(stdout);

  // Poll every node (a watch stream per node would leave the others unattended).
  std::vector<v1::Job> last(nodes.size());
  int64_t shown = -1;
  absl::Time shown_at = absl::InfinitePast();
  while (true) {
    bool all_finished = true;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (Finished(last[i].state())) continue;
      v1::GetJobRequest request;
      request.set_job_id(jobs[i]);
      grpc::Status status =
          clients[i]->jobs()->GetJob(clients[i]->Context().get(), request, &last[i]);
      if (!status.ok()) {
        std::fprintf(stderr, "latentctl: node %s:\n", nodes[i].c_str());
        return RpcError(status);
      }
      all_finished = all_finished && Finished(last[i].state());
    }
    // Rank 0's progress, at most once a second, and where it ended.
    const v1::JobProgress& progress = last[0].progress();
    if (progress.units_total() > 0 && progress.units_done() != shown &&
        (all_finished || absl::Now() - shown_at >= absl::Seconds(1))) {
      std::printf("rank 0: %lld/%lld %s (%.1f/s)\n", static_cast<long long>(progress.units_done()),
                  static_cast<long long>(progress.units_total()), progress.unit().c_str(),
                  progress.rate());
      std::fflush(stdout);
      shown = progress.units_done();
      shown_at = absl::Now();
    }
    if (all_finished) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  bool succeeded = true;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const v1::Job& job = last[i];
    succeeded = succeeded && job.state() == v1::SUCCEEDED;
    std::printf("node %s: job %llu %s", nodes[i].c_str(), static_cast<unsigned long long>(job.id()),
                v1::JobState_Name(job.state()).c_str());
    if (job.state() == v1::SUCCEEDED) {
      std::printf(", artifact %llu at %s, final loss %.6g\n",
                  static_cast<unsigned long long>(job.result().train().artifact_id()),
                  job.result().train().artifact_path().c_str(), job.result().train().final_loss());
    } else {
      std::printf(": %s\n", job.message().c_str());
    }
  }
  return succeeded ? 0 : kExitJobNotSucceeded;
}

int Run(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "help") {
    std::printf("%s", kHelp);
    return args.empty() ? kExitUsage : 0;
  }
  if (args[0] == "tokenize") return Tokenize(args);   // local: no daemon needed
  if (args[0] == "train-nodes") return TrainNodes();  // its own clients, one per node
  Client client;
  std::string error;
  if (!client.LoadToken(&error)) return Usage(error);
  const std::string& command = args[0];
  if (command == "submit") return Submit(client);
  if (command == "get") return Get(client, args);
  if (command == "pipeline") return Pipeline(client, args);
  if (command == "list") return List(client);
  if (command == "watch") return Watch(client, args);
  if (command == "cancel") return Cancel(client, args);
  if (command == "delete-job") return DeleteJob(client, args);
  if (command == "devices") return Devices(client);
  if (command == "telemetry") return Telemetry(client, args);
  if (command == "datasets") return Datasets(client);
  if (command == "dataset") return Dataset(client, args);
  if (command == "rows") return Rows(client, args);
  if (command == "latent") return Latent(client, args);
  if (command == "latents") return Latents(client, args);
  if (command == "firings") return Firings(client, args);
  if (command == "dashboard") return Dashboard(client, args);
  if (command == "examples") return Examples(client, args);
  if (command == "weights") return Weights(client, args);
  if (command == "prompt") return Prompt(client, args);
  if (command == "steer") return Steer(client, args);
  if (command == "attribute") return Attribute(client, args);
  if (command == "graph") return Graph(client, args);
  if (command == "compare") return Compare(client, args);
  if (command == "scaling") return Scaling(client, args);
  if (command == "cofiring") return OnRows(client, args, /*by_token=*/false);
  if (command == "token") return OnRows(client, args, /*by_token=*/true);
  if (command == "export") return Export(client, args);
  if (command == "delete-dataset") return DeleteDataset(client, args);
  if (command == "artifacts") return Artifacts(client);
  if (command == "delete-artifact") return DeleteArtifact(client, args);
  return Usage(absl::StrCat("unknown command '", command, "'"));
}

}  // namespace
}  // namespace latentd::client

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(latentd::client::kHelp);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  return latentd::client::Run(args);
}
