// The SAE and model that made a SPARSE dataset (named by its EXTRACT job's spec), loaded on the
// CPU on demand, checked against the hashes the dataset recorded (so no answer describes other
// weights than the stored latents') and cached, for two questions no stored row answers:
//
// 1. What a latent's weights say (ReadLatentWeights): the latents whose decoder directions lie
//    nearest (cosine), and the direct effect of its decoder direction on the output logits
//    (SAEDashboard's neighbour and top/bottom logit tables). u = W_dec[j]; for mlp.hook_post
//    hooks u = u W_out of the hooked block (into the residual stream); logits = W_U^T u. The
//    final norm is not folded in (as SAEDashboard on a model loaded without fold_ln): logits rank
//    tokens, their scale is indicative only.
// 2. Which latents fire on a new prompt (EncodePrompt), Neuronpedia's search by text, encoded as
//    EXTRACT encoded the dataset's sequences.
// 3. What a latent does to the model's output (SteerPrompt, steering.h): the prompt run and
//    continued with the latent ablated, clamped or added, beside the model as it is; and
//    which latents drive a prediction (AttributePrompt, attribution.h).
//
// Torch-free header (the Datasets service includes it).
#ifndef LATENTD_ENGINE_DATASET_MODELS_H_
#define LATENTD_ENGINE_DATASET_MODELS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/attribution.h"
#include "engine/extract_runner.h"
#include "engine/latent_scaling.h"
#include "engine/steering.h"

