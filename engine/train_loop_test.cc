#include "engine/train_loop.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <cmath>
#include <functional>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/train_models.h"

namespace latentd::engine {
namespace {

constexpr int64_t kWidth = 8;

// Rows from a sparse dictionary of 16 directions plus an offset, so b_dec and the SAE matter.
std::vector<float> DictionaryRows(int64_t n, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  torch::Tensor dictionary = at::randn({16, kWidth}, gen, torch::kFloat32);
  torch::Tensor codes = at::rand({n, 16}, gen, torch::kFloat32);
  codes = codes * (at::rand({n, 16}, gen, torch::kFloat32) < 0.2);
  torch::Tensor rows = (codes.matmul(dictionary) + 0.5).contiguous();
  return std::vector<float>(rows.data_ptr<float>(), rows.data_ptr<float>() + rows.numel());
}

SaeModelOptions Sae() {
  SaeModelOptions options;
  options.architecture = latentd::v1::TOPK;
  options.d_in = kWidth;
  options.d_sae = 32;
  options.k = 4;
  options.seed = 5;
  return options;
}

OptimizerConfig Adam() {
  latentd::v1::OptimizerSpec spec;
  spec.set_name("adam");
  spec.set_lr(1e-2);
  return *OptimizerConfigFromProto(spec);
}

TrainLoopOptions Loop(int64_t steps) {
  TrainLoopOptions options;
  options.batch_size = 32;
  options.total_steps = steps;
  options.lr.base_lr = 1e-2;
  options.lr.total_steps = steps;
  options.lr.kind = latentd::v1::COSINE;
  options.checkpoint_every = 10;
  options.telemetry_every = 5;
  options.init_rows = 256;
  return options;
}

// One fresh run (model, optimizer, stream) against `checkpoints`.
struct Trainer {
  explicit Trainer(DenseRowSource* source, OptimizerConfig config = Adam(),
                   SaeModelOptions sae = Sae())
      : model(sae, c10::kCPU),
        optimizer(*MakeOptimizer(config, model.parameters())),
        stream(source, {.seed = 9, .window_chunks = 2}) {}
  absl::StatusOr<TrainLoopResult> Go(const TrainLoopOptions& options, CheckpointStore* store,
                                     GradientSync* sync = nullptr) {
    return RunTrainLoop(options, &model, optimizer.get(), &stream, kWidth, sync, store, nullptr,
                        nullptr);
  }
  SaeTrainable model;
  std::unique_ptr<TrainOptimizer> optimizer;
  ShuffledRowStream stream;
};

// Runs `run(rank, sync)` for ranks 0 and 1 of one Gloo group, each on its own thread; returns
// rank 0's error, else rank 1's.
absl::Status OnTwoRanks(const std::function<absl::Status(int, GradientSync*)>& run) {
  auto store = NewInProcessStore();
  absl::Status status[2];
  auto rank_thread = [&](int rank) {
    // A rank that waits on a collective its peer left fails within the test's time.
    auto sync = JoinProcessGroup(store, {.rank = rank, .world_size = 2, .timeout_seconds = 30});
    status[rank] = sync.ok() ? run(rank, sync->get()) : sync.status();
  };
  std::thread t0(rank_thread, 0);
  std::thread t1(rank_thread, 1);
  t0.join();
  t1.join();
  return status[0].ok() ? status[1] : status[0];
}

// Runs `rank0` and `rank1` for `steps` steps as the two ranks of one Gloo group (no checkpoints).
absl::Status TrainTwoRanks(Trainer* rank0, Trainer* rank1, int64_t steps,
                           const TrainLoopOptions& options = Loop(0)) {
  TrainLoopOptions loop = options;
  loop.total_steps = steps;
  loop.lr.total_steps = steps;
  return OnTwoRanks([&](int rank, GradientSync* sync) {
    return (rank == 0 ? rank0 : rank1)->Go(loop, nullptr, sync).status();
  });
}

TEST(TrainLoopTest, LossFallsAndTelemetryMatchesTheOptimizersAccounting) {
  InMemoryDenseRowSource source(DictionaryRows(1024, 1), kWidth, 64);
  Trainer run(&source);
  auto first = run.Go(Loop(1), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  Trainer trained(&source);
  auto result = trained.Go(Loop(200), nullptr);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_LT(result->final_loss, 0.5 * first->final_loss);
  EXPECT_LT(result->final_fvu, 0.5);
  EXPECT_LE(result->final_l0, 4.0);
  const auto& t = result->last_telemetry;
  EXPECT_EQ(t.step(), 200);
  const OptimizerMemory memory = trained.optimizer->Memory();
  EXPECT_EQ(t.optimizer_state_total_bytes(), memory.total());
  for (const auto& [name, bytes] : memory.components) {
    EXPECT_EQ(t.optimizer_state_bytes().at(name), bytes) << name;
  }
  // Adam: two fp32 moments per parameter; parameters and gradients fp32.
  const int64_t d = kWidth * 32 * 2 + 32 + kWidth;
  EXPECT_EQ(memory.total(), 8 * d);
  EXPECT_EQ(t.parameter_bytes(), 4 * d);
  EXPECT_EQ(t.gradient_bytes(), 4 * d);
  EXPECT_EQ(t.dense_mfac_history_bytes(), 4 * 64 * d);
  EXPECT_GT(t.process_rss_bytes(), 0);
  EXPECT_GE(t.tracked_tensor_bytes(), t.parameter_bytes() + t.gradient_bytes() + memory.total());
  EXPECT_EQ(result->peak_optimizer_state_bytes, memory.total());
}

OptimizerConfig Smfac() {
  latentd::v1::OptimizerSpec spec;
  spec.set_name("smfac");
  spec.set_lr(1e-2);
  spec.set_window(8);
  spec.set_density(0.05);
  spec.set_damp(1e-2);
  spec.set_momentum(0.5);
  return *OptimizerConfigFromProto(spec);
}

SaeModelOptions BatchTopKSae() {
  SaeModelOptions options = Sae();
  options.architecture = latentd::v1::BATCHTOPK;
  return options;
}

// Adam (moments, step count) and S-MFAC (ring buffer, error buffer, Gram matrix, momentum) alike,
// and a BatchTopK SAE's threshold (state outside the parameters, checkpointed with them).
TEST(TrainLoopTest, ResumeAfterACrashGivesTheWeightsOfAnUninterruptedRun) {
  const std::pair<OptimizerConfig, SaeModelOptions> runs[] = {
      {Adam(), Sae()}, {Smfac(), Sae()}, {Adam(), BatchTopKSae()}};
  for (const auto& [config, sae] : runs) {
    SCOPED_TRACE(config.name + " architecture " + std::to_string(sae.architecture));
    InMemoryDenseRowSource source(DictionaryRows(512, 2), kWidth, 32);
    InMemoryCheckpointStore uninterrupted_store;
    Trainer uninterrupted(&source, config, sae);
    auto straight = uninterrupted.Go(Loop(45), &uninterrupted_store);
    ASSERT_TRUE(straight.ok()) << straight.status();
    if (sae.architecture == latentd::v1::BATCHTOPK) {
      EXPECT_NEAR(straight->final_l0, 4.0, 1e-6);  // k a row on average, by construction
    }

    InMemoryCheckpointStore store;
    {
      Trainer crashed(&source, config, sae);
      TrainLoopOptions options = Loop(45);
      options.crash_after_step = 27;  // the checkpoint at step 20 is the newest
      auto status = crashed.Go(options, &store).status();
      EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
      EXPECT_EQ((*store.LoadLatest())->step, 20);
    }
    Trainer resumed(&source, config, sae);
    auto result = resumed.Go(Loop(45), &store);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->resumed_from_step, 20);
    auto a = uninterrupted.model.parameters();
    auto b = resumed.model.parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
    }
    auto buffers_a = uninterrupted.model.buffers();
    auto buffers_b = resumed.model.buffers();
    ASSERT_EQ(buffers_a.size(), sae.architecture == latentd::v1::BATCHTOPK ? 1u : 0u);
    ASSERT_EQ(buffers_a.size(), buffers_b.size());
    for (size_t i = 0; i < buffers_a.size(); ++i) {
      EXPECT_GT(buffers_a[i].item<float>(), 0.0f);  // calibrated after the last step
      EXPECT_TRUE(torch::equal(buffers_a[i], buffers_b[i])) << "buffer " << i;
    }
    EXPECT_EQ(uninterrupted.optimizer->Memory().total(), resumed.optimizer->Memory().total());
  }
}

// Two ranks each keep the k x rows largest of their own slice; both calibrate the threshold on
// the same rows with the same weights, so they agree on it as on the weights.
TEST(TrainLoopTest, TwoGlooRanksAgreeOnTheBatchTopKThreshold) {
  InMemoryDenseRowSource source(DictionaryRows(1024, 6), kWidth, 64);
  Trainer rank0(&source, Adam(), BatchTopKSae()), rank1(&source, Adam(), BatchTopKSae());
  ASSERT_TRUE(TrainTwoRanks(&rank0, &rank1, 20).ok());
  const float threshold = rank0.model.sae()->batch_threshold.item<float>();
  EXPECT_GT(threshold, 0.0f);
  EXPECT_EQ(rank1.model.sae()->batch_threshold.item<float>(), threshold);
  auto a = rank0.model.parameters();
  auto b = rank1.model.parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

// TopK's AuxK runs on the latents the loop's counters call dead (here after 3 steps without
// firing): it shows in telemetry whenever latents are dead, and since the counters are part of
// the checkpoint a resumed run still ends with the uninterrupted run's weights.
TEST(TrainLoopTest, AuxKFollowsTheDeadCountersAndResumesExactly) {
  SaeModelOptions sae = Sae();
  sae.d_sae = 96;  // more latents than the data needs: some stop firing
  sae.aux_k_coefficient = 1.0 / 32;
  TrainLoopOptions options = Loop(45);
  options.dead_window_steps = 3;
  options.telemetry_every = 1;
  InMemoryDenseRowSource source(DictionaryRows(512, 2), kWidth, 32);
  InMemoryCheckpointStore uninterrupted_store;
  Trainer uninterrupted(&source, Adam(), sae);
  auto full = uninterrupted.Go(options, &uninterrupted_store);
  ASSERT_TRUE(full.ok()) << full.status();
  const auto& t = full->last_telemetry;
  ASSERT_GT(t.dead_latents(), 0);
  EXPECT_GT(t.aux_k_loss(), 0);

  InMemoryCheckpointStore store;
  {
    Trainer crashed(&source, Adam(), sae);
    TrainLoopOptions crash = options;
    crash.crash_after_step = 27;
    EXPECT_EQ(crashed.Go(crash, &store).status().code(), absl::StatusCode::kAborted);
  }
  Trainer resumed(&source, Adam(), sae);
  auto result = resumed.Go(options, &store);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->resumed_from_step, 20);
  auto a = uninterrupted.model.parameters();
  auto b = resumed.model.parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  }
  // Without AuxK the same run ends elsewhere: the term did act.
  sae.aux_k_coefficient = 0;
  Trainer plain(&source, Adam(), sae);
  InMemoryCheckpointStore plain_store;
  auto plain_result = plain.Go(options, &plain_store);
  ASSERT_TRUE(plain_result.ok()) << plain_result.status();
  EXPECT_GT(plain_result->last_telemetry.dead_latents(), 0);
  EXPECT_EQ(plain_result->last_telemetry.aux_k_loss(), 0);
  EXPECT_FALSE(torch::equal(plain.model.parameters()[2], a[2]));  // W_dec
}

