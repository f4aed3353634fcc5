// Records of trained SAEs written to disk (a directory with safetensors + cfg.json), kept in the
// kMeta family under "art/" keys (storage/keys.h). Thread-safe.
#ifndef LATENTD_STORAGE_ARTIFACT_STORE_H_
#define LATENTD_STORAGE_ARTIFACT_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/latentd/v1/datasets.pb.h"
#include "storage/db.h"

namespace latentd::storage {

class ArtifactStore {
 public:
  explicit ArtifactStore(Db* db) : db_(db) {}

  // A new record (synced). Registering the same (name, path, job_id) again returns the first
  // record's id: a job resumed after a crash between its registration and its end registers
  // again. INVALID_ARGUMENT for an empty name or path; ALREADY_EXISTS for a name taken otherwise.
  absl::StatusOr<uint64_t> Register(const std::string& name, const std::string& path,
                                    uint64_t job_id);
  // Removes the record and its name (synced) and returns it; the files at its path are the
  // caller's to remove. NOT_FOUND for an unknown id. A record that does not parse (List shows it
  // unreadable) is removed with every name mapped to its id, and comes back with the id alone.
  absl::StatusOr<latentd::v1::Artifact> Delete(uint64_t id);
  absl::StatusOr<latentd::v1::Artifact> Get(uint64_t id) const;                     // NOT_FOUND
  absl::StatusOr<latentd::v1::Artifact> FindByName(const std::string& name) const;  // NOT_FOUND
  // Every artifact, ascending id; a record that does not parse is listed as unreadable instead
  // of failing the listing.
  absl::StatusOr<latentd::v1::ListArtifactsResponse> List() const;

 private:
  Db* const db_;
  absl::Mutex mu_;  // serializes Register and Delete (id counter, name uniqueness)
};

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_ARTIFACT_STORE_H_
