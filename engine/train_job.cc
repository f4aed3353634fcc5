#include "engine/train_job.h"

#include <ATen/ATen.h>
#include <torch/script.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/path_within.h"
#include "common/status_macros.h"
#include "engine/checkpoint.h"
#include "engine/clt_model.h"
#include "engine/crosscoder_model.h"
#include "engine/data_parallel.h"
#include "engine/extract_runner.h"
#include "engine/hook_name.h"
#include "engine/job_continuation.h"
#include "engine/lr_schedule.h"
#include "engine/optimizer_factory.h"
#include "engine/sae_model.h"
#include "engine/torch_status.h"
#include "engine/train_data.h"
#include "engine/train_loop.h"
#include "engine/train_model_source.h"
#include "engine/train_models.h"
#include "engine/train_store_source.h"
#include "engine/train_token_source.h"
#include "storage/artifact_store.h"
#include "storage/chunk_store.h"

namespace latentd::engine {
namespace {

constexpr int64_t kDefaultBatchSize = 256;
constexpr int64_t kDefaultCheckpointEvery = 100;
constexpr int64_t kDefaultTelemetryEvery = 10;
constexpr uint64_t kStreamSeedSalt = 0x5eed5eed5eed5eedULL;

// Everything ValidateTrainSpec checks, resolved, so that RunTrain runs exactly what was admitted.
struct TrainPlan {
  storage::DatasetRecord record;  // rows_committed = sequences for a token file
  bool tokens = false;            // rows come from spec.tokens (resolved path in token_spec)
  latentd::v1::TokenSource token_spec;
  bool activations = false;  // rows come from a model (activation_spec, mode DENSE)
  latentd::v1::ExtractSpec activation_spec;
  int64_t width = 0;
  // The stored DENSE datasets whose rows, side by side, the loop reads (SideBySideDenseRowSource):
  // dataset_id; a transcoder's and target_dataset_id; a CLT's cross_layer_dataset_ids.
  std::vector<uint64_t> stored_ids;
  // A transcoder's target (spec.target_dataset_id): its record and row width; the rows the loop
  // sees are width + target_width wide.
  std::optional<storage::DatasetRecord> target;
  int64_t target_width = 0;
  // A transcoder's target hook (the target dataset's, or spec.target_hook_name); "" for an SAE.
  std::string target_hook;
  // A cross-layer transcoder (sae.cross_layers > 0): its options, and the hooks within a block it
  // reads and predicts (activations.hook_name's and target_hook_name's, past "blocks.0.").
  bool clt = false;
  CltModelOptions clt_options;
  std::string clt_input_hook, clt_output_hook;
  // A crosscoder (spec.crosscoder_dataset_ids or crosscoder_hooks): its options, and its
  // sources in the order of its rows' columns (the model of live hooks is known at run time).
  bool crosscoder = false;
  CrosscoderModelOptions crosscoder_options;
  std::vector<CrosscoderSource> crosscoder_sources;
  // Values in a row the train loop reads: a CLT's rows hold every block's input and target, a
  // crosscoder's every source's hook.
  int64_t row_width() const {
    if (clt) return clt_options.RowWidth();
    if (crosscoder) return static_cast<int64_t>(crosscoder_sources.size()) * width;
    return width + target_width;
  }
  bool sae = true;
  SaeModelOptions sae_options;
  int64_t num_latents() const {
    if (clt) return clt_options.layers * clt_options.d_sae;
    return crosscoder ? crosscoder_options.d_sae : sae_options.d_sae;
  }
  std::string torchscript_path;  // resolved
  OptimizerConfig optimizer;
  int64_t batch_size = kDefaultBatchSize;
  // Data-parallel ranks the batch is split over: the job's devices, or the rendezvous' world.
  int ranks = 1;
  int64_t total_steps = 1;
  LrScheduleOptions lr;
  int64_t checkpoint_every = kDefaultCheckpointEvery;
  int64_t telemetry_every = kDefaultTelemetryEvery;
  int64_t dead_window_steps = TrainLoopOptions().dead_window_steps;
  std::vector<std::vector<int64_t>> shapes;  // of the parameters
  int64_t num_params = 0;
};

std::string Gb(int64_t bytes) {
  return absl::StrFormat("%.2f GB", static_cast<double>(bytes) / 1e9);
}

absl::StatusOr<std::string> ResolveUnderRoots(const std::string& path,
                                              const std::vector<std::string>& roots,
                                              const std::string& field) {
  std::error_code error;
  const std::filesystem::path resolved = std::filesystem::weakly_canonical(path, error);
  if (error) return absl::NotFoundError(absl::StrCat(field, ": cannot resolve ", path));
  for (const std::string& root : roots) {
    const std::filesystem::path canonical_root = std::filesystem::weakly_canonical(root, error);
    if (error) continue;
    if (PathIsWithin(resolved, canonical_root)) {
      if (!std::filesystem::is_regular_file(resolved, error)) {
        return absl::NotFoundError(absl::StrCat(field, ": no file at ", path));
      }
      return resolved.string();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(field, ": ", path, " is not under a data root (",
                                                  absl::StrJoin(roots, ", "), ")"));
}

std::vector<std::vector<int64_t>> SaeShapes(const SaeModelOptions& o) {
  std::vector<std::vector<int64_t>> shapes = {
      {o.d_in, o.d_sae}, {o.d_sae}, {o.d_sae, o.OutWidth()}, {o.OutWidth()}};
  if (o.architecture == latentd::v1::JUMPRELU) shapes.push_back({o.d_sae});
  if (o.skip) shapes.push_back({o.OutWidth(), o.d_in});
  return shapes;
}

constexpr size_t kMaxArtifactName = 128;

absl::Status CheckArtifactName(const std::string& name) {
  if (name.empty()) return absl::OkStatus();
  if (name.size() > kMaxArtifactName || name == "." || name == ".." ||
      !std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
      })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.artifact_name: \"", name, "\" must be 1..128 of [A-Za-z0-9._-] and not . or .."));
  }
  return absl::OkStatus();
}

// train.activations as the DENSE one-hook extraction it describes: INVALID_ARGUMENT naming the
// field for what TRAIN cannot read (latents, several hooks, a continued dataset).
absl::StatusOr<latentd::v1::ExtractSpec> CheckActivationSpec(latentd::v1::ExtractSpec spec) {
  if (spec.mode() == latentd::v1::SPARSE ||
      (spec.has_sae() && spec.sae().source_case() != latentd::v1::SaeSource::SOURCE_NOT_SET)) {
    return absl::InvalidArgumentError(
        "train.activations.sae / train.activations.mode: TRAIN reads a hook's hidden states; "
        "leave out the SAE (mode DENSE)");
  }
  if (spec.more_outputs_size() > 0) {
    return absl::InvalidArgumentError(
        "train.activations.more_outputs: TRAIN reads one hook (hook_name)");
  }
  if (spec.model().has_stored()) {
    return absl::InvalidArgumentError(
        "train.activations.model.stored: stored activations are datasets; name them in "
        "train.dataset_id (train.crosscoder_dataset_ids for a crosscoder)");
  }
  if (spec.resume_from_job_id() != 0) {
    return absl::InvalidArgumentError(
        "train.activations.resume_from_job_id: nothing is stored to continue; set "
        "train.resume_from_job_id to continue a TRAIN job");
  }
  spec.set_mode(latentd::v1::DENSE);
  return spec;
}

// An extraction's error as the train.activations field it is about.
absl::Status InActivationsField(const absl::Status& status) {
  if (status.ok()) return status;
  std::string message(status.message());
  if (absl::StartsWith(message, "extract.")) {
    message = absl::StrCat("train.activations.", message.substr(8));
  } else if (absl::StartsWith(message, "extract:")) {
    message = absl::StrCat("train.activations:", message.substr(8));
  } else {
    message = absl::StrCat("train.activations: ", message);
  }
  return WithMessage(status, message);
}

// As InActivationsField, but the target hook train.target_hook_name added as the activation
// spec's second output is named as the user named it.
absl::Status InTargetOrActivationsField(const absl::Status& status) {
  constexpr absl::string_view kTarget = "extract.more_outputs[0].hook_name";
  if (absl::StartsWith(status.message(), kTarget)) {
    return WithMessage(
        status, absl::StrCat("train.target_hook_name", status.message().substr(kTarget.size())));
  }
  return InActivationsField(status);
}

