#include "engine/extract_pipeline.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "engine/device_util.h"
#include "engine/torch_status.h"

namespace latentd::engine {
namespace {

using Clock = std::chrono::steady_clock;

// One batch's output on the host. On a CUDA device the host tensors are filled by asynchronous
// copies: read them only after ready.Wait().
struct BatchOutput {
  int64_t batch = 0;
  int64_t first_row = 0;  // within the shard
  int64_t num_rows = 0;
  std::vector<int32_t> token_ids;
  at::Tensor finite;      // bool [n]
  at::Tensor indices;     // sparse: int32 [n, k] (fixed) or [nnz]
  at::Tensor values;      // sparse: float [n, k] or [nnz]; dense: float [n, d]
  at::Tensor row_counts;  // sparse ragged: int64 [n]
  DeviceFence ready;      // passed once the copies into the host tensors are done
  absl::Status status;
};

class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity) {}
  // False when stopped.
  bool Push(BatchOutput out, const std::atomic<bool>& stop) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return items_.size() < capacity_ || stop.load(); });
    if (stop.load()) return false;
    items_.push_back(std::move(out));
    cv_.notify_all();
    return true;
  }
  BatchOutput Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !items_.empty(); });
    BatchOutput out = std::move(items_.front());
    items_.pop_front();
    cv_.notify_all();
    return out;
  }
  void Wake() {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<BatchOutput> items_;
  size_t capacity_;
};

// A host copy of `t`: on a CUDA device an asynchronous copy into pinned memory (the batch's fence
// tells when all of them are done); CPU tensors are used in place.
at::Tensor ToHost(const at::Tensor& t) {
  if (!t.is_cuda()) return t.contiguous();
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  host.copy_(t, /*non_blocking=*/true);
  return host;
}

