#include "engine/extract_runner.h"

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/path_within.h"
#include "common/status_macros.h"
#include "engine/device_util.h"
#include "engine/downstream_loss.h"
#include "engine/extract_pipeline.h"
#include "engine/gpt2_model.h"
#include "engine/hf_model.h"
#include "engine/hook_name.h"
#include "engine/job_continuation.h"
#include "engine/reference_model.h"
#include "engine/sae.h"
#include "engine/sae_config.h"
#include "engine/stored_activations_model.h"
#include "engine/token_source.h"
#include "engine/torchscript_model.h"

namespace latentd::engine {
namespace {

using latentd::v1::ExtractSpec;

constexpr int64_t kDefaultBatchSequences = 32;

}  // namespace

// On CPUs B x L^2 stays at X1's 32 x 128^2. Measured on the 2-core VM (EXTRACT DENSE of the
// reference model, one CPU device): at 1024 tokens 1 sequence a pass took 17 s where 32 took
// 39 s; at 512, 2 a pass 6-12 s where 32 took 22 s (docs/EXTRACT.md).
int64_t DefaultBatchSequences(int64_t context_length, bool all_cpu) {
  if (!all_cpu || context_length <= 0) return kDefaultBatchSequences;
  const int64_t budget = kDefaultBatchSequences * 128 * 128;
  return std::clamp<int64_t>(budget / (context_length * context_length), 1, kDefaultBatchSequences);
}

namespace {
constexpr int64_t kDefaultCommitRows = 16384;

}  // namespace

absl::StatusOr<std::string> ResolveUnderRoots(const std::string& path, const ExtractEnv& env,
                                              const std::string& field) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty path"));
  if (env.data_roots.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(field, ": no data roots are configured"));
  }
  char buf[PATH_MAX];
  std::string resolved;
  bool exists = true;
  if (realpath(path.c_str(), buf) != nullptr) {
    resolved = buf;
  } else {
    exists = false;
    if (path[0] != '/') {
      return absl::PermissionDeniedError(absl::StrCat(field, ": ", path, " must be absolute"));
    }
    for (absl::string_view part : absl::StrSplit(path, '/')) {
      if (part == "..") {
        return absl::PermissionDeniedError(absl::StrCat(field, ": ", path, " contains .."));
      }
    }
    resolved = path;
  }
  for (const std::string& root : env.data_roots) {
    char rbuf[PATH_MAX];
    const std::string r = realpath(root.c_str(), rbuf) != nullptr ? std::string(rbuf) : root;
    if (PathIsWithin(resolved, r)) {
      if (!exists) return absl::NotFoundError(absl::StrCat(field, ": ", path, " not found"));
      return resolved;
    }
  }
  return absl::PermissionDeniedError(
      absl::StrCat(field, ": ", path, " is not under a configured data root"));
}

absl::StatusOr<std::string> ResolveSaeDir(const ExtractSpec& spec, const ExtractEnv& env) {
  switch (spec.sae().source_case()) {
    case latentd::v1::SaeSource::kPath:
      return ResolveUnderRoots(spec.sae().path(), env, "extract.sae.path");
    case latentd::v1::SaeSource::kArtifactId:
      if (!env.sae_artifact_dir) {
        return absl::InvalidArgumentError("extract.sae.artifact_id: no artifact store");
      }
      return env.sae_artifact_dir(spec.sae().artifact_id());
    default:
      return absl::InvalidArgumentError("extract.sae: required in SPARSE mode");
  }
}

int ExtractOutputCount(const ExtractSpec& spec) { return 1 + spec.more_outputs_size(); }

ExtractSpec ExtractOutputSpec(const ExtractSpec& spec, int output) {
  ExtractSpec one = spec;
  one.clear_more_outputs();
  if (output > 0) {
    const latentd::v1::ExtractOutput& more = spec.more_outputs(output - 1);
    one.clear_crosscoder_hooks();  // the job's own output's
    one.set_hook_name(more.hook_name());
    if (more.has_sae()) {
      *one.mutable_sae() = more.sae();
    } else {
      one.clear_sae();
    }
    one.set_dataset_name(more.dataset_name());
  }
  return one;
}

std::string ExtractOutputField(int output, absl::string_view field) {
  return output == 0 ? absl::StrCat("extract.", field)
                     : absl::StrCat("extract.more_outputs[", output - 1, "].", field);
}

