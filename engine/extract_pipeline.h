// The EXTRACT pipeline: token batches -> forward on each device -> SAE encode + TopK on the device
// (only indices and values leave it) -> host buffers -> one committer (the calling thread)
// appending rows in order and committing every commit_rows rows -> progress and telemetry.
// A model with several hooks fills several sinks (outputs) from one forward pass, each hook
// encoded by its own SAE.
//
// Batches lie on a fixed grid of the shard (batch b = sequences [b*B, (b+1)*B)). With n replicas,
// batch b goes to replica b mod n: every replica works on its own contiguous sequence ranges and
// holds its activations until the committer takes them, in order, from a bounded queue (depth
// queue_depth per replica), so memory is bounded whatever the dataset size and device work
// overlaps storage. Commits happen only at batch boundaries, so the watermark is always on the
// grid: a resumed run (same spec) recomputes exactly the batches an uninterrupted run would have
// computed after that point, and the final rows are identical. Outputs keep their own
// watermarks: the model runs from the earliest, and each output takes the batches past its own.
#ifndef LATENTD_ENGINE_EXTRACT_PIPELINE_H_
#define LATENTD_ENGINE_EXTRACT_PIPELINE_H_

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/activation_model.h"
#include "engine/row_sink.h"
#include "engine/sae.h"
#include "engine/token_source.h"
#include "proto/latentd/v1/extract.pb.h"
#include "storage/reconstruction_fit.h"

namespace latentd::engine {

// Part of another output's prediction: the codes of output `source`, decoded by W_dec [d_sae of
// source, d_out] (a cross-layer transcoder's latents of an earlier layer writing to this one).
struct CrossLayerDecoder {
  int source = 0;
  at::Tensor W_dec;  // on the replica's device
};

struct PipelineReplica {
  // Its first hooks are the outputs' (one per sink, in order); any after them are only what
  // transcoders predict (fit_hooks).
  std::unique_ptr<ActivationModel> model;
  std::vector<Sae> saes;  // sparse: one per output, on `device`
  // Sparse: per output, the model hook whose activation its SAE's prediction is measured against
  // (PipelineOutputResult::fit): the output's own hook for an SAE, a transcoder's output hook
  // for a transcoder; -1: not measured. Empty: every output's own.
  std::vector<int> fit_hooks;
  // Sparse: per output, the decoders of other outputs' codes its prediction adds (a cross-layer
  // transcoder's layer L: its layers 0..L-1); empty: none. Only for outputs without a skip
  // connection (the prediction is then decoded from codes alone).
  std::vector<std::vector<CrossLayerDecoder>> cross_decoders;
  at::Device device = at::kCPU;
  int cpu_threads = 0;  // intra-op threads of this replica's worker; 0 = leave alone
};

struct PipelineOptions {
  bool sparse = true;
  int64_t batch_sequences = 32;  // sequences per forward
  int64_t commit_rows = 16384;   // commit once this many rows are pending (rounded up to batches)
  bool skip_non_finite = false;  // false: fail naming the row; true: store the row empty / zeros
  int queue_depth = 2;           // finished batches a replica may hold before it waits
  double telemetry_interval_seconds = 1.0;
  int value_bytes = 2;  // bytes per stored value (fp16/bf16: 2, fp32: 4), for the bytes estimate
};

struct PipelineCallbacks {
  std::function<bool()> cancelled;                                      // may be empty
  std::function<void(int64_t rows_done, int64_t rows_total)> progress;  // after each commit
  std::function<void(const latentd::v1::ExtractTelemetry&)> telemetry;  // rate-limited
};

struct PipelineOutputResult {
  int64_t rows = 0;  // rows in the output's sink at the end (committed)
  int64_t rows_this_run = 0;
  int64_t nnz_this_run = 0;
  int64_t rows_skipped_non_finite = 0;
  int64_t bytes_committed = 0;  // the sink's figure, else an estimate of the stored bytes
  // Sparse: how well the SAE reconstructs the rows this run stored (rows with NaN/Inf left
  // out); the same sums went to the sink with the rows.
  storage::ReconstructionFit fit;
};

struct PipelineResult {
  int64_t rows = 0;           // rows every sink holds at the end (committed)
  int64_t rows_this_run = 0;  // rows the model ran over in this call (from the earliest watermark)
  int64_t nnz_this_run = 0;   // over all outputs
  int64_t rows_skipped_non_finite = 0;  // over all outputs
  double seconds = 0;
  double tokens_per_second = 0;               // rows_this_run / seconds
  int64_t bytes_committed = 0;                // over all outputs
  std::vector<PipelineOutputResult> outputs;  // one per sink
  // Seconds the busiest replica's worker spent on batches (tokens in, codes on the host); against
  // `seconds` it shows how much of the wall time storage and bookkeeping add, in the same run.
  // On CUDA devices the worker only queues the work (copies complete asynchronously), so this
  // counts its host-side time and a device that keeps up shows less than the wall time.
  double device_busy_seconds = 0;
};

// Runs the shard from sink->rows_committed() to the end, then MarkComplete(). CANCELLED when
// callbacks.cancelled() turns true (what was committed stays); on any failure nothing beyond the
// last commit is written. Errors: INVALID_ARGUMENT (token id >= vocab, non-finite activations
// under the fail policy, hook width != SAE d_in), RESOURCE_EXHAUSTED (device out of memory),
// FAILED_PRECONDITION (a watermark off the sequence grid), the sink's errors.
absl::StatusOr<PipelineResult> RunExtractPipeline(const TokenSource& tokens,
                                                  std::vector<PipelineReplica>* replicas,
                                                  RowSink* sink, const PipelineOptions& options,
                                                  const PipelineCallbacks& callbacks);
// One sink per model hook: sinks[o] gets hook o's rows (encoded by saes[o] when sparse). Each sink
// commits on its own; progress reports the rows every sink holds. A failure leaves every sink at
// its last commit.
absl::StatusOr<PipelineResult> RunExtractPipeline(const TokenSource& tokens,
                                                  std::vector<PipelineReplica>* replicas,
                                                  const std::vector<RowSink*>& sinks,
                                                  const PipelineOptions& options,
                                                  const PipelineCallbacks& callbacks);

// Forward + encode (every output) alone over the first `max_sequences` sequences on replica 0,
// nothing stored or copied beyond what the encoder returns: the compute floor the bench compares
// the pipeline to.
absl::StatusOr<double> MeasureComputeFloorTokensPerSecond(const TokenSource& tokens,
                                                          PipelineReplica* replica,
                                                          const PipelineOptions& options,
                                                          int64_t max_sequences);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_EXTRACT_PIPELINE_H_
