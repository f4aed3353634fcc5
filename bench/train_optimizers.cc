// TRAIN benchmark: the same TopK SAE trained on the same rows with adam, dense M-FAC (at a size
// where its history fits) and S-MFAC at 1% density, side by side in one run: final FVU (on a
// held-out batch), peak optimizer state bytes (the optimizers' own accounting), mean step time.
// Then T2's memory table (d_in 1024, d_sae 4096, m 1024) from the static estimates, which is
// where dense M-FAC no longer fits on a 24 GB device.
//
//   bazel run -c opt //bench:train_optimizers -- [--steps=300] [--d_in=256] [--d_sae=2048]
//       [--window=32] [--batch=256] [--adam_lr=1e-3] [--mfac_lr=3e-2] [--smfac_lr=3e-2]
#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/str_format.h"
#include "engine/train_loop.h"
#include "engine/train_models.h"

namespace latentd::engine {
namespace {

// Rows from a sparse dictionary (4096 unit atoms, ~16 active per row, Zipf-like frequencies):
// what an SAE on a residual stream sees, with a known sparse structure.
std::vector<float> DictionaryRows(int64_t rows, int64_t d_in, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  const int64_t atoms = 4096;
  torch::Tensor dictionary = at::randn({atoms, d_in}, gen, torch::kFloat32);
  dictionary = dictionary / dictionary.norm(2, {1}, true);
  torch::Tensor frequency = 1.0 / torch::arange(1, atoms + 1, torch::kFloat32).pow(0.7);
  frequency = frequency * (16.0 / frequency.sum().item<double>());
  torch::Tensor active = at::rand({rows, atoms}, gen, torch::kFloat32) < frequency.clamp_max(1.0);
  torch::Tensor codes = at::rand({rows, atoms}, gen, torch::kFloat32) * active;
  torch::Tensor x = codes.matmul(dictionary).contiguous();
  return std::vector<float>(x.data_ptr<float>(), x.data_ptr<float>() + x.numel());
}

struct Outcome {
  double fvu = 0;
  int64_t peak_optimizer_bytes = 0;
  double step_seconds = 0;
  std::vector<std::pair<std::string, int64_t>> components;
};

Outcome Train(const std::string& name, double lr, double density, int64_t window,
              InMemoryDenseRowSource* source, const torch::Tensor& held_out, int64_t d_in,
              int64_t d_sae, int64_t steps, int64_t batch) {
  latentd::v1::OptimizerSpec spec;
  spec.set_name(name);
  spec.set_lr(lr);
  spec.set_window(static_cast<int32_t>(window));
  spec.set_damp(1e-4);
  spec.set_density(density);
  OptimizerConfig config = *OptimizerConfigFromProto(spec);
  SaeModelOptions sae;
  sae.d_in = d_in;
  sae.d_sae = d_sae;
  sae.k = 32;
  sae.seed = 1;
  SaeTrainable model(sae, c10::kCPU);
  auto optimizer = MakeOptimizer(config, model.parameters());
  if (!optimizer.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), optimizer.status().ToString().c_str());
    std::exit(1);
  }
  ShuffledRowStream stream(source, {7, 4});
  TrainLoopOptions options;
  options.batch_size = batch;
  options.total_steps = steps;
  latentd::v1::LrSchedule schedule;
  schedule.set_kind(latentd::v1::COSINE);
  schedule.set_warmup_steps(steps / 20);
  schedule.set_final_lr_fraction(0.1);
  options.lr = *LrScheduleFromProto(schedule, lr, steps);
  options.checkpoint_every = 0;
  options.telemetry_every = 0;
  options.mfac_window = window;
  auto result = RunTrainLoop(options, &model, optimizer->get(), &stream, d_in, nullptr, nullptr,
                             nullptr, nullptr);
  if (!result.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), result.status().ToString().c_str());
    std::exit(1);
  }
  Outcome outcome;
  torch::NoGradGuard no_grad;
  outcome.fvu = model.sae()->Forward(held_out).fvu;
  outcome.peak_optimizer_bytes = result->peak_optimizer_state_bytes;
  outcome.step_seconds = result->last_telemetry.step_seconds();
  outcome.components = (*optimizer)->Memory().components;
  return outcome;
}

std::string Mb(int64_t bytes) { return absl::StrFormat("%.2f MB", bytes / 1e6); }

