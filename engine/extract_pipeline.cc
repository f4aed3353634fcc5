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

// One hook's codes of a batch, on the host.
struct HookCodes {
  at::Tensor fit;         // sparse: ReconstructionSums, float64 [4 + d]
  at::Tensor finite;      // bool [n]
  at::Tensor indices;     // sparse: int32 [n, k] (fixed) or [nnz]
  at::Tensor values;      // sparse: float [n, k] or [nnz]; dense: float [n, d]
  at::Tensor row_counts;  // sparse ragged: int64 [n]
};

// One batch's output on the host. On a CUDA device the host tensors are filled by asynchronous
// copies: read them only after ready.Wait().
struct BatchOutput {
  int64_t batch = 0;
  int64_t first_row = 0;  // within the shard
  int64_t num_rows = 0;
  std::vector<int32_t> token_ids;
  std::vector<HookCodes> hooks;  // one per output, in the model's hook order
  DeviceFence ready;             // passed once the copies into the host tensors are done
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
    ASSIGN_OR_RETURN(std::vector<at::Tensor> hooked, r->model->HooksOfRows(out->first_row, tok));
    const size_t outputs = options.sparse ? r->saes.size() : hooked.size();
    out->hooks.resize(outputs);
    auto rows_of = [&](const at::Tensor& t) { return t.reshape({seqs * L, t.size(-1)}); };
    // Kept to the end of the batch for predictions that add other outputs' codes (cross-layer
    // transcoders), whose fits are measured once every output is encoded.
    std::vector<SparseCodes> all_codes(options.sparse ? outputs : 0);
    const bool keep_codes =
        std::any_of(r->cross_decoders.begin(), r->cross_decoders.end(),
                    [](const std::vector<CrossLayerDecoder>& d) { return !d.empty(); });
    std::vector<at::Tensor> all_finite(outputs);
    auto cross = [&](size_t o) -> const std::vector<CrossLayerDecoder>& {
      static const std::vector<CrossLayerDecoder> kNone;
      return o < r->cross_decoders.size() ? r->cross_decoders[o] : kNone;
    };
    // An SAE's reconstruction against its own hook, a transcoder's prediction against the hook
    // it predicts (rows where everything it is computed from is finite).
    auto measure_fit = [&](size_t o, const at::Tensor& x, at::Tensor prediction) {
      const int target = r->fit_hooks.empty() ? static_cast<int>(o) : r->fit_hooks[o];
      if (target < 0) return;
      const bool own = target == static_cast<int>(o);
      const at::Tensor y = own ? x : rows_of(hooked[target]);
      at::Tensor keep = own ? all_finite[o] : all_finite[o].logical_and(at::isfinite(y).all(1));
      for (const CrossLayerDecoder& d : cross(o)) {
        prediction.add_(DecodeSparseCodes(d.W_dec, at::Tensor(), all_codes[d.source], seqs * L));
        keep = keep.logical_and(all_finite[d.source]);
      }
      out->hooks[o].fit = ToHost(ReconstructionSums(y, prediction, keep));
    };
    for (size_t o = 0; o < outputs; ++o) {
      HookCodes& codes_out = out->hooks[o];
      at::Tensor x = rows_of(hooked[o]);
      hooked[o].reset();  // freed once encoded (or copied), before the next hook's encoder runs
      all_finite[o] = at::isfinite(x).all(1);
      codes_out.finite = ToHost(all_finite[o]);
      if (options.sparse) {
        const Sae& sae = r->saes[o];
        SparseCodes codes = sae.EncodeSparse(x);
        if (cross(o).empty()) measure_fit(o, x, sae.Predict(x, codes));
        codes_out.indices = ToHost(codes.indices);
        codes_out.values = ToHost(codes.values);
        if (!codes.fixed_k()) codes_out.row_counts = ToHost(codes.row_counts);
        if (keep_codes) all_codes[o] = std::move(codes);
      } else {
        codes_out.values = ToHost(x);
      }
    }
    for (size_t o = 0; options.sparse && o < outputs; ++o) {
      if (cross(o).empty()) continue;
      measure_fit(o, at::Tensor(), r->saes[o].DecodeSparse(all_codes[o], seqs * L));
    }
    out->ready.Record(r->device);
  } catch (const std::exception& e) {
    return TorchErrorStatus(e, absl::StrCat("batch ", batch, " on ", r->device.str()));
  }
  return absl::OkStatus();
}