// Everything a replica does to one batch: tokens in, host-side codes out.
absl::Status ComputeBatch(const TokenSource& tokens, PipelineReplica* r,
                          const PipelineOptions& options, int64_t batch, BatchOutput* out) {
  const int64_t L = tokens.context_length();
  const int64_t first_seq = batch * options.batch_sequences;
  const int64_t seqs = std::min(options.batch_sequences, tokens.num_sequences() - first_seq);
  out->batch = batch;
  out->first_row = first_seq * L;
  out->num_rows = seqs * L;
  // On a CUDA device the ids go through pinned memory, so their upload does not wait for the
  // device to finish the previous batch (a pageable copy would synchronize the stream).
  const bool cuda = r->device.is_cuda();
  at::Tensor ids = at::empty({seqs, L}, at::TensorOptions(at::kLong).pinned_memory(cuda));
  int64_t* id_data = ids.data_ptr<int64_t>();
  RETURN_IF_ERROR(tokens.Read(first_seq, seqs, id_data));
  const int64_t vocab = r->model->vocab_size();
  out->token_ids.resize(seqs * L);
  for (int64_t i = 0; i < seqs * L; ++i) {
    if ((vocab > 0 && id_data[i] >= vocab) || id_data[i] > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "extract.tokens: token id ", id_data[i], " at row ", out->first_row + i, " (sequence ",
          tokens.first_sequence() + first_seq + i / L, ") >= vocab_size ", vocab));
    }
    out->token_ids[i] = static_cast<int32_t>(id_data[i]);
  }
  try {
    at::Tensor tok = ids.to(r->device, /*non_blocking=*/cuda);
    at::Tensor h = r->model->Forward(tok);
    at::Tensor x = h.reshape({seqs * L, h.size(-1)});
    at::Tensor finite = at::isfinite(x).all(1);
    out->finite = ToHost(finite);
    if (options.sparse) {
      SparseCodes codes = r->sae->EncodeSparse(x);
      out->indices = ToHost(codes.indices);
      out->values = ToHost(codes.values);
      if (!codes.fixed_k()) out->row_counts = ToHost(codes.row_counts);
    } else {
      out->values = ToHost(x);
    }
    out->ready.Record(r->device);
  } catch (const std::exception& e) {
    return TorchErrorStatus(e, absl::StrCat("batch ", batch, " on ", r->device.str()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PipelineResult> RunExtractPipeline(const TokenSource& tokens,
                                                  std::vector<PipelineReplica>* replicas,
                                                  RowSink* sink, const PipelineOptions& options,
                                                  const PipelineCallbacks& callbacks) {
  if (replicas->empty()) return absl::InvalidArgumentError("no device");
  if (options.batch_sequences < 1) return absl::InvalidArgumentError("extract.batch_sequences < 1");
  const int64_t L = tokens.context_length();
  const int64_t width = (*replicas)[0].model->hook_width();
  for (auto& r : *replicas) {
    if (options.sparse && !r.sae.has_value())
      return absl::InvalidArgumentError("extract.sae: missing");
    if (options.sparse && r.sae->config().d_in != width) {
      return absl::InvalidArgumentError(
          absl::StrCat("extract.sae: d_in ", r.sae->config().d_in, " != hook width ", width));
    }
    if (r.model->max_context() > 0 && L > r.model->max_context()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "extract.tokens.context_length: ", L, " > the model's context ", r.model->max_context()));
    }
  }
  const int64_t committed = sink->rows_committed();
  const int64_t batch_rows = options.batch_sequences * L;
  if (committed % batch_rows != 0 && committed != tokens.num_rows()) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset watermark ", committed, " is not on the batch grid of ", batch_rows,
                     " rows; was it written with another batch_sequences or context_length?"));
  }
  if (committed > tokens.num_rows()) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset holds ", committed, " rows, the shard only ", tokens.num_rows()));
  }
  const int64_t num_batches =
      (tokens.num_sequences() + options.batch_sequences - 1) / options.batch_sequences;
  const int64_t first_batch = committed == tokens.num_rows() ? num_batches : committed / batch_rows;
  const int n = static_cast<int>(replicas->size());
  const int64_t commit_rows = std::max<int64_t>(options.commit_rows, 1);

  std::atomic<bool> stop{false};
  std::vector<double> busy(n, 0.0);
  std::vector<std::unique_ptr<BoundedQueue>> queues;
  for (int i = 0; i < n; ++i)
    queues.push_back(std::make_unique<BoundedQueue>(std::max(1, options.queue_depth)));
  std::vector<std::thread> workers;
  for (int w = 0; w < n; ++w) {
    workers.emplace_back([&, w] {
      PipelineReplica* r = &(*replicas)[w];
      SetCpuThreadsForThisThread(r->cpu_threads);
      c10::InferenceMode inference;
      for (int64_t b = first_batch + w; b < num_batches && !stop.load(); b += n) {
        BatchOutput out;
        const auto t0 = Clock::now();
        out.status = ComputeBatch(tokens, r, options, b, &out);
        busy[w] += std::chrono::duration<double>(Clock::now() - t0).count();
        const bool failed = !out.status.ok();
        if (!queues[w]->Push(std::move(out), stop) || failed) break;
      }
    });
  }
  auto shutdown = [&] {
    stop.store(true);
    for (auto& q : queues) q->Wake();
    for (auto& t : workers) t.join();
  };

  PipelineResult result;
  const auto start = Clock::now();
  auto last_telemetry = start;
  int64_t bytes_estimate = 0;
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  std::vector<float> values;
  auto seconds_since_start = [&] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  auto bytes_committed = [&] {
    int64_t b = sink->bytes_committed();
    return b >= 0 ? b : bytes_estimate;
  };
  auto telemetry = [&](bool force) {
    if (!callbacks.telemetry) return;
    auto now = Clock::now();
    if (!force && std::chrono::duration<double>(now - last_telemetry).count() <
                      options.telemetry_interval_seconds) {
      return;
    }
    last_telemetry = now;
    latentd::v1::ExtractTelemetry t;
    t.set_rows_done(sink->rows_committed());
    t.set_rows_total(tokens.num_rows());
    const double s = seconds_since_start();
    t.set_tokens_per_second(s > 0 ? result.rows_this_run / s : 0);
    t.set_bytes_committed(bytes_committed());
    t.set_bytes_per_token(sink->rows_committed() > 0
                              ? static_cast<double>(bytes_committed()) / sink->rows_committed()
                              : 0);
    int64_t mem = 0;
    for (auto& r : *replicas) {
      mem = r.device.is_cuda() ? mem + DeviceMemoryInUse(r.device)
                               : std::max(mem, DeviceMemoryInUse(r.device));
    }
    t.set_device_memory_bytes(mem);
    t.set_host_rss_bytes(ProcessRssBytes());
    callbacks.telemetry(t);
  };
  int64_t pending_nnz = 0, pending_rows = 0, pending_skipped = 0;
  absl::Status status;
  // Where this run starts (0, or the watermark it resumes at): watchers see the total at once,
  // and the rate of the first commit is measured from here, even when it is the only one.
  if (callbacks.progress) callbacks.progress(committed, tokens.num_rows());
  for (int64_t b = first_batch; b < num_batches; ++b) {
    if (callbacks.cancelled && callbacks.cancelled()) {
      status = absl::CancelledError("extract cancelled");
      break;
    }
    BatchOutput out = queues[(b - first_batch) % n]->Pop();
    if (out.status.ok()) out.status = out.ready.Wait();
    if (!out.status.ok()) {
      status = out.status;
      break;
    }
    const int64_t rows = out.num_rows;
    const bool* finite = out.finite.data_ptr<bool>();
    int64_t skipped = 0;
    for (int64_t i = 0; i < rows; ++i) {
      if (finite[i]) continue;
      if (!options.skip_non_finite) {
        const int64_t row = out.first_row + i;
        status = absl::InvalidArgumentError(
            absl::StrCat("non-finite activation (NaN/Inf) at row ", row, " (sequence ",
                         tokens.first_sequence() + row / L, ", position ", row % L,
                         "); set extract.non_finite = NON_FINITE_SKIP to store such rows empty"));
        break;
      }
      ++skipped;
    }
    if (!status.ok()) break;
    if (options.sparse) {
      indptr.assign(1, 0);
      indices.clear();
      values.clear();
      const int32_t* idx = out.indices.data_ptr<int32_t>();
      const float* val = out.values.data_ptr<float>();
      if (!out.row_counts.defined()) {
        const int64_t k = out.indices.size(1);
        indices.reserve(rows * k);
        values.reserve(rows * k);
        for (int64_t i = 0; i < rows; ++i) {
          if (finite[i]) {
            for (int64_t j = i * k; j < (i + 1) * k; ++j) {
              if (val[j] != 0) {
                indices.push_back(idx[j]);
                values.push_back(val[j]);
              }
            }
          }
          indptr.push_back(static_cast<int64_t>(indices.size()));
        }
      } else {
        const int64_t* counts = out.row_counts.data_ptr<int64_t>();
        int64_t pos = 0;
        for (int64_t i = 0; i < rows; ++i) {
          if (finite[i]) {
            indices.insert(indices.end(), idx + pos, idx + pos + counts[i]);
            values.insert(values.end(), val + pos, val + pos + counts[i]);
          }
          pos += counts[i];
          indptr.push_back(static_cast<int64_t>(indices.size()));
        }
      }
      status = sink->AppendSparse(rows, indptr.data(), indices.data(), values.data(),
                                  out.token_ids.data());
      pending_nnz += static_cast<int64_t>(indices.size());
      bytes_estimate += rows * 4 + static_cast<int64_t>(indices.size()) * (4 + options.value_bytes);
    } else {
      float* val = out.values.data_ptr<float>();
      const int64_t d = out.values.size(1);
      for (int64_t i = 0; i < rows; ++i) {
        if (!finite[i]) std::fill(val + i * d, val + (i + 1) * d, 0.0f);
      }
      status = sink->AppendDense(rows, val, out.token_ids.data());
      bytes_estimate += rows * (4 + d * options.value_bytes);
    }
    if (!status.ok()) break;
    pending_rows += rows;
    pending_skipped += skipped;
    const bool last = b + 1 == num_batches;
    if (sink->rows_pending() >= commit_rows || last) {
      // Intermediate commits are written in the background while the next rows arrive; the
      // progress below reports what is durable.
      status = last ? sink->MarkComplete() : sink->CommitAsync();
      if (!status.ok()) break;
      result.rows_this_run += pending_rows;
      result.nnz_this_run += pending_nnz;
      result.rows_skipped_non_finite += pending_skipped;
      pending_rows = pending_nnz = pending_skipped = 0;
      if (callbacks.progress) callbacks.progress(sink->rows_committed(), tokens.num_rows());
      telemetry(last);
    }
  }
  shutdown();
  if (!status.ok()) {
    sink->WaitDurable().IgnoreError();  // a commit in flight lands (or fails) before we return
    return status;
  }
  if (first_batch >= num_batches && sink->rows_committed() == tokens.num_rows()) {
    RETURN_IF_ERROR(sink->MarkComplete());  // everything was committed before; only the flag
  }
  result.rows = sink->rows_committed();
  result.seconds = seconds_since_start();
  result.tokens_per_second = result.seconds > 0 ? result.rows_this_run / result.seconds : 0;
  result.bytes_committed = bytes_committed();
  result.device_busy_seconds = *std::max_element(busy.begin(), busy.end());
  return result;
}