namespace {

// How an encoder chose the stored entries, for the dataset's metadata.
const char* ThresholdPolicy(SaeArchitecture architecture) {
  switch (architecture) {
    case SaeArchitecture::kJumpRelu:
      return "per-latent threshold (pre > threshold)";
    case SaeArchitecture::kTopK:
      return "topk then relu, zeros dropped";
    case SaeArchitecture::kGated:
      return "gate (pre_gate > 0) times relu(magnitude), zeros dropped";
    case SaeArchitecture::kRelu:
      break;
  }
  return "relu, zeros dropped";
}

// `status` about output `output`, naming its field where it names output 0's ("extract.sae...",
// ...): the checks below run on ExtractOutputSpec, whose messages name the first output's fields.
absl::Status ForOutput(const absl::Status& status, int output) {
  if (status.ok() || output == 0) return status;
  for (absl::string_view field : {"hook_name", "sae", "dataset_name"}) {
    const std::string prefix = absl::StrCat("extract.", field);
    if (absl::StartsWith(status.message(), prefix)) {
      return WithMessage(status, absl::StrCat(ExtractOutputField(output, field),
                                              status.message().substr(prefix.size())));
    }
  }
  return WithMessage(status,
                     absl::StrCat("extract.more_outputs[", output - 1, "]: ", status.message()));
}

bool WantsSparse(const ExtractSpec& spec) {
  if (spec.mode() == latentd::v1::SPARSE) return true;
  if (spec.mode() == latentd::v1::DENSE) return false;
  return spec.has_sae() && spec.sae().source_case() != latentd::v1::SaeSource::SOURCE_NOT_SET;
}

int ValueBytes(latentd::v1::ValueDtype d) { return d == latentd::v1::FLOAT32 ? 4 : 2; }

constexpr int kMaxMoreOutputs = 63;

// One output (hook, and SAE when sparse) after the cheap checks.
struct CheckedOutput {
  std::string hook_name;
  HookName hook;
  std::string sae_dir;
  SaeConfig sae_cfg;
  int64_t hook_width = 0;  // 0 until the model is loaded (TorchScript)
  // A transcoder's output hook (TranscoderOutputHook): what its fit is measured against and
  // where the downstream loss puts its prediction; unset for an SAE.
  std::optional<HookName> hook_out;
  std::string hook_name_out;
  // An earlier output with the same SAE directory (and layer, in a circuit-tracer release),
  // whose loaded weights this one shares (one SAE on several hooks costs its memory once); -1 for
  // none.
  int sae_of = -1;
  // Layer L > 0 of a cross-layer transcoder: the outputs that hold its layers 0..L-1, whose
  // latents add to this one's prediction (CrossLayerSources), in layer order. Empty when one is
  // missing: the fit is then not measured, and cross_layer_missing names the layers.
  std::vector<int> cross_layer_sources;
  std::vector<int> cross_layer_missing;
  // A crosscoder's hooks after `hook` (ExtractSpec.crosscoder_hooks), which the model gives side
  // by side with it as the output's one activation; empty for an SAE.
  std::vector<HookName> crosscoder_hooks;
};

// Whether an output reads a layer of a cross-layer transcoder.
bool IsCrossLayer(const CheckedOutput& out) {
  return out.sae_cfg.circuit_tracer && out.sae_cfg.circuit_tracer->cross_layer;
}

// Whether outputs a and b have the same SAE: the same directory, and in a circuit-tracer release
// the same layer.
bool SameSae(const CheckedOutput& a, const CheckedOutput& b) {
  if (a.sae_dir != b.sae_dir) return false;
  const auto& x = a.sae_cfg.circuit_tracer;
  const auto& y = b.sae_cfg.circuit_tracer;
  return !x || !y || x->layer == y->layer;
}

// CheckedOutput::cross_layer_sources and cross_layer_missing of every cross-layer output: the
// job's outputs that read layer i < L of the same transcoder at the same hook point.
void CrossLayerSources(std::vector<CheckedOutput>* outputs) {
  for (CheckedOutput& out : *outputs) {
    if (!IsCrossLayer(out)) continue;
    for (int layer = 0; layer < out.sae_cfg.circuit_tracer->layer; ++layer) {
      int found = -1;
      for (int s = 0; s < static_cast<int>(outputs->size()) && found < 0; ++s) {
        const CheckedOutput& other = (*outputs)[s];
        if (IsCrossLayer(other) && other.sae_dir == out.sae_dir &&
            other.sae_cfg.circuit_tracer->layer == layer && other.hook.point == out.hook.point) {
          found = s;
        }
      }
      if (found >= 0) {
        out.cross_layer_sources.push_back(found);
      } else {
        out.cross_layer_missing.push_back(layer);
      }
    }
    if (!out.cross_layer_missing.empty()) out.cross_layer_sources.clear();
  }
}

// What the spec resolves to after the cheap checks.
struct Checked {
  std::vector<CheckedOutput> outputs;
  latentd::v1::ReferenceModelSpec reference;  // resolved, when the model is the reference one
  std::optional<TransformerShape> shape;      // a natively run model's (reference, Hugging Face)
  std::string model_path;                     // resolved TorchScript path or Hugging Face dir
  std::string tokens_path;
  bool sparse = true;
  int64_t batch_sequences = kDefaultBatchSequences;
  int64_t commit_rows = kDefaultCommitRows;
  int64_t rows = 0;  // rows of the token shard
  // The token shard as TokenSource::Describe words it, and its sequences (for a dry run).
  std::string tokens_described;
  int64_t sequences = 0;
  int32_t context_length = 0;
  // A stored model's datasets (ModelSpec.stored), in source order; empty for a model that runs.
  // The shard's row 0 is their row stored_first_row, its sequence 0 the token order's
  // stored_first_sequence.
  std::vector<std::shared_ptr<const StoredDenseRows>> stored;
  int64_t stored_first_row = 0;
  int64_t stored_first_sequence = 0;
  // What the new dataset records as its token source: the stored datasets' own when the job
  // covers all their rows (so that it counts as holding the same rows as every dataset
  // extracted from those tokens), else tokens_described.
  std::string stored_token_source;
};

HfModelOptions HfOptions(const ExtractSpec& spec, const Checked& c) {
  HfModelOptions options;
  options.dir = c.model_path;
  options.center_writing_weights = spec.model().huggingface().center_writing_weights();
  options.bfloat16 = spec.model().huggingface().dtype() == latentd::v1::BFLOAT16;
  return options;
}

// A reader's error as the spec field it is about (unless it names a field already).
absl::Status InHuggingFaceField(const absl::Status& s) {
  if (absl::StartsWith(s.message(), "extract.")) return s;
  return absl::Status(s.code(), absl::StrCat("extract.model.huggingface.path: ", s.message()));
}

// A transcoder's output hook (out.hook_name_out) parsed into out.hook_out and checked: a hook
// of the model, computed after the input, d_out wide.
absl::Status CheckTranscoderOutput(CheckedOutput& out, const Checked& c) {
  // The hook checks' errors name extract.hook_name, the job's input hook: this is the SAE's.
  auto about_output = [](const absl::Status& s) {
    return absl::InvalidArgumentError(
        absl::StrCat("extract.sae: the transcoder's output hook (hook_name_out): ",
                     absl::StripPrefix(s.message(), "extract.hook_name: ")));
  };
  auto parsed = ParseHookName(out.hook_name_out);
  if (!parsed.ok()) return about_output(parsed.status());
  if (!ComputedBefore(out.hook, *parsed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("extract.sae: the transcoder predicts ", out.hook_name_out, " from ",
                     out.hook_name, ", but the forward pass computes ", out.hook_name_out,
                     " first (a transcoder's output hook comes after its input, e.g. "
                     "blocks.L.ln2.hook_normalized -> blocks.L.hook_mlp_out)"));
  }
  if (c.shape) {
    if (absl::Status s = CheckTransformerHook(*c.shape, *parsed); !s.ok()) return about_output(s);
    const int64_t width = TransformerHookWidth(*c.shape, *parsed);
    if (out.sae_cfg.d_out != width) {
      return absl::InvalidArgumentError(
          absl::StrCat("extract.sae: d_out ", out.sae_cfg.d_out, " != width ", width,
                       " of the hook it predicts, ", out.hook_name_out));
    }
  } else if (absl::Status s = HiddenStateIndex(*parsed).status(); !s.ok()) {
    return about_output(s);
  }
  out.hook_out = *parsed;
  return absl::OkStatus();
}

// A crosscoder's hooks (one.crosscoder_hooks) checked against its SAE (out->sae_cfg) and the
// model, into out->crosscoder_hooks; out->hook_width becomes their side-by-side width.
absl::Status CheckCrosscoderHooks(const ExtractSpec& one, const Checked& c, CheckedOutput* out) {
  const int sources = out->sae_cfg.crosscoder_sources;
  if (sources == 0) {
    return absl::InvalidArgumentError(
        "extract.crosscoder_hooks: given, but extract.sae is not a crosscoder");
  }
  if (one.crosscoder_hooks_size() != sources - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extract.crosscoder_hooks: the crosscoder reads ", sources, " hooks: hook_name and the ",
        sources - 1, " after it, in the order of its sources",
        out->sae_cfg.crosscoder_hooks.empty()
            ? std::string()
            : absl::StrCat(
                  " (its latentd.json: ", absl::StrJoin(out->sae_cfg.crosscoder_hooks, ", "), ")"),
        "; got ", one.crosscoder_hooks_size()));
  }
  for (int i = 0; i < one.crosscoder_hooks_size(); ++i) {
    const std::string field = absl::StrCat("extract.crosscoder_hooks[", i, "]");
    auto hook = ParseHookName(one.crosscoder_hooks(i));
    if (!hook.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", hook.status().message()));
    }
    if (one.crosscoder_hooks(i) == one.hook_name() ||
        std::find(one.crosscoder_hooks().begin(), one.crosscoder_hooks().begin() + i,
                  one.crosscoder_hooks(i)) != one.crosscoder_hooks().begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", one.crosscoder_hooks(i), " is read already"));
    }
    if (c.shape) {
      if (absl::Status s = CheckTransformerHook(*c.shape, *hook); !s.ok()) {
        return WithMessage(s, absl::StrCat(field, ": ", s.message()));
      }
      const int64_t width = TransformerHookWidth(*c.shape, *hook);
      if (width != out->hook_width) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": ", one.crosscoder_hooks(i), " is ", width, " wide, hook_name ",
            one.hook_name(), " ", out->hook_width, ": a crosscoder's hooks are alike in width"));
      }
    } else if (absl::Status s = HiddenStateIndex(*hook).status(); !s.ok()) {
      return WithMessage(s, absl::StrCat(field, ": ", s.message()));
    }
    out->crosscoder_hooks.push_back(*hook);
  }
  out->hook_width *= sources;
  return absl::OkStatus();
}

constexpr char kStoredField[] = "extract.model.stored.dataset_ids";

// An SAE (one dataset) or crosscoder (one dataset per source) for a stored model's datasets.
absl::Status CheckStoredSources(const ExtractSpec& one, const Checked& c, const SaeConfig& cfg) {
  const int datasets = static_cast<int>(c.stored.size());
  if (one.crosscoder_hooks_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extract.crosscoder_hooks: a crosscoder over stored activations reads the datasets of ",
        kStoredField, ", one per source; leave crosscoder_hooks empty"));
  }
  if (cfg.crosscoder_sources == 0 && datasets > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kStoredField, ": ", datasets,
                     " datasets side by side need a crosscoder; extract.sae is an SAE, which "
                     "reads one"));
  }
  if (cfg.crosscoder_sources > 0 && cfg.crosscoder_sources != datasets) {
    return absl::InvalidArgumentError(absl::StrCat(
        kStoredField, ": the crosscoder reads ", cfg.crosscoder_sources, " sources",
        cfg.crosscoder_hooks.empty()
            ? std::string()
            : absl::StrCat(" (its latentd.json: ", absl::StrJoin(cfg.crosscoder_hooks, ", "), ")"),
        ", one dataset each in that order; got ", datasets));
  }
  if (cfg.transcoder) {
    return absl::InvalidArgumentError(
        "extract.sae: a transcoder, whose prediction of another hook a stored dataset cannot "
        "check; encode it while the model runs (extract.model.reference, huggingface or "
        "torchscript)");
  }
  return absl::OkStatus();
}

// What a job over stored activations cannot do, and its outputs' hook: the one the datasets
// recorded.
absl::Status CheckStoredJob(const ExtractSpec& spec, const Checked& c) {
  const StoredDenseInfo& first = c.stored[0]->info();
  if (!c.sparse) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.mode() == latentd::v1::DENSE ? "extract.mode: DENSE" : "extract.sae: required",
        ": the activations of extract.model.stored are stored already; a job over them encodes "
        "them (SPARSE) with an SAE or a crosscoder"));
  }
  if (spec.downstream_loss_sequences() > 0) {
    return absl::InvalidArgumentError(
        "extract.downstream_loss_sequences: measured through the model's logits, and a stored "
        "model has none; measure it in a job that runs the model");
  }
  // Every output reads the one hook the datasets hold (more_outputs: other SAEs over it).
  for (int o = 0; o < ExtractOutputCount(spec); ++o) {
    const std::string& hook = o == 0 ? spec.hook_name() : spec.more_outputs(o - 1).hook_name();
    if (!hook.empty() && hook != first.hook_name) {
      return absl::InvalidArgumentError(absl::StrCat(
          ExtractOutputField(o, "hook_name"), ": dataset ", first.id, " holds activations of ",
          first.hook_name, ", not ", hook, "; leave it empty"));
    }
  }
  return absl::OkStatus();
}