int Main(int argc, char** argv) {
  std::map<std::string, double> flags = {{"steps", 300},    {"d_in", 256},     {"d_sae", 2048},
                                         {"window", 32},    {"batch", 256},    {"adam_lr", 1e-3},
                                         {"mfac_lr", 3e-2}, {"smfac_lr", 3e-2}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      flags[arg.substr(2, eq - 2)] = std::stod(arg.substr(eq + 1));
    }
  }
  const int64_t d_in = flags["d_in"], d_sae = flags["d_sae"], window = flags["window"];
  const int64_t steps = flags["steps"], batch = flags["batch"];
  const int64_t rows = std::max<int64_t>(steps * batch / 2, 4 * batch);  // ~2 epochs
  InMemoryDenseRowSource source(DictionaryRows(rows, d_in, 11), d_in, 4096);
  std::vector<float> held = DictionaryRows(2048, d_in, 12);
  torch::Tensor held_out = torch::from_blob(held.data(), {2048, d_in}, torch::kFloat32);
  const int64_t d = 2 * d_in * d_sae + d_sae + d_in;
  std::printf(
      "TopK SAE d_in %lld, d_sae %lld, k 32 (d = %lld parameters); %lld steps of %lld rows"
      " (%lld rows, cosine lr with warm-up); M-FAC window m = %lld\n\n",
      (long long)d_in, (long long)d_sae, (long long)d, (long long)steps, (long long)batch,
      (long long)rows, (long long)window);
  struct Run {
    const char* label;
    const char* name;
    double lr;
    double density;
  };
  // lr per optimizer (--adam_lr, --mfac_lr, --smfac_lr): defaults are the best of a small grid
  // (docs/TRAIN.md records the grid).
  const Run runs[] = {{"adam", "adam", flags["adam_lr"], 0},
                      {"mfac (dense)", "mfac", flags["mfac_lr"], 0},
                      {"smfac 1%", "smfac", flags["smfac_lr"], 0.01}};
  std::vector<Outcome> outcomes;
  for (const Run& run : runs) {
    outcomes.push_back(
        Train(run.name, run.lr, run.density, window, &source, held_out, d_in, d_sae, steps, batch));
  }
  const Outcome& adam = outcomes[0];
  std::printf(
      "| optimizer | final FVU (held out) | peak optimizer state | vs adam | step time | "
      "vs adam |\n|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const Outcome& o = outcomes[i];
    std::printf("| %s | %.4f | %s | %.2fx | %.1f ms | %.2fx |\n", runs[i].label, o.fvu,
                Mb(o.peak_optimizer_bytes).c_str(),
                static_cast<double>(o.peak_optimizer_bytes) / adam.peak_optimizer_bytes,
                o.step_seconds * 1e3, o.step_seconds / adam.step_seconds);
  }
  std::printf("\nS-MFAC components:");
  for (const auto& [name, bytes] : outcomes[2].components) {
    std::printf(" %s=%s", name.c_str(), Mb(bytes).c_str());
  }
  std::printf("\ndense M-FAC history for this d and m: %s\n\n",
              Mb(DenseMfacHistoryBytes(d, window)).c_str());

  // T2: the static estimates at the size where the memory matters.
  const std::vector<std::vector<int64_t>> t2 = {{1024, 4096}, {4096}, {4096, 1024}, {1024}};
  std::printf("T2 estimate (d_in 1024, d_sae 4096, d = %lld, m = 1024):\n",
              (long long)(2 * 1024 * 4096 + 4096 + 1024));
  std::printf("| optimizer | state | vs dense M-FAC |\n|---|---|---|\n");
  int64_t dense_bytes = 0;
  for (const auto& [label, name, density] :
       std::vector<std::tuple<const char*, const char*, double>>{
           {"mfac (dense)", "mfac", 0}, {"adam", "adam", 0}, {"smfac 1%", "smfac", 0.01}}) {
    latentd::v1::OptimizerSpec spec;
    spec.set_name(name);
    spec.set_lr(1e-3);
    spec.set_window(1024);
    spec.set_density(density);
    const int64_t bytes = EstimateOptimizerMemory(*OptimizerConfigFromProto(spec), t2).total();
    if (dense_bytes == 0) dense_bytes = bytes;
    std::printf("| %s | %.3f GB | %.4f |\n", label, bytes / 1e9,
                static_cast<double>(bytes) / dense_bytes);
  }
  return 0;
}

}  // namespace
}  // namespace latentd::engine

int main(int argc, char** argv) { return latentd::engine::Main(argc, argv); }