// The committer's buffers for a batch's CSR rows, kept across batches.
struct CsrScratch {
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  std::vector<float> values;
};

// Appends one hook's codes of a batch to its sink (rows with NaN/Inf stored empty or as zeros;
// the caller has checked the policy allows them). Adds the nonzeros appended to *nnz.
absl::Status AppendBatch(const BatchOutput& out, const HookCodes& codes, bool sparse,
                         CsrScratch* scratch, RowSink* sink, int64_t* nnz) {
  const int64_t rows = out.num_rows;
  const bool* finite = codes.finite.data_ptr<bool>();
  if (!sparse) {
    float* val = codes.values.data_ptr<float>();
    const int64_t d = codes.values.size(1);
    for (int64_t i = 0; i < rows; ++i) {
      if (!finite[i]) std::fill(val + i * d, val + (i + 1) * d, 0.0f);
    }
    return sink->AppendDense(rows, val, out.token_ids.data());
  }
  std::vector<int64_t>& indptr = scratch->indptr;
  std::vector<int32_t>& indices = scratch->indices;
  std::vector<float>& values = scratch->values;
  indptr.assign(1, 0);
  indices.clear();
  values.clear();
  const int32_t* idx = codes.indices.data_ptr<int32_t>();
  const float* val = codes.values.data_ptr<float>();
  if (!codes.row_counts.defined()) {
    const int64_t k = codes.indices.size(1);
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
    const int64_t* counts = codes.row_counts.data_ptr<int64_t>();
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
  *nnz += static_cast<int64_t>(indices.size());
  return sink->AppendSparse(rows, indptr.data(), indices.data(), values.data(),
                            out.token_ids.data());
}

}  // namespace

absl::StatusOr<PipelineResult> RunExtractPipeline(const TokenSource& tokens,
                                                  std::vector<PipelineReplica>* replicas,
                                                  RowSink* sink, const PipelineOptions& options,
                                                  const PipelineCallbacks& callbacks) {
  return RunExtractPipeline(tokens, replicas, std::vector<RowSink*>{sink}, options, callbacks);
}

