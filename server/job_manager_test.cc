#include "server/job_manager.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/big_endian.h"
#include "common/status_macros.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::server {
namespace {

using latentd::v1::Job;
using latentd::v1::JobEvent;
using latentd::v1::JobSpec;

// A runner the test steers: each job blocks until released (or cancelled), then returns its
// result. Records the order jobs started in.
struct Gate {
  absl::Mutex mu;
  std::vector<uint64_t> started;
  std::map<uint64_t, bool> released;
  std::map<uint64_t, JobSpec> specs;
  std::atomic<int> running{0};
  std::atomic<int> max_running{0};

  absl::StatusOr<latentd::v1::JobResult> Run(const JobSpec& spec, engine::JobContext* ctx) {
    {
      absl::MutexLock lock(&mu);
      started.push_back(ctx->job_id());
      specs[ctx->job_id()] = spec;
    }
    int now = ++running;
    int seen = max_running.load();
    while (now > seen && !max_running.compare_exchange_weak(seen, now)) {
    }
    ctx->ReportProgress(1, 2, "steps");
    ctx->Log(latentd::v1::LogLine::INFO, "working");
    if (spec.label() == "telemetry") {
      latentd::v1::Telemetry sample;
      sample.mutable_train()->set_step(ctx->attempt());
      sample.mutable_train()->set_loss(0.5 * ctx->job_id());
      ctx->ReportTelemetry(sample);
    }
    while (true) {
      if (ctx->cancel_requested()) {
        --running;
        return absl::CancelledError("stopped");
      }
      {
        absl::MutexLock lock(&mu);
        if (released[ctx->job_id()]) break;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    --running;
    if (spec.label() == "finish") ctx->ReportProgress(2, 2, "steps");
    if (spec.label() == "fail") return absl::InvalidArgumentError("spec.label: bad on purpose");
    latentd::v1::JobResult result;
    // "result=X" labels a job whose result names device X (a value for bindings to take).
    const bool named = spec.label().rfind("result=", 0) == 0;
    result.mutable_probe()->add_devices()->set_device(named ? spec.label().substr(7)
                                                            : ctx->devices()[0].name);
    return result;
  }

  void Release(uint64_t id) {
    absl::MutexLock lock(&mu);
    released[id] = true;
  }
  std::vector<uint64_t> Started() {
    absl::MutexLock lock(&mu);
    return started;
  }
  // The spec job `id` ran with (bindings applied).
  JobSpec SpecOf(uint64_t id) {
    absl::MutexLock lock(&mu);
    return specs[id];
  }
};

class JobManagerTest : public ::testing::Test {
 protected:
  void Open(const std::string& devices = "cpu:2") {
    db_ = std::move(*storage::Db::Open(dir_));
    store_ = std::make_unique<JobStore>(db_.get());
    pool_ = std::move(*engine::DevicePool::Create(devices));
    JobRunner runner;
    runner.run = [this](const JobSpec& spec, engine::JobContext* ctx) {
      return gate_.Run(spec, ctx);
    };
    runner.forget = [this](uint64_t job_id) {
      forgotten_.push_back(job_id);
      return absl::OkStatus();
    };
    runner.continues = [](const JobSpec& spec) { return spec.extract().resume_from_job_id(); };
    // EXTRACT answers dry runs: its label is the plan, or "bad" its error.
    JobRunner extract = runner;
    extract.validate = [](const JobSpec& spec) -> absl::Status {
      if (spec.extract().dataset_name() == "invalid") {
        return absl::InvalidArgumentError("extract.dataset_name: \"invalid\" is refused");
      }
      return absl::OkStatus();
    };
    // EXPORT stands for every type that runs without a device.
    JobRunner deviceless = runner;
    deviceless.holds_devices = false;
    // A plan makes validate's checks itself (the JobRunner contract).
    extract.plan = [validate = extract.validate](
                       const JobSpec& spec) -> absl::StatusOr<std::vector<std::string>> {
      RETURN_IF_ERROR(validate(spec));
      if (spec.label() == "bad") return absl::InvalidArgumentError("extract.hook_name: bad");
      return std::vector<std::string>{"plan of " + spec.label(), "second line"};
    };
    manager_ = std::make_unique<JobManager>(
        store_.get(), pool_.get(),
        std::map<latentd::v1::JobType, JobRunner>{{latentd::v1::PROBE, runner},
                                                  {latentd::v1::EXTRACT, extract},
                                                  {latentd::v1::EXPORT, deviceless}});
    ASSERT_TRUE(manager_->Start().ok());
  }
  void Close() {
    manager_.reset();
    pool_.reset();
    store_.reset();
    db_.reset();
  }
  void TearDown() override { Close(); }

  JobSpec Probe(int devices = 1, int priority = 0, const std::string& label = "") {
    JobSpec spec;
    spec.set_type(latentd::v1::PROBE);
    spec.set_num_devices(devices);
    spec.set_priority(priority);
    spec.set_label(label);
    return spec;
  }

  // A job without devices; label "result=X" makes its result name X.
  JobSpec Export(const std::string& label = "") {
    JobSpec spec;
    spec.set_type(latentd::v1::EXPORT);
    spec.set_label(label);
    return spec;
  }

  Job WaitFor(uint64_t id, latentd::v1::JobState state) {
    for (int i = 0; i < 5000; ++i) {
      Job job = *manager_->Get(id);
      if (job.state() == state) return job;
      absl::SleepFor(absl::Milliseconds(2));
    }
    ADD_FAILURE() << "job " << id << " never reached " << latentd::v1::JobState_Name(state);
    return *manager_->Get(id);
  }

  std::string dir_ = FreshTestDir("job_manager");
  Gate gate_;
  std::unique_ptr<storage::Db> db_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<engine::DevicePool> pool_;
  std::unique_ptr<JobManager> manager_;
  std::vector<uint64_t> forgotten_;  // ids the runner was asked to forget
};

TEST_F(JobManagerTest, RunsAJobToSucceededWithEventsInOrder) {
  Open();
  Job job = *manager_->Submit("", Probe());
  EXPECT_EQ(job.state(), latentd::v1::PENDING);
  WaitFor(job.id(), latentd::v1::RUNNING);
  gate_.Release(job.id());
  Job done = WaitFor(job.id(), latentd::v1::SUCCEEDED);
  EXPECT_EQ(done.result().probe().devices(0).device(), "cpu:0");
  EXPECT_TRUE(done.has_finished());
  std::vector<JobEvent> events;
  ASSERT_TRUE(manager_
                  ->Watch(
                      job.id(), 0,
                      [&](const JobEvent& e) {
                        events.push_back(e);
                        return true;
                      },
                      [] { return false; })
                  .ok());
  ASSERT_GE(events.size(), 4u);  // PENDING, RUNNING, progress, log, SUCCEEDED
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].sequence(), int64_t(i + 1));
  EXPECT_EQ(events.front().state().state(), latentd::v1::PENDING);
  EXPECT_EQ(events.back().state().state(), latentd::v1::SUCCEEDED);
  // Resuming from a sequence number sends only what follows it.
  std::vector<JobEvent> tail;
  ASSERT_TRUE(manager_
                  ->Watch(
                      job.id(), events.size() - 1,
                      [&](const JobEvent& e) {
                        tail.push_back(e);
                        return true;
                      },
                      [] { return false; })
                  .ok());
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0].sequence(), int64_t(events.size()));
}

