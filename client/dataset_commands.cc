#include "client/dataset_commands.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "client/direction_file.h"
#include "client/explanation_files.h"
#include "client/job_commands.h"
#include "client/latent_view.h"
#include "client/latentctl_flags.h"
#include "client/row_ranges.h"
#include "client/telemetry_plot.h"
#include "client/vocabulary.h"
#include "common/read_file.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace latentd::client::cli {

namespace {

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

// GetLatentWeights of latent J with top_n neighbours and logits, --unembedding as the flag says.
v1::GetLatentWeightsRequest WeightsRequest(uint64_t id, int32_t latent, int top_n) {
  v1::GetLatentWeightsRequest request;
  request.set_dataset_id(id);
  request.set_latent(latent);
  request.set_top_n(top_n);
  request.set_unembedding(absl::GetFlag(FLAGS_unembedding));
  return request;
}

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

// The rows of `items` and of the file `file` (flag `file_flag` names it in errors; "" for
// none), parsed and merged (ParseRowRanges) into `out`, which is set even when empty; the
// number of ranges. With `sequence_rows` > 0 the items are sequences of that many rows each.
absl::StatusOr<size_t> FillRowRanges(const std::string& items, const char* file_flag,
                                     const std::string& file, int64_t sequence_rows,
                                     v1::RowRanges* out) {
  std::string text = items;
  if (!file.empty()) {
    absl::StatusOr<std::string> contents = ReadFileToString(file);
    if (!contents.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(file_flag, ": ", contents.status().message()));
    }
    absl::StrAppend(&text, " ", *contents);
  }
  ASSIGN_OR_RETURN(std::vector<RowRange> ranges, ParseRowRanges(text));
  if (sequence_rows > 0) {
    ASSIGN_OR_RETURN(ranges, RowsOfSequences(ranges, sequence_rows));
  }
  out->Clear();
  for (const RowRange& range : ranges) {
    v1::RowRange* added = out->add_ranges();
    added->set_start(range.start);
    added->set_count(range.count);
  }
  return ranges.size();
}

// What ReadNamedRows read: the ranges of each side (after merging), whether versus rows were
// given at all, and whether the items named sequences.
struct NamedRows {
  size_t ranges = 0;
  size_t versus_ranges = 0;
  bool contrast = false;
  bool by_sequence = false;
};

// The rows `onrows` and `probe` name: the items after the dataset id and --rows_file into
// `rows`, --versus and --versus_file into `versus` when either is given (else it is left as it
// is); with --sequences every item names whole sequences of the dataset's context_length rows.
// INVALID_ARGUMENT, to show as a usage error, for a bad item or file (prefixed with `command`:
// or --versus:) or a dataset without sequences; otherwise the status of the GetDataset call
// --sequences makes.
absl::StatusOr<NamedRows> ReadNamedRows(Client& client, uint64_t id, absl::string_view command,
                                        const std::vector<std::string>& args, v1::RowRanges* rows,
                                        v1::RowRanges* versus) {
  NamedRows named;
  const std::string versus_items = absl::GetFlag(FLAGS_versus);
  const std::string versus_file = absl::GetFlag(FLAGS_versus_file);
  named.contrast = !versus_items.empty() || !versus_file.empty();
  named.by_sequence = absl::GetFlag(FLAGS_sequences);
  int64_t sequence_rows = 0;
  if (named.by_sequence) {
    ASSIGN_OR_RETURN(const v1::DatasetInfo info, GetDatasetInfo(client, id));
    if (info.context_length() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sequences: dataset ", id, " has no sequences"));
    }
    sequence_rows = info.context_length();
  }
  absl::StatusOr<size_t> ranges =
      FillRowRanges(absl::StrJoin(args.begin() + 2, args.end(), " "), "--rows_file",
                    absl::GetFlag(FLAGS_rows_file), sequence_rows, rows);
  if (!ranges.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(command, ": ", ranges.status().message()));
  }
  named.ranges = *ranges;
  if (named.contrast) {
    absl::StatusOr<size_t> versus_ranges =
        FillRowRanges(versus_items, "--versus_file", versus_file, sequence_rows, versus);
    if (!versus_ranges.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--versus: ", versus_ranges.status().message()));
    }
    if (*versus_ranges == 0) {
      return absl::InvalidArgumentError("--versus: no rows to contrast with");
    }
    named.versus_ranges = *versus_ranges;
  }
  return named;
}

