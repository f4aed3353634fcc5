#include "server/job_manager.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "server/spec_bindings.h"

namespace latentd::server {

using latentd::v1::Job;
using latentd::v1::JobEvent;
using latentd::v1::JobReason;
using latentd::v1::JobResult;
using latentd::v1::JobSpec;
using latentd::v1::JobState;
using latentd::v1::JobType;

int DevicesRequested(const JobSpec& spec) {
  return spec.num_devices() == 0 ? 1 : spec.num_devices();
}

bool IsTerminal(JobState state) {
  return state == latentd::v1::SUCCEEDED || state == latentd::v1::FAILED ||
         state == latentd::v1::CANCELLED;
}

namespace {

google::protobuf::Timestamp Now() {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(absl::Now()));
}

constexpr int kMaxRequestIdLength = 128;
constexpr int kMaxLabelLength = 256;
constexpr int kMaxPageSize = 1000;
constexpr int kDefaultPageSize = 50;
constexpr int kEventsPerRead = 256;

// Runs `spec`; a spec with bindings first passes the runner's submit-time checks, which could not
// run at submit on the values the bindings have filled in since.
absl::StatusOr<JobResult> RunChecked(const JobRunner& runner, const JobSpec& spec,
                                     engine::JobContext* context) {
  if (!spec.bindings().empty() && runner.validate) RETURN_IF_ERROR(runner.validate(spec));
  return runner.run(spec, context);
}

// "starts once jobs 4, 5 have succeeded", for a spec with after_job_ids.
std::string WaitsFor(const JobSpec& spec) {
  const bool several = spec.after_job_ids_size() > 1;
  return absl::StrCat("starts once job", several ? "s " : " ",
                      absl::StrJoin(spec.after_job_ids(), ", "), several ? " have" : " has",
                      " succeeded");
}

// The reason a runner's failure is reported with, unless it attached one itself.
JobReason ReasonFor(const absl::Status& status) {
  JobReason attached = engine::AttachedReason(status);
  if (attached != latentd::v1::JOB_REASON_UNSPECIFIED) return attached;
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted:
      return latentd::v1::OOM;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      return latentd::v1::INVALID_INPUT;
    case absl::StatusCode::kDataLoss:
      return latentd::v1::DATA_LOSS;
    default:
      return latentd::v1::INTERNAL;
  }
}

}  // namespace

struct JobManager::Entry {
  Job job;
  std::atomic<bool> cancel_requested{false};
  // Set with cancel_requested by Shutdown: the runner's CANCELLED then means "leave it resumable".
  std::atomic<bool> interrupted{false};
  std::thread thread;
  std::vector<engine::DeviceRef> devices;
  absl::Time last_progress_write = absl::InfinitePast();
  // Rate over the recent window: the (time, units) sample the window starts at.
  absl::Time rate_window_start = absl::InfinitePast();
  int64_t rate_window_units = 0;
  bool rate_window_closed = false;
};

// The JobContext a runner sees. Calls come from the runner's thread (or threads it starts).
class JobManager::Context final : public engine::JobContext {
 public:
  Context(JobManager* manager, Entry* entry) : manager_(manager), entry_(entry) {}

  uint64_t job_id() const override { return entry_->job.id(); }
  int attempt() const override { return attempt_; }
  const std::vector<engine::DeviceRef>& devices() const override { return entry_->devices; }
  bool cancel_requested() const override { return entry_->cancel_requested.load(); }