TEST_F(JobManagerTest, ADryRunChecksAndPlansWithoutCreatingAJob) {
  Open();
  JobSpec extract;
  extract.set_type(latentd::v1::EXTRACT);
  extract.set_label("x");
  auto plan = manager_->Plan(extract);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->type(), latentd::v1::EXTRACT);
  EXPECT_EQ(std::vector<std::string>(plan->lines().begin(), plan->lines().end()),
            (std::vector<std::string>{"plan of x", "second line"}));
  // A type without a plan: the checks alone.
  auto probe = manager_->Plan(Probe());
  ASSERT_TRUE(probe.ok());
  EXPECT_EQ(probe->lines(0), "the spec passed every submit-time check");
  // The errors a submit would give: the shared checks', and the runner's.
  EXPECT_EQ(manager_->Plan(Probe(/*devices=*/99)).status().code(),
            absl::StatusCode::kInvalidArgument);
  extract.set_label("bad");
  EXPECT_EQ(manager_->Plan(extract).status().message(), "extract.hook_name: bad");
  // Nothing was created.
  auto jobs = manager_->List({}, 0, "");
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->jobs.empty());
  EXPECT_EQ(manager_->Submit("", Probe())->id(), 1u);
}

TEST_F(JobManagerTest, SameRequestIdReturnsTheSameJob) {
  Open();
  Job a = *manager_->Submit("req-1", Probe());
  Job b = *manager_->Submit("req-1", Probe());
  EXPECT_EQ(a.id(), b.id());
  auto conflict = manager_->Submit("req-1", Probe(1, 5));
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(manager_->List({}, 0, "")->jobs.size(), 1u);
}

// A shutdown that lands while the scheduler is between picking a job and starting it must still
// stop that job: the daemon's stop (SIGTERM) would otherwise wait forever on a runner nobody
// asked to stop. The race is narrow, so it is run many times; each round shuts down right after
// a submit, when the scheduler is most likely to be in the middle of its pass.
TEST_F(JobManagerTest, ShutdownRightAfterASubmitStopsWhateverTheSchedulerStarts) {
  for (int round = 0; round < 300; ++round) {
    Open("cpu:1");
    ASSERT_TRUE(manager_->Submit("", Probe()).ok());
    manager_->Shutdown();  // hangs (the test times out) if a runner started and was never stopped
    Close();
    dir_ = FreshTestDir(absl::StrCat("job_manager_round_", round));
  }
}

