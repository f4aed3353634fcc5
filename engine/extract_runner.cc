#include "engine/extract_runner.h"

#include <limits.h>
#include <stdlib.h>

#include <cerrno>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/path_within.h"
#include "common/status_macros.h"
#include "engine/device_util.h"
#include "engine/extract_pipeline.h"
#include "engine/hook_name.h"
#include "engine/job_continuation.h"
#include "engine/reference_model.h"
#include "engine/sae.h"
#include "engine/sae_config.h"
#include "engine/token_source.h"
#include "engine/torchscript_model.h"

namespace latentd::engine {
namespace {

using latentd::v1::ExtractSpec;

constexpr int64_t kDefaultBatchSequences = 32;
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

namespace {

bool WantsSparse(const ExtractSpec& spec) {
  if (spec.mode() == latentd::v1::SPARSE) return true;
  if (spec.mode() == latentd::v1::DENSE) return false;
  return spec.has_sae() && spec.sae().source_case() != latentd::v1::SaeSource::SOURCE_NOT_SET;
}

int ValueBytes(latentd::v1::ValueDtype d) { return d == latentd::v1::FLOAT32 ? 4 : 2; }

// What the spec resolves to after the cheap checks.
struct Checked {
  HookName hook;
  latentd::v1::ReferenceModelSpec reference;  // resolved, when the model is the reference one
  std::string model_path;                     // resolved TorchScript path
  std::string tokens_path;
  std::string sae_dir;
  SaeConfig sae_cfg;
  bool sparse = true;
  int64_t batch_sequences = kDefaultBatchSequences;
  int64_t commit_rows = kDefaultCommitRows;
  int64_t hook_width = 0;  // 0 until the model is loaded (TorchScript)
  int64_t rows = 0;        // rows of the token shard
};

absl::StatusOr<Checked> Check(const ExtractSpec& spec, const ExtractEnv& env) {
  Checked c;
  ASSIGN_OR_RETURN(c.hook, ParseHookName(spec.hook_name()));
  latentd::v1::TokenSource tokens = spec.tokens();
  ASSIGN_OR_RETURN(c.tokens_path, ResolveUnderRoots(tokens.path(), env, "extract.tokens.path"));
  tokens.set_path(c.tokens_path);
  switch (spec.model().model_case()) {
    case latentd::v1::ModelSpec::kReference: {
      ASSIGN_OR_RETURN(c.reference, ResolveReferenceSpec(spec.model().reference()));
      RETURN_IF_ERROR(CheckReferenceHook(c.reference, c.hook));
      c.hook_width = ReferenceHookWidth(c.reference, c.hook);
      if (tokens.context_length() > c.reference.context_length()) {
        return absl::InvalidArgumentError(
            absl::StrCat("extract.tokens.context_length: ", tokens.context_length(),
                         " > the model's context ", c.reference.context_length()));
      }
      break;
    }
    case latentd::v1::ModelSpec::kTorchscript: {
      ASSIGN_OR_RETURN(c.model_path, ResolveUnderRoots(spec.model().torchscript().path(), env,
                                                       "extract.model.torchscript.path"));
      RETURN_IF_ERROR(HiddenStateIndex(c.hook).status());
      if (spec.model().torchscript().vocab_size() < 0) {
        return absl::InvalidArgumentError("extract.model.torchscript.vocab_size: must be >= 0");
      }
      break;
    }
    default:
      return absl::InvalidArgumentError("extract.model: set reference or torchscript");
  }
  {
    ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> source, TokenSource::Open(tokens));
    c.rows = source->num_rows();
  }
  c.sparse = WantsSparse(spec);
  if (c.sparse) {
    ASSIGN_OR_RETURN(c.sae_dir, ResolveSaeDir(spec, env));
    auto cfg = ReadAndCheckSae(c.sae_dir);
    if (!cfg.ok()) {
      if (cfg.status().code() == absl::StatusCode::kNotFound) return cfg.status();
      return absl::InvalidArgumentError(absl::StrCat("extract.sae: ", cfg.status().message()));
    }
    c.sae_cfg = *cfg;
    if (c.hook_width > 0 && c.sae_cfg.d_in != c.hook_width) {
      return absl::InvalidArgumentError(absl::StrCat("extract.sae: d_in ", c.sae_cfg.d_in,
                                                     " != width ", c.hook_width, " of hook ",
                                                     spec.hook_name()));
    }
  } else if (spec.has_sae() && spec.sae().source_case() != latentd::v1::SaeSource::SOURCE_NOT_SET) {
    return absl::InvalidArgumentError("extract.sae: given with mode DENSE (drop it or use SPARSE)");
  }
  if (spec.batch_sequences() < 0 || spec.batch_sequences() > 65536) {
    return absl::InvalidArgumentError("extract.batch_sequences: must be in [1, 65536] (0: 32)");
  }
  if (spec.batch_sequences() > 0) c.batch_sequences = spec.batch_sequences();
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
  return c;
}

// Device bytes one replica needs: weights + one batch in flight (activations, pre-activations,
// top-k scratch) + the queue of finished batches.
int64_t EstimateDeviceBytes(const Checked& c, int64_t model_param_bytes,
                            int64_t model_act_bytes_per_token, int64_t context_length) {
  const int64_t rows = c.batch_sequences * context_length;
  int64_t bytes = model_param_bytes + rows * model_act_bytes_per_token;
  if (c.sparse) {
    bytes += 4 * (2 * c.sae_cfg.d_in * c.sae_cfg.d_sae + 3 * c.sae_cfg.d_sae);
    // Pre-activations + the encoder's working copy, for one encoder pass of the batch.
    bytes += std::min(rows, EncodeRowsPerPass(c.sae_cfg.d_sae)) * 4 * 2 * c.sae_cfg.d_sae;
  }
  return bytes;
}

int64_t ReferenceParamBytes(const latentd::v1::ReferenceModelSpec& s) {
  const int64_t d = s.d_model(), f = s.d_mlp();
  return 4 * ((s.vocab_size() + s.context_length()) * d + s.n_layers() * (4 * d * d + 2 * d * f));
}

int64_t ReferenceActBytes(const latentd::v1::ReferenceModelSpec& s, int64_t L) {
  return 4 * (11 * s.d_model() + 2 * s.n_heads() * L + 2 * s.d_mlp());
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

// A lower bound of the bytes the dataset will take on disk, for the check against free space;
// bytes 0 when no useful bound is known (ReLU and JumpReLU SAEs fire a data-dependent number of
// latents; a TorchScript model's hook width is known once loaded).
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
  if (c.sparse && c.sae_cfg.architecture == SaeArchitecture::kTopK) {
    floor.bytes = c.rows * c.sae_cfg.k * value_bytes * 3 / 4;
    floor.how = absl::StrCat(c.rows, " rows x ", c.sae_cfg.k, " latents x ", value_bytes,
                             " B values, 3/4 of them after compression at best");
  } else if (!c.sparse && c.hook_width > 0) {
    floor.bytes = c.rows * c.hook_width * value_bytes / 2;
    floor.how = absl::StrCat(c.rows, " rows x ", c.hook_width, " x ", value_bytes,
                             " B values, 1/2 of them after compression at best");
  }
  return floor;
}

}  // namespace

std::string ExtractDatasetName(const ExtractSpec& spec, uint64_t job_id) {
  return spec.dataset_name().empty() ? absl::StrCat("extract-", job_id) : spec.dataset_name();
}

absl::StatusOr<std::string> ExtractDatasetNameFor(const ExtractSpec& spec, const ExtractEnv& env,
                                                  uint64_t job_id) {
  const uint64_t from = spec.resume_from_job_id();
  if (from == 0) return ExtractDatasetName(spec, job_id);
  constexpr absl::string_view kField = "extract.resume_from_job_id";
  ASSIGN_OR_RETURN(latentd::v1::Job job,
                   FindContinuableJob(env.find_job, from, latentd::v1::JobSpec::kExtract, kField));
  const std::string name = ExtractDatasetName(job.spec().extract(), from);
  if (!spec.dataset_name().empty() && spec.dataset_name() != name) {
    return absl::InvalidArgumentError(absl::StrCat("extract.dataset_name: job ", from,
                                                   " wrote dataset ", name, ", not ",
                                                   spec.dataset_name()));
  }
  // Every other field shapes the rows (batching too: a matmul's blocking can change the last
  // bits), so the continuation computes exactly what the first job would have.
  RETURN_IF_ERROR(CheckSameSpecBut<ExtractSpec>(
      job.spec().extract(), spec,
      [](ExtractSpec* s) {
        s->clear_dataset_name();
        s->clear_resume_from_job_id();
      },
      from, kField, ""));
  return name;
}

absl::Status ValidateExtractSpec(const ExtractSpec& spec, const ExtractEnv& env) {
  ASSIGN_OR_RETURN(Checked c, Check(spec, env));
  RETURN_IF_ERROR(ExtractDatasetNameFor(spec, env, 0).status());
  // Hours into a job is a bad time to learn that the disk was always too small. (A continued
  // dataset already holds part of its rows.)
  if (env.free_disk_bytes && spec.resume_from_job_id() == 0) {
    const DatasetBytesFloor floor = EstimateDatasetBytesFloor(c, spec);
    const int64_t free_bytes = floor.bytes > 0 ? env.free_disk_bytes() : -1;
    if (free_bytes >= 0 && floor.bytes > free_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "extract: the dataset needs at least %.1f GB (%s), the data dir has %.1f GB free",
          floor.bytes / 1e9, floor.how, free_bytes / 1e9));
    }
  }
  if (spec.model().has_reference() && env.device_memory_bytes > 0) {
    const int64_t need =
        EstimateDeviceBytes(c, ReferenceParamBytes(c.reference),
                            ReferenceActBytes(c.reference, spec.tokens().context_length()),
                            spec.tokens().context_length());
    absl::Status s = MemoryCheck(c, need, env.device_memory_bytes, "extract.batch_sequences");
    if (!s.ok()) return absl::InvalidArgumentError(s.message());
  }
  return absl::OkStatus();
}

