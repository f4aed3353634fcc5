#include "server/artifact_deletion.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/directory_bytes.h"
#include "common/path_within.h"
#include "common/status_macros.h"

namespace latentd::server {
namespace {

namespace fs = std::filesystem;

// `path` with symlinks and ".." resolved as far as it exists; empty when it cannot be.
fs::path Resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::path() : p;
}

}  // namespace

absl::StatusOr<ArtifactDeletion> DeleteArtifact(
    storage::ArtifactStore* artifacts, const std::string& artifact_dir,
    const std::vector<latentd::v1::Job>& unfinished_jobs, uint64_t id) {
  auto found = artifacts->Get(id);
  // A record that does not parse can still be deleted: jobs are checked by its id, and its
  // files, whose path it no longer gives, stay.
  if (!found.ok() && found.status().code() != absl::StatusCode::kDataLoss) return found.status();
  latentd::v1::Artifact artifact;
  artifact.set_id(id);
  if (found.ok()) artifact = *std::move(found);
  // Resolved("") would be the daemon's working directory: an unknown path stays empty.
  const fs::path dir = artifact.path().empty() ? fs::path() : Resolved(artifact.path());
  for (const latentd::v1::Job& job : unfinished_jobs) {
    if (!job.spec().has_extract()) continue;
    std::vector<const latentd::v1::SaeSource*> saes = {&job.spec().extract().sae()};
    for (const auto& more : job.spec().extract().more_outputs()) saes.push_back(&more.sae());
    const bool names_it = std::any_of(saes.begin(), saes.end(), [&](const auto* sae) {
      return (sae->source_case() == latentd::v1::SaeSource::kArtifactId &&
              sae->artifact_id() == id) ||
             (sae->source_case() == latentd::v1::SaeSource::kPath && !dir.empty() &&
              PathIsWithin(Resolved(sae->path()), dir));
    });
    if (names_it) {
      return absl::FailedPreconditionError(absl::StrCat(
          "artifact ", id, " (\"", artifact.name(), "\") is the SAE of job ", job.id(), " (",
          latentd::v1::JobState_Name(job.state()), "); cancel it or let it finish first"));
    }
  }
  RETURN_IF_ERROR(artifacts->Delete(id).status());

  ArtifactDeletion deletion;
  deletion.path = artifact.path();
  const fs::path root = artifact_dir.empty() ? fs::path() : Resolved(artifact_dir);
  if (dir.empty() || dir == root || !PathIsWithin(dir, root)) return deletion;
  deletion.bytes_freed = std::max<int64_t>(0, DirectoryBytes(dir));
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("artifact ", id, " deleted, but removing ",
                                            dir.string(), " failed: ", ec.message()));
  }
  return deletion;
}

}  // namespace latentd::server