// Rows a batch of stored activations holds when the spec leaves batch_sequences at 0 (no
// attention to bound, so the batch is sized in rows).
constexpr int64_t kStoredBatchRows = 4096;

// A stored model's datasets opened and checked into c->stored, and the token shard they give
// (their token ids and context length; spec.tokens may only cut a shard of their sequences).
absl::Status CheckStoredModel(const ExtractSpec& spec, const ExtractEnv& env, Checked* c) {
  const latentd::v1::StoredActivationsSpec& stored = spec.model().stored();
  if (!env.open_stored_dense) {
    return absl::FailedPreconditionError(
        "extract.model.stored: this daemon has no chunk store to read activations from");
  }
  if (stored.dataset_ids_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kStoredField,
                     ": name the DENSE dataset to encode (one per source of a "
                     "crosscoder)"));
  }
  if (stored.dataset_ids_size() > kMaxMoreOutputs + 1) {
    return absl::InvalidArgumentError(absl::StrCat(kStoredField, ": at most ", kMaxMoreOutputs + 1,
                                                   " datasets, not ", stored.dataset_ids_size()));
  }
  for (int i = 0; i < stored.dataset_ids_size(); ++i) {
    const std::string field = absl::StrCat(kStoredField, "[", i, "]");
    const uint64_t id = stored.dataset_ids(i);
    if (std::find(stored.dataset_ids().begin(), stored.dataset_ids().begin() + i, id) !=
        stored.dataset_ids().begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": dataset ", id, " is named twice"));
    }
    ASSIGN_OR_RETURN(std::shared_ptr<const StoredDenseRows> rows, env.open_stored_dense(id, field));
    const StoredDenseInfo& info = rows->info();
    if (!info.complete) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": dataset ", id, " (", info.name, ") holds ", info.rows, " of its ",
                       info.rows_planned, " rows and is not complete: is job ", info.job_id,
                       " still running, or did it stop? (resume_from_job_id continues it)"));
    }
    if (i > 0) {
      const StoredDenseInfo& first = c->stored[0]->info();
      if (info.rows != first.rows || info.context_length != first.context_length) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": dataset ", id, " holds ", info.rows, " rows in sequences of ",
            info.context_length, ", dataset ", first.id, " ", first.rows, " in sequences of ",
            first.context_length, ": a crosscoder's datasets hold the same rows"));
      }
    }
    c->stored.push_back(std::move(rows));
  }
  const StoredDenseInfo& first = c->stored[0]->info();
  const latentd::v1::TokenSource& tokens = spec.tokens();
  if (!tokens.path().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("extract.tokens.path: the tokens come with the stored activations (dataset ",
                     first.id, "); leave it empty"));
  }
  if (tokens.format() != latentd::v1::TOKEN_FORMAT_UNSPECIFIED || !tokens.column().empty() ||
      tokens.prepend_bos() || tokens.bos_token_id() != 0) {
    return absl::InvalidArgumentError(
        "extract.tokens: a stored model's datasets bring their tokens; only sequence_start and "
        "sequence_count (a shard of their sequences) may be set");
  }
  // (A dataset of context length 0 is one sequence.)
  const int64_t L =
      first.context_length > 0 ? first.context_length : std::max<int64_t>(1, first.rows);
  if (tokens.context_length() != 0 && tokens.context_length() != L) {
    return absl::InvalidArgumentError(absl::StrCat("extract.tokens.context_length: dataset ",
                                                   first.id, "'s sequences are ", L,
                                                   " rows; leave it 0"));
  }
  const int64_t total = first.rows / L;
  if (tokens.sequence_start() < 0 || tokens.sequence_start() >= total) {
    return absl::InvalidArgumentError(
        absl::StrCat("extract.tokens.sequence_start: ", tokens.sequence_start(), " outside the ",
                     total, " sequences of dataset ", first.id));
  }
  const int64_t left = total - tokens.sequence_start();
  if (tokens.sequence_count() < 0 || tokens.sequence_count() > left) {
    return absl::InvalidArgumentError(
        absl::StrCat("extract.tokens.sequence_count: ", tokens.sequence_count(), " sequences from ",
                     tokens.sequence_start(), " exceed the ", total, " of dataset ", first.id));
  }
  c->context_length = static_cast<int32_t>(L);
  c->sequences = tokens.sequence_count() > 0 ? tokens.sequence_count() : left;
  c->rows = c->sequences * L;
  c->stored_first_row = tokens.sequence_start() * L;
  c->stored_first_sequence = first.token_order_start / L + tokens.sequence_start();
  std::vector<std::string> ids;
  for (const auto& source : c->stored) ids.push_back(absl::StrCat(source->info().id));
  c->tokens_described =
      absl::StrCat("stored:dataset", ids.size() > 1 ? "s " : " ", absl::StrJoin(ids, "+"),
                   "[sequences ", tokens.sequence_start(), "..",
                   tokens.sequence_start() + c->sequences, ", L=", L, "] of ", first.token_source);
  c->stored_token_source = c->rows == first.rows ? first.token_source : c->tokens_described;
  return absl::OkStatus();
}

// Hook and SAE of output `output` (ExtractOutputSpec), with c.sparse and the model known.
absl::StatusOr<CheckedOutput> CheckOutput(const ExtractSpec& one, const ExtractEnv& env,
                                          const Checked& c) {
  CheckedOutput out;
  out.hook_name = one.hook_name();
  ASSIGN_OR_RETURN(out.hook, ParseHookName(one.hook_name()));
  if (!c.stored.empty()) {
    for (const auto& source : c.stored) out.hook_width += source->info().width;
  } else if (c.shape) {
    RETURN_IF_ERROR(CheckTransformerHook(*c.shape, out.hook));
    out.hook_width = TransformerHookWidth(*c.shape, out.hook);
  } else {
    RETURN_IF_ERROR(HiddenStateIndex(out.hook).status());
  }
  const bool has_sae =
      one.has_sae() && one.sae().source_case() != latentd::v1::SaeSource::SOURCE_NOT_SET;
  if (c.sparse) {
    ASSIGN_OR_RETURN(out.sae_dir, ResolveSaeDir(one, env));
    auto cfg = ReadAndCheckSae(out.sae_dir, out.hook);
    if (!cfg.ok()) {
      if (cfg.status().code() == absl::StatusCode::kNotFound) return cfg.status();
      return absl::InvalidArgumentError(absl::StrCat("extract.sae: ", cfg.status().message()));
    }
    out.sae_cfg = *cfg;
    if (!c.stored.empty()) {
      RETURN_IF_ERROR(CheckStoredSources(one, c, out.sae_cfg));
    } else if (out.sae_cfg.crosscoder_sources > 0 || one.crosscoder_hooks_size() > 0) {
      RETURN_IF_ERROR(CheckCrosscoderHooks(one, c, &out));
    }
    if (out.hook_width > 0 && out.sae_cfg.d_in != out.hook_width) {
      return absl::InvalidArgumentError(absl::StrCat("extract.sae: d_in ", out.sae_cfg.d_in,
                                                     " != width ", out.hook_width, " of hook ",
                                                     one.hook_name()));
    }
    if (out.sae_cfg.transcoder) {
      ASSIGN_OR_RETURN(out.hook_name_out, TranscoderOutputHook(out.sae_cfg, out.hook));
      RETURN_IF_ERROR(CheckTranscoderOutput(out, c));
    }
  } else if (has_sae) {
    return absl::InvalidArgumentError("extract.sae: given with mode DENSE (drop it or use SPARSE)");
  } else if (one.crosscoder_hooks_size() > 0) {
    return absl::InvalidArgumentError(
        "extract.crosscoder_hooks: the hooks a crosscoder reads (extract.sae, SPARSE); a DENSE "
        "job stores each hook as a dataset of its own (more_outputs)");
  }
  return out;
}