absl::StatusOr<latentd::v1::ExtractResult> RunExtractToSink(const ExtractSpec& spec,
                                                            const ExtractEnv& env, JobContext* ctx,
                                                            const SinkOpener& open_sink) {
  ASSIGN_OR_RETURN(Checked c, Check(spec, env));
  latentd::v1::TokenSource token_spec = spec.tokens();
  token_spec.set_path(c.tokens_path);
  ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> tokens, TokenSource::Open(token_spec));

  std::vector<DeviceRef> devices = ctx != nullptr ? ctx->devices() : std::vector<DeviceRef>{};
  if (devices.empty()) devices.push_back(DeviceRef{DeviceKind::kCpu, 0, "cpu:0", 0});
  int cpu_devices = 0;
  for (const auto& d : devices) cpu_devices += d.kind == DeviceKind::kCpu;
  const int host_cores = std::max(1u, std::thread::hardware_concurrency());
  const int cpu_threads = cpu_devices > 0 ? std::max(1, host_cores / cpu_devices) : 0;

  std::optional<Sae> sae_cpu;
  if (c.sparse) {
    auto sae = Sae::Load(c.sae_dir);
    if (!sae.ok())
      return absl::InvalidArgumentError(absl::StrCat("extract.sae: ", sae.status().message()));
    sae_cpu = std::move(*sae);
  }
  std::vector<PipelineReplica> replicas;
  try {
    for (const auto& d : devices) {
      PipelineReplica r;
      ASSIGN_OR_RETURN(r.device, ToAtDevice(d));
      r.cpu_threads = d.kind == DeviceKind::kCpu ? cpu_threads : 0;
      if (spec.model().has_reference()) {
        ASSIGN_OR_RETURN(r.model, ReferenceModel::Create(c.reference, c.hook, r.device));
      } else {
        TorchScriptModelOptions o;
        o.path = c.model_path;
        o.vocab_size = spec.model().torchscript().vocab_size();
        ASSIGN_OR_RETURN(r.model, LoadTorchScriptModel(o, c.hook, r.device));
      }
      if (c.sparse) {
        if (sae_cpu->config().d_in != r.model->hook_width()) {
          return absl::InvalidArgumentError(
              absl::StrCat("extract.sae: d_in ", sae_cpu->config().d_in, " != width ",
                           r.model->hook_width(), " of hook ", spec.hook_name()));
        }
        r.sae = sae_cpu->To(r.device);
      }
      const int64_t need = EstimateDeviceBytes(
          c, r.model->parameter_bytes(),
          r.model->activation_bytes_per_token(tokens->context_length()), tokens->context_length());
      RETURN_IF_ERROR(WithReason(MemoryCheck(c, need, d.memory_total_bytes, "device " + d.name),
                                 latentd::v1::OOM));
      replicas.push_back(std::move(r));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading the model: ", e.what()));
  }
  const ActivationModel& model = *replicas[0].model;

  const uint64_t job_id = ctx != nullptr ? ctx->job_id() : 0;
  ExtractDatasetMeta meta;
  ASSIGN_OR_RETURN(meta.name, ExtractDatasetNameFor(spec, env, job_id));
  meta.adopt_from_job = spec.resume_from_job_id();
  meta.sparse = c.sparse;
  meta.value_dtype = spec.value_dtype() == latentd::v1::VALUE_DTYPE_UNSPECIFIED
                         ? latentd::v1::FLOAT16
                         : spec.value_dtype();
  meta.model_id = model.model_id();
  meta.model_weight_hash = model.weight_hash();
  meta.hook_name = spec.hook_name();
  meta.layer = c.hook.layer;
  meta.d_in = static_cast<int32_t>(model.hook_width());
  if (c.sparse) {
    meta.encoder = SaeArchitectureName(c.sae_cfg.architecture);
    meta.k = c.sae_cfg.k;
    meta.threshold_policy = c.sae_cfg.architecture == SaeArchitecture::kJumpRelu
                                ? "per-latent threshold (pre > threshold)"
                            : c.sae_cfg.architecture == SaeArchitecture::kTopK
                                ? "topk then relu, zeros dropped"
                                : "relu, zeros dropped";
    meta.apply_b_dec_to_input = c.sae_cfg.apply_b_dec_to_input;
    meta.width = static_cast<int32_t>(c.sae_cfg.d_sae);
    meta.sae_weight_hash = sae_cpu->weight_hash();
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
  ASSIGN_OR_RETURN(OpenedSink opened, open_sink(meta));
  if (ctx != nullptr && opened.sink->rows_committed() > 0) {
    ctx->Log(latentd::v1::LogLine::INFO,
             absl::StrCat("resuming dataset ", meta.name, " at row ", opened.sink->rows_committed(),
                          " of ", meta.rows_planned));
  }

  PipelineOptions options;
  options.sparse = c.sparse;
  options.batch_sequences = c.batch_sequences;
  options.commit_rows = c.commit_rows;
  options.skip_non_finite = spec.non_finite() == latentd::v1::NON_FINITE_SKIP;
  options.value_bytes = ValueBytes(meta.value_dtype);
  PipelineCallbacks callbacks;
  if (ctx != nullptr) {
    callbacks.cancelled = [ctx] { return ctx->cancel_requested(); };
    // Once the first commits show what a row costs on disk, say (once) when the rest will not
    // fit: the user can free space or stop the job while it is cheap to.
    callbacks.progress = [ctx, sink = opened.sink.get(), warned = false](int64_t done,
                                                                         int64_t total) mutable {
      ctx->ReportProgress(done, total, "rows");
      const int64_t bytes = sink->bytes_committed();
      if (warned || done <= 0 || done >= total || bytes <= 0) return;
      const int64_t free_bytes = sink->free_disk_bytes();
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
  auto run = RunExtractPipeline(*tokens, &replicas, opened.sink.get(), options, callbacks);
  if (!run.ok()) {
    absl::Status s = run.status();
    // How a user picks the rows up again once the cause is fixed (disk space, a cancel).
    if (ctx != nullptr) {
      s = WithMessage(s, absl::StrCat(s.message(),
                                      " (rows up to the last commit are kept; an EXTRACT job with "
                                      "resume_from_job_id ",
                                      job_id, " continues dataset ", meta.name, ")"));
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
  latentd::v1::ExtractResult result;
  result.set_dataset_id(opened.dataset_id);
  result.set_rows(run->rows);
  const int64_t nnz = opened.sink->nnz_committed();
  result.set_nnz(nnz >= 0 ? nnz : run->nnz_this_run);
  result.set_rows_skipped_non_finite(run->rows_skipped_non_finite);
  result.set_tokens_per_second(run->tokens_per_second);
  result.set_bytes_per_token(run->rows > 0 ? static_cast<double>(run->bytes_committed) / run->rows
                                           : 0);
  return result;
}

}  // namespace latentd::engine
