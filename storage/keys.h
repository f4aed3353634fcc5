// Key layout of the chunk store and the artifact store. Ids and row numbers are fixed-width
// big-endian, so byte order is numeric order and every "all X of dataset d" is one range.
//
//   family        key                                   value
//   kMeta         "ds/d" id                            DatasetMeta + created time (dataset record)
//   kMeta         "ds/n" name                          id (name index, unique)
//   kMeta         "ds/w" id                            watermark: rows, nnz, chunks, live latents,
//                                                      complete flag (rewritten by every commit)
//   kMeta         "ds/f" id                            reconstruction totals of the SAE that
//                                                      encoded the rows (reconstruction_fit.h),
//                                                      rewritten by every commit that has sums
//   kMeta         "ds/k" id row_start                  chunk directory: num_rows, nnz
//   kMeta         "ds/i"                               next dataset id (id_counter.h; stores
//                                                      written before it: "ds/next")
//   kMeta         "ds/e" id latent(u32)                a latent's explanation
//                                                      (latent_explanations.h)
//   kChunks       id row_start                         encoded chunk (chunk_codec.h): DENSE
//                                                      datasets, SPARSE ones of format 1-2
//   kChunks       id part(u16) row_start               SPARSE format 3: header, token ids, latent
//                                                      slices (sliced_chunk.h)
//   kLatentIndex  id first_latent(u32) 'S'             statistics of latents [first, first + 64)
//   kLatentIndex  id first_latent(u32) 'T'             top-N rows of latents [first, first + 64)
//   kPostings     id latent(u32) row_start             format 1-2 only: rows and values of the
//                                                      latent in the commit starting at row_start
//   kMeta         "art/a" id | "art/n" name | "art/i"   artifacts (artifact_store.h)
//
// Chunk keys are deterministic (the chunk's first row): a replayed commit overwrites.
#ifndef LATENTD_STORAGE_KEYS_H_
#define LATENTD_STORAGE_KEYS_H_

#include <cstdint>
#include <string>

#include "common/big_endian.h"

namespace latentd::storage::keys {

inline std::string WithId(const char* prefix, uint64_t id) {
  std::string k(prefix);
  AppendBigEndian64(id, &k);
  return k;
}
inline std::string DatasetRecord(uint64_t id) { return WithId("ds/d", id); }
inline std::string DatasetName(const std::string& name) { return "ds/n" + name; }
inline std::string Watermark(uint64_t id) { return WithId("ds/w", id); }
inline std::string Fit(uint64_t id) { return WithId("ds/f", id); }
inline std::string ChunkDir(uint64_t id, int64_t row_start) {
  std::string k = WithId("ds/k", id);
  AppendBigEndian64(static_cast<uint64_t>(row_start), &k);
  return k;
}
inline std::string ChunkDirPrefix(uint64_t id) { return WithId("ds/k", id); }
inline std::string ExplanationPrefix(uint64_t id) { return WithId("ds/e", id); }
inline std::string Explanation(uint64_t id, uint32_t latent) {
  std::string k = ExplanationPrefix(id);
  AppendBigEndian32(latent, &k);
  return k;
}
// Id counters (id_counter.h): no name key ("ds/n" + name) can equal these.
inline const char* kDatasetIdCounter = "ds/i";
inline const char* kLegacyDatasetIdCounter = "ds/next";
inline const char* kDatasetRecordPrefix = "ds/d";

inline std::string Chunk(uint64_t id, int64_t row_start) {
  std::string k;
  AppendBigEndian64(id, &k);
  AppendBigEndian64(static_cast<uint64_t>(row_start), &k);
  return k;
}
// Part first: every chunk's part p is one contiguous range (a latent slice across all chunks is
// one range read).
inline std::string ChunkPart(uint64_t id, int64_t row_start, uint16_t part) {
  std::string k;
  AppendBigEndian64(id, &k);
  k.push_back(static_cast<char>(part >> 8));
  k.push_back(static_cast<char>(part & 0xff));
  AppendBigEndian64(static_cast<uint64_t>(row_start), &k);
  return k;
}
inline std::string IdPrefix(uint64_t id) {
  std::string k;
  AppendBigEndian64(id, &k);
  return k;
}
inline std::string LatentStats(uint64_t id, uint32_t latent) {
  std::string k = IdPrefix(id);
  AppendBigEndian32(latent, &k);
  k.push_back('S');
  return k;
}
inline std::string LatentTop(uint64_t id, uint32_t latent) {
  std::string k = IdPrefix(id);
  AppendBigEndian32(latent, &k);
  k.push_back('T');
  return k;
}
inline std::string PostingPrefix(uint64_t id, uint32_t latent) {
  std::string k = IdPrefix(id);
  AppendBigEndian32(latent, &k);
  return k;
}
inline std::string Posting(uint64_t id, uint32_t latent, int64_t row_start) {
  std::string k = PostingPrefix(id, latent);
  AppendBigEndian64(static_cast<uint64_t>(row_start), &k);
  return k;
}
// The smallest key greater than every key starting with `prefix` (prefix is never all 0xff here).
inline std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty() && static_cast<unsigned char>(prefix.back()) == 0xff) prefix.pop_back();
  if (!prefix.empty()) prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

inline std::string ArtifactRecord(uint64_t id) { return WithId("art/a", id); }
inline std::string ArtifactName(const std::string& name) { return "art/n" + name; }
inline const char* kArtifactIdCounter = "art/i";
inline const char* kLegacyArtifactIdCounter = "art/next";
inline const char* kArtifactRecordPrefix = "art/a";

}  // namespace latentd::storage::keys

#endif  // LATENTD_STORAGE_KEYS_H_