// Rows turn NaN from the `poison_after`-th Read on, as a corrupt stretch of a dataset would.
class PoisonedSource : public InMemoryDenseRowSource {
 public:
  PoisonedSource(std::vector<float> values, int poison_after)
      : InMemoryDenseRowSource(std::move(values), kWidth, 8), poison_after_(poison_after) {}
  absl::Status Read(int64_t row_start, int64_t row_count, float* out) override {
    absl::Status status = InMemoryDenseRowSource::Read(row_start, row_count, out);
    if (++reads_ > poison_after_) out[0] = std::numeric_limits<float>::quiet_NaN();
    return status;
  }

 private:
  int poison_after_;
  int reads_ = 0;
};

TEST(TrainLoopTest, NanLossFailsWithNumericalReasonAndKeepsTheLastGoodCheckpoint) {
  PoisonedSource source(DictionaryRows(256, 3), /*poison_after=*/40);
  InMemoryCheckpointStore store;
  Trainer run(&source);
  TrainLoopOptions options = Loop(40);
  options.checkpoint_every = 1;
  auto result = run.Go(options, &store);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(AttachedReason(result.status()), latentd::v1::NUMERICAL);
  auto latest = store.LoadLatest();
  ASSERT_TRUE(latest->has_value());
  const int64_t good = (*latest)->step;
  EXPECT_GT(good, 0);
  EXPECT_NE(result.status().message().find(absl::StrCat("at step ", good)), std::string::npos)
      << result.status();
  // The kept checkpoint holds finite weights.
  InMemoryDenseRowSource clean(DictionaryRows(256, 3), kWidth, 8);
  Trainer check(&clean);
  ASSERT_TRUE(check.Go(Loop(good), &store).ok());
  for (const auto& p : check.model.parameters()) {
    EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  }
}

