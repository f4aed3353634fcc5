#include "client/model_commands.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/cli.h"
#include "client/dataset_commands.h"
#include "client/latent_view.h"
#include "client/latentctl_flags.h"
#include "client/steer_view.h"
#include "client/vocabulary.h"
#include "common/status_macros.h"

namespace latentd::client::cli {

namespace {

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
    if (!siblings.ok()) return StatusError(siblings.status());
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

}  // namespace

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
  if (!siblings.ok()) return StatusError(siblings.status());
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
  if (!siblings.ok()) return StatusError(siblings.status());
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
    if (!suite.ok()) return StatusError(suite.status());
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

}  // namespace latentd::client::cli
