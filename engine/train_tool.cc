// train_tool: trains a TorchScript module (forward(batch) -> scalar loss) or a TopK SAE on rows of
// a raw float32 file with the TRAIN loop, without the daemon. Used by the python3-torch test
// (tests/python/test_train_torchscript.py) and handy for trying optimizers by hand.
//
//   train_tool --rows=FILE --width=W (--module=M.pt | --d_sae=N --k=K) --out=DIR
//              [--optimizer=adam] [--lr=1e-2] [--steps=100] [--batch=32] [--seed=0]
//              [--density=0.01] [--window=16] [--damp=1e-4] [--devices=1] [--schedule=constant]
//              [--db=DIR --job=N --checkpoint_every=K]
//   train_tool --tokens=FILE.bin|.npy --context=L --module=M.pt --out=DIR ...  (batches of int64
//              token ids [batch, L], for a module trained on a token file)
// With --db, checkpoints go to a RocksDB store in DIR under job N (as in the daemon), each commit
// is announced on stderr as "checkpoint <step>", and a rerun resumes from the newest one (the
// kill -9 test in tests/python/test_train_torchscript.py relies on both).
// Writes DIR (model.pt, or the SAE in SAELens layout) and prints one JSON line of final metrics.
// Exit status 2 for bad input, 1 for a failed run.
#include <torch/types.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint.h"
#include "engine/train_loop.h"
#include "engine/train_models.h"
#include "engine/train_token_source.h"

namespace latentd::engine {
namespace {

// Announces each durable commit, so that a test can kill the process right after one.
class AnnouncingStore : public CheckpointStore {
 public:
  explicit AnnouncingStore(CheckpointStore* inner) : inner_(inner) {}
  absl::StatusOr<std::optional<Checkpoint>> LoadLatest() override {
    auto latest = inner_->LoadLatest();
    if (latest.ok() && latest->has_value()) {
      std::fprintf(stderr, "resumed %lld\n", static_cast<long long>((*latest)->step));
    }
    return latest;
  }
  absl::Status Commit(const Checkpoint& checkpoint) override {
    absl::Status status = inner_->Commit(checkpoint);
    if (status.ok())
      std::fprintf(stderr, "checkpoint %lld\n", static_cast<long long>(checkpoint.step));
    std::fflush(stderr);
    return status;
  }
  absl::Status Clear() override { return inner_->Clear(); }