namespace latentd::engine {

// The unembedding names tried, in order, on a TorchScript model when the query names none:
// untied heads first, then tied input embeddings (Hugging Face drops a tied lm_head.weight from
// named_parameters, leaving only the embedding).
inline constexpr const char* kUnembeddingCandidates[] = {
    "lm_head.weight",         "embed_out.weight",          "unembed.W_U", "W_U",
    "transformer.wte.weight", "model.embed_tokens.weight", "embed.W_E"};
// Of those, the input embeddings (the answer says "(tied)").
inline constexpr const char* kTiedEmbeddings[] = {"transformer.wte.weight",
                                                  "model.embed_tokens.weight", "embed.W_E"};

inline constexpr int kMaxLatentWeightsTopN = 1000;

struct LatentWeightsQuery {
  int64_t latent = 0;
  // Neighbours, and logits of each sign; 0: 10. At most kMaxLatentWeightsTopN.
  int top_n = 0;
  // TorchScript models: the parameter holding the unembedding; empty: the first of
  // kUnembeddingCandidates the module has. Must be empty for the reference model.
  std::string unembedding;
  // Also the decoder row itself (LatentWeights::decoder). Default false.
  bool decoder = false;
};

struct ScoredIndex {
  int64_t index = 0;  // a latent (neighbours) or a token id (logits)
  float score = 0;    // cosine or logit
};

struct SourceDecoder {
  std::string hook_name;  // latentd.json's; "" where it names none
  // |W_dec_s[j]| at the crosscoder's training scale (latentd.json's training_scale; the saved
  // file's units where it has none), the norms training compared.
  float norm = 0;
  float share = 0;              // norm / the sum over sources; 0 when every norm is 0
  float cosine_with_first = 0;  // cos(W_dec_s[j], W_dec_0[j]); 0 where either is 0
  // W_dec_s[j] through the unembedding of the model that source came from (for model diffing,
  // each model's own), as an SAE's logits are; logits_unavailable says why there are none.
  std::vector<ScoredIndex> positive_logits, negative_logits;
  std::string logits_source, logits_unavailable;
};

struct LatentWeights {
  float decoder_norm = 0;                    // |W_dec[j]|
  float encoder_norm = 0;                    // |W_enc[:, j]|
  float encoder_decoder_cosine = 0;          // cos(W_enc[:, j], W_dec[j]); 0 when either is 0
  std::vector<ScoredIndex> neighbors;        // other latents, cosine descending, ties by index
  std::vector<ScoredIndex> positive_logits;  // logit descending
  std::vector<ScoredIndex> negative_logits;  // logit ascending
  std::string logits_source;       // "embed.W_E (tied)", "lm_head.weight", ...; "" without logits
  std::string logits_unavailable;  // why there are no logits; "" with them
  // A latent of a cross-layer transcoder's layer L: the norm of its decoder into each layer from
  // L on (the fields above are of the one into L), and the logits unembed the sum of those
  // decoders, everything it writes to the residual stream. Empty for other SAEs.
  std::vector<std::pair<int, float>> decoder_norm_by_layer;
  // A crosscoder's latent: its decoder into each source, in source order, each with its own
  // logits; the fields above are of the whole decoder row (every source's side by side), and
  // the logits are per source only (each source is a hook or a model of its own). Empty for
  // other SAEs.
  std::vector<SourceDecoder> decoder_by_source;
  // With LatentWeightsQuery::decoder: W_dec[j], the direction the latent writes into the hook
  // its decoder predicts (a crosscoder's: every source's block side by side; a cross-layer
  // transcoder's: the one into its own layer), as the neighbours compare it. Empty otherwise.
  std::vector<float> decoder;
};

inline constexpr int64_t kMaxPromptTokens = 4096;
// The model for prompts keeps the last prompt's activations at every hook when they take at most
// this many bytes (128 tokens x 768 x 12 hooks x 4 B: 4.7 MB), so that the same prompt sent to
// each dataset of an SAE suite runs the model once; counted in the cache with the model.
inline constexpr int64_t kLastPromptActivationBytes = int64_t{16} << 20;

struct PromptQuery {
  std::vector<int64_t> token_ids;  // the prompt, without BOS; 1 to kMaxPromptTokens ids
  int latents_per_token = 0;       // latents listed per token, value descending; 0: 10
  int top_latents = 0;             // latents over the whole prompt, by max value; 0: 20
};

struct PromptToken {
  int64_t token_id = 0;
  int64_t active = 0;                // latents firing on it
  std::vector<ScoredIndex> latents;  // the largest latents_per_token, value descending
};

struct PromptLatent {
  int64_t latent = 0;
  float max_value = 0;    // its largest value over the prompt
  int64_t position = 0;   // where (first on ties), counting a prepended BOS
  int64_t positions = 0;  // tokens it fires on
};

struct PromptLatents {
  bool bos_prepended = false;       // the dataset's spec prepends BOS, so the prompt got one
  std::vector<PromptToken> tokens;  // one per position, BOS included
  std::vector<PromptLatent> top;    // by max value, ties by latent
};

struct SaeComparisonQuery {
  std::vector<int64_t> latents;  // the first SAE's latents to match; empty: all, or a sample
  int64_t sample = 0;            // with no latents: this many, evenly spread; 0: every latent
  int bins = 0;                  // histogram bins over [-1, 1]; 0: 20, at most 1000
};

struct SaeComparison {
  std::vector<int64_t> latents;    // compared, ascending
  std::vector<int64_t> best;       // per compared latent: the other SAE's nearest latent
  std::vector<float> best_cosine;  // and its decoder cosine
  double mean_best_cosine = 0;
  std::vector<int64_t> histogram;  // best cosines in equal bins over [-1, 1]
};

// Which weights made a dataset (from its metadata).
struct DatasetSource {
  uint64_t dataset_id = 0;
  uint64_t job_id = 0;            // the EXTRACT job that wrote it (its spec names SAE and model)
  std::string sae_weight_hash;    // "" for datasets written before it was recorded: not checked
  std::string model_weight_hash;  // "" : not checked
  int64_t d_sae = 0;
  // Which of the job's outputs (ExtractSpec.more_outputs) wrote it; "": the first.
  std::string name;
  // The hook the dataset's rows were read at (which layer of a circuit-tracer release its SAE
  // is); "": not known, fine for every other layout.
  std::string hook_name;
  // A transcoder's output hook, as the dataset recorded it (its decoder directions live there,
  // and the logit tables unembed from there); "": an SAE, whose decoder writes its own hook.
  std::string hook_name_out;
};

struct DatasetModelsOptions {
  // Bytes kept loaded between queries (for weights: unit decoder rows and unembeddings; for
  // prompts: the SAE, and the model, one for all datasets made with the same weights, built with
  // the hooks they were asked at), least recently used dropped first; what is larger than this
  // is loaded for each query. Default 2 GiB.
  int64_t cache_bytes = int64_t{2} << 30;
  // Host memory reading an SAE may take (its file, W_enc and W_dec as float32, the unit
  // decoder rows); more is RESOURCE_EXHAUSTED with the numbers instead of an allocation that
  // could take the daemon down. Default 0: the host's available memory at the time.
  int64_t memory_limit_bytes = 0;
  // Work one CompareSaes call may do, in multiply-adds (compared latents x the other SAE's
  // latents x d_in). Default 2^36: 0.65-0.8 s on this project's 2-core machines (bench).
  int64_t max_compare_macs = int64_t{1} << 36;
};

// Thread-safe. Everything runs on the CPU: a weights query is two matrix-vector products, a
// prompt one short forward and encode, and the devices belong to jobs.
class DatasetModels {
 public:
  // env: data roots, the artifact directory and find_job (required).
  explicit DatasetModels(ExtractEnv env, DatasetModelsOptions options = {});
  ~DatasetModels();
  DatasetModels(const DatasetModels&) = delete;
  DatasetModels& operator=(const DatasetModels&) = delete;

