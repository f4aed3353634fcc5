// Deleting a trained SAE (an artifact): its record, then its files. The record goes first, in
// one synced write, so a crash in between leaves files without a record (harmless, and a TRAIN
// job of the same name later writes over them) but never a record without files.
#ifndef LATENTD_SERVER_ARTIFACT_DELETION_H_
#define LATENTD_SERVER_ARTIFACT_DELETION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/latentd/v1/jobs.pb.h"
#include "storage/artifact_store.h"

namespace latentd::server {

struct ArtifactDeletion {
  std::string path;         // the directory the record named
  int64_t bytes_freed = 0;  // bytes of the files removed (0 when they were left in place)
};

// Deletes artifact `id`. FAILED_PRECONDITION naming the job while one of `unfinished_jobs` is an
// EXTRACT naming the artifact (by id, or by a path inside its directory): a PENDING job would
// fail when it starts, and one resumed after a restart could not finish its dataset. NOT_FOUND
// for an unknown id. A record that does not parse is deleted too (jobs checked by its id); its
// files stay, since it no longer says where they are. The files are removed only when the directory
// lies under `artifact_dir` (symlinks resolved; TRAIN writes nowhere else), so a record can never
// make the daemon remove anything outside it; an empty `artifact_dir` removes nothing. A job
// submitted between the check and the delete fails at its start with NOT_FOUND naming
// extract.sae.artifact_id.
absl::StatusOr<ArtifactDeletion> DeleteArtifact(
    storage::ArtifactStore* artifacts, const std::string& artifact_dir,
    const std::vector<latentd::v1::Job>& unfinished_jobs, uint64_t id);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_ARTIFACT_DELETION_H_
