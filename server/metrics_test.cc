#include "server/metrics.h"

#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/read_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace latentd::server {
namespace {

using latentd::v1::JobState;
using latentd::v1::JobType;
using ::testing::HasSubstr;

// The lines of `text` that are samples of `name` (its HELP and TYPE lines excluded).
std::vector<std::string> SamplesOf(const std::string& text, const std::string& name) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, name + "{") || absl::StartsWith(line, name + " ")) {
      out.emplace_back(line);
    }
  }
  return out;
}

latentd::v1::Job RunningJob(uint64_t id, JobType type, const std::string& label) {
  latentd::v1::Job job;
  job.set_id(id);
  job.set_type(type);
  job.set_state(latentd::v1::RUNNING);
  job.mutable_spec()->set_label(label);
  job.add_devices("cpu:0");
  job.add_devices("cpu:1");
  job.set_attempts(2);
  job.mutable_started()->set_seconds(1000);
  return job;
}

DaemonFigures Figures() {
  DaemonFigures figures;
  figures.start_time = absl::FromUnixSeconds(900);
  figures.now = absl::FromUnixSeconds(1030);
  figures.process_rss_bytes = 123456789;
  figures.store_bytes_on_disk = 5 << 20;
  figures.free_disk_bytes = -1;  // unknown: left out
  figures.jobs.counts[{latentd::v1::EXTRACT, latentd::v1::RUNNING}] = 1;
  figures.jobs.counts[{latentd::v1::TRAIN, latentd::v1::RUNNING}] = 1;
  figures.jobs.counts[{latentd::v1::PROBE, latentd::v1::SUCCEEDED}] = 7;

  latentd::v1::Job extract = RunningJob(3, latentd::v1::EXTRACT, "layer \"8\"\nrun");
  extract.mutable_progress()->set_units_done(4096);
  extract.mutable_progress()->set_units_total(16384);
  extract.mutable_progress()->set_unit("rows");
  extract.mutable_progress()->set_rate(2048.5);
  extract.mutable_latest_telemetry()->mutable_extract()->set_tokens_per_second(2048.5);
  extract.mutable_latest_telemetry()->mutable_extract()->set_bytes_committed(344064);
  extract.mutable_latest_telemetry()->mutable_extract()->set_bytes_per_token(84.0);
  figures.jobs.active.push_back(extract);

  latentd::v1::Job train = RunningJob(4, latentd::v1::TRAIN, "");
  latentd::v1::TrainTelemetry* t = train.mutable_latest_telemetry()->mutable_train();
  t->set_step(120);
  t->set_loss(0.03125);
  t->set_fvu(std::numeric_limits<double>::quiet_NaN());
  (*t->mutable_optimizer_state_bytes())["history_values"] = 4000;
  (*t->mutable_optimizer_state_bytes())["error_buffer"] = 800;
  t->set_dense_mfac_history_bytes(400000);
  t->add_block_fvu(0.25);
  t->add_block_fvu(0.5);
  figures.jobs.active.push_back(train);

  engine::DeviceStatus cpu0;
  cpu0.device.name = "cpu:0";
  cpu0.device.memory_total_bytes = 1 << 30;
  cpu0.memory_used_bytes = 1 << 20;
  cpu0.held_by_job = 3;
  engine::DeviceStatus gpu;
  gpu.device.name = "cuda:0";
  gpu.device.kind = engine::DeviceKind::kCuda;
  gpu.device.memory_total_bytes = int64_t{80} << 30;
  figures.devices = {cpu0, gpu};
  return figures;
}