 private:
  CheckpointStore* inner_;
};

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"optimizer", "adam"}, {"lr", "1e-2"},
                                              {"steps", "100"},      {"batch", "32"},
                                              {"seed", "0"},         {"density", "0.01"},
                                              {"window", "16"},      {"damp", "1e-4"},
                                              {"devices", "1"},      {"schedule", "constant"},
                                              {"k", "32"},           {"d_sae", "0"},
                                              {"job", "1"},          {"checkpoint_every", "10"}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::cerr << "train_tool: expected --name=value, got " << arg << "\n";
      return 2;
    }
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  const bool tokens = !flags["tokens"].empty();
  if ((!tokens && (flags["rows"].empty() || flags["width"].empty())) || flags["out"].empty()) {
    std::cerr << "train_tool: --rows and --width (or --tokens and --context) and --out are "
                 "required\n";
    return 2;
  }
  std::unique_ptr<DenseRowSource> source;
  int64_t width = 0;
  if (tokens) {
    latentd::v1::TokenSource token_spec;
    token_spec.set_path(flags["tokens"]);
    token_spec.set_context_length(std::stoi(flags["context"].empty() ? "0" : flags["context"]));
    auto opened = TokenRowSource::Open(token_spec);
    if (!opened.ok()) {
      std::cerr << "train_tool: " << opened.status() << "\n";
      return 2;
    }
    width = (*opened)->width();
    source = std::move(*opened);
  } else {
    width = std::stoll(flags["width"]);
    std::ifstream in(flags["rows"], std::ios::binary);
    if (!in) {
      std::cerr << "train_tool: cannot read " << flags["rows"] << "\n";
      return 2;
    }
    in.seekg(0, std::ios::end);
    std::vector<float> values(static_cast<size_t>(in.tellg()) / sizeof(float));
    in.seekg(0);
    in.read(reinterpret_cast<char*>(values.data()), values.size() * sizeof(float));
    if (width <= 0 || values.size() % width != 0 || values.empty()) {
      std::cerr << "train_tool: " << values.size() << " floats are not rows of width " << width
                << "\n";
      return 2;
    }
    source = std::make_unique<InMemoryDenseRowSource>(std::move(values), width, 256);
  }

  latentd::v1::OptimizerSpec spec;
  spec.set_name(flags["optimizer"]);
  spec.set_lr(std::stod(flags["lr"]));
  spec.set_density(std::stod(flags["density"]));
  spec.set_window(std::stoi(flags["window"]));
  spec.set_damp(std::stod(flags["damp"]));
  auto config = OptimizerConfigFromProto(spec);
  if (!config.ok()) {
    std::cerr << "train_tool: " << config.status() << "\n";
    return 2;
  }
  const int64_t steps = std::stoll(flags["steps"]);
  const int devices = std::stoi(flags["devices"]);
  latentd::v1::LrSchedule schedule;
  latentd::v1::LrScheduleKind kind = latentd::v1::CONSTANT;
  latentd::v1::LrScheduleKind_Parse(absl::AsciiStrToUpper(flags["schedule"]), &kind);
  schedule.set_kind(kind);
  TrainLoopOptions options;
  options.batch_size = std::stoll(flags["batch"]);
  options.total_steps = steps;
  options.lr = *LrScheduleFromProto(schedule, config->lr, steps);
  options.checkpoint_every = 0;
  options.telemetry_every = 0;
  options.mfac_window = config->window;
  std::unique_ptr<storage::Db> db;
  std::unique_ptr<DbCheckpointStore> db_checkpoints;
  std::unique_ptr<AnnouncingStore> checkpoints;
  if (!flags["db"].empty()) {
    auto opened = storage::Db::Open(flags["db"]);
    if (!opened.ok()) {
      std::cerr << "train_tool: " << opened.status() << "\n";
      return 2;
    }
    db = std::move(*opened);
    db_checkpoints = std::make_unique<DbCheckpointStore>(db.get(), std::stoull(flags["job"]));
    checkpoints = std::make_unique<AnnouncingStore>(db_checkpoints.get());
    options.checkpoint_every = std::stoll(flags["checkpoint_every"]);
  }

  const uint64_t seed = std::stoull(flags["seed"]);
  struct RankState {
    std::unique_ptr<TrainableModel> model;
    std::unique_ptr<TrainOptimizer> optimizer;
    std::unique_ptr<ShuffledRowStream> stream;
    absl::StatusOr<TrainLoopResult> result = absl::UnknownError("not run");
  };
  std::vector<RankState> ranks(devices);
  for (auto& rank : ranks) {
    if (!flags["module"].empty()) {
      auto model = LoadTorchScriptTrainable(flags["module"], c10::kCPU, tokens);
      if (!model.ok()) {
        std::cerr << "train_tool: " << model.status() << "\n";
        return 2;
      }
      rank.model = std::move(*model);
    } else {
      latentd::v1::SaeTrainConfig sae;
      sae.set_d_sae(std::stoi(flags["d_sae"]));
      sae.set_k(std::stoi(flags["k"]));
      auto sae_options = SaeModelOptionsFromProto(sae, width, seed);
      if (!sae_options.ok()) {
        std::cerr << "train_tool: " << sae_options.status() << "\n";
        return 2;
      }
      rank.model = std::make_unique<SaeTrainable>(*sae_options, c10::kCPU);
    }
    auto optimizer = MakeOptimizer(*config, rank.model->parameters());
    if (!optimizer.ok()) {
      std::cerr << "train_tool: " << optimizer.status() << "\n";
      return 2;
    }
    rank.optimizer = std::move(*optimizer);
    rank.stream =
        std::make_unique<ShuffledRowStream>(source.get(), ShuffledRowStreamOptions{seed, 4});
  }
  if (devices == 1) {
    ranks[0].result =
        RunTrainLoop(options, ranks[0].model.get(), ranks[0].optimizer.get(), ranks[0].stream.get(),
                     width, nullptr, checkpoints.get(), nullptr, nullptr);
  } else {
    auto store = NewInProcessStore();
    std::vector<std::thread> threads;
    for (int r = 0; r < devices; ++r) {
      threads.emplace_back([&, r] {
        ProcessGroupOptions group;
        group.rank = r;
        group.world_size = devices;
        auto sync = JoinProcessGroup(store, group);
        if (!sync.ok()) {
          ranks[r].result = sync.status();
          return;
        }
        ranks[r].result = RunTrainLoop(options, ranks[r].model.get(), ranks[r].optimizer.get(),
                                       ranks[r].stream.get(), width, sync->get(), checkpoints.get(),
                                       nullptr, nullptr);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (auto& rank : ranks) {
    if (!rank.result.ok()) {
      std::cerr << "train_tool: " << rank.result.status() << "\n";
      return 1;
    }
  }
  absl::Status saved = ranks[0].model->Save(flags["out"]);
  if (!saved.ok()) {
    std::cerr << "train_tool: " << saved << "\n";
    return 1;
  }
  const TrainLoopResult& r = *ranks[0].result;
  std::cout << absl::StrFormat(
      "{\"steps\": %d, \"final_loss\": %.9g, \"final_fvu\": %.9g, \"final_l0\": %.9g, "
      "\"peak_optimizer_state_bytes\": %d, \"step_seconds\": %.9g}\n",
      r.steps, r.final_loss, r.final_fvu, r.final_l0, r.peak_optimizer_state_bytes,
      r.last_telemetry.step_seconds());
  return 0;
}

}  // namespace
}  // namespace latentd::engine

int main(int argc, char** argv) { return latentd::engine::Main(argc, argv); }