  // RESOURCE_EXHAUSTED when the SAE does not fit in memory_limit_bytes (with the numbers);
  // INVALID_ARGUMENT for top_n outside [0, 1000] or an unembedding named for the reference model
  // or absent from the module, or latent outside [0, d_sae); FAILED_PRECONDITION
  // when the job record is gone or is not an EXTRACT job with an SAE, or its SAE (file or
  // artifact) was deleted or no longer has the recorded hash; PERMISSION_DENIED when the SAE no
  // longer lies under a data root.
  // A model that changed since, or has no unembedding, leaves the logits empty and says why.
  absl::StatusOr<LatentWeights> ReadLatentWeights(const DatasetSource& dataset,
                                                  const LatentWeightsQuery& query);

  // How far two SAEs learned the same directions (two SAEs trained on the same activations
  // with different optimizers, seeds or widths): for each compared latent of `dataset`'s SAE
  // the latent of `other`'s SAE with the nearest decoder direction (cosine), their mean and
  // histogram, the measure of SAE universality papers report. INVALID_ARGUMENT for a latent
  // outside the first SAE, a negative sample, bins outside [0, 1000]; FAILED_PRECONDITION for
  // SAEs of different d_in (their directions live in different spaces); RESOURCE_EXHAUSTED with
  // the numbers above max_compare_macs (ask a sample).
  absl::StatusOr<SaeComparison> CompareSaes(const DatasetSource& dataset,
                                            const DatasetSource& other,
                                            const SaeComparisonQuery& query);

  // The dataset's latents on a new prompt: its model and SAE (loaded on the CPU, checked against
  // the recorded hashes, cached) run over the tokens as EXTRACT ran over each sequence, with BOS
  // prepended when the dataset's spec did; per token its largest latents, and the latents with
  // the largest values anywhere in the prompt. INVALID_ARGUMENT naming token_ids (empty, too
  // long for the model or kMaxPromptTokens, an id outside the vocabulary), latents_per_token or
  // top_latents; FAILED_PRECONDITION as ReadLatentWeights, and when the model changed since or
  // gives non-finite activations.
  absl::StatusOr<PromptLatents> EncodePrompt(const DatasetSource& dataset,
                                             const PromptQuery& query);