// `all_cpu`: every device the job runs on is a CPU (DefaultBatchSequences).
absl::StatusOr<Checked> Check(const ExtractSpec& spec, const ExtractEnv& env,
                              bool all_cpu = false) {
  Checked c;
  latentd::v1::TokenSource tokens = spec.tokens();
  if (!spec.model().has_stored()) {
    ASSIGN_OR_RETURN(
        c.tokens_path,
        ResolveTokenPath(tokens.path(), "extract.tokens.path", [&](const std::string& p) {
          return ResolveUnderRoots(p, env, "extract.tokens.path");
        }));
    tokens.set_path(c.tokens_path);
  }
  switch (spec.model().model_case()) {
    case latentd::v1::ModelSpec::kReference: {
      ASSIGN_OR_RETURN(c.reference, ResolveReferenceSpec(spec.model().reference()));
      c.shape = Gpt2Shape(ReferenceGpt2Config(c.reference));
      break;
    }
    case latentd::v1::ModelSpec::kHuggingface: {
      ASSIGN_OR_RETURN(c.model_path, ResolveUnderRoots(spec.model().huggingface().path(), env,
                                                       "extract.model.huggingface.path"));
      const latentd::v1::ValueDtype dtype = spec.model().huggingface().dtype();
      if (dtype != latentd::v1::VALUE_DTYPE_UNSPECIFIED && dtype != latentd::v1::FLOAT32 &&
          dtype != latentd::v1::BFLOAT16) {
        return absl::InvalidArgumentError(absl::StrCat(
            "extract.model.huggingface.dtype: ", latentd::v1::ValueDtype_Name(dtype),
            " is not supported (FLOAT32 or BFLOAT16; float16 overflows in some models, e.g. "
            "Gemma's activations)"));
      }
      auto shape = CheckHfModel(HfOptions(spec, c));
      if (!shape.ok()) return InHuggingFaceField(shape.status());
      c.shape = *shape;
      break;
    }
    case latentd::v1::ModelSpec::kTorchscript: {
      ASSIGN_OR_RETURN(c.model_path, ResolveUnderRoots(spec.model().torchscript().path(), env,
                                                       "extract.model.torchscript.path"));
      if (spec.model().torchscript().vocab_size() < 0) {
        return absl::InvalidArgumentError("extract.model.torchscript.vocab_size: must be >= 0");
      }
      break;
    }
    case latentd::v1::ModelSpec::kStored:
      RETURN_IF_ERROR(CheckStoredModel(spec, env, &c));
      break;
    default:
      return absl::InvalidArgumentError(
          "extract.model: set reference, huggingface, torchscript or stored");
  }
  if (c.shape && tokens.context_length() > c.shape->context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("extract.tokens.context_length: ", tokens.context_length(),
                     " > the model's context ", c.shape->context_length));
  }
  if (spec.more_outputs_size() > kMaxMoreOutputs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extract.more_outputs: at most ", kMaxMoreOutputs, ", not ", spec.more_outputs_size()));
  }
  c.sparse = WantsSparse(spec);
  if (!c.stored.empty()) RETURN_IF_ERROR(CheckStoredJob(spec, c));
  for (int i = 0; i < ExtractOutputCount(spec); ++i) {
    ExtractSpec one = ExtractOutputSpec(spec, i);
    // Stored activations are of the hook their datasets recorded.
    if (!c.stored.empty() && one.hook_name().empty()) {
      one.set_hook_name(c.stored[0]->info().hook_name);
    }
    auto out = CheckOutput(one, env, c);
    if (!out.ok()) return ForOutput(out.status(), i);
    for (int j = 0; c.sparse && j < i && out->sae_of < 0; ++j) {
      if (SameSae(c.outputs[j], *out)) out->sae_of = j;
    }
    c.outputs.push_back(*std::move(out));
  }
  CrossLayerSources(&c.outputs);
  if (!c.outputs[0].crosscoder_hooks.empty()) {
    if (spec.more_outputs_size() > 0) {
      return absl::InvalidArgumentError(
          "extract.more_outputs: a job encoding with a crosscoder has its one output; extract "
          "other hooks in another job");
    }
    if (spec.downstream_loss_sequences() > 0) {
      return absl::InvalidArgumentError(
          "extract.downstream_loss_sequences: not measured for a crosscoder (its reconstruction "
          "replaces several hooks at once)");
    }
  }
  if (c.stored.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> source, TokenSource::Open(tokens));
    c.rows = source->num_rows();
    c.tokens_described = source->Describe();
    c.sequences = source->num_sequences();
    c.context_length = source->context_length();
  }
  if (spec.batch_sequences() < 0 || spec.batch_sequences() > 65536) {
    return absl::InvalidArgumentError(
        "extract.batch_sequences: must be in [1, 65536] (0: 32, fewer on CPUs at long "
        "contexts)");
  }
  c.batch_sequences = spec.batch_sequences() > 0 ? spec.batch_sequences()
                      : !c.stored.empty()
                          ? std::max<int64_t>(1, kStoredBatchRows / c.context_length)
                          : DefaultBatchSequences(c.context_length, all_cpu);
  if (spec.commit_rows() < 0 || spec.commit_rows() > (int64_t{1} << 26)) {
    return absl::InvalidArgumentError("extract.commit_rows: must be in [1, 2^26] (0: 16384)");
  }
  if (spec.commit_rows() > 0) c.commit_rows = spec.commit_rows();
  if (spec.top_n() < 0 || spec.top_n() > 4096) {
    return absl::InvalidArgumentError("extract.top_n: must be in [1, 4096] (0: 64)");
  }
  if (!latentd::v1::ValueDtype_IsValid(spec.value_dtype())) {
    return absl::InvalidArgumentError("extract.value_dtype: unknown");
  }
  if (spec.downstream_loss_sequences() < 0) {
    return absl::InvalidArgumentError("extract.downstream_loss_sequences: must be >= 0");
  }
  if (spec.downstream_loss_sequences() > 0 && !c.sparse) {
    return absl::InvalidArgumentError(
        "extract.downstream_loss_sequences: measures an SAE's reconstruction; a DENSE job has "
        "none");
  }
  for (int o = 0; spec.downstream_loss_sequences() > 0 && o < static_cast<int>(c.outputs.size());
       ++o) {
    if (!c.outputs[o].cross_layer_missing.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "extract.downstream_loss_sequences: ", ExtractOutputField(o, "sae"), " is layer ",
          c.outputs[o].sae_cfg.circuit_tracer->layer,
          " of a cross-layer transcoder, whose prediction needs the latents of its layers ",
          absl::StrJoin(c.outputs[o].cross_layer_missing, ", "),
          " too: extract them in the same job (more_outputs)"));
    }
  }
  if (spec.downstream_loss_sequences() > 0 && spec.model().has_torchscript()) {
    return absl::InvalidArgumentError(
        "extract.downstream_loss_sequences: a TorchScript model gives its hidden states, not "
        "its logits; use the reference model or a Hugging Face checkpoint");
  }
  return c;
}

// Device bytes one replica needs: weights + one batch in flight (every hook's activations, an
// encoder pass's pre-activations and top-k scratch) + the queue of finished batches.
int64_t EstimateDeviceBytes(const Checked& c, const std::vector<int64_t>& hook_widths,
                            int64_t model_param_bytes, int64_t model_act_bytes_per_token,
                            int64_t context_length) {
  const int64_t rows = c.batch_sequences * context_length;
  int64_t bytes = model_param_bytes + rows * model_act_bytes_per_token;
  int64_t encoder_scratch = 0;
  for (size_t o = 0; o < c.outputs.size(); ++o) {
    // The first hook's activations are part of the model's figure; the others are kept too.
    if (o > 0 && o < hook_widths.size()) bytes += rows * 4 * hook_widths[o];
    if (!c.sparse) continue;
    const SaeConfig& cfg = c.outputs[o].sae_cfg;
    if (c.outputs[o].sae_of < 0) bytes += 4 * (2 * cfg.d_in * cfg.d_sae + 3 * cfg.d_sae);
    // A cross-layer transcoder's decoders from its earlier layers (d_sae and d_out are the
    // release's, the same in every layer).
    bytes += static_cast<int64_t>(c.outputs[o].cross_layer_sources.size()) * 4 * cfg.d_sae *
             cfg.OutWidth();
    // Pre-activations + the encoder's working copy, for one encoder pass of the batch (the
    // outputs are encoded one after another).
    encoder_scratch =
        std::max(encoder_scratch, std::min(rows, EncodeRowsPerPass(cfg.d_sae)) * 4 * 2 * cfg.d_sae);
  }
  return bytes + encoder_scratch;
}

absl::Status MemoryCheck(const Checked& c, int64_t need, int64_t have, const std::string& what) {
  if (have > 0 && need > have) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": the job needs about ", need >> 20, " MiB per device (weights + a batch of ",
        c.batch_sequences, " sequences), the device has ", have >> 20,
        " MiB; lower extract.batch_sequences"));
  }
  return absl::OkStatus();
}

// A lower bound of the bytes the datasets will take on disk, for the check against free space;
// bytes 0 when no useful bound is known (ReLU and JumpReLU SAEs fire a data-dependent number of
// latents; a TorchScript model's hook width is known once loaded).
// The device memory a spec's job needs, as the submit check estimates it.
int64_t DeviceBytesAtSubmit(const Checked& c, const ExtractSpec& spec) {
  std::vector<int64_t> widths;
  for (const CheckedOutput& out : c.outputs) widths.push_back(out.hook_width);
  return EstimateDeviceBytes(
      c, widths, c.shape->parameter_bytes,
      TransformerActivationBytesPerToken(*c.shape, spec.tokens().context_length()),
      spec.tokens().context_length());
}

