// engine/dataset_models on SAEs of growing width. GetLatentWeights: the first query of an SAE
// (read the safetensors, check its hash, prepare unit decoder rows; draw the reference model for
// its embedding) against later ones served from the prepared weights (two matrix-vector products
// and two top-k). EncodePrompt of 128 tokens: the first (loads model and SAE for encoding)
// against later ones. Side by side in one run.
//
//   bazel run -c opt //bench:dataset_models_bench -- [widths=4096,32768,131072] [d_in=768]
//       [vocab=50257] [queries=50]
//
// With suite=N: an SAE suite instead (N layers, an SAE of 4096 latents on each layer's residual
// stream) and a prompt through every layer's dataset in turn, as `latentctl prompt --all_hooks`
// asks: the suite extracted by one job (its datasets share one model) against the same suite
// extracted by N one-hook jobs (a model per dataset), rounds=R times each; then an attribution
// graph of the prompt's prediction over the suite (4 nodes a hook), the median of R, with a
// forward per pass, per hook, and per hook with the ablation check of every edge.
//
// With steer=N: SteerPrompt on a 64-token prompt of a reference model of layers=L (default 12,
// GPT-2 small's shape at d_in 768) with an SAE of 4096 latents at its middle block, without and
// with N generated tokens (the median of rounds=R calls each): the cost of a generated token;
// sweep=K adds K values of the intervention (K more rows a batch). Then AttributePrompt (to the
// next token, to a latent, with the ablation check of its top 8 entries), and the same steering
// through a crosscoder over the middle block and the one before it (4096 latents), whose
// latents are read in a pass before each steered one, and through a crosscoder over two
// models' activations at the middle block (model diffing: the reference model and one of
// another seed), steered in the second with the first running beside it (and attributed so).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/process_memory.h"
#include "engine/attribution_graph.h"
#include "engine/crosscoder_model.h"
#include "engine/dataset_models.h"
#include "engine/sae.h"
#include "engine/stored_dense.h"

