#include "client/job_commands.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
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
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/latentctl_flags.h"
#include "client/pipeline_file.h"
#include "client/telemetry_plot.h"
#include "google/protobuf/util/json_util.h"

namespace latentd::client::cli {

namespace {

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

bool Finished(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

}  // namespace

void PrintFit(const v1::SaeFit& fit) {
  if (fit.rows() == 0) return;
  // A transcoder's fit is its prediction of another hook.
  const std::string against =
      fit.predicted_hook().empty() ? "" : absl::StrCat(" of ", fit.predicted_hook());
  std::printf("  sae fit  explained variance%s %.4f, mse %.4g, cosine %.4f (over %lld rows)\n",
              against.c_str(), fit.explained_variance(), fit.mse(), fit.cosine_similarity(),
              static_cast<long long>(fit.rows()));
}

absl::StatusOr<v1::JobSpec> SpecFromFlags(const std::string& default_type) {
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
  for (bool first_page = true;; first_page = false) {
    v1::ListJobsResponse response;
    grpc::Status status = client.jobs()->ListJobs(client.Context().get(), request, &response);
    if (!status.ok()) return RpcError(status);
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", Json(response).c_str());
    } else {
      // The header waits for the first answer: a refused list prints no empty table.
      if (first_page) {
        std::printf("%-6s %-8s %-11s %-14s %-20s %s\n", "ID", "TYPE", "STATE", "REASON", "PROGRESS",
                    "LABEL");
      }
      for (const auto& job : response.jobs()) PrintJobLine(job);
    }
    if (!absl::GetFlag(FLAGS_all) || response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  return 0;
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
    if (!s.ok()) return PlotError(s);
    if (!json) std::printf("wrote %s\n", plot.c_str());
  }
  return 0;
}

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

}  // namespace latentd::client::cli
