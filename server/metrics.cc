#include "server/metrics.h"

#include <cmath>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace latentd::server {
namespace {

using latentd::v1::JobState;
using latentd::v1::JobType;

// The text format's escapes: backslash and newline everywhere, and in label values the double
// quote too (HELP text keeps its quotes).
std::string Escape(const std::string& text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Counts and byte figures print whole; they stay exact below 2^53.
  if (value == std::trunc(value) && std::fabs(value) < 9.0e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  return absl::StrFormat("%.10g", value);
}

// "EXTRACT" -> "extract": label values in the lower case Prometheus users write.
std::string Lower(const std::string& enum_name) { return absl::AsciiStrToLower(enum_name); }

void AddJobsByTypeAndState(const JobFigures& jobs, PrometheusText* out) {
  out->Declare("latentd_jobs", "gauge",
               "Jobs the daemon holds by type and state (finished ones until deleted).");
  for (int t = latentd::v1::JobType_MIN; t <= latentd::v1::JobType_MAX; ++t) {
    if (!latentd::v1::JobType_IsValid(t) || t == latentd::v1::JOB_TYPE_UNSPECIFIED) continue;
    for (int s = latentd::v1::JobState_MIN; s <= latentd::v1::JobState_MAX; ++s) {
      if (!latentd::v1::JobState_IsValid(s) || s == latentd::v1::JOB_STATE_UNSPECIFIED) continue;
      const auto it = jobs.counts.find({static_cast<JobType>(t), static_cast<JobState>(s)});
      out->Add("latentd_jobs",
               {{"type", Lower(latentd::v1::JobType_Name(t))},
                {"state", Lower(latentd::v1::JobState_Name(s))}},
               it == jobs.counts.end() ? 0 : static_cast<double>(it->second));
    }
  }
}

void AddExtractTelemetry(const PrometheusText::Labels& job, const latentd::v1::ExtractTelemetry& t,
                         PrometheusText* out) {
  out->Declare("latentd_extract_tokens_per_second", "gauge",
               "Tokens an EXTRACT job processed per second, at its latest sample.");
  out->Add("latentd_extract_tokens_per_second", job, t.tokens_per_second());
  out->Declare("latentd_extract_bytes_committed", "gauge",
               "Bytes an EXTRACT job has committed to the store in this run.");
  out->Add("latentd_extract_bytes_committed", job, t.bytes_committed());
  out->Declare("latentd_extract_bytes_per_token", "gauge",
               "Stored bytes per token of an EXTRACT job's output so far.");
  out->Add("latentd_extract_bytes_per_token", job, t.bytes_per_token());
  out->Declare("latentd_extract_device_memory_bytes", "gauge",
               "Device memory an EXTRACT job holds.");
  out->Add("latentd_extract_device_memory_bytes", job, t.device_memory_bytes());
  if (t.explained_variance() != 0) {
    out->Declare(
        "latentd_extract_explained_variance", "gauge",
        "Variance of the hook's activations the first SAE explains, over this run's rows.");
    out->Add("latentd_extract_explained_variance", job, t.explained_variance());
  }
}

void AddTrainTelemetry(const PrometheusText::Labels& job, const latentd::v1::TrainTelemetry& t,
                       PrometheusText* out) {
  struct Figure {
    const char* name;
    const char* help;
    double value;
    bool always;  // else shown only when nonzero (a figure this device or model does not have)
  };
  const Figure figures[] = {
      {"latentd_train_step", "Optimizer steps a TRAIN job has taken.", double(t.step()), true},
      {"latentd_train_steps_total", "Steps a TRAIN job will take.", double(t.steps_total()), true},
      {"latentd_train_loss", "A TRAIN job's loss at its latest sample.", t.loss(), true},
      {"latentd_train_fvu", "Fraction of variance unexplained by the SAE being trained.", t.fvu(),
       true},
      {"latentd_train_l0", "Mean active latents per row of the SAE being trained.", t.l0(), true},
      {"latentd_train_dead_latents", "Latents of the SAE being trained that have not fired lately.",
       double(t.dead_latents()), true},
      {"latentd_train_step_seconds", "Seconds a TRAIN job's step takes.", t.step_seconds(), true},
      {"latentd_train_rows_per_second", "Rows a TRAIN job consumes per second.",
       t.rows_per_second(), true},
      {"latentd_train_learning_rate", "A TRAIN job's learning rate now.", t.lr(), true},
      {"latentd_train_parameter_bytes", "Bytes of a TRAIN job's parameters.",
       double(t.parameter_bytes()), true},
      {"latentd_train_gradient_bytes", "Bytes of a TRAIN job's gradients.",
       double(t.gradient_bytes()), true},
      {"latentd_train_dense_mfac_history_bytes",
       "What dense M-FAC's gradient history would take for the same parameters and window.",
       double(t.dense_mfac_history_bytes()), false},
      {"latentd_train_device_allocated_bytes", "CUDA allocator bytes allocated by a TRAIN job.",
       double(t.device_allocated_bytes()), false},
      {"latentd_train_device_reserved_bytes", "CUDA allocator bytes reserved by a TRAIN job.",
       double(t.device_reserved_bytes()), false},
      {"latentd_train_device_peak_bytes", "Peak CUDA allocator bytes of a TRAIN job.",
       double(t.device_peak_bytes()), false},
      {"latentd_train_tracked_tensor_bytes", "Bytes of the tensors a TRAIN job tracks on CPU.",
       double(t.tracked_tensor_bytes()), false},
  };
  for (const Figure& f : figures) {
    if (!f.always && f.value == 0) continue;
    out->Declare(f.name, "gauge", f.help);
    out->Add(f.name, job, f.value);
  }
  if (!t.optimizer_state_bytes().empty()) {
    out->Declare("latentd_train_optimizer_state_bytes", "gauge",
                 "A TRAIN job's optimizer state by component, from the optimizer's accounting.");
    // The proto map's order is unspecified; the exposition's is sorted.
    std::map<std::string, int64_t> sorted(t.optimizer_state_bytes().begin(),
                                          t.optimizer_state_bytes().end());
    for (const auto& [component, bytes] : sorted) {
      PrometheusText::Labels labels = job;
      labels.push_back({"component", component});
      out->Add("latentd_train_optimizer_state_bytes", labels, bytes);
    }
  }
  if (!t.block_fvu().empty()) {
    out->Declare("latentd_train_block_fvu", "gauge",
                 "FVU of each block (cross-layer transcoder) or source (crosscoder) alone.");
    for (int b = 0; b < t.block_fvu_size(); ++b) {
      PrometheusText::Labels labels = job;
      labels.push_back({"block", absl::StrCat(b)});
      out->Add("latentd_train_block_fvu", labels, t.block_fvu(b));
    }
  }
  if (!t.prefix_fvu().empty() && t.prefix_fvu_size() == t.prefix_widths_size()) {
    out->Declare("latentd_train_prefix_fvu", "gauge",
                 "FVU of a Matryoshka SAE's reconstruction from its first `width` latents alone.");
    for (int p = 0; p < t.prefix_fvu_size(); ++p) {
      PrometheusText::Labels labels = job;
      labels.push_back({"width", absl::StrCat(t.prefix_widths(p))});
      out->Add("latentd_train_prefix_fvu", labels, t.prefix_fvu(p));
    }
  }
}

void AddActiveJob(const latentd::v1::Job& job, absl::Time now, PrometheusText* out) {
  const PrometheusText::Labels labels = {{"job", absl::StrCat(job.id())},
                                         {"type", Lower(latentd::v1::JobType_Name(job.type()))}};
  out->Declare("latentd_job_info", "gauge",
               "1 for each running job, with its label, state and devices.");
  out->Add("latentd_job_info",
           {labels[0],
            labels[1],
            {"label", job.spec().label()},
            {"state", Lower(latentd::v1::JobState_Name(job.state()))},
            {"devices", absl::StrJoin(job.devices(), ",")}},
           1);
  out->Declare("latentd_job_attempts", "gauge",
               "How many times a running job has been started (more than 1 after restarts).");
  out->Add("latentd_job_attempts", labels, job.attempts());
  if (job.has_started()) {
    const absl::Time started =
        absl::FromUnixSeconds(job.started().seconds()) + absl::Nanoseconds(job.started().nanos());
    out->Declare("latentd_job_running_seconds", "gauge",
                 "Seconds since a running job's current attempt started.");
    out->Add("latentd_job_running_seconds", labels, absl::ToDoubleSeconds(now - started));
  }
  if (job.has_progress()) {
    const latentd::v1::JobProgress& p = job.progress();
    PrometheusText::Labels with_unit = labels;
    with_unit.push_back({"unit", p.unit()});
    out->Declare("latentd_job_units_done", "gauge",
                 "Units (rows, steps...) a running job has done.");
    out->Add("latentd_job_units_done", with_unit, p.units_done());
    out->Declare("latentd_job_units_total", "gauge", "Units a running job will do in all.");
    out->Add("latentd_job_units_total", with_unit, p.units_total());
    out->Declare("latentd_job_units_per_second", "gauge",
                 "Units a running job does per second over its recent window.");
    out->Add("latentd_job_units_per_second", with_unit, p.rate());
    if (p.units_total() > 0) {
      out->Declare("latentd_job_progress_ratio", "gauge",
                   "Fraction of a running job's units done, in [0, 1].");
      out->Add("latentd_job_progress_ratio", labels,
               static_cast<double>(p.units_done()) / static_cast<double>(p.units_total()));
    }
  }
  const latentd::v1::Telemetry& telemetry = job.latest_telemetry();
  if (telemetry.has_extract()) AddExtractTelemetry(labels, telemetry.extract(), out);
  if (telemetry.has_train()) AddTrainTelemetry(labels, telemetry.train(), out);
}

void AddDevices(const std::vector<engine::DeviceStatus>& devices, PrometheusText* out) {
  out->Declare("latentd_device_memory_total_bytes", "gauge", "Memory of each device latentd owns.");
  out->Declare("latentd_device_memory_used_bytes", "gauge", "Memory in use on each device.");
  out->Declare("latentd_device_busy", "gauge", "1 while a job holds the device, else 0.");
  for (const engine::DeviceStatus& d : devices) {
    const PrometheusText::Labels labels = {{"device", d.device.name}};
    PrometheusText::Labels with_kind = labels;
    with_kind.push_back({"kind", d.device.kind == engine::DeviceKind::kCuda ? "cuda" : "cpu"});
    out->Add("latentd_device_memory_total_bytes", with_kind, d.device.memory_total_bytes);
    out->Add("latentd_device_memory_used_bytes", labels, d.memory_used_bytes);
    out->Add("latentd_device_busy", labels, d.held_by_job != 0 ? 1 : 0);
  }
}

}  // namespace

void PrometheusText::Declare(const std::string& name, const std::string& type,
                             const std::string& help) {
  if (Find(name) == nullptr) families_.push_back({name, type, help, {}});
}

void PrometheusText::Add(const std::string& name, const Labels& labels, double value) {
  Family* family = Find(name);
  if (family == nullptr) return;  // undeclared: a programming error, shown by a missing series
  std::string sample = name;
  if (!labels.empty()) {
    sample += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&sample, i == 0 ? "" : ",", labels[i].first, "=\"",
                      Escape(labels[i].second, /*quotes=*/true), "\"");
    }
    sample += '}';
  }
  absl::StrAppend(&sample, " ", FormatValue(value));
  family->samples.push_back(std::move(sample));
}