namespace {

using latentd::engine::DatasetModels;
using latentd::engine::DatasetSource;
using latentd::engine::LatentWeightsQuery;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

latentd::v1::ReferenceModelSpec BenchModel(int64_t d_in, int64_t vocab, int64_t layers) {
  latentd::v1::ReferenceModelSpec model;
  model.set_d_model(d_in);
  model.set_n_layers(layers);
  model.set_n_heads(12);
  model.set_vocab_size(vocab);
  model.set_context_length(128);
  return model;
}

// Writes a TopK SAE (k 32) of random weights to `dir`; its weight hash, or "" on failure.
std::string WriteBenchSae(const std::string& dir, int64_t d_sae, int64_t d_in, uint64_t seed) {
  at::manual_seed(seed);
  latentd::engine::SaeWeights w;
  w.W_dec = at::randn({d_sae, d_in});
  w.W_enc = w.W_dec.t().contiguous();
  w.b_enc = at::zeros({d_sae});
  w.b_dec = at::zeros({d_in});
  latentd::engine::SaeConfig cfg;
  cfg.d_in = d_in;
  cfg.d_sae = d_sae;
  cfg.k = 32;
  if (!latentd::engine::SaveSae(dir, w, cfg).ok()) return "";
  return latentd::engine::Sae::Load(dir)->weight_hash();
}

// The median wall time of `rounds` calls of `call`; nullopt, after saying why, when one fails.
template <typename Call>
std::optional<double> MedianSeconds(int64_t rounds, Call call) {
  std::vector<double> times;
  for (int64_t r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = call();
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
      return std::nullopt;
    }
    times.push_back(Seconds(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The suite=N mode (see the top of the file).
int RunSuite(const std::string& root, int64_t layers, int64_t d_in, int64_t vocab, int64_t rounds) {
  std::vector<std::string> dirs, hashes, hooks;
  for (int64_t l = 0; l < layers; ++l) {
    dirs.push_back(root + "/suite-" + std::to_string(l));
    hashes.push_back(WriteBenchSae(dirs.back(), 4096, d_in, 10 + l));
    if (hashes.back().empty()) return 1;
    hooks.push_back("blocks." + std::to_string(l) + ".hook_resid_post");
  }
  std::map<uint64_t, latentd::v1::Job> jobs;
  // Job 1: every layer; jobs 2 .. N + 1: one layer each.
  for (int64_t l = 0; l < layers; ++l) {
    latentd::v1::ExtractSpec* spec = jobs[2 + l].mutable_spec()->mutable_extract();
    *spec->mutable_model()->mutable_reference() = BenchModel(d_in, vocab, layers);
    spec->set_hook_name(hooks[l]);
    spec->mutable_sae()->set_path(dirs[l]);
    if (l == 0) {
      *jobs[1].mutable_spec() = jobs[2].spec();
    } else {
      latentd::v1::ExtractOutput* out =
          jobs[1].mutable_spec()->mutable_extract()->add_more_outputs();
      out->set_hook_name(hooks[l]);
      out->mutable_sae()->set_path(dirs[l]);
    }
  }
  latentd::engine::ExtractEnv env;
  env.data_roots = {root};
  env.find_job = [&jobs](uint64_t id) -> absl::StatusOr<latentd::v1::Job> { return jobs.at(id); };
  latentd::engine::PromptQuery prompt;
  for (int64_t t = 0; t < 32; ++t) prompt.token_ids.push_back((t * 104729) % vocab);
  std::printf(
      "dataset_models_bench suite: %lld layers, d_model %lld, vocab %lld, SAEs of 4096, "
      "a 32-token prompt through every layer's dataset, %lld rounds\n",
      static_cast<long long>(layers), static_cast<long long>(d_in), static_cast<long long>(vocab),
      static_cast<long long>(rounds));
  std::printf("%-22s %-14s %-16s %-9s %s\n", "SUITE", "FIRST_ROUND_S", "LATER_ROUND_P50_S",
              "CACHE_MB", "RSS_MB");
  for (const bool one_job : {true, false}) {
    DatasetModels reader(env);
    std::vector<double> later;
    double first = 0;
    for (int64_t r = 0; r <= rounds; ++r) {
      const auto start = std::chrono::steady_clock::now();
      for (int64_t l = 0; l < layers; ++l) {
        const std::string name = l == 0 ? "extract-1" : "extract-1." + hooks[l];
        const DatasetSource source{static_cast<uint64_t>(100 + l),
                                   one_job ? 1 : static_cast<uint64_t>(2 + l),
                                   hashes[l],
                                   "",
                                   4096,
                                   one_job ? name : ""};
        auto got = reader.EncodePrompt(source, prompt);
        if (!got.ok()) {
          std::fprintf(stderr, "%s\n", std::string(got.status().message()).c_str());
          return 1;
        }
      }
      if (r == 0) {
        first = Seconds(start);  // loads models and SAEs
      } else {
        later.push_back(Seconds(start));
      }
    }
    std::sort(later.begin(), later.end());
    std::printf("%-22s %-14.3f %-16.3f %-9.0f %.0f\n",
                one_job ? "one job, N hooks" : "N jobs, one hook each", first,
                later.empty() ? 0.0 : later[later.size() / 2], reader.cached_bytes() / 1e6,
                latentd::ProcessRssBytes() / 1e6);
  }
  // An attribution graph of the prompt's prediction over the one-job suite, 4 nodes a hook.
  DatasetModels reader(env);
  std::vector<DatasetSource> sources;
  for (int64_t l = 0; l < layers; ++l) {
    sources.push_back({static_cast<uint64_t>(100 + l), 1, hashes[l], "", 4096,
                       l == 0 ? "extract-1" : "extract-1." + hooks[l]});
  }
  latentd::engine::AttributionQuery metric;
  metric.token_ids = prompt.token_ids;
  latentd::engine::GraphPasses shared;  // a forward per hook, shared by its targets
  shared.metric = [&](int hook, const latentd::engine::AttributionQuery& query) {
    return reader.AttributePrompt(sources[hook], query);
  };
  shared.latents = [&](int hook, const latentd::engine::AttributionQuery& query, int target_hook,
                       const std::vector<latentd::engine::TargetLatent>& targets) {
    return reader.AttributeToLatents(sources[hook], query, sources[target_hook], targets);
  };
  latentd::engine::GraphPasses apart = shared;  // a forward per target, as before
  apart.latents = [&](int hook, const latentd::engine::AttributionQuery& query, int target_hook,
                      const std::vector<latentd::engine::TargetLatent>& targets)
      -> absl::StatusOr<std::vector<absl::StatusOr<latentd::engine::AttributionResult>>> {
    std::vector<absl::StatusOr<latentd::engine::AttributionResult>> answers;
    for (const latentd::engine::TargetLatent& t : targets) {
      latentd::engine::AttributionQuery one = query;
      one.target_latent = t;
      answers.push_back(reader.AttributePrompt(sources[hook], one, &sources[target_hook]));
    }
    return answers;
  };
  for (const auto& [name, passes] :
       {std::pair{"a forward per target", &apart}, std::pair{"a forward per hook", &shared}}) {
    int made = 0;
    const std::optional<double> graph = MedianSeconds(rounds, [&] {
      return latentd::engine::BuildAttributionGraph(hooks, metric, {4}, *passes,
                                                    [&](int, int n) { made = n; })
          .status();
    });
    if (!graph) return 1;
    std::printf(
        "AttributionGraph over the %lld hooks, 4 nodes a hook, %s: %.3f s (median), %d "
        "passes\n",
        static_cast<long long>(layers), name, *graph, made);
  }
  // The same graph with every edge's ablation check (a batch of 5 runs per child).
  latentd::engine::GraphOptions checked;
  checked.ablate = true;
  const std::optional<double> with_check = MedianSeconds(rounds, [&] {
    return latentd::engine::BuildAttributionGraph(hooks, metric, checked, shared).status();
  });
  if (!with_check) return 1;
  std::printf(
      "AttributionGraph, a forward per hook, with the ablation check of its edges: %.3f s "
      "(median)\n",
      *with_check);
  return 0;
}

}  // namespace

// A BatchTopK crosscoder of 4096 latents over `sources` (d_in wide each), random weights of
// `seed`, its threshold calibrated on random rows, saved to `dir`; false (said on stderr) when
// it cannot be.
bool WriteBenchCrosscoder(const std::string& dir, int64_t d_in, uint64_t seed,
                          const std::vector<latentd::engine::CrosscoderSource>& sources) {
  latentd::engine::CrosscoderModelOptions options;
  options.sources = static_cast<int64_t>(sources.size());
  options.d_in = d_in;
  options.d_sae = 4096;
  options.seed = seed;
  latentd::engine::CrosscoderModelImpl crosscoder(options);
  crosscoder.InitWeights();
  crosscoder.CalibrateBatchThreshold({at::randn({256, options.sources * d_in})});
  const absl::Status saved = crosscoder.Save(dir, sources);
  if (!saved.ok()) std::fprintf(stderr, "%s\n", std::string(saved.message()).c_str());
  return saved.ok();
}

// The steer=N mode (see the top of the file).
int RunSteer(const std::string& root, int64_t new_tokens, int64_t d_in, int64_t vocab,
             int64_t layers, int64_t rounds, int64_t sweep) {
  const std::string dir = root + "/steer-sae";
  const std::string hash = WriteBenchSae(dir, 4096, d_in, 1);
  if (hash.empty()) return 1;
  latentd::v1::Job job;
  latentd::v1::ExtractSpec* spec = job.mutable_spec()->mutable_extract();
  *spec->mutable_model()->mutable_reference() = BenchModel(d_in, vocab, layers);
  spec->set_hook_name(absl::StrCat("blocks.", layers / 2, ".hook_resid_post"));
  spec->mutable_sae()->set_path(dir);
  // Job 2: a crosscoder (BatchTopK, calibrated on random rows) over the block before the
  // middle one and the middle one.
  const std::string crosscoder_dir = root + "/steer-crosscoder";
  const std::string before = absl::StrCat("blocks.", layers / 2 - 1, ".hook_resid_post");
  latentd::v1::Job crosscoder_job = job;
  {
    if (!WriteBenchCrosscoder(
            crosscoder_dir, d_in, 3,
            {{before, "reference", "live"}, {spec->hook_name(), "reference", "live"}})) {
      return 1;
    }
    latentd::v1::ExtractSpec* c = crosscoder_job.mutable_spec()->mutable_extract();
    c->add_crosscoder_hooks(spec->hook_name());
    c->set_hook_name(before);
    c->mutable_sae()->set_path(crosscoder_dir);
  }
  auto crosscoder_sae = latentd::engine::Sae::Load(crosscoder_dir);
  if (!crosscoder_sae.ok()) return 1;
  // Job 3: a crosscoder over two models' stored activations at the middle hook (model
  // diffing): stored datasets 1 and 2 of jobs 4 (the model) and 5 (the same of another seed).
  const std::string diff_dir = root + "/steer-diff";
  latentd::v1::Job diff_job, second_model_job = job;
  {
    if (!WriteBenchCrosscoder(
            diff_dir, d_in, 4,
            {{spec->hook_name(), "base", "live"}, {spec->hook_name(), "chat", "live"}})) {
      return 1;
    }
    latentd::v1::ExtractSpec* d = diff_job.mutable_spec()->mutable_extract();
    d->mutable_model()->mutable_stored()->add_dataset_ids(1);
    d->mutable_model()->mutable_stored()->add_dataset_ids(2);
    d->mutable_sae()->set_path(diff_dir);
    latentd::v1::ReferenceModelSpec* chat =
        second_model_job.mutable_spec()->mutable_extract()->mutable_model()->mutable_reference();
    chat->set_seed(chat->seed() + 1);
  }
  auto diff_sae = latentd::engine::Sae::Load(diff_dir);
  if (!diff_sae.ok()) return 1;
  latentd::engine::ExtractEnv env;
  env.data_roots = {root};
  env.find_job = [&](uint64_t id) -> absl::StatusOr<latentd::v1::Job> {
    switch (id) {
      case 2:
        return crosscoder_job;
      case 3:
        return diff_job;
      case 5:
        return second_model_job;
      default:
        return job;
    }
  };
  env.open_stored_dense = [&](uint64_t id, const std::string&)
      -> absl::StatusOr<std::shared_ptr<const latentd::engine::StoredDenseRows>> {
    latentd::engine::StoredDenseInfo info;
    info.id = id;
    info.job_id = 3 + id;
    info.hook_name = spec->hook_name();
    info.width = d_in;
    return latentd::engine::InMemoryStoredDenseRows(info, {}, {});
  };
  DatasetModels reader(env);
  const DatasetSource source{1, 1, hash, "", 4096};
  const DatasetSource crosscoder_source{2, 2, crosscoder_sae->weight_hash(), "", 4096};
  const DatasetSource diff_source{3, 3, diff_sae->weight_hash(), "", 4096};
  latentd::engine::SteeringQuery query;
  for (int64_t t = 0; t < 64; ++t) query.token_ids.push_back((t * 104729) % vocab);
  query.interventions = {{7, latentd::engine::InterventionMode::kAdd, 10.0f, {}}};
  for (int64_t i = 0; i < sweep; ++i) query.sweep.push_back(2.0f * i);
  std::printf(
      "dataset_models_bench steer: a %lld-token prompt, reference model of %lld layers, d_model "
      "%lld, vocab %lld, SAE of 4096 at %s; %lld runs a batch; median of %lld rounds, %d "
      "threads\n",
      static_cast<long long>(query.token_ids.size()), static_cast<long long>(layers),
      static_cast<long long>(d_in), static_cast<long long>(vocab), spec->hook_name().c_str(),
      static_cast<long long>(2 + sweep), static_cast<long long>(rounds), at::get_num_threads());
  std::printf("%-11s %-9s %-16s %s\n", "NEW_TOKENS", "CALL_S", "MS_PER_NEW_TOKEN", "SAE");
  // The cost of a new token through each: an SAE, the crosscoder over hooks, then the one over
  // two models steered in the second (the first running beside it to the hook).
  const std::string diffed =
      absl::StrCat("crosscoder over two models' ", spec->hook_name(), ", the second steered");
  std::vector<std::pair<const DatasetSource*, std::string>> steered_by = {
      {&source, spec->hook_name()},
      {&crosscoder_source, absl::StrCat("crosscoder ", before, " + ", spec->hook_name())},
      {&diff_source, diffed}};
  std::vector<double> per_token;
  for (const auto& [steered, name] : steered_by) {
    latentd::engine::SteeringQuery q = query;
    if (steered == &diff_source) q.crosscoder_source = 1;
    q.new_tokens = 0;
    const auto loaded = reader.SteerPrompt(*steered, q, nullptr);  // loads model(s) and SAE
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
      return 1;
    }
    double base = 0;
    for (const int64_t n : {int64_t{0}, new_tokens}) {
      q.new_tokens = static_cast<int>(n);
      const std::optional<double> median =
          MedianSeconds(rounds, [&] { return reader.SteerPrompt(*steered, q, nullptr).status(); });
      if (!median) return 1;
      if (n == 0) base = *median;
      if (n > 0) per_token.push_back((*median - base) / n);
      std::printf("%-11lld %-9.3f %-16s %s\n", static_cast<long long>(n), *median,
                  n == 0 ? "-" : absl::StrFormat("%.1f", (*median - base) / n * 1e3).c_str(),
                  name.c_str());
    }
  }
  if (per_token.size() == 3 && per_token[0] > 0) {
    std::printf(
        "a new token through the crosscoder over hooks: %.2fx the SAE's; over two models: "
        "%.2fx\n",
        per_token[1] / per_token[0], per_token[2] / per_token[0]);
  }
  std::printf(
      "(NEW_TOKENS 0: the prompt clean and steered as one batch of two, to the logits, losses at "
      "every position; then a forward of the runs per new token, reading the key-value cache)\n");
  // Attribution of the next token to the latents: one forward and one backward pass.
  latentd::engine::AttributionQuery attribute;
  attribute.token_ids = query.token_ids;
  const std::optional<double> attributed =
      MedianSeconds(rounds, [&] { return reader.AttributePrompt(source, attribute).status(); });
  if (!attributed) return 1;
  std::printf("AttributePrompt of the prompt: %.3f s (median)\n", *attributed);
  // The same credited in the second model of the crosscoder over two, the first run beside it.
  latentd::engine::AttributionQuery in_second = attribute;
  in_second.crosscoder_source = 1;
  const std::optional<double> diff_attributed = MedianSeconds(
      rounds, [&] { return reader.AttributePrompt(diff_source, in_second).status(); });
  if (!diff_attributed) return 1;
  std::printf(
      "AttributePrompt in the second model of the crosscoder over two models' %s: %.3f s "
      "(median), %.2fx the SAE's\n",
      spec->hook_name().c_str(), *diff_attributed, *diff_attributed / *attributed);
  // The same pass to a latent at the dataset's own hook (its largest on the last token): the
  // forward stops there, without the later blocks and the unembedding. Then the diff's latents,
  // credited in the second model, to the latent of the SAE over that model's hook (dataset 5):
  // the first model runs beside it.
  latentd::engine::PromptQuery prompt;
  prompt.token_ids = query.token_ids;
  const DatasetSource second_model{5, 5, hash, "", 4096};
  std::vector<double> to_latent;
  for (const auto& [attributed_by, target] :
       {std::pair{&source, &source}, std::pair{&diff_source, &second_model}}) {
    auto encoded = reader.EncodePrompt(*target, prompt);
    if (!encoded.ok() || encoded->tokens.back().latents.empty()) return 1;
    latentd::engine::AttributionQuery q = attributed_by == &diff_source ? in_second : attribute;
    q.target_latent = latentd::engine::TargetLatent{
        encoded->tokens.back().latents[0].index, static_cast<int64_t>(encoded->tokens.size()) - 1};
    const std::optional<double> median = MedianSeconds(
        rounds, [&] { return reader.AttributePrompt(*attributed_by, q, target).status(); });
    if (!median) return 1;
    to_latent.push_back(*median);
  }
  std::printf("AttributePrompt to a latent at %s: %.3f s (median), %.2fx the next token's\n",
              spec->hook_name().c_str(), to_latent[0], to_latent[0] / *attributed);
  std::printf(
      "AttributePrompt of the crosscoder over two models to the second model's latent there: "
      "%.3f s (median), %.2fx to the next token's, %.2fx the SAE's to its latent\n",
      to_latent[1], to_latent[1] / *diff_attributed, to_latent[1] / to_latent[0]);
  // The ablation check of the top 8 entries: a batch of 9 forward passes more.
  attribute.target_latent.reset();
  attribute.ablate = 8;
  const std::optional<double> checked =
      MedianSeconds(rounds, [&] { return reader.AttributePrompt(source, attribute).status(); });
  if (!checked) return 1;
  std::printf(
      "AttributePrompt with the ablation check of its top 8 entries: %.3f s (median), "
      "%.2fx without\n",
      *checked, *checked / *attributed);
  return 0;
}

int main(int argc, char** argv) {
  std::vector<int64_t> widths = {4096, 32768, 131072};
  int64_t d_in = 768, vocab = 50257, queries = 50, suite = 0, rounds = 5, steer = 0, layers = 12,
          sweep = 0;
  const std::map<std::string, int64_t*> numbers = {
      {"d_in", &d_in},     {"vocab", &vocab}, {"queries", &queries}, {"suite", &suite},
      {"rounds", &rounds}, {"steer", &steer}, {"layers", &layers},   {"sweep", &sweep}};
  for (int i = 1; i < argc; ++i) {
    std::vector<std::string> kv = absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    if (kv.size() != 2) continue;
    if (kv[0] == "widths") {
      widths.clear();
      for (absl::string_view w : absl::StrSplit(kv[1], ',')) {
        int64_t v;
        if (absl::SimpleAtoi(w, &v)) widths.push_back(v);
      }
    } else if (auto it = numbers.find(kv[0]); it != numbers.end()) {
      absl::SimpleAtoi(kv[1], it->second);
    }
  }
  const std::string root =
      (std::filesystem::temp_directory_path() / "dataset_models_bench").string();
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  if (suite > 0 || steer > 0) {
    const int rc = suite > 0 ? RunSuite(root, suite, d_in, vocab, rounds)
                             : RunSteer(root, steer, d_in, vocab, layers, rounds, sweep);
    std::filesystem::remove_all(root);
    return rc;
  }
  std::printf(
      "dataset_models_bench: d_in %lld, reference model vocab %lld, %lld queries each, %d "
      "threads\n",
      static_cast<long long>(d_in), static_cast<long long>(vocab), static_cast<long long>(queries),
      at::get_num_threads());
  std::printf("%-8s %-8s %-9s %-9s %-9s %-13s %-11s %-17s %-9s %s\n", "D_SAE", "SAE_MB", "FIRST_S",
              "WARM_P50", "WARM_P90", "PROMPT_FIRST", "PROMPT_P50", "COMPARE (N, S)", "CACHE_MB",
              "RSS_MB");
  for (const int64_t d_sae : widths) {
    const std::string dir = root + "/sae-" + std::to_string(d_sae);
    const std::string hash = WriteBenchSae(dir, d_sae, d_in, 1);
    if (hash.empty()) return 1;
    latentd::v1::Job job;
    latentd::v1::ExtractSpec* spec = job.mutable_spec()->mutable_extract();
    *spec->mutable_model()->mutable_reference() = BenchModel(d_in, vocab, 2);
    spec->set_hook_name("blocks.1.hook_resid_post");
    spec->mutable_sae()->set_path(dir);
    latentd::engine::ExtractEnv env;
    env.data_roots = {root};
    env.find_job = [&job](uint64_t) -> absl::StatusOr<latentd::v1::Job> { return job; };
    DatasetModels reader(env);
    const DatasetSource source{1, 1, hash, "", d_sae};
    LatentWeightsQuery q;
    q.top_n = 10;
    auto start = std::chrono::steady_clock::now();
    auto first = reader.ReadLatentWeights(source, q);
    const double first_s = Seconds(start);
    if (!first.ok()) {
      std::fprintf(stderr, "%s\n", std::string(first.status().message()).c_str());
      return 1;
    }
    std::vector<double> warm;
    for (int64_t i = 0; i < queries; ++i) {
      q.latent = (i * 7919) % d_sae;
      start = std::chrono::steady_clock::now();
      if (!reader.ReadLatentWeights(source, q).ok()) return 1;
      warm.push_back(Seconds(start));
    }
    std::sort(warm.begin(), warm.end());
    // A 128-token prompt: the first call loads the model and the SAE for encoding.
    latentd::engine::PromptQuery prompt;
    for (int64_t t = 0; t < 128; ++t) prompt.token_ids.push_back((t * 104729) % vocab);
    start = std::chrono::steady_clock::now();
    if (!reader.EncodePrompt(source, prompt).ok()) return 1;
    const double prompt_first_s = Seconds(start);
    std::vector<double> prompts;
    for (int64_t i = 0; i < std::max<int64_t>(queries / 5, 1); ++i) {
      prompt.token_ids[0] = i % vocab;
      start = std::chrono::steady_clock::now();
      if (!reader.EncodePrompt(source, prompt).ok()) return 1;
      prompts.push_back(Seconds(start));
    }
    std::sort(prompts.begin(), prompts.end());
    // CompareSaes of the SAE with itself: every latent, or the sample the work budget allows.
    latentd::engine::SaeComparisonQuery compare;
    compare.sample = std::min<int64_t>(d_sae, (int64_t{1} << 36) / (d_sae * d_in));
    start = std::chrono::steady_clock::now();
    auto compared = reader.CompareSaes(source, source, compare);
    const double compare_s = Seconds(start);
    if (!compared.ok() || compared->mean_best_cosine < 0.999) {
      std::fprintf(stderr, "CompareSaes of an SAE with itself did not match it\n");
      return 1;
    }
    std::printf(
        "%-8lld %-8.0f %-9.3f %-9.2f %-9.2f %-13.3f %-11.2f %-17s %-9.0f %.0f\n",
        static_cast<long long>(d_sae), 2.0 * d_sae * d_in * 4 / 1e6, first_s,
        warm[warm.size() / 2] * 1e3, warm[warm.size() * 9 / 10] * 1e3, prompt_first_s,
        prompts[prompts.size() / 2] * 1e3,
        absl::StrFormat("%lld, %.2f", static_cast<long long>(compare.sample), compare_s).c_str(),
        reader.cached_bytes() / 1e6, latentd::ProcessRssBytes() / 1e6);
  }
  std::printf(
      "(FIRST_S, PROMPT_FIRST in s; WARM_P50 / WARM_P90 / PROMPT_P50 (128 tokens) in ms; "
      "COMPARE: latents compared with the SAE itself (the 2^36 budget's sample) and seconds; "
      "SAE_MB: W_enc + W_dec as float32)\n");
  std::filesystem::remove_all(root);
  return 0;
}