// A usage error for ReadNamedRows' INVALID_ARGUMENT, else the call's failure.
int NamedRowsError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ? Usage(std::string(status.message()))
                                                             : StatusError(status);
}

}  // namespace

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
  // In another hook's dataset the question is which latents are this one there: by F1.
  cofiring_request.set_order(v1::BY_F1);
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
    if (!written.ok()) return PlotError(written);
    std::printf("wrote %s\n", plot.c_str());
  }
  return 0;
}

namespace {

// Each nonzero bin of a histogram as a line: its low edge, a bar, its count; with `max_lines`
// > 0, neighbouring bins merged so that there are at most that many.
void PrintHistogramBins(const google::protobuf::RepeatedField<int64_t>& bins, double lo,
                        double width, int max_lines = 0) {
  if (bins.empty()) return;
  const int merge = max_lines > 0 ? (bins.size() + max_lines - 1) / max_lines : 1;
  const std::vector<int64_t> merged = MergeBins(bins, merge);
  const int64_t peak = *std::max_element(merged.begin(), merged.end());
  for (size_t b = 0; b < merged.size(); ++b) {
    if (merged[b] == 0) continue;
    std::printf("  %8.3g %s %lld\n", lo + width * merge * b, Bar(merged[b], peak).c_str(),
                static_cast<long long>(merged[b]));
  }
}

// An example row as one line: row, value, token and its window (ContextLine).
void PrintExample(const v1::TopActivation& t, const Vocabulary* decoder) {
  std::printf("  row %-9lld value %-9.4g token %-6d %s\n", static_cast<long long>(t.row()),
              t.value(), t.token_id(), ContextLine(t, decoder).c_str());
}

}  // namespace

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
  if (response.has_explanation()) {
    std::printf("explanation: %s\n", ExplanationLine(response.explanation()).c_str());
  }
  if (s.histogram_size() > 0) {
    std::printf("histogram of nonzero values [%.3g, %.3g]:\n", s.histogram_min(),
                s.histogram_max());
    PrintHistogramBins(s.histogram(), s.histogram_min(),
                       (s.histogram_max() - s.histogram_min()) / s.histogram_size());
  }
  auto print_row = [&](const v1::TopActivation& t) { PrintExample(t, decoder); };
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

