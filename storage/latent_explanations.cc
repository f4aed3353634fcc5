#include "storage/latent_explanations.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/big_endian.h"
#include "common/status_macros.h"
#include "rocksdb/write_batch.h"
#include "storage/byte_io.h"
#include "storage/keys.h"

namespace latentd::storage {
namespace {

// Value layout, version 1: varint version, u8 has_score, f64 score, string source, string text.
constexpr uint64_t kExplanationVersion = 1;

std::string Encode(const LatentExplanation& e) {
  std::string out;
  PutVarint(kExplanationVersion, &out);
  PutRaw<uint8_t>(e.score.has_value() ? 1 : 0, &out);
  PutRaw<double>(e.score.value_or(0.0), &out);
  PutString(e.source, &out);
  PutString(e.text, &out);
  return out;
}

absl::StatusOr<LatentExplanation> Decode(uint64_t id, int32_t latent, absl::string_view value) {
  ByteReader in(value);
  const uint64_t version = in.Varint();
  LatentExplanation e;
  e.latent = latent;
  const bool has_score = in.Raw<uint8_t>() != 0;
  const double score = in.Raw<double>();
  e.source = in.String();
  e.text = in.String();
  if (!in.ok() || version != kExplanationVersion || !in.rest().empty() ||
      (has_score && !std::isfinite(score))) {
    return absl::DataLossError(
        absl::StrCat("the explanation of latent ", latent, " of dataset ", id, " is damaged"));
  }
  if (has_score) e.score = score;
  return e;
}

// Calls visit(latent, value) for each stored explanation of dataset `id`, by latent, until it
// returns an error; DATA_LOSS for a malformed key.
template <typename Visit>
absl::Status ForEachExplanation(const ChunkStore& store, uint64_t id, Visit visit) {
  const std::string prefix = keys::ExplanationPrefix(id);
  std::unique_ptr<rocksdb::Iterator> it = store.db()->NewIterator(Family::kMeta);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const rocksdb::Slice key = it->key();
    if (key.size() != prefix.size() + 4) {
      return absl::DataLossError(
          absl::StrCat("an explanation key of dataset ", id, " has ", key.size(), " bytes"));
    }
    const auto latent = static_cast<int32_t>(ReadBigEndian32(key.data() + prefix.size()));
    RETURN_IF_ERROR(visit(latent, absl::string_view(it->value().data(), it->value().size())));
  }
  return FromRocks(it->status(), absl::StrCat("dataset ", id, ": explanations"));
}

// Adds the deletion of every explanation of dataset `id` to `batch` (replace_all).
void DeleteAllOf(const Db& db, uint64_t id, rocksdb::WriteBatch* batch) {
  const std::string prefix = keys::ExplanationPrefix(id);
  batch->DeleteRange(db.handle(Family::kMeta), prefix, keys::PrefixEnd(prefix));
}

absl::Status CheckExplanation(const LatentExplanation& e, int32_t width, size_t i) {
  const std::string field = absl::StrCat("explanations[", i, "]");
  if (e.latent < 0 || e.latent >= width) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".latent: ", e.latent, " outside [0, ", width, ")"));
  }
  if (e.text.empty() || e.text.size() > kMaxExplanationBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".text: ", e.text.size(), " bytes; give 1 to ", kMaxExplanationBytes));
  }
  if (e.source.size() > kMaxExplanationSourceBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".source: ", e.source.size(), " bytes, more than ", kMaxExplanationSourceBytes));
  }
  if (e.score.has_value() && !std::isfinite(*e.score)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".score: ", *e.score, " is not finite"));
  }
  return absl::OkStatus();
}

// Whether `haystack` holds every one of `words` (already lowercase), ASCII case aside.
bool HoldsAll(absl::string_view haystack, const std::vector<std::string>& words) {
  const std::string lower = absl::AsciiStrToLower(haystack);
  return std::all_of(words.begin(), words.end(),
                     [&lower](const std::string& w) { return absl::StrContains(lower, w); });
}

}  // namespace

absl::Status PutExplanations(const ChunkStore& store, uint64_t id,
                             const std::vector<LatentExplanation>& explanations, bool replace_all) {
  if (explanations.size() > kMaxExplanationsPerPut) {
    return absl::InvalidArgumentError(absl::StrCat("explanations: ", explanations.size(),
                                                   ", more than ", kMaxExplanationsPerPut,
                                                   " in one call"));
  }
  ASSIGN_OR_RETURN(const DatasetRecord rec, store.GetSparseRecord(id));
  std::set<int32_t> seen;
  for (size_t i = 0; i < explanations.size(); ++i) {
    RETURN_IF_ERROR(CheckExplanation(explanations[i], rec.meta.width, i));
    if (!seen.insert(explanations[i].latent).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "explanations[", i, "].latent: ", explanations[i].latent, " is given twice"));
    }
  }
  Db* db = store.db();
  rocksdb::WriteBatch batch;
  if (replace_all) DeleteAllOf(*db, id, &batch);
  for (const LatentExplanation& e : explanations) {
    batch.Put(db->handle(Family::kMeta), keys::Explanation(id, static_cast<uint32_t>(e.latent)),
              Encode(e));
  }
  return db->Write(&batch, /*sync=*/true);
}