ExtractEnv ActivationEnv(const TrainEnv& env) {
  ExtractEnv extract_env;
  extract_env.data_roots = env.data_roots;
  // The model alone must fit the device (its weights and a forward batch); TRAIN's admission
  // below counts the SAE.
  extract_env.device_memory_bytes = env.device_memory_bytes;
  return extract_env;
}

constexpr int kDefaultRendezvousTimeoutSeconds = 300;

int RendezvousTimeoutSeconds(const latentd::v1::TrainRendezvous& rendezvous) {
  return rendezvous.timeout_seconds() > 0 ? rendezvous.timeout_seconds()
                                          : kDefaultRendezvousTimeoutSeconds;
}

absl::Status CheckRendezvous(const latentd::v1::TrainRendezvous& rendezvous, int local_ranks) {
  auto address = ParseHostPort(rendezvous.address());
  if (!address.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.rendezvous.address: ", address.status().message(),
                     " (the TCPStore of the node with rank_offset 0)"));
  }
  if (rendezvous.world_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.rendezvous.world_size: must be >= 1 (ranks over all nodes), got ",
                     rendezvous.world_size()));
  }
  if (rendezvous.rank_offset() < 0 ||
      rendezvous.rank_offset() + local_ranks > rendezvous.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.rendezvous.rank_offset: this node's ", local_ranks, " rank(s) from ",
        rendezvous.rank_offset(), " do not fit in world_size ", rendezvous.world_size()));
  }
  if (rendezvous.timeout_seconds() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.rendezvous.timeout_seconds: must be >= 0 (0: 300), got ",
                     rendezvous.timeout_seconds()));
  }
  return absl::OkStatus();
}

constexpr absl::string_view kFirstBlock = "blocks.0.";

// A cross-layer transcoder's hooks: train.activations reads block 0's input hook (hook_name) and
// target (target_hook_name); this adds block l's input for l = 1..layers-1, then every block's
// target, as more_outputs, so that a row is [x_0 .. x_{layers-1}, y_0 .. y_{layers-1}]. Sets the
// plan's hooks within a block. INVALID_ARGUMENT naming the field for what a CLT cannot read.
absl::Status AddCrossLayerHooks(const latentd::v1::TrainSpec& spec, TrainPlan* plan) {
  const int layers = spec.sae().cross_layers();
  if (spec.target_hook_name().empty()) {
    return absl::InvalidArgumentError(
        "train.sae.cross_layers: name the hook each block's latents predict in "
        "train.target_hook_name (block 0's, e.g. blocks.0.hook_mlp_out)");
  }
  const std::string& in = plan->activation_spec.hook_name();
  const std::string& out = spec.target_hook_name();
  if (!absl::StartsWith(in, kFirstBlock)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.activations.hook_name: a cross-layer transcoder starts at block 0 (circuit-tracer "
        "numbers its layers from 0); name block 0's input hook, e.g. blocks.0.ln2.hook_normalized, "
        "not ",
        in));
  }
  if (!absl::StartsWith(out, kFirstBlock)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.target_hook_name: a cross-layer transcoder's targets start at block 0; name block "
        "0's output hook, e.g. blocks.0.hook_mlp_out, not ",
        out));
  }
  plan->clt_input_hook = in.substr(kFirstBlock.size());
  plan->clt_output_hook = out.substr(kFirstBlock.size());
  for (int l = 1; l < layers; ++l) {
    plan->activation_spec.add_more_outputs()->set_hook_name(
        absl::StrCat("blocks.", l, ".", plan->clt_input_hook));
  }
  for (int l = 0; l < layers; ++l) {
    plan->activation_spec.add_more_outputs()->set_hook_name(
        absl::StrCat("blocks.", l, ".", plan->clt_output_hook));
  }
  return absl::OkStatus();
}

// An extraction error about the hook of activation_spec.more_outputs[i] (one the plan added for a
// CLT or a crosscoder): i, and the message after "extract.more_outputs[i].hook_name". nullopt for
// another error.
std::optional<std::pair<int, absl::string_view>> MoreOutputError(
    const absl::Status& status, const latentd::v1::ExtractSpec& activation_spec) {
  absl::string_view message = status.message();
  if (!absl::ConsumePrefix(&message, "extract.more_outputs[")) return std::nullopt;
  const size_t close = message.find(']');
  int index = -1;
  if (close == absl::string_view::npos || !absl::SimpleAtoi(message.substr(0, close), &index) ||
      index < 0 || index >= activation_spec.more_outputs_size()) {
    return std::nullopt;
  }
  message.remove_prefix(close + 1);
  absl::ConsumePrefix(&message, ".hook_name");
  return std::make_pair(index, message);
}

// An extraction error about one of a CLT's hooks (more_outputs[i], added by AddCrossLayerHooks)
// as the field that asked for it: block 0's target is target_hook_name, the others come from
// cross_layers.
absl::Status InCrossLayerField(const absl::Status& status, const latentd::v1::TrainSpec& spec,
                               const latentd::v1::ExtractSpec& activation_spec) {
  const auto error = MoreOutputError(status, activation_spec);
  if (!error) return InActivationsField(status);
  const auto [index, message] = *error;
  const std::string& hook = activation_spec.more_outputs(index).hook_name();
  if (hook == spec.target_hook_name()) {
    return WithMessage(status, absl::StrCat("train.target_hook_name", message));
  }
  return WithMessage(status, absl::StrCat("train.sae.cross_layers: ", spec.sae().cross_layers(),
                                          " blocks need ", hook, message));
}

// A crosscoder's live hooks: activations.hook_name, then spec.crosscoder_hooks as the
// activation spec's more_outputs, so that a row is every source's hook side by side.
absl::Status AddCrosscoderHooks(const latentd::v1::TrainSpec& spec, TrainPlan* plan) {
  constexpr absl::string_view kField = "train.crosscoder_hooks";
  if (spec.sae().cross_layers() != 0 || !spec.target_hook_name().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField,
                     ": trains a crosscoder, which reconstructs the hooks it reads; leave "
                     "train.sae.cross_layers and train.target_hook_name (a transcoder's) unset"));
  }
  std::vector<std::string> hooks = {plan->activation_spec.hook_name()};
  for (int i = 0; i < spec.crosscoder_hooks_size(); ++i) {
    const std::string& hook = spec.crosscoder_hooks(i);
    if (std::find(hooks.begin(), hooks.end(), hook) != hooks.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, "[", i, "]: ", hook,
          " is read already (activations.hook_name and the hooks listed are the sources, each "
          "once)"));
    }
    hooks.push_back(hook);
    plan->activation_spec.add_more_outputs()->set_hook_name(hook);
  }
  for (const std::string& hook : hooks) plan->crosscoder_sources.push_back({hook, "", "live"});
  plan->crosscoder = true;
  return absl::OkStatus();
}

// An extraction error about one of a crosscoder's hooks (more_outputs[i], added by
// AddCrosscoderHooks) as train.crosscoder_hooks[i]'s.
absl::Status InCrosscoderField(const absl::Status& status,
                               const latentd::v1::ExtractSpec& activation_spec) {
  const auto error = MoreOutputError(status, activation_spec);
  if (!error) return InActivationsField(status);
  return WithMessage(status,
                     absl::StrCat("train.crosscoder_hooks[", error->first, "]", error->second));
}

// INVALID_ARGUMENT naming `field` unless `out` holds the rows of `in` (committed count, token
// source and order), `why` saying what needs them alike.
absl::Status CheckSameRows(const storage::DatasetRecord& in, const storage::DatasetRecord& out,
                           absl::string_view field, absl::string_view why) {
  if (out.rows_committed == in.rows_committed && out.meta.token_source == in.meta.token_source &&
      out.meta.token_order_start == in.meta.token_order_start &&
      out.meta.context_length == in.meta.context_length) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": dataset ", out.id, " (", out.rows_committed, " rows of ", out.meta.token_source,
      " from row ", out.meta.token_order_start, ") does not hold the rows of dataset ", in.id, " (",
      in.rows_committed, " rows of ", in.meta.token_source, " from row ", in.meta.token_order_start,
      "): ", why));
}