  void ReportProgress(int64_t units_done, int64_t units_total, const std::string& unit) override {
    absl::MutexLock lock(&manager_->mu_);
    const absl::Time now = absl::Now();
    auto* progress = entry_->job.mutable_progress();
    progress->set_units_done(units_done);
    progress->set_units_total(units_total);
    progress->set_unit(unit);
    // The rate is measured over windows of at least a second, so it reads steadily.
    if (entry_->rate_window_start == absl::InfinitePast()) {
      entry_->rate_window_start = now;
      entry_->rate_window_units = units_done;
    } else {
      const double seconds = absl::ToDoubleSeconds(now - entry_->rate_window_start);
      // The rate changes once a window (>= 1 s) closes; before the first one closes it is
      // measured over the time since the first report, so short jobs show one too.
      if (seconds >= 1.0 || (!entry_->rate_window_closed && seconds > 0)) {
        progress->set_rate(static_cast<double>(units_done - entry_->rate_window_units) / seconds);
      }
      if (seconds >= 1.0) {
        entry_->rate_window_closed = true;
        entry_->rate_window_start = now;
        entry_->rate_window_units = units_done;
      }
    }
    const bool last = units_total > 0 && units_done >= units_total;
    if (!last && now - entry_->last_progress_write < manager_->options_.progress_interval) return;
    entry_->last_progress_write = now;
    JobEvent event;
    *event.mutable_progress() = *progress;
    manager_->AppendEventLocked(entry_, std::move(event), /*sync=*/false).IgnoreError();
  }

  void ReportTelemetry(const latentd::v1::Telemetry& sample) override {
    absl::MutexLock lock(&manager_->mu_);
    *entry_->job.mutable_latest_telemetry() = sample;  // written with the event's record
    JobEvent event;
    *event.mutable_telemetry() = sample;
    manager_->AppendEventLocked(entry_, std::move(event), /*sync=*/false).IgnoreError();
  }

  void Log(latentd::v1::LogLine::Level level, const std::string& text) override {
    absl::MutexLock lock(&manager_->mu_);
    JobEvent event;
    event.mutable_log()->set_level(level);
    event.mutable_log()->set_text(text);
    manager_->AppendEventLocked(entry_, std::move(event), /*sync=*/false).IgnoreError();
  }

  void set_attempt(int attempt) { attempt_ = attempt; }

 private:
  JobManager* const manager_;
  Entry* const entry_;
  int attempt_ = 1;
};

JobManager::JobManager(JobStore* store, engine::DevicePool* pool,
                       std::map<JobType, JobRunner> runners, JobManagerOptions options)
    : store_(store), pool_(pool), runners_(std::move(runners)), options_(options) {}

JobManager::~JobManager() { Shutdown(); }

absl::Status JobManager::Start() {
  absl::MutexLock lock(&mu_);
  if (started_) return absl::FailedPreconditionError("job manager already started");
  auto next_id = store_->LoadNextId();
  if (!next_id.ok()) return next_id.status();
  next_id_ = *next_id;
  auto loaded = store_->LoadAll();
  if (!loaded.ok()) return loaded.status();
  for (const std::string& unreadable : loaded->unreadable) {
    startup_warnings_.push_back(
        absl::StrCat(unreadable, "; left out (its id stays taken, its datasets stay)"));
  }
  for (Job& job : loaded->jobs) {
    auto entry = std::make_unique<Entry>();
    entry->job = std::move(job);
    Entry* e = entry.get();
    const uint64_t id = e->job.id();
    if (!e->job.request_id().empty()) by_request_id_[e->job.request_id()] = id;
    next_id_ = std::max(next_id_, id + 1);
    jobs_[id] = std::move(entry);
    // A job the previous process was running never reached a safe end: put it back in the queue.
    if (e->job.state() == latentd::v1::RUNNING) {
      e->job.clear_devices();
      absl::Status s = SetStateLocked(
          e, latentd::v1::PENDING, latentd::v1::INTERRUPTED,
          "the daemon stopped while the job ran; re-queued, it resumes from its last checkpoint");
      if (!s.ok()) return s;
    } else if (e->job.state() == latentd::v1::CANCELLING) {
      absl::Status s = SetStateLocked(e, latentd::v1::CANCELLED, latentd::v1::USER_CANCELLED,
                                      "cancelled (the daemon stopped while cancelling)");
      if (!s.ok()) return s;
    }
  }
  started_ = true;
  schedule_dirty_ = true;
  scheduler_ = std::thread([this] { SchedulerLoop(); });
  return absl::OkStatus();
}

void JobManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (auto& [id, entry] : jobs_) {
      if (entry->job.state() == latentd::v1::RUNNING ||
          entry->job.state() == latentd::v1::CANCELLING) {
        entry->interrupted = entry->job.state() == latentd::v1::RUNNING;
        entry->cancel_requested = true;
      }
    }
    changed_.SignalAll();
  }
  if (scheduler_.joinable()) scheduler_.join();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, entry] : jobs_) {
      if (entry->thread.joinable()) threads.push_back(std::move(entry->thread));
    }
    for (auto& t : finished_threads_) threads.push_back(std::move(t));
    finished_threads_.clear();
  }
  for (auto& t : threads) t.join();
}