namespace {

absl::StatusOr<double> ComputeFloorInThisThread(const TokenSource& tokens, PipelineReplica* replica,
                                                const PipelineOptions& options,
                                                int64_t max_sequences) {
  SetCpuThreadsForThisThread(replica->cpu_threads);
  c10::InferenceMode inference;
  const int64_t L = tokens.context_length();
  const int64_t total = std::min(max_sequences, tokens.num_sequences());
  std::vector<int64_t> ids(options.batch_sequences * L);
  const auto start = Clock::now();
  int64_t rows = 0;
  try {
    for (int64_t s = 0; s < total; s += options.batch_sequences) {
      const int64_t seqs = std::min(options.batch_sequences, total - s);
      RETURN_IF_ERROR(tokens.Read(s, seqs, ids.data()));
      at::Tensor tok = at::from_blob(ids.data(), {seqs, L}, at::kLong).to(replica->device);
      at::Tensor h = replica->model->Forward(tok);
      at::Tensor x = h.reshape({seqs * L, h.size(-1)});
      if (options.sparse) {
        SparseCodes codes = replica->sae->EncodeSparse(x);
        codes.values.sum().item<float>();  // waits for the device
      } else {
        x.sum().item<float>();
      }
      rows += seqs * L;
    }
  } catch (const std::exception& e) {
    return TorchErrorStatus(e, "compute floor");
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  return s > 0 ? rows / s : 0;
}

}  // namespace

absl::StatusOr<double> MeasureComputeFloorTokensPerSecond(const TokenSource& tokens,
                                                          PipelineReplica* replica,
                                                          const PipelineOptions& options,
                                                          int64_t max_sequences) {
  // In a thread of its own, as the pipeline's workers run: OpenMP and allocator state are per
  // thread, so the floor and the job see the same conditions.
  absl::StatusOr<double> result = absl::InternalError("not run");
  std::thread t(
      [&] { result = ComputeFloorInThisThread(tokens, replica, options, max_sequences); });
  t.join();
  return result;
}

}  // namespace latentd::engine