// A store error about a dataset opened for `field` (StoreDenseRowSource::Open names
// train.dataset_id) as that field's.
absl::Status InDatasetField(const absl::Status& status, absl::string_view field) {
  return absl::Status(
      status.code(),
      absl::StrCat(field, ": ", absl::StripPrefix(status.message(), "train.dataset_id: ")));
}

// Hook i of a cross-layer transcoder's 2N (every block's input, then every block's target),
// widths[i] wide, against its side's block 0: INVALID_ARGUMENT naming `field` unless alike.
absl::Status CheckBlockWidth(absl::string_view field, absl::string_view hook,
                             const std::vector<int64_t>& widths, int layers, int i) {
  const int64_t expected = widths[i < layers ? 0 : layers];
  if (widths[i] == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", hook, " is ", widths[i],
                                                 " wide, block 0's ", expected,
                                                 ": a cross-layer transcoder's blocks must be "
                                                 "alike"));
}

// A cross-layer transcoder on stored datasets (spec.cross_layer_dataset_ids): 2N DENSE datasets
// of the same rows, block l's input hook then every block's target, each hook block l's of the
// same hook within a block. Fills the plan as AddCrossLayerHooks and the activations do.
absl::Status PlanCrossLayerDatasets(const latentd::v1::TrainSpec& spec, const TrainEnv& env,
                                    TrainPlan* plan) {
  constexpr absl::string_view kField = "train.cross_layer_dataset_ids";
  const int n = spec.cross_layer_dataset_ids_size();
  const int layers = spec.has_sae() ? spec.sae().cross_layers() : 0;
  if (spec.dataset_id() != 0 || spec.target_dataset_id() != 0 || spec.has_activations()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField,
                     ": names every dataset of a cross-layer transcoder; leave train.dataset_id, "
                     "train.target_dataset_id and train.activations unset"));
  }
  if (layers < 1 || n != 2 * layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, ": ", n, " datasets; a cross-layer transcoder over sae.cross_layers = ", layers,
        " blocks reads 2 x ", layers, " (every block's input, then every block's target)"));
  }
  std::vector<storage::DatasetRecord> records;
  std::vector<int64_t> widths;
  for (int i = 0; i < n; ++i) {
    auto source = StoreDenseRowSource::Open(env.store, spec.cross_layer_dataset_ids(i));
    const std::string field = absl::StrCat(kField, "[", i, "]");
    if (!source.ok()) return InDatasetField(source.status(), field);
    records.push_back((*source)->record());
    widths.push_back((*source)->width());
  }
  for (const int first : {0, layers}) {
    if (!absl::StartsWith(records[first].meta.hook_name, kFirstBlock)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, "[", first, "]: dataset ", records[first].id, " holds ",
                       records[first].meta.hook_name,
                       "; a cross-layer transcoder starts at block 0, so it must hold block "
                       "0's ",
                       first == 0 ? "input" : "target", " hook (blocks.0.<hook>)"));
    }
  }
  plan->clt_input_hook = records[0].meta.hook_name.substr(kFirstBlock.size());
  plan->clt_output_hook = records[layers].meta.hook_name.substr(kFirstBlock.size());
  for (int i = 0; i < n; ++i) {
    const bool input = i < layers;
    const int block = input ? i : i - layers;
    const std::string field = absl::StrCat(kField, "[", i, "]");
    const std::string hook =
        absl::StrCat("blocks.", block, ".", input ? plan->clt_input_hook : plan->clt_output_hook);
    if (records[i].meta.hook_name != hook) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": dataset ", records[i].id, " holds ", records[i].meta.hook_name,
                       ", not block ", block, "'s ", input ? "input " : "target ", hook));
    }
    RETURN_IF_ERROR(CheckBlockWidth(field, hook, widths, layers, i));
    RETURN_IF_ERROR(CheckSameRows(records[0], records[i], field,
                                  "a cross-layer transcoder learns from the same tokens' hooks"));
  }
  plan->clt = true;
  plan->record = records[0];
  plan->width = widths[0];
  plan->target_width = widths[layers];
  plan->target_hook = records[layers].meta.hook_name;
  plan->stored_ids.assign(spec.cross_layer_dataset_ids().begin(),
                          spec.cross_layer_dataset_ids().end());
  return absl::OkStatus();
}

// A crosscoder on stored datasets (spec.crosscoder_dataset_ids): n >= 2 DENSE datasets of the same
// rows and width, each read once; from any hooks of any models.
absl::Status PlanCrosscoderDatasets(const latentd::v1::TrainSpec& spec, const TrainEnv& env,
                                    TrainPlan* plan) {
  constexpr absl::string_view kField = "train.crosscoder_dataset_ids";
  const int n = spec.crosscoder_dataset_ids_size();
  if (spec.dataset_id() != 0 || spec.target_dataset_id() != 0 || spec.has_activations() ||
      spec.cross_layer_dataset_ids_size() > 0 || !spec.target_hook_name().empty() ||
      spec.crosscoder_hooks_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField,
        ": names every dataset a crosscoder reads; leave train.dataset_id, "
        "train.target_dataset_id, train.target_hook_name, train.cross_layer_dataset_ids, "
        "train.activations and train.crosscoder_hooks unset"));
  }
  if (!spec.has_sae()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": trains a crosscoder, whose settings are train.sae's"));
  }
  if (n < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": a crosscoder reads >= 2 datasets together, got ", n,
                     " (one dataset: train an SAE on train.dataset_id)"));
  }
  std::vector<storage::DatasetRecord> records;
  for (int i = 0; i < n; ++i) {
    const uint64_t id = spec.crosscoder_dataset_ids(i);
    const std::string field = absl::StrCat(kField, "[", i, "]");
    for (int j = 0; j < i; ++j) {
      if (spec.crosscoder_dataset_ids(j) == id) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": dataset ", id, " is ", kField, "[",
                                                       j, "] already; each source once"));
      }
    }
    auto source = StoreDenseRowSource::Open(env.store, id);
    if (!source.ok()) return InDatasetField(source.status(), field);
    records.push_back((*source)->record());
    const int64_t width = (*source)->width();
    if (i == 0) {
      plan->width = width;
    } else if (width != plan->width) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": dataset ", id, " (", records[i].meta.hook_name, ") is ", width,
                       " wide, dataset ", records[0].id, " (", records[0].meta.hook_name, ") ",
                       plan->width, ": a crosscoder's sources must be alike in width"));
    }
    RETURN_IF_ERROR(CheckSameRows(records[0], records[i], field,
                                  "a crosscoder reads the same tokens' activations in every "
                                  "source (extract each over the same token file and shard)"));
    plan->crosscoder_sources.push_back(
        {records[i].meta.hook_name, records[i].meta.model_id, absl::StrCat("dataset ", id)});
  }
  plan->crosscoder = true;
  plan->record = records[0];
  plan->stored_ids.assign(spec.crosscoder_dataset_ids().begin(),
                          spec.crosscoder_dataset_ids().end());
  return absl::OkStatus();
}

// spec.target_dataset_id, checked against the input dataset (plan.record): a DENSE dataset of the
// same rows (committed count, token source and order). Its record and row width.
absl::StatusOr<std::pair<storage::DatasetRecord, int64_t>> CheckTranscoderTarget(
    const latentd::v1::TrainSpec& spec, const TrainEnv& env, const TrainPlan& plan) {
  if (!spec.has_sae() || spec.dataset_id() == 0 || plan.activations || plan.tokens) {
    return absl::InvalidArgumentError(
        "train.target_dataset_id: trains a transcoder, an SAE (train.sae) reading the DENSE "
        "dataset train.dataset_id");
  }
  if (spec.target_dataset_id() == spec.dataset_id()) {
    return absl::InvalidArgumentError(
        "train.target_dataset_id: the same dataset as train.dataset_id (an SAE reconstructs its "
        "input; leave target_dataset_id unset)");
  }
  auto target = StoreDenseRowSource::Open(env.store, spec.target_dataset_id());
  if (!target.ok()) return InDatasetField(target.status(), "train.target_dataset_id");
  const storage::DatasetRecord& out = (*target)->record();
  RETURN_IF_ERROR(CheckSameRows(plan.record, out, "train.target_dataset_id",
                                "a transcoder learns from the same tokens' two hooks"));
  return std::make_pair(out, (*target)->width());
}

