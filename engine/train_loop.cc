#include "engine/train_loop.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "engine/cuda_info.h"
#include "engine/device_pool.h"

namespace latentd::engine {
namespace {

constexpr int kStatLoss = 0;
constexpr int kStatSquaredError = 1;
constexpr int kStatL0 = 2;
constexpr int kStatCancel = 3;
constexpr int kStatAuxK = 4;
constexpr int kStatCentredSquares = 5;
constexpr int kNumStats = 6;

// Everything a resumed run needs besides the stream position (a function of the step).
absl::StatusOr<std::string> SerializeState(int64_t steps_done, TrainableModel* model,
                                           TrainOptimizer* optimizer,
                                           const torch::Tensor& steps_since_fired,
                                           int64_t peak_optimizer_bytes) {
  try {
    torch::serialize::OutputArchive archive;
    archive.write("trainer/steps_done", torch::tensor({steps_done}, torch::kInt64));
    archive.write("trainer/peak_optimizer_bytes",
                  torch::tensor({peak_optimizer_bytes}, torch::kInt64));
    if (steps_since_fired.defined()) archive.write("trainer/steps_since_fired", steps_since_fired);
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      archive.write(absl::StrCat("model/", i), params[i].detach().to(torch::kCPU));
    }
    const auto buffers = model->buffers();
    for (size_t i = 0; i < buffers.size(); ++i) {
      archive.write(absl::StrCat("model_buffer/", i), buffers[i].detach().to(torch::kCPU));
    }
    torch::serialize::OutputArchive optimizer_archive;
    RETURN_IF_ERROR(optimizer->Save(&optimizer_archive));
    archive.write("optimizer", optimizer_archive);
    std::string blob;
    archive.save_to([&blob](const void* data, size_t size) {
      blob.append(static_cast<const char*>(data), size);
      return size;
    });
    return blob;
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("writing the checkpoint: ", e.what_without_backtrace()));
  }
}

absl::Status RestoreState(const std::string& blob, TrainableModel* model, TrainOptimizer* optimizer,
                          int64_t* steps_done, torch::Tensor* steps_since_fired,
                          int64_t* peak_optimizer_bytes) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(blob.data(), blob.size());
    torch::Tensor t;
    archive.read("trainer/steps_done", t);
    *steps_done = t.item<int64_t>();
    archive.read("trainer/peak_optimizer_bytes", t);
    *peak_optimizer_bytes = t.item<int64_t>();
    if (steps_since_fired->defined()) {
      torch::Tensor counters;
      archive.read("trainer/steps_since_fired", counters);
      steps_since_fired->copy_(counters);
    }
    torch::NoGradGuard no_grad;
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor value;
      archive.read(absl::StrCat("model/", i), value);
      if (!value.sizes().equals(params[i].sizes())) {
        return absl::DataLossError(absl::StrCat("checkpoint parameter ", i, " has shape ",
                                                c10::str(value.sizes()), ", the model ",
                                                c10::str(params[i].sizes())));
      }
      params[i].copy_(value);
    }
    const auto buffers = model->buffers();
    for (size_t i = 0; i < buffers.size(); ++i) {
      torch::Tensor value;
      if (!archive.try_read(absl::StrCat("model_buffer/", i), value) ||
          !value.sizes().equals(buffers[i].sizes())) {
        return absl::DataLossError(absl::StrCat("checkpoint buffer ", i,
                                                " is missing or has "
                                                "another shape than the model's"));
      }
      buffers[i].copy_(value);
    }
    torch::serialize::InputArchive optimizer_archive;
    archive.read("optimizer", optimizer_archive);
    return optimizer->Load(&optimizer_archive);
  } catch (const c10::Error& e) {
    return absl::DataLossError(
        absl::StrCat("reading the checkpoint: ", e.what_without_backtrace()));
  }
}

void FillDeviceMemory(const c10::Device& device, latentd::v1::TrainTelemetry* sample) {
  if (device.is_cuda()) {
    const CudaAllocatorStats stats = QueryCudaAllocator(device.index());
    sample->set_device_allocated_bytes(stats.allocated_bytes);
    sample->set_device_reserved_bytes(stats.reserved_bytes);
    sample->set_device_peak_bytes(stats.peak_allocated_bytes);
  }
  sample->set_process_rss_bytes(ProcessRssBytes());
}

}  // namespace