absl::StatusOr<int64_t> CopyExplanations(const ChunkStore& store, uint64_t from, uint64_t to,
                                         bool replace_all) {
  ASSIGN_OR_RETURN(const DatasetRecord target, store.GetSparseRecord(to));
  absl::StatusOr<DatasetRecord> source = store.GetSparseRecord(from);
  if (absl::IsNotFound(source.status())) {
    return absl::NotFoundError(absl::StrCat("from_dataset_id: ", source.status().message()));
  }
  RETURN_IF_ERROR(source.status());
  if (from == to) {
    return absl::FailedPreconditionError(
        absl::StrCat("from_dataset_id: ", from, " is the dataset itself"));
  }
  const auto sae_of = [](const DatasetRecord& r) {
    return absl::StrCat("dataset ", r.id, "'s SAE (",
                        r.meta.sae_weight_hash.empty() ? "not recorded" : r.meta.sae_weight_hash,
                        ", ", r.meta.width, " latents)");
  };
  if (source->meta.sae_weight_hash.empty() ||
      source->meta.sae_weight_hash != target.meta.sae_weight_hash ||
      source->meta.width != target.meta.width) {
    return absl::FailedPreconditionError(
        absl::StrCat("explanations describe the latents of one SAE: ", sae_of(*source),
                     " is not known to be ", sae_of(target)));
  }
  Db* db = store.db();
  rocksdb::WriteBatch batch;
  if (replace_all) DeleteAllOf(*db, to, &batch);
  int64_t copied = 0;
  RETURN_IF_ERROR(ForEachExplanation(store, from, [&](int32_t latent, absl::string_view value) {
    // Decoded only to be checked: a damaged value is not passed on.
    RETURN_IF_ERROR(Decode(from, latent, value).status());
    if (++copied > static_cast<int64_t>(kMaxExplanationsPerPut)) {
      return absl::ResourceExhaustedError(absl::StrCat("dataset ", from, " has more than ",
                                                       kMaxExplanationsPerPut,
                                                       " explanations, the most one copy takes"));
    }
    batch.Put(db->handle(Family::kMeta), keys::Explanation(to, static_cast<uint32_t>(latent)),
              rocksdb::Slice(value.data(), value.size()));
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(db->Write(&batch, /*sync=*/true));
  return copied;
}

absl::StatusOr<std::optional<LatentExplanation>> GetExplanation(const ChunkStore& store,
                                                                uint64_t id, int32_t latent) {
  ASSIGN_OR_RETURN(const DatasetRecord rec, store.GetSparseRecord(id));
  if (latent < 0 || latent >= rec.meta.width) {
    return absl::InvalidArgumentError(
        absl::StrCat("latent: ", latent, " outside [0, ", rec.meta.width, ")"));
  }
  absl::StatusOr<std::string> value =
      store.db()->Get(Family::kMeta, keys::Explanation(id, static_cast<uint32_t>(latent)));
  if (absl::IsNotFound(value.status())) return std::optional<LatentExplanation>();
  RETURN_IF_ERROR(value.status());
  ASSIGN_OR_RETURN(LatentExplanation e, Decode(id, latent, *value));
  return std::optional<LatentExplanation>(std::move(e));
}

absl::StatusOr<int64_t> CountExplanations(const ChunkStore& store, uint64_t id) {
  RETURN_IF_ERROR(store.GetSparseRecord(id).status());
  const std::string prefix = keys::ExplanationPrefix(id);
  int64_t count = 0;
  std::unique_ptr<rocksdb::Iterator> it = store.db()->NewIterator(Family::kMeta);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) ++count;
  RETURN_IF_ERROR(FromRocks(it->status(), absl::StrCat("dataset ", id, ": explanations")));
  return count;
}

absl::StatusOr<ExplanationMatches> SearchExplanations(const ChunkStore& store, uint64_t id,
                                                      absl::string_view query, int32_t limit) {
  if (limit < 1 || limit > kMaxExplanationResults) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: ", limit, " outside [1, ", kMaxExplanationResults, "]"));
  }
  RETURN_IF_ERROR(store.GetSparseRecord(id).status());
  const std::vector<std::string> words =
      absl::StrSplit(absl::AsciiStrToLower(query), absl::ByAnyChar(" \t\n\r"), absl::SkipEmpty());
  ExplanationMatches found;
  // Scored first, by score descending, then by latent: a total order (a latent has one
  // explanation, a stored score is finite).
  const auto ranks_before = [](const LatentExplanation& a, const LatentExplanation& b) {
    if (a.score.has_value() != b.score.has_value()) return a.score.has_value();
    if (a.score.has_value() && *a.score != *b.score) return *a.score > *b.score;
    return a.latent < b.latent;
  };
  // Only the best `limit` matches are kept, cut back each time they reach twice that: a search
  // that matches a million explanations holds at most 2 * limit of them.
  std::vector<LatentExplanation>& best = found.explanations;
  const auto keep_best = [&] {
    std::nth_element(best.begin(), best.begin() + limit, best.end(), ranks_before);
    best.resize(limit);
  };
  RETURN_IF_ERROR(ForEachExplanation(store, id, [&](int32_t latent, absl::string_view value) {
    ASSIGN_OR_RETURN(LatentExplanation e, Decode(id, latent, value));
    ++found.explained;
    if (!HoldsAll(absl::StrCat(e.text, "\n", e.source), words)) return absl::OkStatus();
    ++found.matched;
    best.push_back(std::move(e));
    if (static_cast<int64_t>(best.size()) >= 2 * static_cast<int64_t>(limit)) keep_best();
    return absl::OkStatus();
  }));
  if (static_cast<int64_t>(best.size()) > limit) keep_best();
  std::sort(best.begin(), best.end(), ranks_before);
  return found;
}

}  // namespace latentd::storage