// A transcoder's target hook (plan.target_hook, from target_hook_name or the target dataset):
// only with an SAE (and target_hook_name only with activations), and computed after the input,
// or EXTRACT could not run the artifact (names that do not parse, from a TorchScript export's
// datasets, are not ordered).
absl::Status CheckTargetHook(const latentd::v1::TrainSpec& spec, const TrainPlan& plan) {
  if (!spec.target_hook_name().empty() &&
      (!spec.has_sae() || !plan.activations || spec.target_dataset_id() != 0)) {
    return absl::InvalidArgumentError(
        "train.target_hook_name: trains a transcoder (train.sae) on train.activations; from "
        "datasets, name the target with train.target_dataset_id");
  }
  if (plan.target_hook.empty()) return absl::OkStatus();
  const absl::StatusOr<HookName> in = ParseHookName(plan.record.meta.hook_name);
  const absl::StatusOr<HookName> out = ParseHookName(plan.target_hook);
  if (in.ok() && out.ok() && !ComputedBefore(*in, *out)) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.target_hook_name().empty() ? "train.target_dataset_id" : "train.target_hook_name",
        ": a transcoder predicts a hook computed after the one it reads; ", plan.target_hook,
        " is not after ", plan.record.meta.hook_name));
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainPlan> MakePlan(const latentd::v1::TrainSpec& spec, const TrainEnv& env) {
  if (env.store == nullptr) return absl::FailedPreconditionError("TRAIN: no chunk store");
  TrainPlan plan;
  const bool has_sae = spec.has_sae();
  const bool has_module = !spec.torchscript_path().empty();
  if (spec.has_tokens()) {
    if (!has_module || has_sae) {
      return absl::InvalidArgumentError(
          "train.tokens: token files train a torchscript_path module, not an SAE");
    }
    if (spec.dataset_id() != 0 || spec.has_activations() ||
        spec.cross_layer_dataset_ids_size() > 0 || spec.crosscoder_dataset_ids_size() > 0 ||
        spec.crosscoder_hooks_size() > 0) {
      return absl::InvalidArgumentError(
          "train.tokens / train.dataset_id / train.activations: set one of them");
    }
    plan.tokens = true;
    plan.token_spec = spec.tokens();
    ExtractEnv roots;  // a Parquet directory is a token path too, not only a regular file
    roots.data_roots = env.data_roots;
    ASSIGN_OR_RETURN(
        *plan.token_spec.mutable_path(),
        ResolveTokenPath(spec.tokens().path(), "train.tokens.path", [&](const std::string& p) {
          return ResolveUnderRoots(p, roots, "train.tokens.path");
        }));
    ASSIGN_OR_RETURN(auto source, TokenRowSource::Open(plan.token_spec));
    plan.record.rows_committed = source->num_rows();
    plan.width = source->width();
  } else if (spec.has_activations()) {
    if (spec.dataset_id() != 0 || spec.cross_layer_dataset_ids_size() > 0 ||
        spec.crosscoder_dataset_ids_size() > 0) {
      return absl::InvalidArgumentError(
          "train.dataset_id / train.cross_layer_dataset_ids / train.crosscoder_dataset_ids / "
          "train.activations: set one");
    }
    ASSIGN_OR_RETURN(plan.activation_spec, CheckActivationSpec(spec.activations()));
    plan.clt = spec.has_sae() && spec.sae().cross_layers() > 0;
    if (spec.crosscoder_hooks_size() > 0) {
      if (!spec.has_sae()) {
        return absl::InvalidArgumentError(
            "train.crosscoder_hooks: trains a crosscoder, whose settings are train.sae's");
      }
      RETURN_IF_ERROR(AddCrosscoderHooks(spec, &plan));
      plan.clt = false;
    } else if (plan.clt) {
      RETURN_IF_ERROR(AddCrossLayerHooks(spec, &plan));
    } else if (!spec.target_hook_name().empty()) {
      // The target is the spec's second output: one forward pass gives both hooks.
      plan.activation_spec.add_more_outputs()->set_hook_name(spec.target_hook_name());
    }
    auto in_field = [&](const absl::Status& status) {
      if (plan.crosscoder) return InCrosscoderField(status, plan.activation_spec);
      return plan.clt ? InCrossLayerField(status, spec, plan.activation_spec)
                      : InTargetOrActivationsField(status);
    };
    const ExtractEnv extract_env = ActivationEnv(env);
    RETURN_IF_ERROR(in_field(ValidateExtractSpec(plan.activation_spec, extract_env)));
    auto shape = ExtractRowShapeOf(plan.activation_spec, extract_env);
    if (!shape.ok()) return in_field(shape.status());
    plan.activations = true;
    plan.record.rows_committed = shape->rows;
    plan.record.meta.hook_name = plan.activation_spec.hook_name();
    plan.width = shape->width;
    for (int i = 1; plan.crosscoder && i < static_cast<int>(shape->widths.size()); ++i) {
      if (shape->widths[i] != plan.width) {
        return absl::InvalidArgumentError(
            absl::StrCat("train.crosscoder_hooks[", i - 1, "]: ", spec.crosscoder_hooks(i - 1),
                         " is ", shape->widths[i], " wide, ", plan.activation_spec.hook_name(), " ",
                         plan.width, ": a crosscoder's sources must be alike in width"));
      }
    }
    if (!spec.target_hook_name().empty()) {
      // A CLT's block-0 target follows its inputs of every block.
      const int layers = plan.clt ? spec.sae().cross_layers() : 1;
      plan.target_width = shape->widths[layers];
      plan.target_hook = spec.target_hook_name();
      for (int i = 0; plan.clt && i < 2 * layers; ++i) {
        RETURN_IF_ERROR(CheckBlockWidth("train.sae.cross_layers",
                                        i == 0
                                            ? plan.activation_spec.hook_name()
                                            : plan.activation_spec.more_outputs(i - 1).hook_name(),
                                        shape->widths, layers, i));
      }
    }
  } else if (spec.cross_layer_dataset_ids_size() > 0) {
    RETURN_IF_ERROR(PlanCrossLayerDatasets(spec, env, &plan));
  } else if (spec.crosscoder_dataset_ids_size() > 0) {
    RETURN_IF_ERROR(PlanCrosscoderDatasets(spec, env, &plan));
  } else if (spec.crosscoder_hooks_size() > 0) {
    return absl::InvalidArgumentError(
        "train.crosscoder_hooks: hooks of the model train.activations runs; for stored "
        "activations name the datasets in train.crosscoder_dataset_ids");
  } else {
    ASSIGN_OR_RETURN(auto source, StoreDenseRowSource::Open(env.store, spec.dataset_id()));
    plan.record = source->record();
    plan.width = source->width();
    plan.stored_ids = {spec.dataset_id()};
  }
  if (spec.target_dataset_id() != 0) {
    ASSIGN_OR_RETURN(std::tie(plan.target, plan.target_width),
                     CheckTranscoderTarget(spec, env, plan));
    plan.target_hook = plan.target->meta.hook_name;
    plan.stored_ids.push_back(plan.target->id);
  }
  RETURN_IF_ERROR(CheckTargetHook(spec, plan));
  if (has_sae == has_module) {
    return absl::InvalidArgumentError(
        "train.sae / train.torchscript_path: set exactly one (an SAE to train, or a module)");
  }
  if (spec.batch_size() < 0 || spec.batch_size() > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.batch_size: must be in [1, 16777216], got ", spec.batch_size()));
  }
  if (spec.batch_size() > 0) plan.batch_size = spec.batch_size();
  plan.ranks = std::max(env.num_devices, 1);
  if (spec.has_rendezvous()) {
    RETURN_IF_ERROR(CheckRendezvous(spec.rendezvous(), plan.ranks));
    plan.ranks = spec.rendezvous().world_size();
  }
  if (plan.batch_size < plan.ranks) {
    return absl::InvalidArgumentError(absl::StrCat("train.batch_size: ", plan.batch_size,
                                                   " rows cannot be split over ", plan.ranks,
                                                   spec.has_rendezvous() ? " ranks" : " devices"));
  }
  if (spec.steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.steps: must be >= 0, got ", spec.steps()));
  }
  if (spec.epochs() < 0 || !std::isfinite(spec.epochs())) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.epochs: must be >= 0, got ", spec.epochs()));
  }
  if (spec.steps() > 0 && spec.epochs() > 0) {
    return absl::InvalidArgumentError("train.steps / train.epochs: set one, not both");
  }
  if (spec.steps() > 0) {
    plan.total_steps = spec.steps();
  } else {
    const double epochs = spec.epochs() > 0 ? spec.epochs() : 1.0;
    plan.total_steps = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(epochs * static_cast<double>(plan.record.rows_committed) /
                                          static_cast<double>(plan.batch_size))));
  }
  if (spec.checkpoint_every() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.checkpoint_every: must be >= 0, got ", spec.checkpoint_every()));
  }
  if (spec.checkpoint_every() > 0) plan.checkpoint_every = spec.checkpoint_every();
  if (spec.telemetry_every() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.telemetry_every: must be >= 0, got ", spec.telemetry_every()));
  }
  if (spec.telemetry_every() > 0) plan.telemetry_every = spec.telemetry_every();
  if (spec.dead_window_steps() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.dead_window_steps: must be >= 0 (0: 1000), got ", spec.dead_window_steps()));
  }
  if (spec.dead_window_steps() > 0) plan.dead_window_steps = spec.dead_window_steps();
  RETURN_IF_ERROR(CheckArtifactName(spec.artifact_name()));
  ASSIGN_OR_RETURN(plan.optimizer, OptimizerConfigFromProto(spec.optimizer()));
  plan.optimizer.seed = spec.seed();
  ASSIGN_OR_RETURN(plan.lr,
                   LrScheduleFromProto(spec.schedule(), plan.optimizer.lr, plan.total_steps));

  if (has_sae) {
    if (spec.sae().d_in() != 0 && spec.sae().d_in() != plan.width) {
      return absl::InvalidArgumentError(absl::StrCat("train.sae.d_in: ", spec.sae().d_in(),
                                                     " does not match the width of dataset ",
                                                     spec.dataset_id(), " (", plan.width, ")"));
    }
    if (plan.crosscoder) {
      ASSIGN_OR_RETURN(plan.crosscoder_options,
                       CrosscoderModelOptionsFromProto(spec.sae(), plan.crosscoder_sources.size(),
                                                       plan.width, spec.seed()));
      plan.shapes = CrosscoderParameterShapes(plan.crosscoder_options);
    } else if (spec.sae().cross_layers() < 0 || (spec.sae().cross_layers() > 0 && !plan.clt)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.sae.cross_layers: ", spec.sae().cross_layers(),
          "; a cross-layer transcoder (>= 1 blocks) trains on train.activations (the model's "
          "hooks of every block computed as training reads them) or on "
          "train.cross_layer_dataset_ids (every block's stored hooks)"));
    } else if (plan.clt) {
      ASSIGN_OR_RETURN(plan.clt_options, CltModelOptionsFromProto(spec.sae(), plan.width,
                                                                  plan.target_width, spec.seed()));
      plan.shapes = CltParameterShapes(plan.clt_options);
    } else {
      ASSIGN_OR_RETURN(plan.sae_options, SaeModelOptionsFromProto(spec.sae(), plan.width,
                                                                  spec.seed(), plan.target_width));
      plan.shapes = SaeShapes(plan.sae_options);
    }
  } else {
    plan.sae = false;
    ASSIGN_OR_RETURN(
        plan.torchscript_path,
        ResolveUnderRoots(spec.torchscript_path(), env.data_roots, "train.torchscript_path"));
    ASSIGN_OR_RETURN(auto model,
                     LoadTorchScriptTrainable(plan.torchscript_path, c10::kCPU, plan.tokens));
    for (const auto& p : model->parameters()) plan.shapes.push_back(p.sizes().vec());
  }
  for (const auto& shape : plan.shapes) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    plan.num_params += n;
  }
  return plan;
}