absl::Status JobManager::ValidateSpec(const JobSpec& spec, bool with_runner) const {
  if (spec.type() == latentd::v1::JOB_TYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError("spec.type: required (PROBE, EXTRACT, TRAIN or EXPORT)");
  }
  auto runner = runners_.find(spec.type());
  if (runner == runners_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.type: ", latentd::v1::JobType_Name(spec.type()), " jobs are not enabled here"));
  }
  // Each type's spec is the oneof member named after it (EXTRACT: extract).
  const google::protobuf::FieldDescriptor* expected =
      JobSpec::descriptor()->FindFieldByName(absl::AsciiStrToLower(JobType_Name(spec.type())));
  if (spec.spec_case() != JobSpec::SPEC_NOT_SET &&
      (expected == nullptr || static_cast<int>(spec.spec_case()) != expected->number())) {
    return absl::InvalidArgumentError(absl::StrCat("spec: the type is ",
                                                   latentd::v1::JobType_Name(spec.type()),
                                                   " but the spec set is another type's"));
  }
  if (!runner->second.holds_devices) {
    if (spec.num_devices() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.num_devices: ", latentd::v1::JobType_Name(spec.type()),
                       " jobs hold no device; leave it 0, not ", spec.num_devices()));
    }
  } else if (spec.num_devices() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.num_devices: must be >= 1, got ", spec.num_devices()));
  }
  const int devices = DevicesRequested(spec);
  if (devices > pool_->size()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.num_devices: ", devices,
                                                   " requested but this daemon has ", pool_->size(),
                                                   " devices"));
  }
  if (spec.label().size() > kMaxLabelLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.label: at most ", kMaxLabelLength, " bytes"));
  }
  if (with_runner && runner->second.validate) return runner->second.validate(spec);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<JobSpec>> JobManager::ResolveSubmitted(const JobSpec& spec) const {
  if (spec.after_job_ids().empty() && spec.bindings().empty()) return spec;
  std::map<uint64_t, JobResult> results;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckBindings(spec, [this](uint64_t id) -> std::optional<JobType> {
      mu_.AssertHeld();
      auto it = jobs_.find(id);
      if (it == jobs_.end()) return std::nullopt;
      return it->second->job.type();
    }));
    for (int i = 0; i < spec.after_job_ids_size(); ++i) {
      const Job& job = jobs_.at(spec.after_job_ids(i))->job;
      if (job.state() == latentd::v1::FAILED || job.state() == latentd::v1::CANCELLED) {
        return absl::FailedPreconditionError(
            absl::StrCat("spec.after_job_ids[", i, "]: job ", job.id(), " is ",
                         latentd::v1::JobState_Name(job.state()), " (", job.message(),
                         "): a job waiting for it would never start"));
      }
    }
    std::optional<std::map<uint64_t, JobResult>> bound = BoundResultsLocked(spec);
    if (!bound.has_value()) return std::optional<JobSpec>();  // the values do not exist yet
    results = *std::move(bound);
  }
  return ApplyBindings(spec, results);
}

std::optional<std::map<uint64_t, JobResult>> JobManager::BoundResultsLocked(
    const JobSpec& spec) const {
  std::map<uint64_t, JobResult> results;
  for (const latentd::v1::SpecBinding& b : spec.bindings()) {
    auto it = jobs_.find(b.job_id());
    if (it == jobs_.end() || it->second->job.state() != latentd::v1::SUCCEEDED) {
      return std::nullopt;
    }
    results[b.job_id()] = it->second->job.result();
  }
  return results;
}