int OnRows(Client& client, const std::vector<std::string>& args, RowsBy by) {
  const char* what = by == RowsBy::kToken ? "token" : by == RowsBy::kLatent ? "cofiring" : "onrows";
  uint64_t id;
  const std::string rows_file = absl::GetFlag(FLAGS_rows_file);
  const bool rows_given = args.size() >= 3 || (by == RowsBy::kRanges && !rows_file.empty());
  if (!ParseId(args, 1, &id) || !rows_given) {
    return Usage(absl::StrCat(what, " needs a dataset id and ",
                              by == RowsBy::kToken ? "a token (id, or text with --vocab)"
                              : by == RowsBy::kLatent
                                  ? "a latent index"
                                  : "rows (ROW or START:COUNT, or --rows_file)"));
  }
  std::optional<Vocabulary> vocab;
  if (std::string error; !LoadVocabFlag(&vocab, &error)) return Usage(error);
  v1::LatentsOnRowsRequest request;
  request.set_dataset_id(id);
  std::string selection;  // the rows, as the heading names them
  const bool contrast =
      !absl::GetFlag(FLAGS_versus).empty() || !absl::GetFlag(FLAGS_versus_file).empty();
  if (contrast && by != RowsBy::kRanges) return Usage("--versus: only with onrows");
  if (absl::GetFlag(FLAGS_sequences) && by != RowsBy::kRanges) {
    return Usage("--sequences: only with onrows");
  }
  const std::string plot = absl::GetFlag(FLAGS_plot);
  if (by == RowsBy::kRanges) {
    v1::RowRanges versus;  // set in the request only when given (its presence asks to contrast)
    absl::StatusOr<NamedRows> named =
        ReadNamedRows(client, id, "onrows", args, request.mutable_row_ranges(), &versus);
    if (!named.ok()) return NamedRowsError(named.status());
    if (named->contrast) *request.mutable_versus_row_ranges() = std::move(versus);
    selection = absl::StrCat("named (", named->ranges, named->ranges == 1 ? " range" : " ranges",
                             named->by_sequence ? " of whole sequences)" : ")");
  } else {
    int32_t selector = 0;
    if (!absl::SimpleAtoi(args[2], &selector)) {
      if (by != RowsBy::kToken || !vocab)
        return Usage(absl::StrCat(what, ": '", args[2], "' is not an integer"));
      const std::vector<int32_t> ids = vocab->Find(args[2]);
      if (ids.size() != 1) {
        return Usage(absl::StrCat("token '", args[2], "': ", ids.size(),
                                  " tokens of the vocabulary are exactly that text"));
      }
      selector = ids[0];
    }
    if (by == RowsBy::kToken) {
      request.set_token_id(selector);
      selection = absl::StrCat("of token ", selector,
                               vocab ? absl::StrCat(" \"", vocab->Display(selector), "\"") : "");
    } else {
      request.set_with_latent(selector);
      selection = absl::StrCat("where latent ", selector, " fires");
    }
  }
  const std::string rank = absl::GetFlag(FLAGS_rank);
  if (rank == "difference" && !contrast) return Usage("--rank=difference needs --versus");
  if (rank != "count" && rank != "lift" && rank != "f1" && rank != "difference") {
    return Usage("--rank: use count, lift, f1 or (with --versus) difference");
  }
  request.set_order(rank == "lift"         ? v1::BY_LIFT
                    : rank == "f1"         ? v1::BY_F1
                    : rank == "difference" ? v1::BY_DIFFERENCE
                                           : v1::BY_COUNT);
  request.set_limit(absl::GetFlag(FLAGS_limit));
  request.set_max_rows(absl::GetFlag(FLAGS_max_rows));
  request.set_min_count(absl::GetFlag(FLAGS_min_count));
  request.set_in_dataset_id(absl::GetFlag(FLAGS_in_dataset));
  v1::LatentsOnRowsResponse response;
  grpc::Status status =
      client.datasets()->LatentsOnRows(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  const uint64_t counted = request.in_dataset_id() != 0 ? request.in_dataset_id() : id;
  if (!plot.empty()) {
    // The first ten (the best by the order asked) carry their numbers.
    absl::Status written =
        contrast
            ? WriteContrastPlot(response,
                                absl::StrCat("dataset ", counted, ": named rows against others"),
                                10, plot)
            : WriteDetectorPlot(
                  response, absl::StrCat("dataset ", counted, ": latents as detectors of the rows"),
                  10, plot);
    if (!written.ok()) return PlotError(written);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  std::printf("dataset %llu: latents on the %lld rows %s%s (%lld read)\n",
              static_cast<unsigned long long>(counted),
              static_cast<long long>(response.rows_selected()), selection.c_str(),
              counted != id ? absl::StrCat(" in dataset ", id).c_str() : "",
              static_cast<long long>(response.rows_read()));
  if (contrast) {
    std::printf("versus %lld rows (%lld read)\n",
                static_cast<long long>(response.versus_rows_selected()),
                static_cast<long long>(response.versus_rows_read()));
    std::printf("%-8s %-9s %-9s %-9s %-9s %-10s %-10s %s\n", "LATENT", "COUNT", "FRACTION",
                "VERSUS", "DIFF", "MEAN", "VS MEAN", "LIFT");
    for (const v1::RowLatent& l : response.latents()) {
      std::printf("%-8d %-9lld %-9.4f %-9.4f %-+9.4f %-10.4g %-10.4g %.4g\n", l.latent(),
                  static_cast<long long>(l.count()), l.fraction(), l.versus_fraction(),
                  l.fraction() - l.versus_fraction(), l.mean(), l.versus_mean(), l.lift());
    }
    if (!plot.empty()) std::printf("wrote %s\n", plot.c_str());
    return 0;
  }
  std::printf("%-8s %-9s %-9s %-10s %-9s %-9s %s\n", "LATENT", "COUNT", "FRACTION", "MEAN", "LIFT",
              "PRECISION", "F1");
  for (const v1::RowLatent& l : response.latents()) {
    std::printf("%-8d %-9lld %-9.4f %-10.4g %-9.4g %-9.4f %.4f\n", l.latent(),
                static_cast<long long>(l.count()), l.fraction(), l.mean(), l.lift(), l.precision(),
                l.f1());
  }
  if (!plot.empty()) std::printf("wrote %s\n", plot.c_str());
  return 0;
}

namespace {

// The direction `project` is asked for: the file args[2], or with --latent=D:J latent J's
// decoder row in dataset D's SAE (GetLatentWeights); *named says which, for the headings.
// nullopt when it was read, else the exit code (why was printed).
std::optional<int> ProjectDirection(Client& client, const std::vector<std::string>& args,
                                    std::vector<float>* direction, std::string* named) {
  const std::string latent_flag = absl::GetFlag(FLAGS_latent);
  if (latent_flag.empty()) {
    absl::StatusOr<std::vector<float>> read = ReadDirection(args[2]);
    if (!read.ok()) return Usage(std::string(read.status().message()));
    *direction = *std::move(read);
    *named = args[2];
    return std::nullopt;
  }
  const std::vector<std::string> parts = absl::StrSplit(latent_flag, ':');
  uint64_t sae_dataset = 0;
  int32_t latent = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &sae_dataset) ||
      !absl::SimpleAtoi(parts[1], &latent)) {
    return Usage(absl::StrCat("--latent: \"", latent_flag, "\" is not DATASET:LATENT"));
  }
  v1::GetLatentWeightsRequest request;
  request.set_dataset_id(sae_dataset);
  request.set_latent(latent);
  request.set_top_n(1);
  request.set_include_decoder(true);
  v1::GetLatentWeightsResponse weights;
  grpc::Status status =
      client.datasets()->GetLatentWeights(client.Context().get(), request, &weights);
  if (!status.ok()) return RpcError(status);
  direction->assign(weights.decoder().begin(), weights.decoder().end());
  *named = absl::StrCat("latent ", latent, "'s decoder row in dataset ", sae_dataset);
  return std::nullopt;
}

}  // namespace