TrainMemoryEstimate Estimate(const TrainPlan& plan, const OptimizerConfig& optimizer) {
  TrainMemoryEstimate estimate;
  const int64_t params = plan.num_params;
  const OptimizerMemory memory = EstimateOptimizerMemory(optimizer, plan.shapes);
  const int64_t rows = (plan.batch_size + plan.ranks - 1) / plan.ranks;
  // Activations of one step and their gradients: the input, x_hat and their gradients (4 x d_in)
  // plus pre-activations, latents and their gradients (~5 x d_sae) per row; a module: 4 x width.
  const int64_t activations = plan.sae ? 4 * rows * (4 * plan.row_width() + 5 * plan.num_latents())
                                       : 4 * rows * 4 * plan.width;
  estimate.optimizer_bytes = memory.total();
  estimate.total_bytes = 8 * params + memory.total() + activations;
  std::vector<std::string> parts;
  for (const auto& [name, bytes] : memory.components) {
    if (bytes > 0) parts.push_back(absl::StrCat(name, " ", Gb(bytes)));
  }
  estimate.breakdown = absl::StrCat("parameters ", Gb(4 * params), ", gradients ", Gb(4 * params),
                                    ", ", optimizer.name, " state ", Gb(memory.total()), " (",
                                    absl::StrJoin(parts, ", "), "), activations ", Gb(activations));
  return estimate;
}

c10::Device TorchDevice(const DeviceRef& device) {
  return device.kind == DeviceKind::kCuda ? c10::Device(c10::kCUDA, device.index)
                                          : c10::Device(c10::kCPU);
}

// 64-bit FNV-1a: the same on every node and build (absl::Hash is seeded per process).
uint64_t StableHash(absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// What every node of a run must have alike, as text for the message when they do not: the
// device kind (Gloo and NCCL do not mix), the data's shape, the spec but for what names
// this node's own things (its dataset id, paths, job ids, rank offset, address), and the
// data's chunk boundaries (which order the stream's shuffle) and first rows (the same dataset,
// not merely the same shape).
absl::StatusOr<std::string> RunAgreement(const TrainPlan& plan, const latentd::v1::TrainSpec& spec,
                                         bool cuda, DenseRowSource* source) {
  latentd::v1::TrainSpec common = spec;
  common.clear_dataset_id();
  common.clear_target_dataset_id();
  common.clear_cross_layer_dataset_ids();
  common.clear_crosscoder_dataset_ids();
  common.clear_torchscript_path();
  if (common.has_tokens()) common.mutable_tokens()->clear_path();
  if (common.has_activations()) {
    latentd::v1::ExtractSpec* activations = common.mutable_activations();
    activations->mutable_tokens()->clear_path();
    latentd::v1::ModelSpec* model = activations->mutable_model();
    if (model->has_huggingface()) model->mutable_huggingface()->clear_path();
    if (model->has_torchscript()) model->mutable_torchscript()->clear_path();
  }
  common.clear_resume_from_job_id();
  common.clear_artifact_name();
  common.clear_checkpoint_every();
  common.clear_telemetry_every();
  latentd::v1::TrainRendezvous* rendezvous = common.mutable_rendezvous();
  rendezvous->clear_address();
  rendezvous->clear_rank_offset();
  rendezvous->clear_node_address();
  // Read from the source, not the stream: a stream would keep the window, and a stream over a
  // source shared by the ranks must load its windows in step with theirs.
  const int64_t probe_rows = std::min<int64_t>(64, plan.record.rows_committed);
  std::vector<float> rows(probe_rows * plan.row_width());
  RETURN_IF_ERROR(source->Read(0, probe_rows, rows.data()));
  const std::vector<int64_t> chunk_starts = source->chunk_starts();
  return absl::StrFormat(
      "%s devices, %d rows of width %d in chunks %016x, %d parameters, spec %016x, first rows "
      "%016x",
      cuda ? "CUDA" : "CPU", plan.record.rows_committed, plan.row_width(),
      StableHash(absl::string_view(reinterpret_cast<const char*>(chunk_starts.data()),
                                   chunk_starts.size() * sizeof(int64_t))),
      plan.num_params, StableHash(common.SerializeAsString()),
      StableHash(absl::string_view(reinterpret_cast<const char*>(rows.data()),
                                   rows.size() * sizeof(float))));
}

// The address Gloo listens on for the other nodes: the spec's, else the route to the store's.
absl::StatusOr<std::string> NodeAddress(const latentd::v1::TrainRendezvous& rendezvous) {
  if (!rendezvous.node_address().empty()) return rendezvous.node_address();
  ASSIGN_OR_RETURN(HostPort master, ParseHostPort(rendezvous.address()));
  auto local = LocalAddressTowards(master);
  if (!local.ok()) {
    return WithMessage(local.status(),
                       absl::StrCat("train.rendezvous.node_address: not given, and ",
                                    local.status().message(), "; name this node's address"));
  }
  return local;
}

// Connects global rank `rank` to the run's TCPStore (rank 0 hosts it), under the run id's
// prefix, and waits until every rank agrees on `agreement`; CANCELLED once `cancelled` is true.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> JoinRendezvous(
    const latentd::v1::TrainRendezvous& rendezvous, int rank, const std::string& agreement,
    const std::function<bool()>& cancelled) {
  ASSIGN_OR_RETURN(HostPort master, ParseHostPort(rendezvous.address()));
  auto tcp = NewTcpStore(master.host, master.port, rendezvous.world_size(), rank == 0,
                         RendezvousTimeoutSeconds(rendezvous), cancelled);
  if (!tcp.ok()) {
    return WithMessage(tcp.status(),
                       absl::StrCat("train.rendezvous: rank ", rank, ": ", tcp.status().message()));
  }
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(
      rendezvous.run_id().empty() ? "train" : rendezvous.run_id(), *tcp);
  absl::Status agreed =
      CheckRanksAgree(*store, rank, rendezvous.world_size(), "the run", agreement, cancelled);
  if (!agreed.ok()) {
    return WithMessage(agreed, absl::StrCat("train.rendezvous: ", agreed.message()));
  }
  return store;
}