absl::StatusOr<latentd::v1::JobPlan> JobManager::Plan(const JobSpec& spec) const {
  latentd::v1::JobPlan plan;
  plan.set_type(spec.type());
  ASSIGN_OR_RETURN(std::optional<JobSpec> runnable, ResolveSubmitted(spec));
  if (!spec.after_job_ids().empty()) plan.add_lines(WaitsFor(spec));
  for (const latentd::v1::SpecBinding& b : spec.bindings()) {
    plan.add_lines(absl::StrCat(b.field(), " from job ", b.job_id(), "'s ", b.output()));
  }
  if (!runnable.has_value()) {
    RETURN_IF_ERROR(ValidateSpec(spec, /*with_runner=*/false));
    plan.add_lines(absl::StrCat("the ", latentd::v1::JobType_Name(spec.type()),
                                " checks and plan wait for those values: they run when the job "
                                "starts"));
    return plan;
  }
  auto runner = runners_.find(spec.type());
  if (runner != runners_.end() && runner->second.plan) {
    // The plan's own checks are the submit checks (and no cheaper to run twice).
    RETURN_IF_ERROR(ValidateSpec(*runnable, /*with_runner=*/false));
    ASSIGN_OR_RETURN(std::vector<std::string> lines, runner->second.plan(*runnable));
    for (std::string& line : lines) plan.add_lines(std::move(line));
    return plan;
  }
  RETURN_IF_ERROR(ValidateSpec(*runnable));
  plan.add_lines("the spec passed every submit-time check");
  return plan;
}

absl::StatusOr<Job> JobManager::Submit(const std::string& request_id, const JobSpec& spec) {
  if (request_id.size() > kMaxRequestIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: at most ", kMaxRequestIdLength, " bytes"));
  }
  {
    // Idempotent retries are answered before validation: the first answer stands.
    absl::MutexLock lock(&mu_);
    if (!request_id.empty()) {
      if (auto it = by_request_id_.find(request_id); it != by_request_id_.end()) {
        const Job& existing = jobs_.at(it->second)->job;
        // A pipeline job's spec holds its bound values once they were taken.
        const JobSpec& submitted =
            existing.has_submitted_spec() ? existing.submitted_spec() : existing.spec();
        if (!google::protobuf::util::MessageDifferencer::Equals(submitted, spec)) {
          return absl::AlreadyExistsError(absl::StrCat("request_id '", request_id,
                                                       "' already created job ", existing.id(),
                                                       " with a different spec"));
        }
        return existing;
      }
    }
  }
  ASSIGN_OR_RETURN(std::optional<JobSpec> runnable, ResolveSubmitted(spec));
  RETURN_IF_ERROR(ValidateSpec(runnable.has_value() ? *runnable : spec,
                               /*with_runner=*/runnable.has_value()));

  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("latentd is shutting down");
  if (!request_id.empty()) {  // a concurrent twin may have won while we validated
    if (auto it = by_request_id_.find(request_id); it != by_request_id_.end()) {
      return jobs_.at(it->second)->job;
    }
  }
  auto entry = std::make_unique<Entry>();
  Job& job = entry->job;
  job.set_id(next_id_);
  job.set_type(spec.type());
  *job.mutable_spec() = spec;  // as submitted: a retry with the same request id compares equal
  job.set_state(latentd::v1::PENDING);
  job.set_request_id(request_id);
  *job.mutable_created() = Now();
  job.set_last_event_sequence(1);
  JobEvent event;
  event.set_job_id(job.id());
  event.set_sequence(1);
  *event.mutable_time() = job.created();
  event.mutable_state()->set_state(latentd::v1::PENDING);
  event.mutable_state()->set_message(
      spec.after_job_ids().empty() ? "submitted" : absl::StrCat("submitted; ", WaitsFor(spec)));
  if (absl::Status s = store_->Create(job, {event}); !s.ok()) return s;
  ++next_id_;
  if (!request_id.empty()) by_request_id_[request_id] = job.id();
  Job copy = job;
  jobs_[job.id()] = std::move(entry);
  schedule_dirty_ = true;
  changed_.SignalAll();
  return copy;
}

absl::StatusOr<Job> JobManager::Get(uint64_t job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return it->second->job;
}

JobFigures JobManager::Figures() const {
  absl::MutexLock lock(&mu_);
  JobFigures figures;
  for (const auto& [id, entry] : jobs_) {
    ++figures.counts[{entry->job.type(), entry->job.state()}];
    const latentd::v1::JobState state = entry->job.state();
    if (state == latentd::v1::RUNNING || state == latentd::v1::CANCELLING) {
      figures.active.push_back(entry->job);
    }
  }
  return figures;
}