struct DatasetBytesFloor {
  int64_t bytes = 0;
  std::string how;  // the arithmetic, for the error message
};
DatasetBytesFloor EstimateDatasetBytesFloor(const Checked& c, const ExtractSpec& spec) {
  DatasetBytesFloor floor;
  const int value_bytes = ValueBytes(spec.value_dtype());
  // Values are stored exactly and compress little (sign, exponent and a few mantissa bits are
  // all LZ4/ZSTD find): TopK latents are nonzero by construction, 3/4 of their raw size is less
  // than any dataset measured takes. Hidden states may hold many exact zeros (a ReLU MLP's
  // hook_post), so DENSE gets 1/2.
  for (const CheckedOutput& out : c.outputs) {
    std::string how;
    if (c.sparse && out.sae_cfg.architecture == SaeArchitecture::kTopK) {
      floor.bytes += c.rows * out.sae_cfg.k * value_bytes * 3 / 4;
      how = absl::StrCat(c.rows, " rows x ", out.sae_cfg.k, " latents x ", value_bytes,
                         " B values, 3/4 of them after compression at best");
    } else if (!c.sparse && out.hook_width > 0) {
      floor.bytes += c.rows * out.hook_width * value_bytes / 2;
      how = absl::StrCat(c.rows, " rows x ", out.hook_width, " x ", value_bytes,
                         " B values, 1/2 of them after compression at best");
    }
    if (!how.empty()) absl::StrAppend(&floor.how, floor.how.empty() ? "" : " + ", how);
  }
  return floor;
}

// The names a spec gives its outputs' datasets, before any continuation. Job id 0 is a spec
// not submitted yet (a dry run words its names with "<job id>" in place of the number).
std::vector<std::string> ExtractDatasetNames(const ExtractSpec& spec, uint64_t job_id) {
  std::vector<std::string> names;
  names.push_back(spec.dataset_name().empty()
                      ? absl::StrCat("extract-", job_id == 0 ? "<job id>" : absl::StrCat(job_id))
                      : spec.dataset_name());
  for (int i = 0; i < spec.more_outputs_size(); ++i) {
    const latentd::v1::ExtractOutput& more = spec.more_outputs(i);
    // Over stored activations every output reads the datasets' hook and may leave it empty:
    // the outputs are then told apart by number.
    names.push_back(!more.dataset_name().empty() ? more.dataset_name()
                    : more.hook_name().empty()   ? absl::StrCat(names[0], ".", i + 1)
                                                 : absl::StrCat(names[0], ".", more.hook_name()));
  }
  return names;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExtractDatasetNamesFor(const ExtractSpec& spec,
                                                                const ExtractEnv& env,
                                                                uint64_t job_id) {
  std::vector<std::string> names;
  const uint64_t from = spec.resume_from_job_id();
  if (from == 0) {
    names = ExtractDatasetNames(spec, job_id);
  } else {
    constexpr absl::string_view kField = "extract.resume_from_job_id";
    // A job continues an earlier one, so following the chain ends (ids decrease).
    if (job_id != 0 && from >= job_id) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": job ", job_id, " cannot continue job ", from, ", a later one"));
    }
    ASSIGN_OR_RETURN(
        latentd::v1::Job job,
        FindContinuableJob(env.find_job, from, latentd::v1::JobSpec::kExtract, kField));
    // Every other field shapes the rows (batching too: a matmul's blocking can change the last
    // bits), so the continuation computes exactly what the first job would have.
    auto names_cleared = [](ExtractSpec* s) {
      s->clear_dataset_name();
      s->clear_resume_from_job_id();
      for (auto& more : *s->mutable_more_outputs()) more.clear_dataset_name();
    };
    RETURN_IF_ERROR(
        CheckSameSpecBut<ExtractSpec>(job.spec().extract(), spec, names_cleared, from, kField, ""));
    // The datasets that job wrote, which it may itself have continued from an earlier one.
    auto theirs = ExtractDatasetNamesFor(job.spec().extract(), env, from);
    if (!theirs.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(kField, ": cannot tell which datasets job ",
                                                        from,
                                                        " wrote: ", theirs.status().message()));
    }
    names = *std::move(theirs);
    for (int i = 0; i < ExtractOutputCount(spec); ++i) {
      const std::string& given =
          i == 0 ? spec.dataset_name() : spec.more_outputs(i - 1).dataset_name();
      if (!given.empty() && given != names[i]) {
        return absl::InvalidArgumentError(absl::StrCat(ExtractOutputField(i, "dataset_name"),
                                                       ": job ", from, " wrote dataset ", names[i],
                                                       ", not ", given));
      }
    }
  }
  for (size_t i = 1; i < names.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (names[i] == names[j]) {
        return absl::InvalidArgumentError(
            absl::StrCat(ExtractOutputField(static_cast<int>(i), "dataset_name"), ": ", names[i],
                         " is output ", j, "'s dataset too; give each output its own name"));
      }
    }
  }
  return names;
}

namespace {

// The checks at submit, and what they found (DescribeExtractSpec words it).
absl::StatusOr<Checked> CheckAtSubmit(const ExtractSpec& spec, const ExtractEnv& env) {
  ASSIGN_OR_RETURN(Checked c, Check(spec, env, env.cpu_only));
  RETURN_IF_ERROR(ExtractDatasetNamesFor(spec, env, 0).status());
  // Hours into a job is a bad time to learn that the disk was always too small. (A continued
  // dataset already holds part of its rows.)
  if (env.free_disk_bytes && spec.resume_from_job_id() == 0) {
    const DatasetBytesFloor floor = EstimateDatasetBytesFloor(c, spec);
    const int64_t free_bytes = floor.bytes > 0 ? env.free_disk_bytes() : -1;
    if (free_bytes >= 0 && floor.bytes > free_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "extract: the dataset%s at least %.1f GB (%s), the data dir has %.1f GB free",
          c.outputs.size() > 1 ? "s need" : " needs", floor.bytes / 1e9, floor.how,
          free_bytes / 1e9));
    }
  }
  if (c.shape && env.device_memory_bytes > 0) {
    absl::Status s = MemoryCheck(c, DeviceBytesAtSubmit(c, spec), env.device_memory_bytes,
                                 "extract.batch_sequences");
    if (!s.ok()) return absl::InvalidArgumentError(s.message());
  }
  return c;
}

}  // namespace

absl::Status ValidateExtractSpec(const ExtractSpec& spec, const ExtractEnv& env) {
  return CheckAtSubmit(spec, env).status();
}

absl::StatusOr<std::vector<std::string>> DescribeExtractSpec(const ExtractSpec& spec,
                                                             const ExtractEnv& env) {
  ASSIGN_OR_RETURN(Checked c, CheckAtSubmit(spec, env));
  std::vector<std::string> lines;
  lines.push_back(absl::StrCat("tokens: ", c.tokens_described, ": ", c.rows, " rows (", c.sequences,
                               " sequences of ", c.context_length, ")"));
  if (!c.stored.empty()) {
    for (const auto& source : c.stored) {
      const StoredDenseInfo& info = source->info();
      lines.push_back(absl::StrCat("model: none; stored dataset ", info.id, " (", info.name,
                                   "): ", info.hook_name, " of ", info.model_id, ", ", info.width,
                                   " wide, ", info.rows, " rows"));
    }
  } else if (c.shape) {
    lines.push_back(absl::StrCat("model: ", c.shape->what, ": ", c.shape->n_layers,
                                 " layers, d_model ", c.shape->d_model, ", ", c.shape->n_heads,
                                 " heads, vocabulary ", c.shape->vocab_size, ", ",
                                 ByteSize(c.shape->parameter_bytes), " of float32 weights"));
  } else {
    lines.push_back(absl::StrCat("model: the TorchScript module ", c.model_path,
                                 " (hook widths are known once it loads)"));
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ExtractDatasetNamesFor(spec, env, 0));
  for (size_t o = 0; o < c.outputs.size(); ++o) {
    const CheckedOutput& out = c.outputs[o];
    const std::string width =
        out.hook_width > 0 ? absl::StrCat(" (", out.hook_width, " wide)") : "";
    std::string what;
    if (!c.sparse) {
      what = absl::StrCat(
          "its hidden states, DENSE ",
          latentd::v1::ValueDtype_Name(spec.value_dtype() == latentd::v1::VALUE_DTYPE_UNSPECIFIED
                                           ? latentd::v1::FLOAT16
                                           : spec.value_dtype()));
    } else {
      const SaeConfig& cfg = out.sae_cfg;
      what = absl::StrCat(
          "SPARSE latents of the ",
          cfg.transcoder               ? "transcoder"
          : cfg.crosscoder_sources > 0 ? "crosscoder"
                                       : "SAE",
          " in ", out.sae_dir, ": ", SaeArchitectureName(cfg.architecture), ", d_sae ", cfg.d_sae,
          cfg.architecture == SaeArchitecture::kTopK ? absl::StrCat(", k ", cfg.k) : "");
      const std::string reading = DescribeSaeReading(cfg);
      if (!reading.empty()) absl::StrAppend(&what, "; ", reading);
      if (!out.hook_name_out.empty()) absl::StrAppend(&what, "; predicts ", out.hook_name_out);
    }
    // A crosscoder's output reads its hooks side by side.
    std::vector<std::string> read = {out.hook_name};
    if (o == 0)
      read.insert(read.end(), spec.crosscoder_hooks().begin(), spec.crosscoder_hooks().end());
    if (c.stored.size() > 1) {
      read.clear();
      for (const auto& source : c.stored)
        read.push_back(absl::StrCat("dataset ", source->info().id));
    }
    lines.push_back(
        absl::StrCat("dataset ", names[o], ": ", absl::StrJoin(read, " + "), width, " -> ", what));
  }
  lines.push_back(absl::StrCat("batches of ", c.batch_sequences, " sequences; a commit every ",
                               c.commit_rows, " rows (readers see rows as they commit)"));
  const DatasetBytesFloor floor = EstimateDatasetBytesFloor(c, spec);
  if (floor.bytes > 0) {
    std::string disk = absl::StrCat("disk: at least ", ByteSize(floor.bytes), " (", floor.how, ")");
    if (env.free_disk_bytes) absl::StrAppend(&disk, "; ", ByteSize(env.free_disk_bytes()), " free");
    lines.push_back(disk);
  }
  if (c.shape) {
    std::string memory =
        absl::StrCat("device memory: about ", ByteSize(DeviceBytesAtSubmit(c, spec)), " a device");
    if (env.device_memory_bytes > 0)
      absl::StrAppend(&memory, " of ", ByteSize(env.device_memory_bytes));
    lines.push_back(memory);
  }
  return lines;
}