// One data-parallel rank's objects.
struct Rank {
  std::unique_ptr<DenseRowSource> source;
  // `source` when it runs a model (training on activations): the ranks share its forward passes.
  ModelRowSource* model_source = nullptr;
  std::unique_ptr<ShuffledRowStream> stream;
  std::unique_ptr<TrainableModel> model;
  std::unique_ptr<TrainOptimizer> optimizer;
  absl::StatusOr<TrainLoopResult> result = absl::UnknownError("not run");
};

// The name the trained model is saved and registered under: the spec's (or "sae-<job id>"),
// unless another job's artifact holds it by now (two jobs submitted with one name, or a name
// registered while this one ran). Saving over that artifact would change the SAE its users
// extract with, so this job takes "<name>.job<id>" instead. Resuming is unaffected: a name this
// job registered before a crash is still its own.
absl::StatusOr<std::string> ClaimArtifactName(const latentd::v1::TrainSpec& spec,
                                              const TrainEnv& env, JobContext* context) {
  const uint64_t job_id = context->job_id();
  const std::string wanted = TrainArtifactName(spec, job_id);
  if (env.artifacts == nullptr) return wanted;
  std::string name = wanted;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto owner = env.artifacts->FindByName(name);
    if (absl::IsNotFound(owner.status())) return name;
    RETURN_IF_ERROR(owner.status());
    if (owner->job_id() == job_id) return name;
    if (attempt == 0) {
      const std::string suffix = absl::StrCat(".job", job_id);
      name = wanted.substr(0, kMaxArtifactName - suffix.size()) + suffix;
      context->Log(latentd::v1::LogLine::WARNING,
                   absl::StrCat("train.artifact_name: \"", wanted, "\" was taken by artifact ",
                                owner->id(), " (job ", owner->job_id(),
                                ") while this job ran; the SAE is saved as \"", name, "\""));
    }
  }
  return absl::AlreadyExistsError(absl::StrCat("train.artifact_name: \"", wanted, "\" and \"", name,
                                               "\" are both taken by other jobs"));
}