TEST(RenderPrometheusMetrics, CountsEveryTypeAndStateZerosIncluded) {
  const std::string text = RenderPrometheusMetrics(Figures());
  const std::vector<std::string> jobs = SamplesOf(text, "latentd_jobs");
  EXPECT_EQ(jobs.size(), 4u * 6u);  // EXTRACT, TRAIN, PROBE, EXPORT x six states
  EXPECT_THAT(text, HasSubstr("\nlatentd_jobs{type=\"export\",state=\"pending\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("\nlatentd_jobs{type=\"probe\",state=\"succeeded\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("\nlatentd_jobs{type=\"extract\",state=\"running\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("\nlatentd_jobs{type=\"train\",state=\"failed\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("# HELP latentd_jobs Jobs the daemon holds"));
  EXPECT_THAT(text, HasSubstr("# TYPE latentd_jobs gauge\n"));
}

TEST(RenderPrometheusMetrics, ShowsRunningJobsProgressAndTheirLatestTelemetry) {
  const std::string text = RenderPrometheusMetrics(Figures());
  // The label is escaped; the devices are joined.
  EXPECT_THAT(text, HasSubstr("latentd_job_info{job=\"3\",type=\"extract\",label=\"layer "
                              "\\\"8\\\"\\nrun\",state=\"running\",devices=\"cpu:0,cpu:1\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("latentd_job_units_done{job=\"3\",type=\"extract\",unit=\"rows\"} "
                              "4096\n"));
  EXPECT_THAT(text, HasSubstr("latentd_job_units_per_second{job=\"3\",type=\"extract\",unit="
                              "\"rows\"} 2048.5\n"));
  EXPECT_THAT(text, HasSubstr("latentd_job_progress_ratio{job=\"3\",type=\"extract\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("latentd_job_running_seconds{job=\"3\",type=\"extract\"} 30\n"));
  EXPECT_THAT(text, HasSubstr("latentd_job_attempts{job=\"4\",type=\"train\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("latentd_extract_bytes_committed{job=\"3\",type=\"extract\"} "
                              "344064\n"));
  EXPECT_THAT(text, HasSubstr("latentd_extract_bytes_per_token{job=\"3\",type=\"extract\"} 84\n"));
  // A job without a progress total shows no ratio; one without a fit shows no fit.
  EXPECT_TRUE(SamplesOf(text, "latentd_extract_explained_variance").empty());
  EXPECT_EQ(SamplesOf(text, "latentd_job_progress_ratio").size(), 1u);

  EXPECT_THAT(text, HasSubstr("latentd_train_step{job=\"4\",type=\"train\"} 120\n"));
  EXPECT_THAT(text, HasSubstr("latentd_train_loss{job=\"4\",type=\"train\"} 0.03125\n"));
  EXPECT_THAT(text, HasSubstr("latentd_train_fvu{job=\"4\",type=\"train\"} NaN\n"));
  // Components sorted by name; the dense history beside them.
  EXPECT_EQ(SamplesOf(text, "latentd_train_optimizer_state_bytes"),
            (std::vector<std::string>{
                "latentd_train_optimizer_state_bytes{job=\"4\",type=\"train\",component=\"error_"
                "buffer\"} 800",
                "latentd_train_optimizer_state_bytes{job=\"4\",type=\"train\",component=\"history_"
                "values\"} 4000"}));
  EXPECT_THAT(text, HasSubstr("latentd_train_dense_mfac_history_bytes{job=\"4\",type=\"train\"} "
                              "400000\n"));
  EXPECT_THAT(text, HasSubstr("latentd_train_block_fvu{job=\"4\",type=\"train\",block=\"1\"} "
                              "0.5\n"));
  // CUDA allocator figures a CPU job does not have are left out, not shown as 0.
  EXPECT_TRUE(SamplesOf(text, "latentd_train_device_peak_bytes").empty());
}

TEST(RenderPrometheusMetrics, ShowsDevicesStoreAndProcess) {
  const std::string text = RenderPrometheusMetrics(Figures());
  EXPECT_THAT(text, HasSubstr("\nlatentd_device_memory_total_bytes{device=\"cuda:0\",kind="
                              "\"cuda\"} 85899345920\n"));
  EXPECT_THAT(text, HasSubstr("\nlatentd_device_busy{device=\"cpu:0\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("\nlatentd_device_busy{device=\"cuda:0\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("latentd_start_time_seconds 900\n"));
  EXPECT_THAT(text, HasSubstr("\nlatentd_process_resident_memory_bytes 123456789\n"));
  EXPECT_THAT(text, HasSubstr("\nlatentd_store_bytes_on_disk 5242880\n"));
  EXPECT_FALSE(absl::StrContains(text, "latentd_store_free_disk_bytes"));  // unknown
}

// The dashboard in deploy/grafana queries only what the daemon exports: every latentd_ name in
// its queries is a family of a scrape with an EXTRACT and a TRAIN job running.
TEST(GrafanaDashboard, QueriesOnlyMetricsTheDaemonExports) {
  auto text = ReadFileToString(std::string(std::getenv("TEST_SRCDIR")) +
                               "/latentd/deploy/grafana/latentd.json");
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json dashboard = nlohmann::json::parse(*text);  // throws on bad JSON: a failure
  DaemonFigures everything = Figures();
  everything.free_disk_bytes = int64_t{1} << 40;  // known, unlike in Figures()
  const std::string scrape = RenderPrometheusMetrics(everything);
  int queries = 0;
  std::set<std::string> names;
  for (const nlohmann::json& panel : dashboard.at("panels")) {
    for (const nlohmann::json& target : panel.at("targets")) {
      const std::string expr = target.at("expr").get<std::string>();
      ++queries;
      static const std::regex kName("latentd_[a-z0-9_]+");
      for (std::sregex_iterator it(expr.begin(), expr.end(), kName), end; it != end; ++it) {
        names.insert(it->str());
      }
    }
  }
  EXPECT_GE(queries, 10);
  EXPECT_GE(names.size(), 15u);
  for (const std::string& name : names) {
    EXPECT_TRUE(absl::StrContains(scrape, "# TYPE " + name + " "))
        << "the dashboard queries " << name << ", which /metrics does not export";
  }
}

TEST(PrometheusText, GroupsEachFamilysSamplesUnderOneHeaderAndLeavesEmptyOnesOut) {
  PrometheusText out;
  out.Declare("a", "gauge", "first \\ family\nhelp");
  out.Declare("b", "counter", "never sampled");
  out.Declare("c", "gauge", "third");
  out.Add("a", {{"k", "1"}}, 1);
  out.Add("c", {}, -std::numeric_limits<double>::infinity());
  out.Add("a", {{"k", "2"}}, 1e300);
  out.Declare("a", "gauge", "declared again: ignored");
  out.Add("undeclared", {}, 1);
  EXPECT_EQ(out.Text(),
            "# HELP a first \\\\ family\\nhelp\n# TYPE a gauge\n"
            "a{k=\"1\"} 1\na{k=\"2\"} 1e+300\n"
            "# HELP c third\n# TYPE c gauge\nc -Inf\n");
}

}  // namespace
}  // namespace latentd::server