TEST_F(JobManagerTest, DevicesAreNeverSharedAndFifoWithinPriority) {
  Open("cpu:2");
  Job big = *manager_->Submit("", Probe(2));
  WaitFor(big.id(), latentd::v1::RUNNING);
  Job low = *manager_->Submit("", Probe(1, 0));
  Job high1 = *manager_->Submit("", Probe(1, 5));
  Job high2 = *manager_->Submit("", Probe(1, 5));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(manager_->Get(low.id())->state(), latentd::v1::PENDING);  // all devices are held
  gate_.Release(big.id());
  WaitFor(high1.id(), latentd::v1::RUNNING);
  WaitFor(high2.id(), latentd::v1::RUNNING);
  EXPECT_EQ(manager_->Get(low.id())->state(), latentd::v1::PENDING);
  // RUNNING is set before a runner's thread gets going: wait until both have entered the runner,
  // so the recorded order is the scheduler's.
  for (int i = 0; i < 5000 && gate_.Started().size() < 3; ++i)
    absl::SleepFor(absl::Milliseconds(1));
  gate_.Release(high1.id());
  gate_.Release(high2.id());
  gate_.Release(low.id());
  WaitFor(low.id(), latentd::v1::SUCCEEDED);
  std::vector<uint64_t> order = gate_.Started();
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order[0], big.id());
  EXPECT_EQ(order[3], low.id());
  EXPECT_LE(gate_.max_running.load(), 2);
}

TEST_F(JobManagerTest, NoBackfillPastAWaitingHead) {
  Open("cpu:2");
  Job one = *manager_->Submit("", Probe(1));
  WaitFor(one.id(), latentd::v1::RUNNING);
  Job two = *manager_->Submit("", Probe(2));    // head: needs both devices
  Job small = *manager_->Submit("", Probe(1));  // would fit, but must not jump the queue
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(manager_->Get(small.id())->state(), latentd::v1::PENDING);
  gate_.Release(one.id());
  WaitFor(two.id(), latentd::v1::RUNNING);
  EXPECT_EQ(manager_->Get(small.id())->state(), latentd::v1::PENDING);
  gate_.Release(two.id());
  gate_.Release(small.id());
  WaitFor(small.id(), latentd::v1::SUCCEEDED);
}

// Jobs of a type that holds no device (EXPORT) run beside the device queue: they start while a
// job waits for a device, never take one, and at most max_deviceless_jobs (2) run at once.
// The rate a dashboard shows: units per second between the reports, not since the job started.
TEST_F(JobManagerTest, TheRateIsUnitsPerSecondBetweenReports) {
  Open();
  const absl::Time submitted = absl::Now();
  Job job = *manager_->Submit("", Probe(1, 0, "finish"));
  WaitFor(job.id(), latentd::v1::RUNNING);
  // RUNNING is set before the runner starts: wait for its first report to start the interval.
  for (int i = 0; i < 5000 && manager_->Get(job.id())->progress().units_done() < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(manager_->Get(job.id())->progress().units_done(), 1);
  constexpr absl::Duration kBetween = absl::Milliseconds(200);
  absl::SleepFor(kBetween);  // between the runner's first report (1 of 2) and its last
  gate_.Release(job.id());
  const Job done = WaitFor(job.id(), latentd::v1::SUCCEEDED);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - submitted);
  EXPECT_EQ(done.progress().units_done(), 2);
  // One unit over at least kBetween and at most the whole test.
  EXPECT_GE(done.progress().rate(), 1 / seconds);
  EXPECT_LE(done.progress().rate(), 1 / absl::ToDoubleSeconds(kBetween));
}

TEST_F(JobManagerTest, JobsWithoutDevicesRunBesideTheDeviceQueueTwoAtATime) {
  Open("cpu:1");
  Job busy = *manager_->Submit("", Probe(1));
  WaitFor(busy.id(), latentd::v1::RUNNING);
  Job waiting = *manager_->Submit("", Probe(1));  // the head of the device queue
  std::vector<Job> exports;
  for (int i = 0; i < 3; ++i) exports.push_back(*manager_->Submit("", Export("result=host")));
  const Job first = WaitFor(exports[0].id(), latentd::v1::RUNNING);
  WaitFor(exports[1].id(), latentd::v1::RUNNING);
  EXPECT_EQ(first.devices_size(), 0);
  EXPECT_EQ(first.message(), "running on the host");
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(manager_->Get(exports[2].id())->state(), latentd::v1::PENDING);  // two at a time
  EXPECT_EQ(manager_->Get(waiting.id())->state(), latentd::v1::PENDING);
  gate_.Release(exports[0].id());
  WaitFor(exports[2].id(), latentd::v1::RUNNING);
  EXPECT_EQ(manager_->Get(waiting.id())->state(), latentd::v1::PENDING);  // still its device
  gate_.Release(busy.id());
  WaitFor(waiting.id(), latentd::v1::RUNNING);
  for (const Job& job : exports) gate_.Release(job.id());
  gate_.Release(waiting.id());
  for (const Job& job : exports) {
    EXPECT_EQ(WaitFor(job.id(), latentd::v1::SUCCEEDED).result().probe().devices(0).device(),
              "host");
  }
  WaitFor(waiting.id(), latentd::v1::SUCCEEDED);
}

TEST_F(JobManagerTest, AJobWithoutDevicesAsksForNone) {
  Open("cpu:2");
  JobSpec spec = Export();
  spec.set_num_devices(1);
  auto refused = manager_->Submit("", spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "spec.num_devices: EXPORT jobs hold no device; leave it 0, not 1");
}