std::vector<Job> JobManager::UnfinishedJobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<Job> out;
  for (const auto& [id, entry] : jobs_) {
    if (IsTerminal(entry->job.state())) continue;
    out.push_back(entry->job);
    if (!entry->job.has_submitted_spec() && !entry->job.spec().bindings().empty()) {
      *out.back().mutable_spec() = PreviewBindingsLocked(entry->job.spec());
    }
  }
  return out;
}

JobSpec JobManager::PreviewBindingsLocked(const JobSpec& spec) const {
  JobSpec preview = spec;
  for (const latentd::v1::SpecBinding& b : spec.bindings()) {
    auto it = jobs_.find(b.job_id());
    if (it == jobs_.end() || it->second->job.state() != latentd::v1::SUCCEEDED) continue;
    JobSpec one = preview;
    one.clear_bindings();
    *one.add_bindings() = b;
    absl::StatusOr<JobSpec> bound = ApplyBindings(one, {{b.job_id(), it->second->job.result()}});
    if (bound.ok()) preview = *std::move(bound);
  }
  *preview.mutable_bindings() = spec.bindings();
  return preview;
}

absl::StatusOr<ListJobsResult> JobManager::List(const JobFilter& filter, int page_size,
                                                const std::string& page_token) const {
  if (page_size < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
  if (page_size == 0) page_size = kDefaultPageSize;
  page_size = std::min(page_size, kMaxPageSize);
  uint64_t below = UINT64_MAX;
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, &below) || below == 0)) {
    return absl::InvalidArgumentError("page_token: not a token this server issued");
  }
  ListJobsResult result;
  absl::MutexLock lock(&mu_);
  for (auto it = jobs_.lower_bound(below); it != jobs_.begin();) {
    --it;
    if (it->first >= below) continue;
    const Job& job = it->second->job;
    if (filter.state != latentd::v1::JOB_STATE_UNSPECIFIED && job.state() != filter.state) continue;
    if (filter.type != latentd::v1::JOB_TYPE_UNSPECIFIED && job.type() != filter.type) continue;
    if (!filter.label.empty() && job.spec().label() != filter.label) continue;
    if (static_cast<int>(result.jobs.size()) == page_size) {
      result.next_page_token = absl::StrCat(result.jobs.back().id());
      break;
    }
    result.jobs.push_back(job);
  }
  return result;
}

absl::Status JobManager::Delete(uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  // A finished job's runner thread may still be on its way out; it must be gone before the
  // entry it points to is.
  JoinFinishedLocked();
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  Entry* entry = it->second.get();
  if (!IsTerminal(entry->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", latentd::v1::JobState_Name(entry->job.state()),
                     "; cancel it, or wait for it to finish, first"));
  }
  for (const auto& [id, other] : jobs_) {
    if (IsTerminal(other->job.state())) continue;
    auto other_runner = runners_.find(other->job.spec().type());
    if (other_runner != runners_.end() && other_runner->second.continues &&
        other_runner->second.continues(other->job.spec()) == job_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " continues job ", job_id, " (resume_from_job_id) and has not finished"));
    }
    for (uint64_t waited_for : other->job.spec().after_job_ids()) {
      if (waited_for == job_id) {
        return absl::FailedPreconditionError(absl::StrCat("job ", id, " waits for job ", job_id,
                                                          " (after_job_ids) and has not finished"));
      }
    }
  }
  if (entry->thread.joinable()) {
    return absl::UnavailableError(absl::StrCat("job ", job_id, " is still shutting down"));
  }
  auto runner = runners_.find(entry->job.spec().type());
  if (runner != runners_.end() && runner->second.forget) {
    RETURN_IF_ERROR(runner->second.forget(job_id));
  }
  RETURN_IF_ERROR(store_->Delete(entry->job));
  if (!entry->job.request_id().empty()) by_request_id_.erase(entry->job.request_id());
  jobs_.erase(it);
  changed_.SignalAll();  // watchers of the job find it gone
  return absl::OkStatus();
}