  // The prompt run through the dataset's model with query.interventions on its SAE's latents
  // (steering.h), and continued, beside the clean run: the same model and SAE as EncodePrompt
  // (cached and shared with it), BOS prepended as the dataset's spec did, on the CPU. The model
  // runs one query at a time (a long generation holds it). Errors as EncodePrompt, and
  // steering.h's; FAILED_PRECONDITION for a crosscoder over two models, a cross-layer
  // transcoder of more layers than the model and a model that cannot run to its logits
  // (TorchScript); CANCELLED when `cancelled` says so between generated tokens.
  // `more`: other datasets' SAEs (of the same model and weights, e.g. the other hooks of the
  // job) whose latents the steered runs change too; FAILED_PRECONDITION naming
  // more_interventions[k] for one of another model.
  absl::StatusOr<SteeringResult> SteerPrompt(
      const DatasetSource& dataset, const SteeringQuery& query,
      const std::function<bool()>& cancelled,
      const std::vector<std::pair<DatasetSource, std::vector<LatentIntervention>>>& more = {});

  // Which of the SAE's latents, where in the prompt, drive the model's next-token prediction
  // (attribution.h): one forward and backward pass of the dataset's model and SAE (those of
  // SteerPrompt) on the CPU. Errors as SteerPrompt's, and attribution.h's; RESOURCE_EXHAUSTED
  // with the numbers when the backward pass's activations (every block's, over the prompt)
  // would pass memory_limit_bytes. With query.target_latent, `target_dataset` is the dataset
  // whose latent it is: SPARSE, of the same model (same spec and weights), or a crosscoder over
  // several models one of whose sources is that model (read there, the others run beside it;
  // else FAILED_PRECONDITION, or INVALID_ARGUMENT naming target_latent.dataset_id).
  absl::StatusOr<AttributionResult> AttributePrompt(const DatasetSource& dataset,
                                                    const AttributionQuery& query,
                                                    const DatasetSource* target_dataset = nullptr);

  // AttributePrompt to several latents of `target_dataset` at once (query.target_latent not
  // read; query.crosscoder_source as AttributePrompt's): one forward pass shared by their
  // backward passes (attribution.h's AttributeToLatents), one answer per target. The call's
  // errors as AttributePrompt's.
  absl::StatusOr<std::vector<absl::StatusOr<AttributionResult>>> AttributeToLatents(
      const DatasetSource& dataset, const AttributionQuery& query,
      const DatasetSource& target_dataset, const std::vector<TargetLatent>& targets);

  // Latents of several datasets' SAEs (one model and weights, e.g. an attribution graph's
  // suite), removed[i] of datasets[i], taken out of one run together (attribution.h's
  // AblateTogether): the change of `metric`'s metric (its target token, or with target_latent
  // that latent of `target_dataset`; `target_token` the token an answer resolved).
  // crosscoder_sources[i] is datasets[i]'s AttributionQuery.crosscoder_source (unset past its
  // end): the model a crosscoder over several models runs as. Errors as AttributePrompt's, and
  // FAILED_PRECONDITION for datasets of different models.
  absl::StatusOr<double> AblateTogether(
      const std::vector<DatasetSource>& datasets,
      const std::vector<std::vector<TargetLatent>>& removed, const AttributionQuery& metric,
      int64_t target_token, const DatasetSource* target_dataset,
      const std::vector<std::optional<int>>& crosscoder_sources = {});

  // Whether the dataset's SAE is a crosscoder over several models' activations (model
  // diffing), whose queries that run a model name the one to run (crosscoder_source). Errors
  // as ReadLatentWeights' for a dataset whose job is gone.
  absl::StatusOr<bool> ReadsSeveralModels(const DatasetSource& dataset);

  // Latent scaling (latent_scaling.h) of a crosscoder over several models' stored activations
  // (model diffing): the dataset's codes and postings from the store, each source's DENSE rows
  // (the stored datasets the dataset encodes, row for row), the crosscoder checked against the
  // recorded hash and kept loaded with EncodePrompt's. FAILED_PRECONDITION for an SAE other than
  // such a crosscoder (one over a model's hooks has no stored activations to fit), a source dataset
  // deleted since, and as ReadLatentWeights; the fit's errors.
  absl::StatusOr<LatentScalingResult> LatentScaling(const DatasetSource& dataset,
                                                    const LatentScalingQuery& query,
                                                    const std::function<bool()>& cancelled);

  // Bytes the cache holds now (for tests and telemetry).
  int64_t cached_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_DATASET_MODELS_H_