// resume_from_job_id at submit: a finished TRAIN job that failed or was cancelled, still
// holding its checkpoint, trained with the same spec but for what may change from one run to
// its continuation.
absl::Status CheckResumeSource(const latentd::v1::TrainSpec& spec, const TrainEnv& env) {
  const uint64_t from = spec.resume_from_job_id();
  if (from == 0) return absl::OkStatus();
  constexpr absl::string_view kField = "train.resume_from_job_id";
  ASSIGN_OR_RETURN(latentd::v1::Job job,
                   FindContinuableJob(env.find_job, from, latentd::v1::JobSpec::kTrain, kField));
  RETURN_IF_ERROR(CheckSameSpecBut<latentd::v1::TrainSpec>(
      job.spec().train(), spec,
      [](latentd::v1::TrainSpec* s) {
        s->clear_steps();
        s->clear_epochs();
        s->mutable_optimizer()->clear_lr();
        s->clear_schedule();
        s->clear_checkpoint_every();
        s->clear_telemetry_every();
        s->clear_artifact_name();
        s->clear_resume_from_job_id();
        s->clear_rendezvous();
      },
      from, kField,
      "only steps, epochs, optimizer.lr, schedule, checkpoint_every, telemetry_every, "
      "artifact_name and rendezvous may change"));
  ASSIGN_OR_RETURN(std::optional<int64_t> step,
                   DbCheckpointStore(env.store->db(), from).LatestStep());
  if (!step.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "train.resume_from_job_id: job ", from,
        " holds no checkpoint (another job took it over, or it failed before its first)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<latentd::v1::TrainResult> RunPlanned(const TrainPlan& plan,
                                                    const latentd::v1::TrainSpec& spec,
                                                    const TrainEnv& env, JobContext* context) {
  std::vector<DeviceRef> devices = context->devices();
  if (devices.empty()) devices.push_back(DeviceRef{DeviceKind::kCpu, 0, "cpu:0", 0});
  const int local_ranks = static_cast<int>(devices.size());
  const bool several_nodes = spec.has_rendezvous();
  // This node's ranks are [rank_offset, rank_offset + local_ranks) of `world`.
  const int rank_offset = several_nodes ? spec.rendezvous().rank_offset() : 0;
  const int world = several_nodes ? spec.rendezvous().world_size() : local_ranks;
  // Admission checked the devices the spec asked for; these are the ones the job holds.
  if (several_nodes) RETURN_IF_ERROR(CheckRendezvous(spec.rendezvous(), local_ranks));
  if (plan.batch_size < world) {
    return absl::InvalidArgumentError(absl::StrCat("train.batch_size: ", plan.batch_size,
                                                   " rows cannot be split over ", world, " ranks"));
  }
  std::vector<Rank> ranks(local_ranks);
  std::string model_id;  // of the model computing the rows (train.activations)
  for (int r = 0; r < local_ranks; ++r) {
    const c10::Device device = TorchDevice(devices[r]);
    if (plan.tokens) {
      ASSIGN_OR_RETURN(ranks[r].source, TokenRowSource::Open(plan.token_spec));
    } else if (plan.activations) {
      auto source = ModelRowSource::Open(plan.activation_spec, ActivationEnv(env), devices[r],
                                         storage::ChunkStoreOptions().chunk_rows);
      if (!source.ok()) return InActivationsField(source.status());
      if (r == 0) model_id = (*source)->model_id();
      ranks[r].model_source = source->get();
      ranks[r].source = *std::move(source);
    } else {
      std::vector<std::unique_ptr<DenseRowSource>> parts;
      for (const uint64_t id : plan.stored_ids) {
        ASSIGN_OR_RETURN(auto part, StoreDenseRowSource::Open(env.store, id));
        parts.push_back(std::move(part));
      }
      if (parts.size() == 1) {
        ranks[r].source = std::move(parts[0]);
      } else {
        ASSIGN_OR_RETURN(ranks[r].source, SideBySideDenseRowSource::Create(std::move(parts)));
      }
    }
    ranks[r].stream = std::make_unique<ShuffledRowStream>(
        ranks[r].source.get(), ShuffledRowStreamOptions{spec.seed() ^ kStreamSeedSalt, 4});
    if (plan.crosscoder) {
      std::vector<CrosscoderSource> sources = plan.crosscoder_sources;
      for (CrosscoderSource& source : sources) {
        if (plan.activations) source.model_name = model_id;
      }
      ranks[r].model = std::make_unique<CrosscoderTrainable>(plan.crosscoder_options, device,
                                                             std::move(sources));
    } else if (plan.clt) {
      ranks[r].model = std::make_unique<CltTrainable>(
          plan.clt_options, device,
          CltProvenance{plan.clt_input_hook, plan.clt_output_hook,
                        plan.activations ? model_id : plan.record.meta.model_id});
    } else if (plan.sae) {
      auto sae = std::make_unique<SaeTrainable>(plan.sae_options, device);
      sae->set_provenance(plan.record.meta.hook_name,
                          plan.activations ? model_id : plan.record.meta.model_id,
                          plan.target_hook);
      ranks[r].model = std::move(sae);
    } else {
      ASSIGN_OR_RETURN(ranks[r].model,
                       LoadTorchScriptTrainable(plan.torchscript_path, device, plan.tokens));
    }
    ASSIGN_OR_RETURN(ranks[r].optimizer,
                     MakeOptimizer(plan.optimizer, ranks[r].model->parameters()));
  }
  DbCheckpointStore checkpoints(env.store->db(), context->job_id());
  if (spec.resume_from_job_id() != 0) {
    auto adopted = checkpoints.AdoptFrom(spec.resume_from_job_id());
    if (!adopted.ok()) {
      return WithMessage(adopted.status(),
                         absl::StrCat("train.resume_from_job_id: ", adopted.status().message()));
    }
    if (adopted->has_value()) {
      context->Log(latentd::v1::LogLine::INFO,
                   absl::StrCat("took over job ", spec.resume_from_job_id(),
                                "'s checkpoint at step ", **adopted));
    }
  }
  auto cancel = [context] { return context->cancel_requested(); };
  auto loop_options = [&](int r) {
    TrainLoopOptions options;
    options.batch_size = plan.batch_size;
    options.total_steps = plan.total_steps;
    options.lr = plan.lr;
    options.checkpoint_every = plan.checkpoint_every;
    options.telemetry_every = plan.telemetry_every;
    options.dead_window_steps = plan.dead_window_steps;
    options.device = TorchDevice(devices[r]);
    options.mfac_window = plan.optimizer.window;
    options.init_rows = std::min<int64_t>(4096, plan.record.rows_committed);
    options.local_leader_rank = rank_offset;
    options.share_start_state = several_nodes;
    options.collective_reads = ranks[r].model_source != nullptr;
    return options;
  };
  if (world == 1) {
    ranks[0].result = RunTrainLoop(loop_options(0), ranks[0].model.get(), ranks[0].optimizer.get(),
                                   ranks[0].stream.get(), plan.row_width(), nullptr, &checkpoints,
                                   context, cancel);
  } else {
    const bool cuda = devices[0].kind == DeviceKind::kCuda;
    ProcessGroupOptions group;
    group.backend = cuda ? CollectiveBackend::kNccl : CollectiveBackend::kGloo;
    group.world_size = world;
    auto in_process_store = NewInProcessStore();
    std::string agreement;  // what every node must have alike
    if (several_nodes) {
      ASSIGN_OR_RETURN(group.gloo_hostname, NodeAddress(spec.rendezvous()));
      group.timeout_seconds = RendezvousTimeoutSeconds(spec.rendezvous());
      ASSIGN_OR_RETURN(agreement, RunAgreement(plan, spec, cuda, ranks[0].source.get()));
      context->Log(
          latentd::v1::LogLine::INFO,
          absl::StrCat("joining ", world, " ranks as ", rank_offset, "..",
                       rank_offset + local_ranks - 1, " through ", spec.rendezvous().address(),
                       " (this node: ", group.gloo_hostname, ")"));
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < local_ranks; ++r) {
      threads.emplace_back([&, r] {
        try {
          ProcessGroupOptions rank_group = group;
          rank_group.rank = rank_offset + r;
          c10::intrusive_ptr<c10d::Store> store = in_process_store;
          if (several_nodes) {
            auto joined = JoinRendezvous(spec.rendezvous(), rank_group.rank, agreement, cancel);
            if (!joined.ok()) {
              ranks[r].result = joined.status();
              return;
            }
            store = *joined;
          }
          auto sync = JoinProcessGroup(store, rank_group);
          if (!sync.ok()) {
            ranks[r].result = sync.status();
            return;
          }
          if (ranks[r].model_source != nullptr) ranks[r].model_source->ShareWork(sync->get());
          ranks[r].result =
              RunTrainLoop(loop_options(r), ranks[r].model.get(), ranks[r].optimizer.get(),
                           ranks[r].stream.get(), plan.row_width(), sync->get(), &checkpoints,
                           r == 0 ? context : nullptr, cancel);
        } catch (const std::exception& e) {
          ranks[r].result =
              absl::InternalError(absl::StrCat("rank ", rank_offset + r, ": ", e.what()));
        }
      });
    }
    for (auto& t : threads) t.join();
    // The first rank that failed on its own says why; a rank that stopped because a peer failed
    // (ABORTED) only that it did.
    for (int r = 0; r < local_ranks; ++r) {
      if (!ranks[r].result.ok() && !absl::IsAborted(ranks[r].result.status())) {
        return ranks[r].result.status();
      }
    }
    for (int r = 1; r < local_ranks; ++r) {
      if (ranks[0].result.ok() && !ranks[r].result.ok()) return ranks[r].result.status();
    }
  }
  if (!ranks[0].result.ok()) return ranks[0].result.status();
  const TrainLoopResult& loop = *ranks[0].result;
  if (plan.activations) {
    // What the activations cost: ranks share the forward passes, so this is the sequences read
    // (a window reread after a resume counts again), not that times the ranks.
    int64_t sequences = 0;
    for (const Rank& rank : ranks) sequences += rank.model_source->sequences_computed();
    context->Log(latentd::v1::LogLine::INFO,
                 absl::StrCat("the model ran over ", sequences, " sequences on this node's ",
                              local_ranks, local_ranks == 1 ? " rank" : " ranks"));
  }

  ASSIGN_OR_RETURN(const std::string name, ClaimArtifactName(spec, env, context));
  const std::string dir = (std::filesystem::path(env.artifact_dir) / name).string();
  RETURN_IF_ERROR(ranks[0].model->Save(dir));
  latentd::v1::TrainResult result;
  if (env.artifacts != nullptr) {
    ASSIGN_OR_RETURN(uint64_t id, env.artifacts->Register(name, dir, context->job_id()));
    result.set_artifact_id(id);
  }
  result.set_artifact_path(dir);
  result.set_steps(loop.steps);
  result.set_final_loss(loop.final_loss);
  result.set_final_fvu(loop.final_fvu);
  result.set_final_l0(loop.final_l0);
  for (const double fvu : loop.final_prefix_fvu) result.add_final_prefix_fvu(fvu);
  for (const double fvu : loop.final_block_fvu) result.add_final_block_fvu(fvu);
  result.set_peak_optimizer_state_bytes(loop.peak_optimizer_state_bytes);
  ranks[0].model->AddToResult(&result);
  // The artifact is registered: the checkpoint has done its work.
  absl::Status cleared = checkpoints.Clear();
  if (!cleared.ok()) {
    context->Log(latentd::v1::LogLine::WARNING,
                 absl::StrCat("could not remove the checkpoint: ", cleared.ToString()));
  }
  return result;
}

}  // namespace

std::string TrainArtifactName(const latentd::v1::TrainSpec& spec, uint64_t job_id) {
  return spec.artifact_name().empty() ? absl::StrCat("sae-", job_id) : spec.artifact_name();
}

absl::Status ForgetTrainJob(storage::ChunkStore* store, uint64_t job_id) {
  return DbCheckpointStore(store->db(), job_id).Clear();
}

absl::StatusOr<TrainMemoryEstimate> EstimateTrainMemory(const latentd::v1::TrainSpec& spec,
                                                        const TrainEnv& env) {
  try {
    ASSIGN_OR_RETURN(TrainPlan plan, MakePlan(spec, env));
    return Estimate(plan, plan.optimizer);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("train: ", e.what_without_backtrace()));
  }
}