TEST(TrainLoopTest, CancelStopsAtAStepBoundaryAndCheckpoints) {
  InMemoryDenseRowSource source(DictionaryRows(256, 4), kWidth, 32);
  InMemoryCheckpointStore store;
  Trainer run(&source);
  int polls = 0;
  auto result = RunTrainLoop(Loop(100), &run.model, run.optimizer.get(), &run.stream, kWidth,
                             nullptr, &store, nullptr, [&polls] { return ++polls > 7; });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ((*store.LoadLatest())->step, 7);
}

TEST(TrainLoopTest, TwoGlooRanksHoldIdenticalStateAfter50Steps) {
  InMemoryDenseRowSource source(DictionaryRows(1024, 6), kWidth, 64);
  Trainer rank0(&source), rank1(&source), single(&source);
  ASSERT_TRUE(TrainTwoRanks(&rank0, &rank1, 50).ok());
  auto a = rank0.model.parameters();
  auto b = rank1.model.parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  // Optimizer state too: Adam's moments of every parameter.
  auto& state0 = rank0.optimizer->optimizer().state();
  auto& state1 = rank1.optimizer->optimizer().state();
  for (size_t i = 0; i < a.size(); ++i) {
    auto& s0 = static_cast<torch::optim::AdamParamState&>(
        *state0.at(c10::guts::to_string(a[i].unsafeGetTensorImpl())));
    auto& s1 = static_cast<torch::optim::AdamParamState&>(
        *state1.at(c10::guts::to_string(b[i].unsafeGetTensorImpl())));
    EXPECT_EQ(s0.step(), 50);
    EXPECT_EQ(s0.step(), s1.step());
    EXPECT_TRUE(torch::equal(s0.exp_avg(), s1.exp_avg())) << "exp_avg " << i;
    EXPECT_TRUE(torch::equal(s0.exp_avg_sq(), s1.exp_avg_sq())) << "exp_avg_sq " << i;
  }
  // And the two-rank run trains the same model as one rank, up to summation order.
  ASSERT_TRUE(single.Go(Loop(50), nullptr).ok());
  auto c = single.model.parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], c[i], 1e-3, 1e-4)) << "parameter " << i;
  }
}