namespace {

// A natively run model's weights, made once so that each replica takes them to its device (CPU
// replicas share the tensors); the reference model is a GPT-2 whose weights are drawn. None for
// a TorchScript model. May throw c10::Error.
absl::StatusOr<std::optional<HfModelWeights>> LoadNativeWeights(const ExtractSpec& spec,
                                                                const Checked& c) {
  std::optional<HfModelWeights> weights;
  if (spec.model().has_reference()) {
    weights.emplace().gpt2 = DrawReferenceWeights(c.reference);
  } else if (spec.model().has_huggingface()) {
    auto loaded = LoadHfModelWeights(HfOptions(spec, c));
    if (!loaded.ok()) return InHuggingFaceField(loaded.status());
    weights = *std::move(loaded);
  }
  return weights;
}

// A crosscoder's input: the inner model's hooks side by side, as its one hook.
class ConcatenatedHooksModel final : public ActivationModel {
 public:
  explicit ConcatenatedHooksModel(std::unique_ptr<ActivationModel> inner)
      : inner_(std::move(inner)) {
    for (const int64_t w : inner_->hook_widths()) width_ += w;
  }
  at::Tensor Forward(const at::Tensor& tokens) override {
    return at::cat(inner_->ForwardHooks(tokens), -1);
  }
  int64_t hook_width() const override { return width_; }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_context() const override { return inner_->max_context(); }
  int64_t parameter_bytes() const override { return inner_->parameter_bytes(); }
  int64_t activation_bytes_per_token(int64_t seq_len) const override {
    return inner_->activation_bytes_per_token(seq_len) + 8 * width_;  // the hooks and their copy
  }
  const std::string& model_id() const override { return inner_->model_id(); }
  const std::string& weight_hash() const override { return inner_->weight_hash(); }
  std::vector<std::pair<std::string, at::Tensor>> NamedWeights() const override {
    return inner_->NamedWeights();
  }

 private:
  std::unique_ptr<ActivationModel> inner_;
  int64_t width_ = 0;
};

// The job's token shard: the file's, or the ids that come with a stored model's datasets.
absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokens(const ExtractSpec& spec, const Checked& c) {
  if (c.stored.empty()) {
    latentd::v1::TokenSource token_spec = spec.tokens();
    token_spec.set_path(c.tokens_path);
    return TokenSource::Open(token_spec);
  }
  return TokenSource::FromReader(
      c.context_length, c.stored_first_sequence, c.sequences, c.stored_token_source,
      [stored = c.stored, first_row = c.stored_first_row, L = c.context_length](
          int64_t first, int64_t count, int64_t* out) {
        return ReadStoredSequences(stored, first_row, L, kStoredField, first, count, out);
      });
}

// The hooks of the spec's outputs, in order.
std::vector<HookName> OutputHooks(const Checked& c) {
  std::vector<HookName> hooks;
  for (const CheckedOutput& out : c.outputs) hooks.push_back(out.hook);
  return hooks;
}

// The spec's model with `hooks` on `device`. May throw c10::Error.
absl::StatusOr<std::unique_ptr<ActivationModel>> MakeModel(
    const ExtractSpec& spec, const Checked& c, const std::optional<HfModelWeights>& native_weights,
    const std::vector<HookName>& hooks, const at::Device& device) {
  if (!c.stored.empty()) {
    return std::make_unique<StoredActivationsModel>(c.stored, c.stored_first_row, device,
                                                    static_cast<int>(c.outputs.size()));
  }
  if (native_weights) return CreateHfModel(*native_weights, hooks, device);
  TorchScriptModelOptions o;
  o.path = c.model_path;
  o.vocab_size = spec.model().torchscript().vocab_size();
  return LoadTorchScriptModel(o, hooks, device);
}

}  // namespace

ExtractInputs::ExtractInputs() = default;
ExtractInputs::ExtractInputs(ExtractInputs&&) = default;
ExtractInputs::~ExtractInputs() = default;

absl::StatusOr<ExtractInputs> OpenExtractInputs(const ExtractSpec& spec, const ExtractEnv& env,
                                                const DeviceRef& device) {
  ASSIGN_OR_RETURN(Checked c, Check(spec, env, device.kind == DeviceKind::kCpu));
  ExtractInputs inputs;
  ASSIGN_OR_RETURN(inputs.tokens, OpenTokens(spec, c));
  inputs.batch_sequences = c.batch_sequences;
  try {
    ASSIGN_OR_RETURN(const std::optional<HfModelWeights> native_weights,
                     LoadNativeWeights(spec, c));
    ASSIGN_OR_RETURN(const at::Device at_device, ToAtDevice(device));
    ASSIGN_OR_RETURN(inputs.model, MakeModel(spec, c, native_weights, OutputHooks(c), at_device));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading the model: ", e.what()));
  }
  return inputs;
}

absl::StatusOr<ExtractRowShape> ExtractRowShapeOf(const ExtractSpec& spec, const ExtractEnv& env) {
  ASSIGN_OR_RETURN(Checked c, Check(spec, env));
  ExtractRowShape shape;
  shape.rows = c.rows;
  for (const CheckedOutput& out : c.outputs) shape.widths.push_back(out.hook_width);
  shape.width = shape.widths[0];
  if (shape.width > 0) return shape;
  try {
    ASSIGN_OR_RETURN(auto model,
                     MakeModel(spec, c, std::nullopt, OutputHooks(c), at::Device(at::kCPU)));
    shape.widths = model->hook_widths();
    shape.width = shape.widths[0];
    return shape;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading the model: ", e.what()));
  }
}

namespace {

// The downstream loss of every output's SAE (spec.downstream_loss_sequences), each logged. The
// rows are stored by now, so a model that cannot run to its logits, or a failure on the way,
// costs a WARNING rather than the job; so does a cancel arriving during the measurement (the
// datasets are complete). The result then has no downstream loss.
std::vector<latentd::v1::DownstreamLoss> MeasureDownstream(
    const ExtractSpec& spec, const Checked& c, const std::vector<std::string>& names,
    const TokenSource* tokens, PipelineReplica* replica, JobContext* ctx) {
  std::vector<SplicedSae> saes;
  for (size_t o = 0; o < c.outputs.size(); ++o) {
    saes.push_back({c.outputs[o].hook, &replica->saes[o], c.outputs[o].hook_out});
    const std::vector<int>& sources = c.outputs[o].cross_layer_sources;
    for (size_t i = 0; i < sources.size(); ++i) {
      saes.back().earlier.push_back({c.outputs[sources[i]].hook, &replica->saes[sources[i]],
                                     replica->cross_decoders[o][i].W_dec,
                                     static_cast<size_t>(sources[i])});
    }
    // (Submit refuses the downstream loss when an earlier layer is missing.)
    saes.back().cross_layer = IsCrossLayer(c.outputs[o]);
  }
  const absl::Time start = absl::Now();
  auto measured = MeasureDownstreamLoss(
      *replica->model, saes, *tokens, spec.downstream_loss_sequences(), c.batch_sequences,
      replica->device, [ctx] { return ctx != nullptr && ctx->cancel_requested(); });
  if (!measured.ok()) {
    if (ctx != nullptr) {
      ctx->Log(latentd::v1::LogLine::WARNING,
               absl::StrCat("no downstream loss: ", measured.status().message()));
    }
    return {};
  }
  for (size_t o = 0; ctx != nullptr && o < measured->size(); ++o) {
    const latentd::v1::DownstreamLoss& d = (*measured)[o];
    ctx->Log(latentd::v1::LogLine::INFO,
             absl::StrFormat("dataset %s: downstream loss over %d predictions: clean %.4f, with "
                             "the SAE %.4f (%+.4f), zero-ablated %.4f; %s (%.2f s for all "
                             "outputs)",
                             names[o], d.predictions(), d.clean(), d.with_sae(),
                             d.with_sae() - d.clean(), d.zero_ablated(), DescribeRecovered(d),
                             absl::ToDoubleSeconds(absl::Now() - start)) +
                 (d.with_layers_replaced() != 0
                      ? absl::StrFormat("; with every layer up to it replaced at once %.4f",
                                        d.with_layers_replaced())
                      : ""));
  }
  return *std::move(measured);
}

}  // namespace