absl::StatusOr<Job> JobManager::Cancel(uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  Entry* entry = it->second.get();
  switch (entry->job.state()) {
    case latentd::v1::PENDING: {
      absl::Status s = SetStateLocked(entry, latentd::v1::CANCELLED, latentd::v1::USER_CANCELLED,
                                      "cancelled before it started");
      if (!s.ok()) return s;
      schedule_dirty_ = true;
      break;
    }
    case latentd::v1::RUNNING: {
      absl::Status s = SetStateLocked(entry, latentd::v1::CANCELLING, latentd::v1::USER_CANCELLED,
                                      "cancel requested; stopping at the next safe point");
      if (!s.ok()) return s;
      entry->cancel_requested = true;
      break;
    }
    case latentd::v1::CANCELLING:
      break;  // already on its way
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " already finished (",
                       latentd::v1::JobState_Name(entry->job.state()), ")"));
  }
  return entry->job;
}

absl::Status JobManager::Watch(uint64_t job_id, int64_t after_sequence,
                               const std::function<bool(const JobEvent&)>& send,
                               const std::function<bool()>& client_gone) const {
  if (after_sequence < 0) return absl::InvalidArgumentError("after_sequence: must be >= 0");
  {
    absl::MutexLock lock(&mu_);
    if (jobs_.find(job_id) == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
    }
  }
  int64_t sent = after_sequence;
  while (true) {
    auto events = store_->ReadEvents(job_id, sent, kEventsPerRead);
    if (!events.ok()) return events.status();
    for (const JobEvent& event : *events) {
      if (!send(event)) return absl::OkStatus();
      sent = event.sequence();
    }
    if (static_cast<int>(events->size()) == kEventsPerRead) continue;
    absl::MutexLock lock(&mu_);
    // Looked up after every wait: a job that finished meanwhile may have been deleted too.
    while (true) {
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) {
        return absl::NotFoundError(absl::StrCat("job ", job_id, " was deleted"));
      }
      const Job& job = it->second->job;
      if (job.last_event_sequence() > sent) break;  // new events to read
      if (IsTerminal(job.state())) return absl::OkStatus();
      if (shutting_down_) return absl::UnavailableError("latentd is shutting down");
      if (client_gone()) return absl::CancelledError("watcher went away");
      changed_.WaitWithTimeout(&mu_, options_.watch_poll);
    }
  }
}

absl::Status JobManager::AppendEventLocked(Entry* entry, JobEvent event, bool sync) {
  Job& job = entry->job;
  event.set_job_id(job.id());
  event.set_sequence(job.last_event_sequence() + 1);
  *event.mutable_time() = Now();
  job.set_last_event_sequence(event.sequence());
  absl::Status s = store_->Update(job, {event}, sync);
  changed_.SignalAll();
  return s;
}

absl::Status JobManager::SetStateLocked(Entry* entry, JobState state, JobReason reason,
                                        const std::string& message) {
  Job& job = entry->job;
  job.set_state(state);
  job.set_reason(reason);
  job.set_message(message);
  if (IsTerminal(state)) *job.mutable_finished() = Now();
  JobEvent event;
  event.mutable_state()->set_state(state);
  event.mutable_state()->set_reason(reason);
  event.mutable_state()->set_message(message);
  return AppendEventLocked(entry, std::move(event), /*sync=*/true);
}

bool JobManager::HoldsDevices(const JobSpec& spec) const {
  auto runner = runners_.find(spec.type());
  return runner == runners_.end() || runner->second.holds_devices;
}