// Two ranks as on two nodes: each with its own checkpoint store and its own SAE seed.
// `stores[r]` is rank r's; rank 0's state (restored or initialised) must reach rank 1.
absl::Status TrainTwoNodes(Trainer* rank0, Trainer* rank1, InMemoryCheckpointStore stores[2],
                           int64_t steps, bool share, int64_t crash_after_step = -1) {
  return OnTwoRanks([&](int rank, GradientSync* sync) {
    TrainLoopOptions options = Loop(steps);
    options.local_leader_rank = rank;  // one rank per node: each writes its own checkpoints
    options.share_start_state = share;
    options.crash_after_step = crash_after_step;
    return (rank == 0 ? rank0 : rank1)->Go(options, &stores[rank], sync).status();
  });
}

bool SameParameters(Trainer& a, Trainer& b) {
  auto x = a.model.parameters();
  auto y = b.model.parameters();
  for (size_t i = 0; i < x.size(); ++i) {
    if (!torch::equal(x[i], y[i])) return false;
  }
  return true;
}

TEST(TrainLoopTest, RanksOnSeveralNodesStartFromRankZerosState) {
  InMemoryDenseRowSource source(DictionaryRows(1024, 6), kWidth, 64);
  SaeModelOptions other_seed = Sae();
  other_seed.seed = 99;
  // Without sharing, ranks whose initial states differ (another machine's rounding; here
  // another seed) stay apart: the all-reduce keeps their updates equal, not their weights.
  {
    Trainer rank0(&source), rank1(&source, Adam(), other_seed);
    InMemoryCheckpointStore stores[2];
    ASSERT_TRUE(TrainTwoNodes(&rank0, &rank1, stores, 20, /*share=*/false).ok());
    EXPECT_FALSE(SameParameters(rank0, rank1));
  }
  // Shared: rank 1 takes rank 0's initial state and both train the model two ranks of one
  // node train; each node keeps its own checkpoints.
  Trainer rank0(&source), rank1(&source, Adam(), other_seed);
  InMemoryCheckpointStore stores[2];
  ASSERT_TRUE(TrainTwoNodes(&rank0, &rank1, stores, 20, /*share=*/true).ok());
  EXPECT_TRUE(SameParameters(rank0, rank1));
  Trainer one_node0(&source), one_node1(&source);
  ASSERT_TRUE(TrainTwoRanks(&one_node0, &one_node1, 20).ok());
  EXPECT_TRUE(SameParameters(rank0, one_node0));
  for (auto& store : stores) {
    auto latest = store.LoadLatest();
    ASSERT_TRUE(latest.ok() && latest->has_value());
    EXPECT_EQ((*latest)->step, 20);
  }
}