TEST_F(JobManagerTest, CancelPendingRunningAndFinished) {
  Open("cpu:1");
  Job running = *manager_->Submit("", Probe());
  Job pending = *manager_->Submit("", Probe());
  WaitFor(running.id(), latentd::v1::RUNNING);
  Job c = *manager_->Cancel(pending.id());
  EXPECT_EQ(c.state(), latentd::v1::CANCELLED);
  Job r = *manager_->Cancel(running.id());
  EXPECT_EQ(r.state(), latentd::v1::CANCELLING);
  Job done = WaitFor(running.id(), latentd::v1::CANCELLED);
  EXPECT_EQ(done.reason(), latentd::v1::USER_CANCELLED);
  EXPECT_EQ(done.message(), "stopped");  // what the runner said, not a generic word
  EXPECT_EQ(manager_->Cancel(running.id()).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->Cancel(999).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool_->free_count(), 1);
}

TEST_F(JobManagerTest, UnfinishedJobsArePendingRunningAndCancelling) {
  Open("cpu:1");
  Job done = *manager_->Submit("", Probe());
  gate_.Release(done.id());
  WaitFor(done.id(), latentd::v1::SUCCEEDED);
  Job running = *manager_->Submit("", Probe());
  Job pending = *manager_->Submit("", Probe());
  Job cancelled = *manager_->Submit("", Probe());
  WaitFor(running.id(), latentd::v1::RUNNING);
  ASSERT_TRUE(manager_->Cancel(cancelled.id()).ok());
  auto ids = [this] {
    std::vector<uint64_t> out;
    for (const Job& job : manager_->UnfinishedJobs()) out.push_back(job.id());
    return out;
  };
  EXPECT_EQ(ids(), (std::vector<uint64_t>{running.id(), pending.id()}));
  gate_.Release(running.id());
  gate_.Release(pending.id());
  WaitFor(pending.id(), latentd::v1::SUCCEEDED);
  EXPECT_TRUE(ids().empty());
}

TEST_F(JobManagerTest, FiguresCountJobsByTypeAndStateAndShowRunningOnesLatestTelemetry) {
  Open("cpu:1");
  Job done = *manager_->Submit("", Probe());
  gate_.Release(done.id());
  WaitFor(done.id(), latentd::v1::SUCCEEDED);
  Job running = *manager_->Submit("", Probe(1, 0, "telemetry"));
  Job pending = *manager_->Submit("", Probe());
  WaitFor(running.id(), latentd::v1::RUNNING);
  // The runner reports its telemetry after RUNNING is written; wait for the sample.
  JobFigures figures;
  for (int i = 0; i < 5000; ++i) {
    figures = manager_->Figures();
    if (figures.active.size() == 1 && figures.active[0].latest_telemetry().has_train()) break;
    absl::SleepFor(absl::Milliseconds(2));
  }
  using Key = std::pair<latentd::v1::JobType, latentd::v1::JobState>;
  EXPECT_EQ(figures.counts,
            (std::map<Key, int64_t>{{{latentd::v1::PROBE, latentd::v1::SUCCEEDED}, 1},
                                    {{latentd::v1::PROBE, latentd::v1::RUNNING}, 1},
                                    {{latentd::v1::PROBE, latentd::v1::PENDING}, 1}}));
  ASSERT_EQ(figures.active.size(), 1u);
  EXPECT_EQ(figures.active[0].id(), running.id());
  EXPECT_EQ(figures.active[0].progress().units_done(), 1);
  EXPECT_EQ(figures.active[0].latest_telemetry().train().loss(), 0.5 * running.id());

  // Cancelling is still active; a finished job is counted but no longer shown.
  ASSERT_TRUE(manager_->Cancel(running.id()).ok());
  WaitFor(running.id(), latentd::v1::CANCELLED);
  WaitFor(pending.id(), latentd::v1::RUNNING);
  figures = manager_->Figures();
  EXPECT_EQ((figures.counts[{latentd::v1::PROBE, latentd::v1::CANCELLED}]), 1);
  ASSERT_EQ(figures.active.size(), 1u);
  EXPECT_EQ(figures.active[0].id(), pending.id());
  EXPECT_FALSE(figures.active[0].latest_telemetry().has_train());  // it reports none
  // A finished job keeps its last sample, for GetJob, after a restart too.
  EXPECT_EQ(manager_->Get(running.id())->latest_telemetry().train().loss(), 0.5 * running.id());
  gate_.Release(pending.id());
  WaitFor(pending.id(), latentd::v1::SUCCEEDED);
}

// An EXTRACT job after `after` that takes job `from`'s result device as its dataset name.
JobSpec BoundExtract(std::vector<uint64_t> after, uint64_t from) {
  JobSpec spec;
  spec.set_type(latentd::v1::EXTRACT);
  spec.mutable_extract();
  for (uint64_t id : after) spec.add_after_job_ids(id);
  if (from != 0) {
    latentd::v1::SpecBinding* b = spec.add_bindings();
    b->set_job_id(from);
    b->set_output("probe.devices.0.device");
    b->set_field("extract.dataset_name");
  }
  return spec;
}