absl::StatusOr<latentd::v1::ExtractResult> RunExtractToSink(const ExtractSpec& spec,
                                                            const ExtractEnv& env, JobContext* ctx,
                                                            const SinkOpener& open_sink) {
  std::vector<DeviceRef> devices = ctx != nullptr ? ctx->devices() : std::vector<DeviceRef>{};
  if (devices.empty()) devices.push_back(DeviceRef{DeviceKind::kCpu, 0, "cpu:0", 0});
  int cpu_devices = 0;
  for (const auto& d : devices) cpu_devices += d.kind == DeviceKind::kCpu;
  ASSIGN_OR_RETURN(Checked c, Check(spec, env, cpu_devices == static_cast<int>(devices.size())));
  ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> tokens, OpenTokens(spec, c));
  const int num_outputs = static_cast<int>(c.outputs.size());

  const int host_cores = std::max(1u, std::thread::hardware_concurrency());
  const int cpu_threads = cpu_devices > 0 ? std::max(1, host_cores / cpu_devices) : 0;

  // The outputs' hooks, then the hooks transcoders predict (fit_hooks). A crosscoder's job has
  // one output, whose hooks the model gives side by side (ConcatenatedHooksModel).
  std::vector<HookName> hooks = OutputHooks(c);
  const std::vector<HookName>& crosscoder_hooks = c.outputs[0].crosscoder_hooks;
  hooks.insert(hooks.end(), crosscoder_hooks.begin(), crosscoder_hooks.end());
  std::vector<int> fit_hooks;
  for (int o = 0; c.sparse && o < num_outputs; ++o) {
    if (!c.outputs[o].cross_layer_missing.empty()) {
      fit_hooks.push_back(-1);  // its prediction would lack the missing layers' latents
      continue;
    }
    fit_hooks.push_back(c.outputs[o].hook_out ? static_cast<int>(hooks.size()) : o);
    if (c.outputs[o].hook_out) hooks.push_back(*c.outputs[o].hook_out);
  }
  std::vector<Sae> saes_cpu;
  for (int o = 0; c.sparse && o < num_outputs; ++o) {
    if (const int shared = c.outputs[o].sae_of; shared >= 0) {
      saes_cpu.push_back(saes_cpu[shared]);  // the same tensors
      continue;
    }
    auto sae = Sae::Load(c.outputs[o].sae_dir, c.outputs[o].hook);
    if (!sae.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ExtractOutputField(o, "sae"), ": ", sae.status().message()));
    }
    saes_cpu.push_back(*std::move(sae));
  }
  // Cross-layer transcoders: the decoders from each earlier layer's output into this one's.
  std::vector<std::vector<CrossLayerDecoder>> cross_cpu(c.sparse ? num_outputs : 0);
  for (int o = 0; c.sparse && o < num_outputs; ++o) {
    const CheckedOutput& out = c.outputs[o];
    for (const int s : out.cross_layer_sources) {
      auto decoder = LoadCrossLayerDecoder(out.sae_dir, c.outputs[s].sae_cfg.circuit_tracer->layer,
                                           out.sae_cfg.circuit_tracer->layer);
      if (!decoder.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(ExtractOutputField(o, "sae"), ": ", decoder.status().message()));
      }
      cross_cpu[o].push_back(CrossLayerDecoder{s, *std::move(decoder)});
    }
  }
  std::vector<PipelineReplica> replicas;
  try {
    ASSIGN_OR_RETURN(const std::optional<HfModelWeights> native_weights,
                     LoadNativeWeights(spec, c));
    for (const auto& d : devices) {
      PipelineReplica r;
      ASSIGN_OR_RETURN(r.device, ToAtDevice(d));
      r.cpu_threads = d.kind == DeviceKind::kCpu ? cpu_threads : 0;
      ASSIGN_OR_RETURN(r.model, MakeModel(spec, c, native_weights, hooks, r.device));
      if (!crosscoder_hooks.empty()) {
        r.model = std::make_unique<ConcatenatedHooksModel>(std::move(r.model));
      }
      const std::vector<int64_t> widths = r.model->hook_widths();
      r.fit_hooks = fit_hooks;
      for (const auto& decoders : cross_cpu) {
        r.cross_decoders.emplace_back();
        for (const CrossLayerDecoder& d : decoders) {
          r.cross_decoders.back().push_back(CrossLayerDecoder{d.source, d.W_dec.to(r.device)});
        }
      }
      for (int o = 0; c.sparse && o < num_outputs; ++o) {
        if (saes_cpu[o].config().d_in != widths[o]) {
          return absl::InvalidArgumentError(
              absl::StrCat(ExtractOutputField(o, "sae"), ": d_in ", saes_cpu[o].config().d_in,
                           " != width ", widths[o], " of hook ", c.outputs[o].hook_name));
        }
        if (fit_hooks[o] >= 0 &&
            saes_cpu[o].config().OutWidth() != widths[fit_hooks[o]]) {  // TorchScript's, now
          return absl::InvalidArgumentError(absl::StrCat(
              ExtractOutputField(o, "sae"), ": d_out ", saes_cpu[o].config().OutWidth(),
              " != width ", widths[fit_hooks[o]], " of hook ", c.outputs[o].hook_name_out));
        }
        const int shared = c.outputs[o].sae_of;
        r.saes.push_back(shared >= 0 ? r.saes[shared] : saes_cpu[o].To(r.device));
      }
      const int64_t need = EstimateDeviceBytes(
          c, widths, r.model->parameter_bytes(),
          r.model->activation_bytes_per_token(tokens->context_length()), tokens->context_length());
      RETURN_IF_ERROR(WithReason(MemoryCheck(c, need, d.memory_total_bytes, "device " + d.name),
                                 latentd::v1::OOM));
      replicas.push_back(std::move(r));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading the model: ", e.what()));
  }
  const ActivationModel& model = *replicas[0].model;
  const std::vector<int64_t> widths = model.hook_widths();

  const uint64_t job_id = ctx != nullptr ? ctx->job_id() : 0;
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ExtractDatasetNamesFor(spec, env, job_id));
  const latentd::v1::ValueDtype value_dtype =
      spec.value_dtype() == latentd::v1::VALUE_DTYPE_UNSPECIFIED ? latentd::v1::FLOAT16
                                                                 : spec.value_dtype();
  std::vector<OpenedSink> opened;
  std::vector<RowSink*> sinks;
  for (int o = 0; o < num_outputs; ++o) {
    const CheckedOutput& out = c.outputs[o];
    ExtractDatasetMeta meta;
    meta.name = names[o];
    meta.adopt_from_job = spec.resume_from_job_id();
    meta.sparse = c.sparse;
    meta.value_dtype = value_dtype;
    meta.model_id = model.model_id();
    meta.model_weight_hash = model.weight_hash();
    meta.hook_name = out.hook_name;
    meta.hook_name_out = out.hook_name_out;
    meta.layer = out.hook.layer;
    meta.d_in = static_cast<int32_t>(widths[o]);
    if (c.sparse) {
      meta.encoder = SaeArchitectureName(out.sae_cfg.architecture);
      meta.k = out.sae_cfg.k;
      meta.threshold_policy = ThresholdPolicy(out.sae_cfg.architecture);
      meta.apply_b_dec_to_input = out.sae_cfg.apply_b_dec_to_input;
      meta.width = static_cast<int32_t>(out.sae_cfg.d_sae);
      meta.sae_weight_hash = saes_cpu[o].weight_hash();
    } else {
      meta.width = meta.d_in;
    }
    meta.postings = !spec.disable_postings();
    if (spec.top_n() > 0) meta.top_n = spec.top_n();
    meta.context_length = tokens->context_length();
    meta.token_source = tokens->Describe();
    meta.token_order_start = tokens->first_sequence() * tokens->context_length();
    meta.job_id = job_id;
    meta.rows_planned = tokens->num_rows();
    auto sink = open_sink(meta);
    if (!sink.ok()) return num_outputs > 1 ? ForOutput(sink.status(), o) : sink.status();
    if (ctx != nullptr && sink->sink->rows_committed() > 0) {
      ctx->Log(latentd::v1::LogLine::INFO,
               absl::StrCat("resuming dataset ", meta.name, " at row ",
                            sink->sink->rows_committed(), " of ", meta.rows_planned));
    }
    sinks.push_back(sink->sink.get());
    opened.push_back(*std::move(sink));
  }

  // An SAE that says which hook it was trained on (SAELens' cfg.json hook_name) but is given
  // another: usually the wrong layer, which the fit shows only at the end of a long job.
  for (int o = 0; ctx != nullptr && c.sparse && o < num_outputs; ++o) {
    const CheckedOutput& out = c.outputs[o];
    if (out.sae_cfg.hook_name.empty()) continue;
    const absl::StatusOr<HookName> trained = ParseHookName(out.sae_cfg.hook_name);
    if (!trained.ok() || SameActivation(*trained, out.hook)) continue;  // another naming: no say
    ctx->Log(
        latentd::v1::LogLine::WARNING,
        absl::StrCat("dataset ", names[o], ": its SAE was trained on hook ", out.sae_cfg.hook_name,
                     " (its cfg.json says), and this output reads ", out.hook_name,
                     "; is it the SAE for this layer? (the fit at the end "
                     "says how well it reconstructs this hook)"));
  }
  for (int o = 0; ctx != nullptr && c.sparse && o < num_outputs; ++o) {
    const std::string reading = DescribeSaeReading(c.outputs[o].sae_cfg);
    if (reading.empty()) continue;
    ctx->Log(latentd::v1::LogLine::INFO, absl::StrCat("dataset ", names[o], ": ", reading));
  }
  // A cross-layer transcoder's layer whose prediction needs layers the job does not extract.
  for (int o = 0; ctx != nullptr && c.sparse && o < num_outputs; ++o) {
    const CheckedOutput& out = c.outputs[o];
    if (out.cross_layer_missing.empty()) continue;
    ctx->Log(latentd::v1::LogLine::WARNING,
             absl::StrCat("dataset ", names[o], ": its fit is not measured: layer ",
                          out.sae_cfg.circuit_tracer->layer,
                          " of a cross-layer transcoder predicts ", out.hook_name_out,
                          " with the latents of every layer up to it, and this job does not "
                          "extract layer(s) ",
                          absl::StrJoin(out.cross_layer_missing, ", "), " of it at ",
                          "the same hook point (add them to more_outputs)"));
  }
  // The same for TransformerLens' centering of a Hugging Face GPT-2, which SAELens records.
  for (int o = 0; ctx != nullptr && c.sparse && spec.model().has_huggingface() && o < num_outputs;
       ++o) {
    const std::optional<bool> trained = c.outputs[o].sae_cfg.center_writing_weights;
    const bool centered = spec.model().huggingface().center_writing_weights();
    if (!trained.has_value() || *trained == centered) continue;
    ctx->Log(latentd::v1::LogLine::WARNING,
             absl::StrCat("dataset ", names[o],
                          ": its SAE's cfg.json says the model it was trained "
                          "on had center_writing_weights ",
                          *trained ? "true" : "false", ", and this job's model has it ",
                          centered ? "true" : "false",
                          "; set extract.model.huggingface."
                          "center_writing_weights to ",
                          *trained ? "true" : "false",
                          " to give the SAE the activations it was trained on"));
  }

  PipelineOptions options;
  options.sparse = c.sparse;
  options.batch_sequences = c.batch_sequences;
  options.commit_rows = c.commit_rows;
  options.skip_non_finite = spec.non_finite() == latentd::v1::NON_FINITE_SKIP;
  options.value_bytes = ValueBytes(value_dtype);
  PipelineCallbacks callbacks;
  if (ctx != nullptr) {
    callbacks.cancelled = [ctx] { return ctx->cancel_requested(); };
    // Once the first commits show what a row costs on disk, say (once) when the rest will not
    // fit: the user can free space or stop the job while it is cheap to.
    callbacks.progress = [ctx, &sinks, warned = false](int64_t done, int64_t total) mutable {
      ctx->ReportProgress(done, total, "rows");
      int64_t bytes = 0;
      for (RowSink* sink : sinks) bytes += std::max<int64_t>(sink->bytes_committed(), 0);
      if (warned || done <= 0 || done >= total || bytes <= 0) return;
      const int64_t free_bytes = sinks[0]->free_disk_bytes();
      const double per_row = static_cast<double>(bytes) / done;
      const double need = per_row * static_cast<double>(total - done);
      if (free_bytes < 0 || need <= static_cast<double>(free_bytes)) return;
      warned = true;
      ctx->Log(latentd::v1::LogLine::WARNING,
               absl::StrFormat("the remaining %d rows need about %.1f MB at the %.1f B/row "
                               "stored so far, and the data dir has %.1f MB free: the job will "
                               "fail with a full disk unless space is freed (committed rows stay)",
                               total - done, need / 1e6, per_row, free_bytes / 1e6));
    };
    callbacks.telemetry = [ctx](const latentd::v1::ExtractTelemetry& t) {
      latentd::v1::Telemetry sample;
      *sample.mutable_extract() = t;
      ctx->ReportTelemetry(sample);
    };
  }
  auto run = RunExtractPipeline(*tokens, &replicas, sinks, options, callbacks);
  if (!run.ok()) {
    absl::Status s = run.status();
    // How a user picks the rows up again once the cause is fixed (disk space, a cancel).
    if (ctx != nullptr) {
      s = WithMessage(s, absl::StrCat(s.message(),
                                      " (rows up to the last commit are kept; an EXTRACT job with "
                                      "resume_from_job_id ",
                                      job_id, " continues dataset", names.size() > 1 ? "s " : " ",
                                      absl::StrJoin(names, ", "), ")"));
    }
    if (absl::StrContains(s.message(), "non-finite")) return WithReason(s, latentd::v1::NUMERICAL);
    if (s.code() == absl::StatusCode::kResourceExhausted) return WithReason(s, latentd::v1::OOM);
    return s;
  }
  if (ctx != nullptr && run->rows_this_run > 0) {
    ctx->Log(latentd::v1::LogLine::INFO,
             absl::StrFormat("extract: %d rows in %.3f s wall, busiest device computing %.3f s "
                             "(storage and bookkeeping beyond compute: %.1f%%)",
                             run->rows_this_run, run->seconds, run->device_busy_seconds,
                             run->device_busy_seconds > 0
                                 ? 100.0 * (run->seconds / run->device_busy_seconds - 1)
                                 : 0.0));
  }
  std::vector<latentd::v1::DownstreamLoss> downstream;
  if (spec.downstream_loss_sequences() > 0) {
    downstream = MeasureDownstream(spec, c, names, tokens.get(), &replicas[0], ctx);
  }
  latentd::v1::ExtractResult result;
  for (int o = 0; o < num_outputs; ++o) {
    const PipelineOutputResult& done = run->outputs[o];
    // The dataset's totals (every committed row, earlier runs' included) where the sink keeps
    // them, else this run's.
    const storage::ReconstructionFit committed = opened[o].sink->fit_committed();
    latentd::v1::SaeFit fit = storage::ToSaeFit(committed.rows > 0 ? committed : done.fit);
    if (fit.rows() > 0) {
      fit.set_predicted_hook(c.outputs[o].hook_name_out);
      // Worse than predicting every row's mean: almost always an SAE for another hook or model
      // (resid_pre against resid_post, another checkpoint), rarely a bad SAE.
      if (ctx != nullptr && fit.explained_variance() < 0) {
        ctx->Log(latentd::v1::LogLine::WARNING,
                 absl::StrFormat(
                     "dataset %s: the %s hook %s worse than the rows' "
                     "mean does (explained variance %.3f, cosine %.3f over %d rows); "
                     "was it trained on this hook of this model?",
                     names[o], c.outputs[o].hook_out ? "transcoder predicts" : "SAE reconstructs",
                     c.outputs[o].hook_out ? c.outputs[o].hook_name_out : c.outputs[o].hook_name,
                     fit.explained_variance(), fit.cosine_similarity(), fit.rows()));
      }
    }
    const int64_t stored_nnz = opened[o].sink->nnz_committed();
    const int64_t nnz = stored_nnz >= 0 ? stored_nnz : done.nnz_this_run;
    const double bytes_per_token =
        done.rows > 0 ? static_cast<double>(done.bytes_committed) / done.rows : 0;
    if (o == 0) {
      result.set_dataset_id(opened[o].dataset_id);
      result.set_rows(done.rows);
      result.set_nnz(nnz);
      result.set_rows_skipped_non_finite(done.rows_skipped_non_finite);
      result.set_tokens_per_second(run->tokens_per_second);
      result.set_bytes_per_token(bytes_per_token);
      if (fit.rows() > 0) *result.mutable_fit() = fit;
      if (!downstream.empty()) *result.mutable_downstream_loss() = downstream[o];
      continue;
    }
    latentd::v1::ExtractOutputResult* more = result.add_more_outputs();
    more->set_dataset_id(opened[o].dataset_id);
    more->set_dataset_name(names[o]);
    more->set_hook_name(c.outputs[o].hook_name);
    more->set_rows(done.rows);
    more->set_nnz(nnz);
    more->set_rows_skipped_non_finite(done.rows_skipped_non_finite);
    more->set_bytes_per_token(bytes_per_token);
    if (fit.rows() > 0) *more->mutable_fit() = fit;
    if (!downstream.empty()) *more->mutable_downstream_loss() = downstream[o];
  }
  return result;
}

}  // namespace latentd::engine