TEST(TrainLoopTest, RanksOnSeveralNodesResumeFromRankZerosCheckpoint) {
  InMemoryDenseRowSource source(DictionaryRows(1024, 6), kWidth, 64);
  Trainer uninterrupted0(&source), uninterrupted1(&source);
  InMemoryCheckpointStore uninterrupted_stores[2];
  ASSERT_TRUE(TrainTwoNodes(&uninterrupted0, &uninterrupted1, uninterrupted_stores, 30, true).ok());
  // Both nodes crash after step 25 (newest checkpoint: step 20). Rank 1's node then loses its
  // store (a new machine) and starts from another seed: it must continue from rank 0's step
  // 20, not from scratch.
  InMemoryCheckpointStore stores[2];
  {
    Trainer first0(&source), first1(&source);
    EXPECT_TRUE(absl::IsAborted(TrainTwoNodes(&first0, &first1, stores, 30, true, 25)));
  }
  ASSERT_TRUE(stores[1].Clear().ok());
  SaeModelOptions other_seed = Sae();
  other_seed.seed = 99;
  Trainer resumed0(&source), resumed1(&source, Adam(), other_seed);
  ASSERT_TRUE(TrainTwoNodes(&resumed0, &resumed1, stores, 30, true).ok());
  EXPECT_TRUE(SameParameters(resumed0, resumed1));
  EXPECT_TRUE(SameParameters(resumed0, uninterrupted0));
}

// Rows whose reads are collectives, as a ModelRowSource's when the ranks share its work: every
// rank must read the same rows at the same time. A read that differs from a peer's fails here
// (a real one would pair with another collective and hang or garble).
class LockstepRowSource : public DenseRowSource {
 public:
  explicit LockstepRowSource(DenseRowSource* rows) : rows_(rows) {}
  void Join(GradientSync* sync) { sync_ = sync; }
  int64_t reads() const { return reads_; }