std::string PrometheusText::Text() const {
  std::string out;
  for (const Family& f : families_) {
    if (f.samples.empty()) continue;
    absl::StrAppend(&out, "# HELP ", f.name, " ", Escape(f.help, /*quotes=*/false), "\n# TYPE ",
                    f.name, " ", f.type, "\n");
    for (const std::string& s : f.samples) absl::StrAppend(&out, s, "\n");
  }
  return out;
}

PrometheusText::Family* PrometheusText::Find(const std::string& name) {
  for (Family& f : families_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string RenderPrometheusMetrics(const DaemonFigures& figures) {
  PrometheusText out;
  out.Declare("latentd_start_time_seconds", "gauge",
              "When this daemon started, in seconds since the Unix epoch.");
  out.Add("latentd_start_time_seconds", {},
          absl::ToDoubleSeconds(figures.start_time - absl::UnixEpoch()));
  if (figures.process_rss_bytes >= 0) {
    out.Declare("latentd_process_resident_memory_bytes", "gauge",
                "Resident set size of the daemon process.");
    out.Add("latentd_process_resident_memory_bytes", {}, figures.process_rss_bytes);
  }
  if (figures.store_bytes_on_disk >= 0) {
    out.Declare("latentd_store_bytes_on_disk", "gauge",
                "Bytes of the store's database files (datasets, jobs, checkpoints; log included).");
    out.Add("latentd_store_bytes_on_disk", {}, figures.store_bytes_on_disk);
  }
  if (figures.free_disk_bytes >= 0) {
    out.Declare("latentd_store_free_disk_bytes", "gauge",
                "Bytes the file system holding the store still has for latentd.");
    out.Add("latentd_store_free_disk_bytes", {}, figures.free_disk_bytes);
  }
  AddJobsByTypeAndState(figures.jobs, &out);
  AddDevices(figures.devices, &out);
  for (const latentd::v1::Job& job : figures.jobs.active) AddActiveJob(job, figures.now, &out);
  return out.Text();
}

}  // namespace latentd::server