TEST_F(JobManagerTest, APipelineJobWaitsWithoutHoldingOthersUpAndTakesItsInputsResult) {
  Open("cpu:2");
  Job first = *manager_->Submit("", Probe(1, 0, "result=cpu:7"));
  WaitFor(first.id(), latentd::v1::RUNNING);
  // Higher priority, but waiting: the job behind it still gets the free device.
  JobSpec waiting_spec = BoundExtract({first.id()}, first.id());
  waiting_spec.set_priority(5);
  Job waiting = *manager_->Submit("piped", waiting_spec);
  Job other = *manager_->Submit("", Probe());
  WaitFor(other.id(), latentd::v1::RUNNING);
  EXPECT_EQ(manager_->Get(waiting.id())->state(), latentd::v1::PENDING);
  gate_.Release(other.id());
  WaitFor(other.id(), latentd::v1::SUCCEEDED);
  EXPECT_EQ(manager_->Get(waiting.id())->state(), latentd::v1::PENDING);

  gate_.Release(first.id());
  WaitFor(waiting.id(), latentd::v1::RUNNING);
  for (int i = 0; i < 5000 && gate_.Started().back() != waiting.id(); ++i) {
    absl::SleepFor(absl::Milliseconds(2));  // the runner records its spec once its thread runs
  }
  EXPECT_EQ(gate_.SpecOf(waiting.id()).extract().dataset_name(), "cpu:7");
  gate_.Release(waiting.id());
  Job done = WaitFor(waiting.id(), latentd::v1::SUCCEEDED);
  // The record's spec is the one that ran (what reads it later, e.g. a dataset's SAE, needs the
  // values); the spec as submitted is kept, and a retry of the submission still finds the job.
  EXPECT_EQ(done.spec().extract().dataset_name(), "cpu:7");
  EXPECT_EQ(done.submitted_spec().extract().dataset_name(), "");
  EXPECT_EQ(done.spec().bindings_size(), 1);
  EXPECT_EQ(manager_->Submit("piped", waiting_spec)->id(), waiting.id());
  std::vector<std::string> lines;
  ASSERT_TRUE(manager_
                  ->Watch(
                      waiting.id(), 0,
                      [&](const JobEvent& e) {
                        if (e.has_log()) lines.push_back(e.log().text());
                        if (e.has_state() && e.sequence() == 1)
                          lines.push_back(e.state().message());
                        return true;
                      },
                      [] { return false; })
                  .ok());
  EXPECT_EQ(lines[0], absl::StrCat("submitted; starts once job ", first.id(), " has succeeded"));
  EXPECT_EQ(lines[1], absl::StrCat("bound extract.dataset_name = \"cpu:7\" (job ", first.id(),
                                   "'s probe.devices.0.device)"));
}

// What a waiting pipeline job will take from a job that has already succeeded is in its spec as
// UnfinishedJobs returns it: deleting a dataset or an artifact checks these specs, and must not
// remove what the job will read once its other inputs are done.
TEST_F(JobManagerTest, UnfinishedJobsShowTheValuesAWaitingJobWillTakeFromSucceededJobs) {
  Open("cpu:1");
  Job first = *manager_->Submit("", Probe(1, 0, "result=cpu:7"));
  Job second = *manager_->Submit("", Probe(1, 0, "result=cpu:8"));
  JobSpec spec = BoundExtract({first.id(), second.id()}, first.id());
  latentd::v1::SpecBinding* b = spec.add_bindings();
  b->set_job_id(second.id());
  b->set_output("probe.devices.0.device");
  b->set_field("extract.hook_name");
  Job waiting = *manager_->Submit("", spec);
  auto waiting_as_listed = [&] {
    for (const Job& job : manager_->UnfinishedJobs()) {
      if (job.id() == waiting.id()) return job;
    }
    ADD_FAILURE() << "job " << waiting.id() << " is not listed";
    return Job();
  };
  EXPECT_EQ(waiting_as_listed().spec().extract().dataset_name(), "");

  gate_.Release(first.id());
  WaitFor(first.id(), latentd::v1::SUCCEEDED);
  WaitFor(second.id(), latentd::v1::RUNNING);
  Job listed = waiting_as_listed();
  EXPECT_EQ(listed.spec().extract().dataset_name(), "cpu:7");
  EXPECT_EQ(listed.spec().extract().hook_name(), "");  // job 2 has no result yet
  EXPECT_EQ(listed.spec().bindings_size(), 2);
  EXPECT_FALSE(listed.has_submitted_spec());
  // Only a preview: the record binds once, when the job is ready.
  EXPECT_EQ(manager_->Get(waiting.id())->spec().extract().dataset_name(), "");

  gate_.Release(second.id());
  WaitFor(waiting.id(), latentd::v1::RUNNING);
  listed = waiting_as_listed();
  EXPECT_EQ(listed.spec().extract().hook_name(), "cpu:8");
  EXPECT_EQ(listed.submitted_spec().extract().hook_name(), "");
  gate_.Release(waiting.id());
  WaitFor(waiting.id(), latentd::v1::SUCCEEDED);
}

