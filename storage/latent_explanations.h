// What people and auto-interpretation pipelines (delphi, a model asked to explain a latent's
// examples) wrote about a dataset's latents: one explanation per latent, with an optional score
// (delphi's detection or fuzzing score, a rater's confidence) and its source, kept beside the
// dataset and deleted with it. Explanations make an SAE searchable by meaning: "the latents
// about French", without reading a row.
//
// Each explanation is one key of the meta family ("ds/e" id latent); a Put is one synced batch,
// so a set of explanations is stored whole or not at all. Dataset ids are never reused, so an
// explanation written while its dataset was being deleted can never attach to another dataset.
#ifndef LATENTD_STORAGE_LATENT_EXPLANATIONS_H_
#define LATENTD_STORAGE_LATENT_EXPLANATIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/chunk_store.h"

namespace latentd::storage {

// Bounds of an explanation and of one Put.
inline constexpr size_t kMaxExplanationBytes = 4096;
inline constexpr size_t kMaxExplanationSourceBytes = 256;
inline constexpr size_t kMaxExplanationsPerPut = 1 << 20;
inline constexpr int32_t kMaxExplanationResults = 10000;

struct LatentExplanation {
  int32_t latent = 0;
  std::string text;             // not empty, at most kMaxExplanationBytes
  std::optional<double> score;  // finite when set
  std::string source;           // who wrote it ("delphi", "human", a model's name); may be empty
};

// Stores explanations of a SPARSE dataset's latents in one synced batch, each replacing what its
// latent had; with replace_all every earlier explanation of the dataset goes in the same batch.
// INVALID_ARGUMENT naming explanations[i] for a latent outside [0, width), a latent given twice,
// an empty or too long text or source, or a non-finite score, and for more than
// kMaxExplanationsPerPut of them; NOT_FOUND; FAILED_PRECONDITION for a DENSE dataset.
absl::Status PutExplanations(const ChunkStore& store, uint64_t id,
                             const std::vector<LatentExplanation>& explanations, bool replace_all);

// Copies every explanation of dataset `from` to dataset `to` in one synced batch (with
// replace_all, `to`'s earlier ones are removed in it; else each copied one replaces its latent's):
// an explanation describes a latent of an SAE, so a dataset the same SAE encoded from other
// tokens takes them over. Returns how many were copied. FAILED_PRECONDITION unless both are
// SPARSE datasets of one SAE (the same width and sae_weight_hash, each recorded; the message
// names both), or when from == to; NOT_FOUND naming from_dataset_id for a missing source;
// RESOURCE_EXHAUSTED past kMaxExplanationsPerPut of them; DATA_LOSS naming the latent for a
// damaged value of the source (nothing is copied then).
absl::StatusOr<int64_t> CopyExplanations(const ChunkStore& store, uint64_t from, uint64_t to,
                                         bool replace_all);

// The latent's explanation, nullopt when it has none. INVALID_ARGUMENT for a latent outside
// [0, width); NOT_FOUND; DATA_LOSS naming the latent for a damaged value.
absl::StatusOr<std::optional<LatentExplanation>> GetExplanation(const ChunkStore& store,
                                                                uint64_t id, int32_t latent);

// How many of the dataset's latents have an explanation: one pass over the keys, no value
// decoded. NOT_FOUND; FAILED_PRECONDITION for a DENSE dataset.
absl::StatusOr<int64_t> CountExplanations(const ChunkStore& store, uint64_t id);

struct ExplanationMatches {
  int64_t explained = 0;  // latents of the dataset with an explanation
  int64_t matched = 0;    // of them, those the query matched
  // The first `limit` matches: scored ones first, by score descending, then by latent.
  std::vector<LatentExplanation> explanations;
};

// The explanations whose text (or source) holds every word of `query` (split at whitespace,
// matched case-insensitively for ASCII letters, anywhere in the text: "fren" finds "French");
// an empty query matches every one. limit in [1, kMaxExplanationResults], else
// INVALID_ARGUMENT; NOT_FOUND; DATA_LOSS naming the latent for a damaged value. One scan of
// the dataset's explanations, holding at most 2 * limit matches at a time.
absl::StatusOr<ExplanationMatches> SearchExplanations(const ChunkStore& store, uint64_t id,
                                                      absl::string_view query, int32_t limit);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_LATENT_EXPLANATIONS_H_