int Project(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id) || args.size() != (absl::GetFlag(FLAGS_latent).empty() ? 3 : 2)) {
    return Usage(
        "project needs a DENSE dataset id and a direction file (.npy or text), or "
        "--latent=D:J");
  }
  std::vector<float> direction;
  std::string named;
  if (std::optional<int> failed = ProjectDirection(client, args, &direction, &named)) {
    return *failed;
  }
  std::optional<Vocabulary> vocab;
  if (std::string error; !LoadVocabFlag(&vocab, &error)) return Usage(error);
  const Vocabulary* decoder = vocab ? &*vocab : nullptr;
  const bool cosine = absl::GetFlag(FLAGS_cosine);
  v1::ProjectRowsRequest request;
  request.set_dataset_id(id);
  request.mutable_direction()->Assign(direction.begin(), direction.end());
  request.set_measure(cosine ? v1::PROJECTION_COSINE : v1::PROJECTION_DOT);
  request.set_top_n(absl::GetFlag(FLAGS_top));
  request.set_context_before(absl::GetFlag(FLAGS_before));
  request.set_context_after(absl::GetFlag(FLAGS_after_tokens));
  request.set_distinct_sequences(absl::GetFlag(FLAGS_distinct));
  request.set_row_start(absl::GetFlag(FLAGS_start));
  request.set_row_count(absl::GetFlag(FLAGS_count));
  v1::ProjectRowsResponse response;
  grpc::Status status = client.datasets()->ProjectRows(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  const std::string measure = cosine ? "cos(x, v)" : "x . v";
  if (const std::string plot = absl::GetFlag(FLAGS_plot); !plot.empty()) {
    HistogramPlot histogram;
    histogram.bins.assign(response.histogram().begin(), response.histogram().end());
    histogram.lo = response.min();
    histogram.bin_width = response.bin_width();
    histogram.title = absl::StrCat("dataset ", id, ": ", measure, " on each row");
    histogram.subtitle = absl::StrFormat("v = %s; %lld rows, mean %.4g, stddev %.4g", named,
                                         static_cast<long long>(response.rows()), response.mean(),
                                         response.stddev());
    histogram.x_label = measure;
    histogram.y_label = "rows";
    if (absl::Status written = WriteHistogramPlot(histogram, plot); !written.ok()) {
      return PlotError(written);
    }
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  std::printf("dataset %llu: %s over %lld rows, v = %s (%zu values)\n",
              static_cast<unsigned long long>(id), measure.c_str(),
              static_cast<long long>(response.rows()), named.c_str(), direction.size());
  std::printf("mean %.4g, stddev %.4g, min %.4g, max %.4g\n", response.mean(), response.stddev(),
              response.min(), response.max());
  PrintHistogramBins(response.histogram(), response.min(), response.bin_width(),
                     /*max_lines=*/16);
  const bool distinct = absl::GetFlag(FLAGS_distinct);
  std::printf("largest%s:\n", distinct ? " (a row per sequence, its largest)" : "");
  for (const v1::TopActivation& t : response.largest()) PrintExample(t, decoder);
  std::printf("smallest%s:\n", distinct ? " (a row per sequence, its smallest)" : "");
  for (const v1::TopActivation& t : response.smallest()) PrintExample(t, decoder);
  if (const std::string plot = absl::GetFlag(FLAGS_plot); !plot.empty()) {
    std::printf("wrote %s\n", plot.c_str());
  }
  return 0;
}

namespace {

// What SetExplanations stored in dataset `id`, as a line or (--json) the response.
int PrintStored(uint64_t id, const v1::SetExplanationsResponse& response) {
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  std::printf("dataset %llu: stored %d %s; %lld latents explained\n",
              static_cast<unsigned long long>(id), response.stored(),
              response.stored() == 1 ? "explanation" : "explanations",
              static_cast<long long>(response.explained()));
  return 0;
}

// The explanations of the delphi run (or explanations directory) at `path` for dataset `id`,
// added to *request: the module that is this dataset, scored by a classifier scorer's
// verdicts where the run has them; `source`, when given, replaces theirs. Says what it read
// (unless --json). nullopt, else the exit code (why was printed).
std::optional<int> AddDelphiRun(Client& client, uint64_t id, const std::string& path,
                                const std::string& source, v1::SetExplanationsRequest* request) {
  absl::StatusOr<DelphiRun> run = LocateDelphiRun(path, absl::GetFlag(FLAGS_scores));
  if (!run.ok()) return Usage(std::string(run.status().message()));
  const std::vector<std::string> modules = DelphiModules(*run);
  std::string hook;  // asked for only when the module must be chosen by it
  if (modules.size() > 1 && absl::GetFlag(FLAGS_module).empty()) {
    absl::StatusOr<v1::DatasetInfo> info = GetDatasetInfo(client, id);
    if (!info.ok()) return StatusError(info.status());
    hook = info->hook_name();
  }
  absl::StatusOr<std::string> module =
      ChooseDelphiModule(modules, absl::GetFlag(FLAGS_module), hook);
  if (!module.ok()) {
    return Usage(absl::StrCat(run->explanations_dir, ": ", module.status().message()));
  }
  absl::StatusOr<std::vector<v1::LatentExplanation>> read = ReadDelphiExplanations(*run, *module);
  if (!read.ok()) return Usage(std::string(read.status().message()));
  int64_t scored = 0;
  for (v1::LatentExplanation& e : *read) {
    scored += e.has_score();
    if (!source.empty()) e.set_source(source);
  }
  if (!absl::GetFlag(FLAGS_json)) {
    std::string line = absl::StrCat("read ", read->size(), " explanations");
    if (!module->empty()) absl::StrAppend(&line, " of ", *module);
    absl::StrAppend(&line, " from ", run->explanations_dir);
    if (!run->scores_dir.empty()) {
      absl::StrAppend(&line, "; ", scored, " scored by ", run->scores_dir, " (balanced accuracy)");
    }
    std::printf("%s\n", line.c_str());
  }
  request->mutable_explanations()->Assign(read->begin(), read->end());
  return std::nullopt;
}

}  // namespace

int Explain(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  const uint64_t from = absl::GetFlag(FLAGS_from_dataset);
  if (!ParseId(args, 1, &id) || args.size() != (from != 0 ? 2 : 3)) {
    return Usage(
        "explain needs a dataset id and a file, a directory, a latent with --text, or "
        "--from_dataset");
  }
  v1::SetExplanationsRequest request;
  request.set_dataset_id(id);
  request.set_replace_all(absl::GetFlag(FLAGS_replace_all));
  if (from != 0) {
    // Copied by the daemon, in one write: no explanation crosses the wire.
    request.set_from_dataset_id(from);
    v1::SetExplanationsResponse response;
    grpc::Status status =
        client.datasets()->SetExplanations(client.Context().get(), request, &response);
    if (!status.ok()) return RpcError(status);
    return PrintStored(id, response);
  }
  const std::string source = absl::GetFlag(FLAGS_source);
  if (int32_t latent = 0; absl::SimpleAtoi(args[2], &latent)) {
    // One explanation, written by hand.
    const std::string text = absl::GetFlag(FLAGS_text);
    if (text.empty()) return Usage("explain ID J: give the explanation with --text");
    v1::LatentExplanation* e = request.add_explanations();
    e->set_latent(latent);
    e->set_text(text);
    if (const double score = absl::GetFlag(FLAGS_score); !std::isnan(score)) e->set_score(score);
    e->set_source(source.empty() ? "human" : source);
  } else if (std::filesystem::is_directory(args[2])) {
    if (std::optional<int> failed = AddDelphiRun(client, id, args[2], source, &request)) {
      return *failed;
    }
  } else {
    absl::StatusOr<std::vector<v1::LatentExplanation>> read = ReadExplanations(args[2], source);
    if (!read.ok()) return Usage(std::string(read.status().message()));
    request.mutable_explanations()->Assign(read->begin(), read->end());
  }
  // In calls of at most 8 MiB (the daemon takes 16 MiB a message; an SAE of 10^6 explained
  // latents holds ~100 MB of them), each stored whole; replace_all goes with the first.
  const std::vector<v1::LatentExplanation> all(request.explanations().begin(),
                                               request.explanations().end());
  v1::SetExplanationsResponse response;
  int64_t stored = 0;
  for (const std::vector<v1::LatentExplanation>& batch : ExplanationBatches(all, 8 << 20)) {
    request.mutable_explanations()->Assign(batch.begin(), batch.end());
    grpc::Status status =
        client.datasets()->SetExplanations(client.Context().get(), request, &response);
    if (!status.ok()) {
      if (stored > 0) {
        std::fprintf(stderr, "latentctl: %lld explanations were stored before this call\n",
                     static_cast<long long>(stored));
      }
      return RpcError(status);
    }
    stored += response.stored();
    request.set_replace_all(false);
  }
  response.set_stored(static_cast<int32_t>(stored));
  return PrintStored(id, response);
}

int Search(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  if (!ParseId(args, 1, &id)) return Usage("search needs a dataset id (and words to look for)");
  v1::SearchExplanationsRequest request;
  request.set_dataset_id(id);
  request.set_query(absl::StrJoin(args.begin() + 2, args.end(), " "));
  request.set_limit(absl::GetFlag(FLAGS_limit));
  v1::SearchExplanationsResponse response;
  grpc::Status status =
      client.datasets()->SearchExplanations(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  std::printf("dataset %llu: %lld of %lld explanations match \"%s\"\n",
              static_cast<unsigned long long>(id), static_cast<long long>(response.matched()),
              static_cast<long long>(response.explained()), request.query().c_str());
  std::printf("%-8s %-7s %-12s %s\n", "LATENT", "SCORE", "SOURCE", "EXPLANATION");
  for (const v1::LatentExplanation& e : response.explanations()) {
    std::printf("%-8d %-7s %-12s %s\n", e.latent(),
                e.has_score() ? absl::StrFormat("%.3g", e.score()).c_str() : "-",
                e.source().c_str(), e.text().c_str());
  }
  return 0;
}

int Probe(Client& client, const std::vector<std::string>& args) {
  uint64_t id;
  const bool rows_given = args.size() >= 3 || !absl::GetFlag(FLAGS_rows_file).empty();
  if (!ParseId(args, 1, &id) || !rows_given) {
    return Usage("probe needs a dataset id and rows (ROW or START:COUNT, or --rows_file)");
  }
  v1::SparseProbeRequest request;
  request.set_dataset_id(id);
  absl::StatusOr<NamedRows> named = ReadNamedRows(
      client, id, "probe", args, request.mutable_row_ranges(), request.mutable_versus_row_ranges());
  if (!named.ok()) return NamedRowsError(named.status());
  if (!named->contrast) return Usage("probe needs --versus or --versus_file: the negatives");
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_ks), ',', absl::SkipEmpty())) {
    int32_t k = 0;
    if (!absl::SimpleAtoi(item, &k)) {
      return Usage(absl::StrCat("--ks: '", item, "' is not an integer"));
    }
    request.add_ks(k);
  }
  request.set_test_fraction(absl::GetFlag(FLAGS_test_fraction));
  request.set_seed(absl::GetFlag(FLAGS_seed));
  request.set_l2(absl::GetFlag(FLAGS_l2));
  request.set_max_rows(absl::GetFlag(FLAGS_max_rows));
  request.set_balanced(absl::GetFlag(FLAGS_balanced));
  const std::string pool = absl::GetFlag(FLAGS_pool);
  if (pool != "" && pool != "mean" && pool != "max") return Usage("--pool: use mean or max");
  if (!pool.empty() && !named->by_sequence) {
    return Usage("--pool: name sequences (--sequences), each pooled into one example");
  }
  request.set_pool(pool == "mean" ? v1::POOL_MEAN : pool == "max" ? v1::POOL_MAX : v1::POOL_NONE);
  const std::string select = absl::GetFlag(FLAGS_select);
  if (select != "fraction" && select != "mean") return Usage("--select: use fraction or mean");
  request.set_select(select == "mean" ? v1::SELECT_BY_MEAN : v1::SELECT_BY_FRACTION);
  v1::SparseProbeResponse response;
  grpc::Status status = client.datasets()->SparseProbe(client.Context().get(), request, &response);
  if (!status.ok()) return RpcError(status);
  const std::string plot = absl::GetFlag(FLAGS_plot);
  if (!plot.empty()) {
    absl::Status written =
        WriteSparseProbePlot(response, absl::StrCat("dataset ", id, ": k-sparse probe"), plot);
    if (!written.ok()) return PlotError(written);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  const char* unit = pool.empty() ? "rows" : "sequences";
  std::printf("dataset %llu: k-sparse probe of %lld rows, named (%zu %s) against others (%zu %s)\n",
              static_cast<unsigned long long>(id), static_cast<long long>(response.rows_read()),
              named->ranges, named->ranges == 1 ? "range" : "ranges", named->versus_ranges,
              named->versus_ranges == 1 ? "range" : "ranges");
  std::printf(
      "%s: %lld + %lld to train on, %lld + %lld held out (positive + negative); "
      "latents chosen by %s\n",
      unit, static_cast<long long>(response.train_positive()),
      static_cast<long long>(response.train_negative()),
      static_cast<long long>(response.test_positive()),
      static_cast<long long>(response.test_negative()),
      select == "mean" ? "mean difference" : "firing fraction difference");
  std::printf("%-5s %-9s %-9s %-9s %-9s %-9s %-9s %s\n", "K", "TRAIN_ACC", "TEST_ACC", "BAL_ACC",
              "PRECISION", "RECALL", "F1", "LATENTS (WEIGHT PER UNIT OF VALUE)");
  for (const v1::SparseProbeFit& fit : response.fits()) {
    std::string chosen;
    for (int i = 0; i < fit.weights_size(); ++i) {
      absl::StrAppend(&chosen, i > 0 ? ", " : "", response.latents(i),
                      absl::StrFormat(" (%+.3g)", fit.weights(i)));
    }
    std::printf("%-5d %-9.4f %-9.4f %-9.4f %-9.4f %-9.4f %-9.4f %s\n", fit.k(),
                fit.train_accuracy(), fit.test_accuracy(), fit.test_balanced_accuracy(),
                fit.test_precision(), fit.test_recall(), fit.test_f1(),
                chosen.empty() ? "(none fired: the intercept alone)" : chosen.c_str());
  }
  if (!plot.empty()) std::printf("wrote %s\n", plot.c_str());
  if (!absl::GetFlag(FLAGS_all_hooks)) return 0;
  // The same labels and split (it depends on the rows and the seed alone) through the other
  // hooks (and SAEs) over the same rows: where along the model the concept is best read.
  absl::StatusOr<v1::DatasetInfo> info = GetDatasetInfo(client, id);
  if (!info.ok()) return StatusError(info.status());
  auto siblings = SiblingDatasets(client, *info);
  if (!siblings.ok()) return StatusError(siblings.status());
  std::printf("held-out balanced accuracy by hook (the same split):\n%-40s", "DATASET");
  for (const v1::SparseProbeFit& fit : response.fits()) {
    std::printf(" %-8s", absl::StrCat("K=", fit.k()).c_str());
  }
  std::printf("\n");
  const auto print_row = [](const std::string& label, const v1::SparseProbeResponse& probe) {
    std::printf("%-40s", label.c_str());
    for (const v1::SparseProbeFit& fit : probe.fits()) {
      std::printf(" %-8.4f", fit.test_balanced_accuracy());
    }
    std::printf("\n");
  };
  print_row(DatasetLabel(*info), response);
  for (const v1::DatasetInfo& d : *siblings) {
    request.set_dataset_id(d.id());
    v1::SparseProbeResponse other;
    status = client.datasets()->SparseProbe(client.Context().get(), request, &other);
    if (!status.ok()) return RpcError(status);
    print_row(DatasetLabel(d), other);
  }
  return 0;
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
    if (!s.ok()) return PlotError(s);
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
  if (!found_siblings.ok()) return StatusError(found_siblings.status());
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
  // What was written about the latents: a column of the index when anything was.
  v1::SearchExplanationsRequest search;
  search.set_dataset_id(id);
  search.set_limit(10000);
  v1::SearchExplanationsResponse explained;
  status = client.datasets()->SearchExplanations(client.Context().get(), search, &explained);
  if (!status.ok()) return RpcError(status);
  std::map<int32_t, v1::LatentExplanation> explanations;
  for (const v1::LatentExplanation& e : explained.explanations()) explanations[e.latent()] = e;
  if (!explanations.empty()) index.explanations = &explanations;
  if (!WriteFile(dir / "index.html", LatentIndexHtml(overview, index))) return kExitRpcError;
  std::printf("wrote %s with %d latent pages\n", (dir / "index.html").c_str(), total);
  return 0;
}

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

}  // namespace latentd::client::cli