TEST_F(JobManagerTest, AFailedOrCancelledJobFailsEveryJobWaitingForItDownTheChain) {
  Open("cpu:1");
  Job head = *manager_->Submit("", Probe(1, 0, "fail"));
  Job second = *manager_->Submit("", BoundExtract({head.id()}, 0));
  JobSpec third_spec = BoundExtract({second.id()}, 0);
  Job third = *manager_->Submit("", third_spec);
  gate_.Release(head.id());
  WaitFor(head.id(), latentd::v1::FAILED);
  Job failed = WaitFor(second.id(), latentd::v1::FAILED);
  EXPECT_EQ(failed.reason(), latentd::v1::DEPENDENCY_FAILED);
  EXPECT_EQ(failed.message(), absl::StrCat("job ", head.id(),
                                           ", which this job waits for, is FAILED: spec.label: "
                                           "bad on purpose"));
  EXPECT_EQ(WaitFor(third.id(), latentd::v1::FAILED).reason(), latentd::v1::DEPENDENCY_FAILED);
  EXPECT_EQ(manager_->Get(second.id())->attempts(), 0);  // never started

  // Cancelled before it ran: its waiter fails as well, and never ran.
  Job blocker = *manager_->Submit("", Probe());
  Job queued = *manager_->Submit("", Probe());
  Job after_queued = *manager_->Submit("", BoundExtract({queued.id()}, 0));
  ASSERT_TRUE(manager_->Cancel(queued.id()).ok());
  EXPECT_EQ(WaitFor(after_queued.id(), latentd::v1::FAILED).reason(),
            latentd::v1::DEPENDENCY_FAILED);
  gate_.Release(blocker.id());
  WaitFor(blocker.id(), latentd::v1::SUCCEEDED);
  for (uint64_t id : gate_.Started()) {
    EXPECT_NE(id, second.id());
    EXPECT_NE(id, after_queued.id());
  }
}

TEST_F(JobManagerTest, PipelineSubmitChecks) {
  Open("cpu:1");
  EXPECT_EQ(manager_->Submit("", BoundExtract({42}, 0)).status().message(),
            "spec.after_job_ids[0]: job 42 not found");
  Job bad = *manager_->Submit("", Probe(1, 0, "fail"));
  gate_.Release(bad.id());
  WaitFor(bad.id(), latentd::v1::FAILED);
  auto refused = manager_->Submit("", BoundExtract({bad.id()}, 0));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            absl::StrCat("spec.after_job_ids[0]: job ", bad.id(),
                         " is FAILED (spec.label: bad on purpose): a job waiting for it would "
                         "never start"));

  // Bound to a job that already succeeded: the values exist, so the type's checks run now.
  Job good = *manager_->Submit("", Probe(1, 0, "result=invalid"));
  gate_.Release(good.id());
  WaitFor(good.id(), latentd::v1::SUCCEEDED);
  auto invalid = manager_->Submit("", BoundExtract({good.id()}, good.id()));
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(invalid.status().message(), "extract.dataset_name: \"invalid\" is refused");
  auto plan = manager_->Plan(BoundExtract({good.id()}, good.id()));
  EXPECT_EQ(plan.status().message(), "extract.dataset_name: \"invalid\" is refused");
}

TEST_F(JobManagerTest, ChecksOnBoundValuesThatDoNotExistYetRunAtStart) {
  Open("cpu:1");
  Job producer = *manager_->Submit("", Probe(1, 0, "result=invalid"));
  auto plan = manager_->Plan(BoundExtract({producer.id()}, producer.id()));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(std::vector<std::string>(plan->lines().begin(), plan->lines().end()),
            (std::vector<std::string>{
                absl::StrCat("starts once job ", producer.id(), " has succeeded"),
                absl::StrCat("extract.dataset_name from job ", producer.id(),
                             "'s probe.devices.0.device"),
                "the EXTRACT checks and plan wait for those values: they run when the job "
                "starts"}));
  Job consumer = *manager_->Submit("", BoundExtract({producer.id()}, producer.id()));
  gate_.Release(producer.id());
  WaitFor(producer.id(), latentd::v1::SUCCEEDED);
  Job failed = WaitFor(consumer.id(), latentd::v1::FAILED);
  EXPECT_EQ(failed.reason(), latentd::v1::INVALID_INPUT);
  EXPECT_EQ(failed.message(), "extract.dataset_name: \"invalid\" is refused");
  for (uint64_t id : gate_.Started()) EXPECT_NE(id, consumer.id());
}

TEST_F(JobManagerTest, AJobThatAnUnfinishedJobWaitsForCannotBeDeleted) {
  Open("cpu:1");
  Job blocker = *manager_->Submit("", Probe());
  WaitFor(blocker.id(), latentd::v1::RUNNING);
  Job done = *manager_->Submit("", Probe());
  Job waiter = *manager_->Submit("", BoundExtract({done.id()}, 0));
  gate_.Release(blocker.id());
  WaitFor(done.id(), latentd::v1::RUNNING);
  gate_.Release(done.id());
  WaitFor(done.id(), latentd::v1::SUCCEEDED);
  WaitFor(waiter.id(), latentd::v1::RUNNING);
  absl::Status refused = manager_->Delete(done.id());
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), absl::StrCat("job ", waiter.id(), " waits for job ", done.id(),
                                            " (after_job_ids) and has not finished"));
  gate_.Release(waiter.id());
  WaitFor(waiter.id(), latentd::v1::SUCCEEDED);
  EXPECT_TRUE(manager_->Delete(done.id()).ok());
}