void JobManager::SchedulerLoop() {
  absl::MutexLock lock(&mu_);
  while (!shutting_down_) {
    while (!schedule_dirty_ && !shutting_down_) changed_.Wait(&mu_);
    if (shutting_down_) break;
    schedule_dirty_ = false;
    JoinFinishedLocked();
    // JoinFinishedLocked lets go of mu_: a Shutdown that came in meanwhile has already told every
    // running job to stop, and would never hear of one started now.
    if (shutting_down_) break;
    std::vector<Entry*> pending;
    for (auto& [id, entry] : jobs_) {
      if (entry->job.state() == latentd::v1::PENDING) pending.push_back(entry.get());
    }
    std::stable_sort(pending.begin(), pending.end(), [](const Entry* a, const Entry* b) {
      return a->job.spec().priority() > b->job.spec().priority();
    });
    int deviceless_running = 0;
    for (auto& [id, entry] : jobs_) {
      const JobState state = entry->job.state();
      if ((state == latentd::v1::RUNNING || state == latentd::v1::CANCELLING) &&
          !HoldsDevices(entry->job.spec())) {
        ++deviceless_running;
      }
    }
    bool devices_blocked = false;  // a job that needs devices waits for them: no backfill
    for (Entry* entry : pending) {
      const bool holds_devices = HoldsDevices(entry->job.spec());
      if (holds_devices ? devices_blocked : deviceless_running >= options_.max_deviceless_jobs) {
        continue;
      }
      std::string why;
      switch (DependenciesLocked(entry->job.spec(), &why)) {
        case Dependencies::kWaiting:
          continue;  // not a candidate yet; the jobs behind it are not held up
        case Dependencies::kFailed:
          SetStateLocked(entry, latentd::v1::FAILED, latentd::v1::DEPENDENCY_FAILED, why)
              .IgnoreError();      // unwritten, it is failed again after a restart
          schedule_dirty_ = true;  // the jobs waiting for this one fail in the next pass
          continue;
        case Dependencies::kReady:
          break;
      }
      if (!BindLocked(entry)) continue;  // it FAILED: a value its bindings took does not fit
      if (!holds_devices) {
        ++deviceless_running;
        StartJobLocked(entry, {});
        continue;
      }
      auto devices = pool_->TryAcquire(DevicesRequested(entry->job.spec()), entry->job.id());
      if (!devices.has_value()) {
        devices_blocked = true;  // the head of the queue waits for its devices
        continue;
      }
      StartJobLocked(entry, std::move(*devices));
    }
  }
}

JobManager::Dependencies JobManager::DependenciesLocked(const JobSpec& spec,
                                                        std::string* why) const {
  bool waiting = false;
  for (uint64_t id : spec.after_job_ids()) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      *why = absl::StrCat("job ", id, ", which this job waits for, was deleted");
      return Dependencies::kFailed;
    }
    const Job& job = it->second->job;
    if (job.state() == latentd::v1::FAILED || job.state() == latentd::v1::CANCELLED) {
      *why = absl::StrCat("job ", id, ", which this job waits for, is ",
                          latentd::v1::JobState_Name(job.state()), ": ", job.message());
      return Dependencies::kFailed;
    }
    if (job.state() != latentd::v1::SUCCEEDED) waiting = true;
  }
  return waiting ? Dependencies::kWaiting : Dependencies::kReady;
}

bool JobManager::BindLocked(Entry* entry) {
  Job& job = entry->job;
  if (job.spec().bindings().empty() || job.has_submitted_spec()) return true;
  // Every job it waits for has SUCCEEDED and cannot be deleted while this one has not finished;
  // were one missing all the same, ApplyBindings would fail the job naming it.
  std::vector<std::string> applied;
  absl::StatusOr<JobSpec> bound = ApplyBindings(
      job.spec(), BoundResultsLocked(job.spec()).value_or(std::map<uint64_t, JobResult>()),
      &applied);
  if (!bound.ok()) {
    SetStateLocked(entry, latentd::v1::FAILED, ReasonFor(bound.status()),
                   std::string(bound.status().message()))
        .IgnoreError();  // unwritten, it is failed again after a restart
    return false;
  }
  *job.mutable_submitted_spec() = job.spec();
  *job.mutable_spec() = *std::move(bound);
  for (const std::string& line : applied) {
    JobEvent event;
    event.mutable_log()->set_level(latentd::v1::LogLine::INFO);
    event.mutable_log()->set_text(absl::StrCat("bound ", line));
    // Synced: the record now holds the bound spec, which a restart must not bind again.
    AppendEventLocked(entry, std::move(event), /*sync=*/true).IgnoreError();
  }
  return true;
}