  int64_t num_rows() const override { return rows_->num_rows(); }
  int64_t width() const override { return rows_->width(); }
  std::vector<int64_t> chunk_starts() const override { return rows_->chunk_starts(); }
  absl::Status Read(int64_t row_start, int64_t row_count, float* out) override {
    if (sync_ != nullptr) {
      std::vector<torch::Tensor> all;
      RETURN_IF_ERROR(sync_->AllGather(torch::tensor({row_start, row_count}), &all));
      for (const auto& peer : all) {
        if (!torch::equal(peer, all[0])) {
          return absl::FailedPreconditionError(absl::StrCat("rank ", sync_->rank(), " read rows ",
                                                            row_start, "+", row_count,
                                                            " while a peer read others"));
        }
      }
      ++reads_;
    }
    return rows_->Read(row_start, row_count, out);
  }

 private:
  DenseRowSource* rows_;
  GradientSync* sync_ = nullptr;
  int64_t reads_ = 0;
};

// Two ranks over lockstep sources: one node (a shared checkpoint store) or two (share_start_state,
// a store each). Batches of 21 rows give the ranks slices of 10 and 11, so that their
// calibration rows (as many whole slices as fit in 260) span three windows of 128 rows on
// rank 0 and two on rank 1 unless every rank reads as many as the one that needs most.
TrainLoopOptions LockstepLoop(int64_t steps) {
  TrainLoopOptions options = Loop(steps);
  options.batch_size = 21;
  options.init_rows = 260;
  return options;
}

absl::Status TrainLockstep(Trainer* rank0, Trainer* rank1, LockstepRowSource* sources[2],
                           InMemoryCheckpointStore stores[2], bool two_nodes, int64_t steps,
                           int64_t crash_after_step = -1) {
  return OnTwoRanks([&](int rank, GradientSync* sync) {
    sources[rank]->Join(sync);
    TrainLoopOptions options = LockstepLoop(steps);
    options.collective_reads = true;
    options.local_leader_rank = two_nodes ? rank : 0;
    options.share_start_state = two_nodes;
    options.crash_after_step = crash_after_step;
    return (rank == 0 ? rank0 : rank1)
        ->Go(options, two_nodes ? &stores[rank] : &stores[0], sync)
        .status();
  });
}

// With collective_reads every rank reads the same rows at the same time (to initialise, at
// every step, to calibrate BatchTopK's threshold at the end; one node or several; fresh or
// resumed) and the ranks train what ranks reading only their slices train.
TEST(TrainLoopTest, CollectiveReadsKeepTheRanksInStep) {
  InMemoryDenseRowSource rows(DictionaryRows(1024, 6), kWidth, 64);
  Trainer expected0(&rows, Adam(), BatchTopKSae()), expected1(&rows, Adam(), BatchTopKSae());
  ASSERT_TRUE(TrainTwoRanks(&expected0, &expected1, 30, LockstepLoop(30)).ok());
  for (const bool two_nodes : {false, true}) {
    LockstepRowSource lockstep0(&rows), lockstep1(&rows);
    LockstepRowSource* sources[2] = {&lockstep0, &lockstep1};
    InMemoryCheckpointStore stores[2];
    {
      // Crashes after step 25; the newest checkpoint is step 20's.
      Trainer first0(&lockstep0, Adam(), BatchTopKSae()),
          first1(&lockstep1, Adam(), BatchTopKSae());
      const absl::Status crashed =
          TrainLockstep(&first0, &first1, sources, stores, two_nodes, 30, 25);
      EXPECT_TRUE(absl::IsAborted(crashed)) << crashed;
    }
    Trainer resumed0(&lockstep0, Adam(), BatchTopKSae()),
        resumed1(&lockstep1, Adam(), BatchTopKSae());
    const absl::Status resumed =
        TrainLockstep(&resumed0, &resumed1, sources, stores, two_nodes, 30);
    ASSERT_TRUE(resumed.ok()) << "two nodes " << two_nodes << ": " << resumed;
    EXPECT_GT(lockstep0.reads(), 0);
    EXPECT_EQ(lockstep0.reads(), lockstep1.reads());
    EXPECT_TRUE(SameParameters(resumed0, expected0)) << "two nodes " << two_nodes;
    EXPECT_TRUE(SameParameters(resumed1, expected0)) << "two nodes " << two_nodes;
    EXPECT_EQ(resumed0.model.sae()->batch_threshold.item<float>(),
              expected0.model.sae()->batch_threshold.item<float>());
  }
}

}  // namespace
}  // namespace latentd::engine