int64_t TensorListBytes(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (t.defined()) bytes += static_cast<int64_t>(t.numel() * t.element_size());
  }
  return bytes;
}

absl::StatusOr<TrainLoopResult> RunTrainLoop(const TrainLoopOptions& options, TrainableModel* model,
                                             TrainOptimizer* optimizer, ShuffledRowStream* stream,
                                             int64_t width, GradientSync* sync,
                                             CheckpointStore* checkpoints, JobContext* context,
                                             const std::function<bool()>& cancel) {
  SingleProcessSync single;
  if (sync == nullptr) sync = &single;
  const int rank = sync->rank();
  const int world = sync->world_size();
  // Writes this node's checkpoints and reports to its job.
  const bool leader = rank == options.local_leader_rank;
  // Restores from its own store; with share_start_state only rank 0, which sends the others
  // what it restored or initialised.
  const bool restores = !options.share_start_state || rank == 0;
  const int64_t global_batch = options.batch_size;
  const int64_t slice_begin = global_batch * rank / world;
  const int64_t slice_end = global_batch * (rank + 1) / world;
  const int64_t slice_rows = slice_end - slice_begin;
  const bool collective_reads = options.collective_reads && world > 1;
  const double slice_weight = static_cast<double>(slice_rows) / static_cast<double>(global_batch);

  std::vector<torch::Tensor> params = model->parameters();
  const int64_t num_params = [&] {
    int64_t n = 0;
    for (const auto& p : params) n += p.numel();
    return n;
  }();
  torch::Tensor steps_since_fired;
  if (model->num_latents() > 0)
    steps_since_fired = torch::zeros({model->num_latents()}, torch::kInt64);

  TrainLoopResult result;
  int64_t start = 0;
  int64_t peak_optimizer_bytes = 0;
  // Every rank starts from the same state: ranks sharing a store restore the same checkpoint (or
  // initialise from the same rows); otherwise rank 0's is broadcast below.
  if (restores && checkpoints != nullptr) {
    ASSIGN_OR_RETURN(std::optional<Checkpoint> latest, checkpoints->LoadLatest());
    if (latest.has_value()) {
      RETURN_IF_ERROR(RestoreState(latest->blob, model, optimizer, &start, &steps_since_fired,
                                   &peak_optimizer_bytes));
      result.resumed_from_step = start;
      if (leader && context != nullptr) {
        context->Log(latentd::v1::LogLine::INFO,
                     absl::StrCat("resumed from the checkpoint at step ", start));
      }
    }
  }
  if (collective_reads && options.share_start_state) {
    // Whether rank 0 starts afresh decides whether every rank reads the initialisation rows.
    std::string start_text = rank == 0 ? absl::StrCat(start) : "";
    RETURN_IF_ERROR(sync->BroadcastBytes(&start_text, options.device));
    if (!absl::SimpleAtoi(start_text, &start)) {
      return absl::InternalError(absl::StrCat("rank 0 sent start step \"", start_text, "\""));
    }
  }
  if ((restores || collective_reads) && start == 0) {
    const int64_t init_rows = std::max<int64_t>(1, options.init_rows);
    std::vector<float> rows(init_rows * width);
    RETURN_IF_ERROR(stream->Read(0, init_rows, rows.data()));
    if (restores) {
      model->InitFromData(
          torch::from_blob(rows.data(), {init_rows, width}, torch::kFloat32).to(options.device));
    }
  }
  if (options.share_start_state && world > 1) {
    std::string state;
    if (rank == 0) {
      ASSIGN_OR_RETURN(
          state, SerializeState(start, model, optimizer, steps_since_fired, peak_optimizer_bytes));
    }
    RETURN_IF_ERROR(sync->BroadcastBytes(&state, options.device));
    if (rank != 0) {
      RETURN_IF_ERROR(
          RestoreState(state, model, optimizer, &start, &steps_since_fired, &peak_optimizer_bytes));
      if (start > 0) result.resumed_from_step = start;
    }
    if (leader && context != nullptr && rank != 0) {
      context->Log(latentd::v1::LogLine::INFO,
                   start > 0 ? absl::StrCat("took rank 0's checkpoint at step ", start)
                             : std::string("took rank 0's initial state"));
    }
  }

  // How a user picks a stopped run up again: a new job that takes this one's checkpoint over.
  auto continue_with = [context]() -> std::string {
    if (context == nullptr) return "";
    return absl::StrCat(" (a TRAIN job with resume_from_job_id ", context->job_id(),
                        " continues from it)");
  };
  auto checkpoint = [&](int64_t steps_done) -> absl::Status {
    if (!leader || checkpoints == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::string blob, SerializeState(steps_done, model, optimizer,
                                                      steps_since_fired, peak_optimizer_bytes));
    return checkpoints->Commit({steps_done, std::move(blob)});
  };

  // With collective reads the whole global batch is read and this rank's slice used.
  std::vector<float> host_batch((collective_reads ? global_batch : slice_rows) * width);
  float* const slice_data = host_batch.data() + (collective_reads ? slice_begin * width : 0);
  double window_seconds = 0;
  int64_t window_steps = 0;
  double last_loss = 0, last_fvu = 0, last_l0 = 0, last_aux_k = 0;
  std::vector<double> last_prefix_fvu;
  std::vector<double> last_block_fvu;
  int64_t last_checkpoint_step = start;
  // Where this run starts: watchers see the total at once, and the first rate has a baseline.
  if (context != nullptr) context->ReportProgress(start, options.total_steps, "steps");
  for (int64_t step = start; step < options.total_steps; ++step) {
    const absl::Time step_start = absl::Now();
    const double lr = LrAt(options.lr, step);
    optimizer->SetLr(lr);
    if (collective_reads) {
      RETURN_IF_ERROR(stream->Read(step * global_batch, global_batch, host_batch.data()));
    } else {
      RETURN_IF_ERROR(stream->Read(step * global_batch + slice_begin, slice_rows, slice_data));
    }
    torch::Tensor batch =
        torch::from_blob(slice_data, {slice_rows, width}, torch::kFloat32).to(options.device);
    for (auto& p : params) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    // The same mask on every rank: the counters follow the all-reduced firing.
    if (steps_since_fired.defined() && model->uses_dead_latents()) {
      model->SetDeadLatents((steps_since_fired >= options.dead_window_steps).to(options.device));
    }
    TrainableModel::Output out;
    try {
      ASSIGN_OR_RETURN(out, model->Forward(batch));
      (out.loss * slice_weight).backward();
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("forward/backward at step ", step, ": ", e.what_without_backtrace()));
    }
    // Matryoshka levels' squared errors ride after the fixed statistics (the same count on every
    // rank); sums are summed, means weighted by the rank's share of the batch.
    const int64_t num_prefixes = static_cast<int64_t>(out.prefix_squared_error.size());
    // Then each block's squared error and centred squares (fvu_blocks()).
    const int64_t num_blocks = static_cast<int64_t>(out.block_squared_error.size());
    const int64_t first_block = kNumStats + num_prefixes;
    torch::Tensor stats = torch::zeros({first_block + 2 * num_blocks}, torch::kFloat32);
    {
      auto acc = stats.accessor<float, 1>();
      for (int64_t i = 0; i < num_prefixes; ++i) {
        acc[kNumStats + i] = static_cast<float>(out.prefix_squared_error[i]);
      }
      for (int64_t b = 0; b < num_blocks; ++b) {
        acc[first_block + 2 * b] = static_cast<float>(out.block_squared_error[b]);
        acc[first_block + 2 * b + 1] = static_cast<float>(out.block_centred_squares[b]);
      }
      acc[kStatLoss] = static_cast<float>(out.loss.item<double>() * slice_weight);
      acc[kStatSquaredError] =
          static_cast<float>(std::isnan(out.squared_error) ? 0.0 : out.squared_error);
      acc[kStatCentredSquares] = static_cast<float>(out.centred_squares);
      acc[kStatL0] = static_cast<float>((std::isnan(out.l0) ? 0.0 : out.l0) * slice_weight);
      acc[kStatCancel] = (cancel && cancel()) ? 1.0f : 0.0f;
      acc[kStatAuxK] = static_cast<float>(out.aux_k_loss * slice_weight);
    }
    std::vector<torch::Tensor> reduced;
    for (auto& p : params) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      reduced.push_back(p.mutable_grad());
    }
    reduced.push_back(stats);
    if (out.centred_sum.defined()) reduced.push_back(out.centred_sum);
    torch::Tensor fired;
    if (steps_since_fired.defined()) {
      fired = out.fired.defined() ? out.fired.to(torch::kCPU, torch::kFloat32).clone()
                                  : torch::zeros({model->num_latents()}, torch::kFloat32);
      reduced.push_back(fired);
    }
    if (world > 1) {
      // A rank that died (its node killed, its network gone): say where this one stopped and
      // how to go on.
      absl::Status reduced_all = sync->AllReduceSum(reduced);
      if (!reduced_all.ok()) {
        return WithMessage(
            reduced_all,
            absl::StrCat("step ", step, ": ", reduced_all.message(), "; the last checkpoint (step ",
                         last_checkpoint_step, ") is kept", continue_with()));
      }
    }
    const double loss = stats[kStatLoss].item<double>();
    if (stats[kStatCancel].item<float>() > 0) {
      RETURN_IF_ERROR(checkpoint(step));
      return absl::CancelledError(absl::StrCat("train cancelled at step ", step,
                                               "; the checkpoint at that step is kept",
                                               continue_with()));
    }
    if (!std::isfinite(loss)) {
      return WithReason(
          absl::InternalError(absl::StrCat(
              absl::StrFormat(
                  "non-finite loss (%f) at step %d; the last good checkpoint (step %d) is kept",
                  loss, step, last_checkpoint_step),
              continue_with())),
          latentd::v1::NUMERICAL);
    }
    model->BeforeOptimizerStep();
    RETURN_IF_ERROR(optimizer->Step());
    model->AfterOptimizerStep();
    const int64_t done = step + 1;
    if (steps_since_fired.defined()) {
      steps_since_fired =
          torch::where(fired > 0, torch::zeros_like(steps_since_fired), steps_since_fired + 1);
    }
    last_loss = loss;
    // The global batch's spread about its mean, from the ranks' sums about b_dec: for the columns
    // [begin, begin + width) of the target, whose centred squares sum to `centred_squares`.
    auto spread_of = [&](double centred_squares, int64_t begin, int64_t width) {
      return centred_squares - out.centred_sum.narrow(0, begin, width)
                                       .to(torch::kFloat64)
                                       .pow(2)
                                       .sum()
                                       .item<double>() /
                                   static_cast<double>(global_batch);
    };
    const double spread =
        out.centred_sum.defined()
            ? spread_of(stats[kStatCentredSquares].item<double>(), 0, out.centred_sum.size(0))
            : 0.0;
    auto fvu_of = [&](double squared_error) { return spread > 0 ? squared_error / spread : 0.0; };
    last_fvu = fvu_of(stats[kStatSquaredError].item<double>());
    last_l0 = stats[kStatL0].item<double>();
    last_aux_k = stats[kStatAuxK].item<double>();
    last_prefix_fvu.clear();
    for (int64_t i = 0; i < num_prefixes; ++i) {
      last_prefix_fvu.push_back(fvu_of(stats[kNumStats + i].item<double>()));
    }
    last_block_fvu.clear();
    const std::vector<int64_t> block_widths =
        num_blocks > 0 ? model->fvu_blocks() : std::vector<int64_t>();
    for (int64_t b = 0, begin = 0; b < num_blocks; begin += block_widths[b], ++b) {
      const double block_spread =
          spread_of(stats[first_block + 2 * b + 1].item<double>(), begin, block_widths[b]);
      const double block_error = stats[first_block + 2 * b].item<double>();
      last_block_fvu.push_back(block_spread > 0 ? block_error / block_spread : 0.0);
    }
    const OptimizerMemory memory = optimizer->Memory();
    peak_optimizer_bytes = std::max(peak_optimizer_bytes, memory.total());
    window_seconds += absl::ToDoubleSeconds(absl::Now() - step_start);
    ++window_steps;

    const bool last = done == options.total_steps;
    if (last && model->wants_calibration()) {
      const int64_t batches = std::max<int64_t>(1, options.init_rows / slice_rows);
      // With collective reads every rank reads as many rows as the rank that needs most.
      int64_t read_rows = batches * slice_rows;
      for (int r = 0; collective_reads && r < world; ++r) {
        const int64_t r_slice = global_batch * (r + 1) / world - global_batch * r / world;
        read_rows =
            std::max(read_rows, std::max<int64_t>(1, options.init_rows / r_slice) * r_slice);
      }
      std::vector<float> rows(read_rows * width);
      RETURN_IF_ERROR(stream->Read(0, read_rows, rows.data()));
      const torch::Tensor all =
          torch::from_blob(rows.data(), {batches * slice_rows, width}, torch::kFloat32)
              .to(options.device);
      std::string line;
      try {
        line = model->Calibrate(all.split(slice_rows));
      } catch (const c10::Error& e) {
        return absl::InternalError(
            absl::StrCat("calibrating after the last step: ", e.what_without_backtrace()));
      }
      if (leader && context != nullptr && !line.empty()) {
        context->Log(latentd::v1::LogLine::INFO, line);
      }
    }
    if (leader && (last || (options.telemetry_every > 0 && done % options.telemetry_every == 0))) {
      latentd::v1::TrainTelemetry sample;
      sample.set_step(done);
      sample.set_steps_total(options.total_steps);
      sample.set_loss(loss);
      sample.set_lr(lr);
      if (model->num_latents() > 0) {
        sample.set_fvu(last_fvu);
        sample.set_l0(last_l0);
        sample.set_aux_k_loss(last_aux_k);
        for (const double fvu : last_prefix_fvu) sample.add_prefix_fvu(fvu);
        for (const int64_t width : model->prefix_widths()) sample.add_prefix_widths(width);
        for (const double fvu : last_block_fvu) sample.add_block_fvu(fvu);
        const int64_t window = std::min(options.dead_window_steps, done);
        sample.set_dead_latents((steps_since_fired >= window).sum().item<int64_t>());
      }
      sample.set_step_seconds(window_seconds / window_steps);
      sample.set_rows_per_second(
          window_seconds > 0 ? static_cast<double>(global_batch * window_steps) / window_seconds
                             : 0);
      for (const auto& [name, bytes] : memory.components) {
        (*sample.mutable_optimizer_state_bytes())[name] = bytes;
      }
      sample.set_optimizer_state_total_bytes(memory.total());
      std::vector<torch::Tensor> grads;
      for (auto& p : params) grads.push_back(p.grad());
      const int64_t param_bytes = TensorListBytes(params);
      const int64_t grad_bytes = TensorListBytes(grads);
      sample.set_parameter_bytes(param_bytes);
      sample.set_gradient_bytes(grad_bytes);
      sample.set_dense_mfac_history_bytes(DenseMfacHistoryBytes(num_params, options.mfac_window));
      FillDeviceMemory(options.device, &sample);
      sample.set_tracked_tensor_bytes(param_bytes + grad_bytes + memory.total() +
                                      static_cast<int64_t>(host_batch.size() * sizeof(float)));
      result.last_telemetry = sample;
      if (context != nullptr) {
        latentd::v1::Telemetry telemetry;
        *telemetry.mutable_train() = sample;
        context->ReportTelemetry(telemetry);
        context->ReportProgress(done, options.total_steps, "steps");
      }
      window_seconds = 0;
      window_steps = 0;
    }
    if (done == options.crash_after_step) {
      return absl::AbortedError(absl::StrCat("simulated crash after step ", done));
    }
    // The last step is checkpointed too: a crash between the end of training and the artifact's
    // registration then resumes straight to writing the artifact.
    if (last || (options.checkpoint_every > 0 && done % options.checkpoint_every == 0)) {
      RETURN_IF_ERROR(checkpoint(done));
      last_checkpoint_step = done;
    }
  }
  result.steps = options.total_steps;
  result.final_loss = last_loss;
  result.final_fvu = last_fvu;
  result.final_l0 = last_l0;
  result.final_prefix_fvu = last_prefix_fvu;
  result.final_block_fvu = last_block_fvu;
  result.peak_optimizer_state_bytes = peak_optimizer_bytes;
  return result;
}

}  // namespace latentd::engine