absl::StatusOr<PipelineResult> RunExtractPipeline(const TokenSource& tokens,
                                                  std::vector<PipelineReplica>* replicas,
                                                  const std::vector<RowSink*>& sinks,
                                                  const PipelineOptions& options,
                                                  const PipelineCallbacks& callbacks) {
  if (replicas->empty()) return absl::InvalidArgumentError("no device");
  if (options.batch_sequences < 1) return absl::InvalidArgumentError("extract.batch_sequences < 1");
  const int64_t L = tokens.context_length();
  const size_t outputs = sinks.size();
  for (auto& r : *replicas) {
    const std::vector<int64_t> widths = r.model->hook_widths();
    if (widths.size() != outputs && (!options.sparse || widths.size() < outputs)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model reads ", widths.size(), " hooks for ", outputs, " datasets"));
    }
    if (options.sparse && r.saes.size() != outputs) {
      return absl::InvalidArgumentError(
          absl::StrCat("extract.sae: ", r.saes.size(), " SAEs for ", outputs, " hooks"));
    }
    if (options.sparse && !r.fit_hooks.empty() && r.fit_hooks.size() != outputs) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.fit_hooks.size(), " fit hooks for ", outputs, " outputs"));
    }
    for (size_t o = 0; options.sparse && o < r.cross_decoders.size(); ++o) {
      for (const CrossLayerDecoder& d : r.cross_decoders[o]) {
        if (o >= outputs || d.source < 0 || d.source >= static_cast<int>(outputs) ||
            r.saes[o].config().skip ||
            d.W_dec.sizes() !=
                at::IntArrayRef({r.saes[d.source].config().d_sae, r.saes[o].config().OutWidth()})) {
          return absl::InvalidArgumentError(absl::StrCat(
              "extract.sae of output ", o, ": a cross-layer decoder that does not fit output ",
              d.source, "'s latents or this output's prediction"));
        }
      }
    }
    for (size_t o = 0; options.sparse && o < outputs; ++o) {
      const SaeConfig& cfg = r.saes[o].config();
      if (cfg.d_in != widths[o]) {
        return absl::InvalidArgumentError(absl::StrCat("extract.sae of output ", o, ": d_in ",
                                                       cfg.d_in, " != hook width ", widths[o]));
      }
      const int target = r.fit_hooks.empty() ? static_cast<int>(o) : r.fit_hooks[o];
      if (target < 0) continue;  // not measured
      if (target >= static_cast<int>(widths.size()) || cfg.OutWidth() != widths[target]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "extract.sae of output ", o, ": it predicts ", cfg.OutWidth(),
            " values a row, the hook it is measured against (model hook ", target, ") has ",
            target >= 0 && target < static_cast<int>(widths.size()) ? widths[target] : 0));
      }
    }
    if (r.model->max_context() > 0 && L > r.model->max_context()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "extract.tokens.context_length: ", L, " > the model's context ", r.model->max_context()));
    }
  }
  const int64_t batch_rows = options.batch_sequences * L;
  // Each output resumes at its own watermark (a crash can fall between two outputs' commits):
  // the model runs from the earliest one, and an output takes only the batches past its own.
  std::vector<int64_t> next_row(outputs);
  int64_t committed = tokens.num_rows();
  for (size_t o = 0; o < outputs; ++o) {
    next_row[o] = sinks[o]->rows_committed();
    if (next_row[o] % batch_rows != 0 && next_row[o] != tokens.num_rows()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "dataset watermark ", next_row[o], " is not on the batch grid of ", batch_rows,
          " rows; was it written with another batch_sequences or context_length?"));
    }
    if (next_row[o] > tokens.num_rows()) {
      return absl::FailedPreconditionError(
          absl::StrCat("dataset holds ", next_row[o], " rows, the shard only ", tokens.num_rows()));
    }
    committed = std::min(committed, next_row[o]);
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
  result.outputs.resize(outputs);
  const auto start = Clock::now();
  auto last_telemetry = start;
  std::vector<int64_t> bytes_estimate(outputs, 0);
  auto seconds_since_start = [&] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  auto bytes_committed = [&](size_t o) {
    int64_t b = sinks[o]->bytes_committed();
    return b >= 0 ? b : bytes_estimate[o];
  };
  // What every output holds: the rows progress reports.
  auto rows_done = [&] {
    int64_t rows = tokens.num_rows();
    for (RowSink* sink : sinks) rows = std::min(rows, sink->rows_committed());
    return rows;
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
    const int64_t done = rows_done();
    t.set_rows_done(done);
    t.set_rows_total(tokens.num_rows());
    const double s = seconds_since_start();
    t.set_tokens_per_second(s > 0 ? (done - committed) / s : 0);
    int64_t bytes = 0, rows_stored = 0;
    for (size_t o = 0; o < outputs; ++o) {
      bytes += bytes_committed(o);
      rows_stored += sinks[o]->rows_committed();
    }
    t.set_bytes_committed(bytes);
    t.set_bytes_per_token(rows_stored > 0 ? static_cast<double>(bytes) / rows_stored : 0);
    int64_t mem = 0;
    for (auto& r : *replicas) {
      mem = r.device.is_cuda() ? mem + DeviceMemoryInUse(r.device)
                               : std::max(mem, DeviceMemoryInUse(r.device));
    }
    t.set_device_memory_bytes(mem);
    t.set_host_rss_bytes(ProcessRssBytes());
    if (result.outputs[0].fit.rows > 0) {
      t.set_explained_variance(result.outputs[0].fit.explained_variance());
    }
    callbacks.telemetry(t);
  };
  struct Pending {
    int64_t rows = 0, nnz = 0, skipped = 0;
  };
  std::vector<Pending> pending(outputs);
  CsrScratch scratch;
  absl::Status status;
  // Where this run starts (0, or the watermark it resumes at): watchers see the total at once,
  // and the rate of the first commit is measured from here, even when it is the only one.
  if (callbacks.progress) callbacks.progress(committed, tokens.num_rows());
  for (int64_t b = first_batch; b < num_batches && status.ok(); ++b) {
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
    const bool last = b + 1 == num_batches;
    // Every output's rows are checked before any output stores the batch, so a failure leaves
    // all of them at their last commit before it.
    std::vector<int64_t> skipped(outputs, 0);
    for (size_t o = 0; o < outputs && status.ok(); ++o) {
      if (out.first_row < next_row[o]) continue;  // this output committed the batch before
      const bool* finite = out.hooks[o].finite.data_ptr<bool>();
      for (int64_t i = 0; i < out.num_rows; ++i) {
        if (finite[i]) continue;
        if (!options.skip_non_finite) {
          const int64_t row = out.first_row + i;
          status = absl::InvalidArgumentError(
              absl::StrCat("non-finite activation (NaN/Inf) at row ", row, " (sequence ",
                           tokens.first_sequence() + row / L, ", position ", row % L, ")",
                           outputs > 1 ? absl::StrCat(" of output ", o) : "",
                           "; set extract.non_finite = NON_FINITE_SKIP to store such rows empty"));
          break;
        }
        ++skipped[o];
      }
    }
    bool committed_any = false;
    for (size_t o = 0; o < outputs && status.ok(); ++o) {
      if (out.first_row < next_row[o]) continue;
      const HookCodes& codes = out.hooks[o];
      int64_t nnz = 0;
      status = AppendBatch(out, codes, options.sparse, &scratch, sinks[o], &nnz);
      if (!status.ok()) break;
      next_row[o] += out.num_rows;
      bytes_estimate[o] +=
          out.num_rows * 4 + (options.sparse ? nnz * (4 + options.value_bytes)
                                             : codes.values.numel() * options.value_bytes);
      pending[o].rows += out.num_rows;
      pending[o].nnz += nnz;
      pending[o].skipped += skipped[o];
      if (codes.fit.defined()) {  // (no early return here: the workers must be stopped first)
        auto fit =
            storage::ReconstructionFit::FromSums(codes.fit.data_ptr<double>(), codes.fit.numel());
        status = fit.status();
        if (status.ok()) status = sinks[o]->AddReconstructionSums(*fit);
        if (status.ok()) status = result.outputs[o].fit.Add(*fit);
        if (!status.ok()) break;
      }
      if (pending[o].rows >= commit_rows || last) {
        // Intermediate commits are written in the background while the next rows arrive; the
        // progress below reports what is durable.
        status = last ? sinks[o]->MarkComplete() : sinks[o]->CommitAsync();
        if (!status.ok()) break;
        PipelineOutputResult& done = result.outputs[o];
        done.rows_this_run += pending[o].rows;
        done.nnz_this_run += pending[o].nnz;
        done.rows_skipped_non_finite += pending[o].skipped;
        pending[o] = Pending();
        committed_any = true;
      }
    }
    if (!status.ok()) break;
    if (committed_any) {
      if (callbacks.progress) callbacks.progress(rows_done(), tokens.num_rows());
      telemetry(last);
    }
  }
  shutdown();
  if (!status.ok()) {
    // Commits in flight land (or fail) before we return.
    for (RowSink* sink : sinks) sink->WaitDurable().IgnoreError();
    return status;
  }
  for (size_t o = 0; o < outputs; ++o) {
    // Everything was committed before (a resumed complete dataset); only the flag.
    if (next_row[o] == tokens.num_rows() && result.outputs[o].rows_this_run == 0) {
      RETURN_IF_ERROR(sinks[o]->MarkComplete());
    }
    PipelineOutputResult& done = result.outputs[o];
    done.rows = sinks[o]->rows_committed();
    done.bytes_committed = bytes_committed(o);
    result.nnz_this_run += done.nnz_this_run;
    result.rows_skipped_non_finite += done.rows_skipped_non_finite;
  }
  result.rows = rows_done();
  result.rows_this_run = result.rows - committed;
  result.seconds = seconds_since_start();
  result.tokens_per_second = result.seconds > 0 ? result.rows_this_run / result.seconds : 0;
  result.bytes_committed = 0;
  for (const PipelineOutputResult& done : result.outputs) {
    result.bytes_committed += done.bytes_committed;
  }
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
      ASSIGN_OR_RETURN(const std::vector<at::Tensor> hooked,
                       replica->model->HooksOfRows(s * L, tok));
      const size_t outputs = options.sparse ? replica->saes.size() : hooked.size();
      for (size_t o = 0; o < outputs; ++o) {
        at::Tensor x = hooked[o].reshape({seqs * L, hooked[o].size(-1)});
        if (options.sparse) {
          SparseCodes codes = replica->saes[o].EncodeSparse(x);
          codes.values.sum().item<float>();  // waits for the device
        } else {
          x.sum().item<float>();
        }
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