namespace {

// The checks at submit, and the plan they made (DescribeTrainSpec words it).
absl::StatusOr<TrainPlan> CheckTrainAtSubmit(const latentd::v1::TrainSpec& spec,
                                             const TrainEnv& env) {
  ASSIGN_OR_RETURN(TrainPlan plan, MakePlan(spec, env));
  RETURN_IF_ERROR(CheckResumeSource(spec, env));
  if (env.artifacts != nullptr && !spec.artifact_name().empty()) {
    auto owner = env.artifacts->FindByName(spec.artifact_name());
    if (owner.ok()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "train.artifact_name: \"", spec.artifact_name(), "\" is taken by artifact ", owner->id(),
          " (job ", owner->job_id(), "); name another, or delete that one first (",
          "latentctl delete-artifact ", owner->id(), ")"));
    }
    if (!absl::IsNotFound(owner.status())) return owner.status();
  }
  if (env.device_memory_bytes <= 0) return plan;
  const TrainMemoryEstimate estimate = Estimate(plan, plan.optimizer);
  if (estimate.total_bytes <= env.device_memory_bytes) return plan;
  std::string message =
      absl::StrCat("train.optimizer: the job needs ", Gb(estimate.total_bytes), " per device (",
                   estimate.breakdown, "), the device has ", Gb(env.device_memory_bytes));
  if (plan.optimizer.name == "mfac") {
    message += absl::StrCat("; dense M-FAC needs ",
                            Gb(DenseMfacHistoryBytes(plan.num_params, plan.optimizer.window)),
                            " for the history");
  }
  if (plan.optimizer.name != "smfac" || plan.optimizer.density > 0.01) {
    OptimizerConfig smfac = plan.optimizer;
    smfac.name = "smfac";
    smfac.density = 0.01;
    const TrainMemoryEstimate alternative = Estimate(plan, smfac);
    message += absl::StrCat("; smfac at 1% needs ", Gb(alternative.optimizer_bytes),
                            " for its state (", Gb(alternative.total_bytes), " in all)");
  }
  return absl::ResourceExhaustedError(message);
}

}  // namespace

absl::Status ValidateTrainSpec(const latentd::v1::TrainSpec& spec, const TrainEnv& env) {
  try {
    return CheckTrainAtSubmit(spec, env).status();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("train: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<std::vector<std::string>> DescribeTrainSpec(const latentd::v1::TrainSpec& spec,
                                                           const TrainEnv& env) {
  try {
    ASSIGN_OR_RETURN(TrainPlan plan, CheckTrainAtSubmit(spec, env));
    std::vector<std::string> lines;
    const std::string rows = absl::StrCat(plan.record.rows_committed, " rows of ", plan.width);
    if (plan.tokens) {
      lines.push_back(
          absl::StrCat("rows: token sequences of ", plan.token_spec.path(), ": ", rows, " ids"));
    } else if (plan.clt) {
      const int64_t last = plan.clt_options.layers - 1;
      lines.push_back(absl::StrCat(
          "rows: the hidden states at blocks.0..", last, ".", plan.clt_input_hook,
          " and blocks.0..", last, ".", plan.clt_output_hook,
          plan.activations ? ", computed as training reads them"
                           : absl::StrCat(" from datasets ", absl::StrJoin(plan.stored_ids, ", ")),
          ": ", plan.record.rows_committed, " rows of ", plan.row_width()));
    } else if (plan.crosscoder) {
      std::vector<std::string> sources;
      for (const CrosscoderSource& source : plan.crosscoder_sources) {
        sources.push_back(source.rows_from == "live"
                              ? source.hook_name
                              : absl::StrCat(source.hook_name, " of ", source.model_name, " (",
                                             source.rows_from, ")"));
      }
      lines.push_back(absl::StrCat("rows: the hidden states at ", absl::StrJoin(sources, ", "),
                                   plan.activations ? ", computed as training reads them" : "",
                                   ", side by side: ", plan.record.rows_committed, " rows of ",
                                   plan.row_width()));
    } else if (plan.activations) {
      lines.push_back(absl::StrCat("rows: the hidden states at ", plan.activation_spec.hook_name(),
                                   ", computed as training reads them: ", rows));
    } else {
      lines.push_back(
          absl::StrCat("rows: dataset ", plan.record.id, " (", plan.record.meta.name, "): ", rows));
    }
    if (plan.target) {
      lines.push_back(absl::StrCat("target: dataset ", plan.target->id, " (",
                                   plan.target->meta.name, "), ", plan.target_width,
                                   " wide: a transcoder"));
    } else if (!plan.target_hook.empty() && !plan.clt) {  // a CLT's targets are on its rows line
      lines.push_back(absl::StrCat("target: ", plan.target_hook, ", ", plan.target_width,
                                   " wide: a transcoder"));
    }
    if (plan.crosscoder) {
      const CrosscoderModelOptions& o = plan.crosscoder_options;
      lines.push_back(absl::StrCat(
          "model: a ", latentd::v1::SaeArchitecture_Name(o.architecture), " crosscoder over ",
          o.sources, " sources, d_in ", o.d_in, " each, d_sae ", o.d_sae,
          o.architecture == latentd::v1::BATCHTOPK ? absl::StrCat(", k ", o.k) : "", ": ",
          plan.num_params, " parameters; saved in dictionary_learning's layout"));
    } else if (plan.clt) {
      const CltModelOptions& o = plan.clt_options;
      lines.push_back(
          absl::StrCat("model: a ", latentd::v1::SaeArchitecture_Name(o.architecture),
                       " cross-layer transcoder over blocks 0..", o.layers - 1, ", d_in ", o.d_in,
                       ", d_sae ", o.d_sae, " a block, d_out ", o.d_out,
                       o.architecture == latentd::v1::BATCHTOPK ? absl::StrCat(", k ", o.k) : "",
                       ": ", plan.num_params, " parameters; saved in circuit-tracer's layout"));
    } else if (plan.sae) {
      const SaeModelOptions& o = plan.sae_options;
      lines.push_back(absl::StrCat(
          "model: a ", latentd::v1::SaeArchitecture_Name(o.architecture), " SAE, d_in ", o.d_in,
          ", d_sae ", o.d_sae,
          o.architecture == latentd::v1::TOPK || o.architecture == latentd::v1::BATCHTOPK
              ? absl::StrCat(", k ", o.k)
              : "",
          o.matryoshka_widths.empty()
              ? ""
              : absl::StrCat(", Matryoshka levels ", absl::StrJoin(o.matryoshka_widths, "/")),
          ": ", plan.num_params, " parameters"));
    } else {
      lines.push_back(absl::StrCat("model: the TorchScript module ", plan.torchscript_path, ": ",
                                   plan.num_params, " parameters"));
    }
    const OptimizerConfig& opt = plan.optimizer;
    std::string optimizer = absl::StrCat("optimizer: ", opt.name, ", lr ", opt.lr);
    if (opt.name == "mfac" || opt.name == "smfac" || opt.name == "lrmfac") {
      absl::StrAppend(&optimizer, ", window ", opt.window);
      if (opt.name == "smfac") absl::StrAppend(&optimizer, ", density ", opt.density);
      if (opt.name == "lrmfac") absl::StrAppend(&optimizer, ", rank ", opt.rank);
      absl::StrAppend(&optimizer, "; dense M-FAC's history would take ",
                      Gb(DenseMfacHistoryBytes(plan.num_params, opt.window)));
    }
    lines.push_back(optimizer);
    lines.push_back(absl::StrCat(plan.total_steps, " steps of ", plan.batch_size, " rows over ",
                                 plan.ranks, plan.ranks == 1 ? " device" : " devices",
                                 "; a checkpoint every ", plan.checkpoint_every, " steps"));
    const TrainMemoryEstimate estimate = Estimate(plan, opt);
    std::string memory = absl::StrCat("device memory: about ", Gb(estimate.total_bytes),
                                      " a device (", estimate.breakdown, ")");
    if (env.device_memory_bytes > 0) absl::StrAppend(&memory, " of ", Gb(env.device_memory_bytes));
    lines.push_back(memory);
    return lines;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("train: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<latentd::v1::TrainResult> RunTrain(const latentd::v1::TrainSpec& spec,
                                                  const TrainEnv& env, JobContext* context) {
  if (env.artifact_dir.empty()) return absl::FailedPreconditionError("TRAIN: no artifact dir");
  try {
    ASSIGN_OR_RETURN(TrainPlan plan, MakePlan(spec, env));
    return RunPlanned(plan, spec, env, context);
  } catch (const c10::Error& e) {
    return TorchErrorStatus(e, "train");
  }
}

}  // namespace latentd::engine