void JobManager::StartJobLocked(Entry* entry, std::vector<engine::DeviceRef> devices) {
  Job& job = entry->job;
  entry->devices = std::move(devices);
  entry->cancel_requested = false;
  entry->interrupted = false;
  job.clear_devices();
  for (const auto& d : entry->devices) job.add_devices(d.name);
  job.set_attempts(job.attempts() + 1);
  *job.mutable_started() = Now();
  job.clear_progress();
  job.clear_latest_telemetry();
  entry->last_progress_write = absl::InfinitePast();
  entry->rate_window_start = absl::InfinitePast();
  entry->rate_window_closed = false;
  std::string on;
  for (const auto& d : entry->devices) absl::StrAppend(&on, on.empty() ? "" : ",", d.name);
  absl::Status s = SetStateLocked(
      entry, latentd::v1::RUNNING, latentd::v1::JOB_REASON_UNSPECIFIED,
      absl::StrCat("running on ", on.empty() ? "the host" : on,
                   job.attempts() > 1 ? absl::StrCat(" (attempt ", job.attempts(), ")") : ""));
  if (!s.ok()) {
    // The record could not be written: do not run a job whose state nobody could read back.
    pool_->Release(job.id());
    job.set_state(latentd::v1::PENDING);
    return;
  }
  if (entry->thread.joinable()) finished_threads_.push_back(std::move(entry->thread));
  entry->thread = std::thread([this, entry] { RunJob(entry); });
}

void JobManager::RunJob(Entry* entry) {
  Context context(this, entry);
  JobSpec spec;
  {
    absl::MutexLock lock(&mu_);
    spec = entry->job.spec();  // with its bindings' values (BindLocked)
    context.set_attempt(entry->job.attempts());
  }
  const JobRunner& runner = runners_.at(spec.type());
  absl::StatusOr<JobResult> result;
  try {
    result = RunChecked(runner, spec, &context);
  } catch (const std::exception& e) {
    // Runners should not throw; if one does, the job fails and the daemon lives on.
    result = absl::InternalError(absl::StrCat("runner threw: ", e.what()));
  }
  FinishJob(entry, result);
}

void JobManager::FinishJob(Entry* entry, const absl::StatusOr<JobResult>& result) {
  absl::MutexLock lock(&mu_);
  Job& job = entry->job;
  absl::Status s;
  if (result.ok()) {
    *job.mutable_result() = *result;
    s = SetStateLocked(entry, latentd::v1::SUCCEEDED, latentd::v1::JOB_REASON_UNSPECIFIED, "done");
  } else if (absl::IsCancelled(result.status()) && entry->interrupted) {
    s = SetStateLocked(entry, latentd::v1::PENDING, latentd::v1::INTERRUPTED,
                       "stopped at a safe point by daemon shutdown; resumes on restart");
  } else if (absl::IsCancelled(result.status()) && entry->cancel_requested) {
    // The runner says where it stopped and what it kept (a TRAIN job: its checkpoint and how to
    // continue from it).
    const absl::string_view said = result.status().message();
    s = SetStateLocked(entry, latentd::v1::CANCELLED, latentd::v1::USER_CANCELLED,
                       said.empty() ? "cancelled" : std::string(said));
  } else {
    s = SetStateLocked(entry, latentd::v1::FAILED, ReasonFor(result.status()),
                       std::string(result.status().message()));
  }
  (void)s;  // a failed record write leaves the job RUNNING on disk: it re-runs after a restart
  pool_->Release(job.id());
  job.clear_devices();
  entry->devices.clear();
  schedule_dirty_ = true;
  changed_.SignalAll();
}

void JobManager::JoinFinishedLocked() {
  for (auto& [id, entry] : jobs_) {
    if (entry->thread.joinable() && entry->job.state() != latentd::v1::RUNNING &&
        entry->job.state() != latentd::v1::CANCELLING) {
      finished_threads_.push_back(std::move(entry->thread));
    }
  }
  // A finished runner thread only has its return left to do; it is joined outside the lock all
  // the same, so that nothing it still runs on the way out can wait for us.
  std::vector<std::thread> threads = std::move(finished_threads_);
  finished_threads_.clear();
  mu_.Unlock();
  for (auto& t : threads) t.join();
  mu_.Lock();
}

}  // namespace latentd::server