TEST_F(JobManagerTest, DeleteForgetsAFinishedJobForGood) {
  Open("cpu:1");
  Job done = *manager_->Submit("key", Probe());
  Job running = *manager_->Submit("", Probe());
  EXPECT_EQ(manager_->Delete(done.id()).code(), absl::StatusCode::kFailedPrecondition);
  gate_.Release(done.id());
  WaitFor(done.id(), latentd::v1::SUCCEEDED);
  WaitFor(running.id(), latentd::v1::RUNNING);
  EXPECT_EQ(manager_->Delete(running.id()).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(manager_->Delete(done.id()).ok());
  EXPECT_EQ(forgotten_, (std::vector<uint64_t>{done.id()}));
  EXPECT_EQ(manager_->Get(done.id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->Delete(done.id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_
                ->Watch(
                    done.id(), 0, [](const JobEvent&) { return true; }, [] { return false; })
                .code(),
            absl::StatusCode::kNotFound);
  auto list = manager_->List({}, 0, "");
  ASSERT_EQ(list->jobs.size(), 1u);
  EXPECT_EQ(list->jobs[0].id(), running.id());
  // The request id is free again: the same key makes a new job, with a new id.
  Job again = *manager_->Submit("key", Probe());
  EXPECT_GT(again.id(), running.id());
  gate_.Release(running.id());
  gate_.Release(again.id());
  WaitFor(again.id(), latentd::v1::SUCCEEDED);
  Close();
  Open("cpu:1");  // and it stays gone
  EXPECT_EQ(manager_->Get(done.id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(manager_->Get(running.id()).ok());
}

// A watcher waiting on a job sees it end, and then its deletion, without touching freed memory
// (the job is looked up again after every wait).
TEST_F(JobManagerTest, WatchersOfADeletedJobEndCleanly) {
  Open("cpu:1");
  Job job = *manager_->Submit("", Probe());
  WaitFor(job.id(), latentd::v1::RUNNING);
  std::vector<std::thread> watchers;
  std::atomic<int> ended{0};
  for (int i = 0; i < 4; ++i) {
    watchers.emplace_back([&] {
      absl::Status s = manager_->Watch(
          job.id(), 0, [](const JobEvent&) { return true; }, [] { return false; });
      EXPECT_TRUE(s.ok() || absl::IsNotFound(s)) << s;
      ++ended;
    });
  }
  gate_.Release(job.id());
  WaitFor(job.id(), latentd::v1::SUCCEEDED);
  while (!manager_->Delete(job.id()).ok()) absl::SleepFor(absl::Milliseconds(1));
  for (auto& w : watchers) w.join();
  EXPECT_EQ(ended.load(), 4);
}

TEST_F(JobManagerTest, AJobThatAnUnfinishedJobContinuesCannotBeDeleted) {
  Open("cpu:1");
  Job first = *manager_->Submit("", Probe());
  WaitFor(first.id(), latentd::v1::RUNNING);
  ASSERT_TRUE(manager_->Cancel(first.id()).ok());
  WaitFor(first.id(), latentd::v1::CANCELLED);
  JobSpec next = Probe();
  next.set_type(latentd::v1::EXTRACT);
  next.mutable_extract()->set_resume_from_job_id(first.id());  // what `continues` reads
  Job second = *manager_->Submit("", next);
  absl::Status s = manager_->Delete(first.id());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(absl::StrCat("job ", second.id())), std::string::npos) << s;
  WaitFor(second.id(), latentd::v1::RUNNING);
  gate_.Release(second.id());
  WaitFor(second.id(), latentd::v1::SUCCEEDED);
  EXPECT_TRUE(manager_->Delete(first.id()).ok());
}

TEST_F(JobManagerTest, RunnerErrorsBecomeFailedWithReason) {
  Open();
  Job job = *manager_->Submit("", Probe(1, 0, "fail"));
  WaitFor(job.id(), latentd::v1::RUNNING);
  gate_.Release(job.id());
  Job failed = WaitFor(job.id(), latentd::v1::FAILED);
  EXPECT_EQ(failed.reason(), latentd::v1::INVALID_INPUT);
  EXPECT_EQ(failed.message(), "spec.label: bad on purpose");
}

TEST_F(JobManagerTest, BadSpecsAreRejectedNamingTheField) {
  Open("cpu:2");
  JobSpec no_type;
  EXPECT_EQ(manager_->Submit("", no_type).status().code(), absl::StatusCode::kInvalidArgument);
  auto too_many = manager_->Submit("", Probe(3));
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("spec.num_devices"), absl::string_view::npos);
  JobSpec train;
  train.set_type(latentd::v1::TRAIN);
  EXPECT_EQ(manager_->Submit("", train).status().code(), absl::StatusCode::kInvalidArgument);
  JobSpec mismatched = Probe();
  mismatched.mutable_extract();
  EXPECT_EQ(manager_->Submit("", mismatched).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->Get(12345).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, ListIsNewestFirstFilteredAndPaged) {
  Open("cpu:1");
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(manager_->Submit("", Probe(1, 0, i % 2 == 1 ? "sweep" : ""))->id());
  }
  WaitFor(ids[0], latentd::v1::RUNNING);
  auto page1 = *manager_->List({latentd::v1::PENDING}, 3, "");
  ASSERT_EQ(page1.jobs.size(), 3u);
  EXPECT_EQ(page1.jobs[0].id(), ids[4]);
  EXPECT_EQ(page1.jobs[2].id(), ids[2]);
  ASSERT_FALSE(page1.next_page_token.empty());
  auto page2 = *manager_->List({latentd::v1::PENDING}, 3, page1.next_page_token);
  ASSERT_EQ(page2.jobs.size(), 1u);
  EXPECT_EQ(page2.jobs[0].id(), ids[1]);
  EXPECT_TRUE(page2.next_page_token.empty());
  EXPECT_TRUE(manager_->List({latentd::v1::JOB_STATE_UNSPECIFIED, latentd::v1::EXTRACT}, 0, "")
                  ->jobs.empty());
  JobFilter sweep;
  sweep.label = "sweep";
  auto labelled = *manager_->List(sweep, 0, "");
  ASSERT_EQ(labelled.jobs.size(), 2u);
  EXPECT_EQ(labelled.jobs[0].id(), ids[3]);
  EXPECT_EQ(labelled.jobs[1].id(), ids[1]);
  EXPECT_EQ(manager_->List({}, 0, "garbage").status().code(), absl::StatusCode::kInvalidArgument);
  for (uint64_t id : ids) gate_.Release(id);
}

TEST_F(JobManagerTest, ShutdownLeavesRunningJobResumableAndRestartRunsIt) {
  Open("cpu:1");
  Job job = *manager_->Submit("keep", Probe());
  WaitFor(job.id(), latentd::v1::RUNNING);
  Close();  // shutdown: the runner sees cancel_requested and stops at a safe point

  Open("cpu:1");  // the scheduler may start the job again at once: read its story from events
  WaitFor(job.id(), latentd::v1::RUNNING);
  EXPECT_EQ(manager_->Get(job.id())->attempts(), 2);
  gate_.Release(job.id());
  WaitFor(job.id(), latentd::v1::SUCCEEDED);
  std::vector<latentd::v1::StateChange> states;
  ASSERT_TRUE(manager_
                  ->Watch(
                      job.id(), 0,
                      [&](const JobEvent& e) {
                        if (e.has_state()) states.push_back(e.state());
                        return true;
                      },
                      [] { return false; })
                  .ok());
  ASSERT_EQ(states.size(), 5u);  // PENDING, RUNNING, PENDING (INTERRUPTED), RUNNING, SUCCEEDED
  EXPECT_EQ(states[2].state(), latentd::v1::PENDING);
  EXPECT_EQ(states[2].reason(), latentd::v1::INTERRUPTED);
  EXPECT_EQ(states[4].state(), latentd::v1::SUCCEEDED);
  // The request id survives the restart too.
  EXPECT_EQ(manager_->Submit("keep", Probe())->id(), job.id());
  // New jobs get fresh ids after a restart.
  Job next = *manager_->Submit("", Probe());
  EXPECT_GT(next.id(), job.id());
  gate_.Release(next.id());
}

// A damaged job record does not keep the daemon from starting: it is left out with a warning,
// every other job is there, and its id is never handed out again.
TEST_F(JobManagerTest, ADamagedJobRecordIsLeftOutAndTheRestStarts) {
  Open("cpu:1");
  Job first = *manager_->Submit("", Probe());
  gate_.Release(first.id());
  WaitFor(first.id(), latentd::v1::SUCCEEDED);
  Job second = *manager_->Submit("", Probe());
  gate_.Release(second.id());
  WaitFor(second.id(), latentd::v1::SUCCEEDED);
  Close();
  {
    auto db = *storage::Db::Open(dir_);
    std::string key = "J";
    AppendBigEndian64(second.id(), &key);
    ASSERT_TRUE(db->Put(storage::Family::kJobs, key, "\xff\xff\xff", true).ok());
  }
  Open("cpu:1");
  EXPECT_EQ(manager_->Get(first.id())->state(), latentd::v1::SUCCEEDED);
  EXPECT_EQ(manager_->Get(second.id()).status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(manager_->startup_warnings().size(), 1u);
  EXPECT_EQ(manager_->startup_warnings()[0],
            absl::StrCat("job record ", second.id(),
                         ": does not parse; left out (its id stays taken, its datasets stay)"));
  Job next = *manager_->Submit("", Probe());
  EXPECT_GT(next.id(), second.id());
  gate_.Release(next.id());
  WaitFor(next.id(), latentd::v1::SUCCEEDED);
}

TEST_F(JobManagerTest, WatchEndsWhenTheClientGoes) {
  Open();
  Job job = *manager_->Submit("", Probe());
  WaitFor(job.id(), latentd::v1::RUNNING);
  std::atomic<bool> gone{false};
  absl::Notification finished;
  absl::Status watch_status;
  std::thread watcher([&] {
    watch_status = manager_->Watch(
        job.id(), 0, [](const JobEvent&) { return true; }, [&] { return gone.load(); });
    finished.Notify();
  });
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_FALSE(finished.HasBeenNotified());
  gone = true;
  EXPECT_TRUE(finished.WaitForNotificationWithTimeout(absl::Seconds(5)));
  watcher.join();
  EXPECT_EQ(watch_status.code(), absl::StatusCode::kCancelled);
  gate_.Release(job.id());
}

}  // namespace
}  // namespace latentd::server
