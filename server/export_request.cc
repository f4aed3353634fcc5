#include "server/export_request.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"
#include "common/path_within.h"
#include "common/status_macros.h"

namespace latentd::server {

absl::StatusOr<std::string> ResolveExportPath(const std::string& export_root,
                                              const std::string& requested) {
  namespace fs = std::filesystem;
  if (export_root.empty()) {
    return absl::FailedPreconditionError("the daemon has no export root configured");
  }
  if (requested.empty()) return absl::InvalidArgumentError("path: must not be empty");
  std::error_code ec;
  const fs::path root = fs::canonical(export_root, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("export root ", export_root, " is not usable: ", ec.message()));
  }
  fs::path target = fs::path(requested).is_absolute() ? fs::path(requested) : root / requested;
  target = fs::weakly_canonical(target, ec);  // resolves symlinks of the existing prefix and ..
  if (ec) return absl::InvalidArgumentError(absl::StrCat("path: ", ec.message()));
  if (target == root || !PathIsWithin(target, root)) {
    return absl::PermissionDeniedError(
        absl::StrCat("path \"", requested, "\" is outside the export root ", root.string()));
  }
  return target.string();
}

namespace {

// The storage format of an API format, and its name in a plan.
struct FormatOf {
  storage::ExportFormat format;
  const char* name;
};
FormatOf Format(latentd::v1::ExportFormat format) {
  switch (format) {
    case latentd::v1::HDF5:
      return {storage::ExportFormat::kHdf5, "HDF5"};
    case latentd::v1::EXPORT_FORMAT_PARQUET:
      return {storage::ExportFormat::kParquet, "Parquet"};
    case latentd::v1::EXPORT_FORMAT_DELPHI:
      return {storage::ExportFormat::kDelphi, "delphi"};
    default:
      return {storage::ExportFormat::kNpz, "NPZ"};
  }
}

// A request that passed ValidateExportRequest: its resolved path and the dataset's record.
struct CheckedRequest {
  std::string path;
  storage::DatasetRecord rec;
};

absl::StatusOr<CheckedRequest> Check(const storage::ChunkStore& store,
                                     const std::string& export_root,
                                     const latentd::v1::ExportDatasetRequest& request,
                                     const std::string& field_prefix) {
  const std::string& p = field_prefix;
  if (!latentd::v1::ExportFormat_IsValid(request.format())) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "format: ", request.format(), " is not an ExportFormat"));
  }
  const bool delphi = request.format() == latentd::v1::EXPORT_FORMAT_DELPHI;
  if (request.delphi_splits() != 0 && !delphi) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "delphi_splits: given only with format EXPORT_FORMAT_DELPHI"));
  }
  if (request.delphi_splits() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "delphi_splits: ", request.delphi_splits(), " is negative"));
  }
  if (request.row_start() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "row_start: ", request.row_start(), " is negative"));
  }
  if (request.row_count() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "row_count: ", request.row_count(), " is negative"));
  }
  absl::StatusOr<std::string> path = ResolveExportPath(export_root, request.path());
  if (!path.ok()) {
    return absl::Status(path.status().code(), absl::StrCat(p, path.status().message()));
  }
  absl::StatusOr<storage::DatasetRecord> rec = store.GetRecord(request.dataset_id());
  if (!rec.ok()) {
    return absl::Status(rec.status().code(),
                        absl::StrCat(p, "dataset_id: ", rec.status().message()));
  }
  if (delphi && rec->meta.kind != storage::DatasetKind::kSparse) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "format: DELPHI exports the latents of a SPARSE dataset; dataset ",
                     request.dataset_id(), " is DENSE"));
  }
  return CheckedRequest{*std::move(path), *std::move(rec)};
}

}  // namespace

absl::Status ValidateExportRequest(const storage::ChunkStore& store, const std::string& export_root,
                                   const latentd::v1::ExportDatasetRequest& request,
                                   const std::string& field_prefix) {
  return Check(store, export_root, request, field_prefix).status();
}

absl::StatusOr<std::vector<std::string>> DescribeExportRequest(
    const storage::ChunkStore& store, const std::string& export_root,
    const latentd::v1::ExportDatasetRequest& request, const std::string& field_prefix) {
  ASSIGN_OR_RETURN(const CheckedRequest checked, Check(store, export_root, request, field_prefix));
  const std::string& path = checked.path;
  const storage::DatasetRecord& rec = checked.rec;
  const bool sparse = rec.meta.kind == storage::DatasetKind::kSparse;
  const int64_t end =
      request.row_count() > 0 ? request.row_start() + request.row_count() : rec.rows_committed;
  const int64_t rows = std::max<int64_t>(0, end - request.row_start());
  std::vector<std::string> lines;
  lines.push_back(absl::StrCat(
      "reads dataset ", rec.id, " \"", rec.meta.name, "\" (", sparse ? "SPARSE" : "DENSE",
      rec.meta.hook_name.empty() ? "" : absl::StrCat(", ", rec.meta.hook_name), "): rows [",
      request.row_start(), ", ", end, ") of ", rec.rows_committed, " committed",
      request.row_count() > 0 ? "" : " (to the end as committed when it starts)"));
  // Stored values at the dataset's mean row; fp16 stays fp16, the rest is written as fp32.
  const double values = storage::MeanValuesPerRow(rec) * rows;
  const int value_bytes = rec.meta.value_dtype == storage::ValueDtype::kFloat16 ? 2 : 4;
  const double per_row_extra = sparse ? 8 + 4 : 4;  // indptr, token id
  const int splits =
      request.delphi_splits() > 0 ? request.delphi_splits() : storage::kDefaultDelphiSplits;
  const double estimate =
      request.format() == latentd::v1::EXPORT_FORMAT_DELPHI
          // uint16 locations (3) and an fp16 activation a firing; the token matrix in each file
          ? values * 8 + static_cast<double>(rows) * 4 * splits
          : values * (value_bytes + (sparse ? 4 : 0)) + static_cast<double>(rows) * per_row_extra;
  lines.push_back(absl::StrCat("writes ", Format(request.format()).name, " to ", path,
                               request.format() == latentd::v1::EXPORT_FORMAT_PARQUET
                                   ? " (ZSTD-compressed: its size is known only once written)"
                                   : absl::StrCat(", about ", ByteSize(estimate))));
  lines.push_back(
      absl::StrCat("streams in blocks of about ", storage::ExportOptions().block_values >> 20,
                   "M values (bounded memory); holds no device; the file appears whole when "
                   "done"));
  return lines;
}

absl::StatusOr<latentd::v1::ExportDatasetResponse> RunExportRequest(
    const storage::ChunkStore& store, const std::string& export_root,
    const latentd::v1::ExportDatasetRequest& request, const std::string& field_prefix,
    storage::ExportProgress progress) {
  ASSIGN_OR_RETURN(const CheckedRequest checked, Check(store, export_root, request, field_prefix));
  const std::string& path = checked.path;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("creating the directory of ", path, ": ", ec.message()));
  }
  storage::ExportOptions options;
  options.delphi_splits = request.delphi_splits();
  options.progress = std::move(progress);
  ASSIGN_OR_RETURN(
      storage::ExportResult result,
      storage::ExportDataset(store, request.dataset_id(), request.row_start(), request.row_count(),
                             Format(request.format()).format, path, options));
  latentd::v1::ExportDatasetResponse response;
  response.set_path(result.path);
  response.set_rows(result.rows);
  response.set_nnz(result.nnz);
  response.set_bytes(result.bytes);
  return response;
}

}  // namespace latentd::server
