// ExportDataset requests as the Datasets RPC runs them and EXPORT jobs run them: the path
// resolved under the daemon's export root, the fields checked, then storage::ExportDataset.
#ifndef LATENTD_SERVER_EXPORT_REQUEST_H_
#define LATENTD_SERVER_EXPORT_REQUEST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "latentd/v1/datasets.pb.h"
#include "storage/chunk_store.h"
#include "storage/export.h"

namespace latentd::server {

// The absolute path that `requested` (relative to `export_root`, or absolute inside it) names,
// ".." and symlinks of its existing prefix resolved. PERMISSION_DENIED for a path outside the
// root (or the root itself), INVALID_ARGUMENT for an empty one, FAILED_PRECONDITION when the
// root is not configured or not usable.
absl::StatusOr<std::string> ResolveExportPath(const std::string& export_root,
                                              const std::string& requested);

// The checks that need no writing: every field of `request` (errors name it, after
// `field_prefix`: "" for the RPC, "export." for an EXPORT job's spec), the path, and that the
// dataset exists (NOT_FOUND) and, for DELPHI, is SPARSE.
absl::Status ValidateExportRequest(const storage::ChunkStore& store, const std::string& export_root,
                                   const latentd::v1::ExportDatasetRequest& request,
                                   const std::string& field_prefix);

// What running `request` would do, for a dry run (PlanJob): the dataset and rows it reads, the
// file it writes and about how large. Makes ValidateExportRequest's checks itself.
absl::StatusOr<std::vector<std::string>> DescribeExportRequest(
    const storage::ChunkStore& store, const std::string& export_root,
    const latentd::v1::ExportDatasetRequest& request, const std::string& field_prefix);

// Validates and runs `request`, creating the path's directory. `progress` as in
// storage::ExportOptions (may be empty).
absl::StatusOr<latentd::v1::ExportDatasetResponse> RunExportRequest(
    const storage::ChunkStore& store, const std::string& export_root,
    const latentd::v1::ExportDatasetRequest& request, const std::string& field_prefix,
    storage::ExportProgress progress);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_EXPORT_REQUEST_H_
