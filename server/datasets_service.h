// gRPC handler of latentd.v1.Datasets: thin proto <-> domain conversion over the ChunkStore and
// ArtifactStore; every error goes through ToGrpcStatus.
//
// ReadRows streams CSR pieces of at most kMaxPieceBytes serialized bytes. ExportDataset writes only
// under `export_root` (".." and symlinks resolved; anything outside is PERMISSION_DENIED).
// DeleteArtifact is server/artifact_deletion.h's DeleteArtifact.
#ifndef LATENTD_SERVER_DATASETS_SERVICE_H_
#define LATENTD_SERVER_DATASETS_SERVICE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dataset_models.h"
#include "proto/latentd/v1/datasets.grpc.pb.h"
#include "proto/latentd/v1/jobs.pb.h"
#include "server/auth.h"
#include "storage/artifact_store.h"
#include "storage/chunk_store.h"

namespace latentd::server {

struct DatasetsServiceOptions {
  // Server-side exports go only under this directory. Required.
  std::string export_root;
  // DeleteArtifact removes an artifact's files only under this directory (where TRAIN writes).
  // Default empty: records are deleted, files never.
  std::string artifact_dir;
  // The jobs that have not finished (JobManager::UnfinishedJobs), for DeleteArtifact's and
  // DeleteDataset's checks that none needs what they delete. Default null: none.
  std::function<std::vector<latentd::v1::Job>()> unfinished_jobs;
  // Loads datasets' SAEs and models for GetLatentWeights and EncodePrompt. Default null: those
  // calls are FAILED_PRECONDITION.
  engine::DatasetModels* dataset_models = nullptr;
};

class DatasetsService final : public latentd::v1::Datasets::Service {
 public:
  static constexpr size_t kMaxPieceBytes = 4 << 20;

  // `auth` may be null (no authentication, as in tests); otherwise every call is checked.
  DatasetsService(storage::ChunkStore* store, storage::ArtifactStore* artifacts,
                  DatasetsServiceOptions options, const TokenAuth* auth = nullptr);

  grpc::Status ListDatasets(grpc::ServerContext* context,
                            const latentd::v1::ListDatasetsRequest* request,
                            latentd::v1::ListDatasetsResponse* response) override;
  grpc::Status GetDataset(grpc::ServerContext* context,
                          const latentd::v1::GetDatasetRequest* request,
                          latentd::v1::DatasetInfo* response) override;
  grpc::Status ReadRows(grpc::ServerContext* context, const latentd::v1::ReadRowsRequest* request,
                        grpc::ServerWriter<latentd::v1::CsrPiece>* writer) override;
  grpc::Status GetLatent(grpc::ServerContext* context, const latentd::v1::GetLatentRequest* request,
                         latentd::v1::GetLatentResponse* response) override;
  grpc::Status ReadLatentFirings(
      grpc::ServerContext* context, const latentd::v1::ReadLatentFiringsRequest* request,
      grpc::ServerWriter<latentd::v1::LatentFiringsPiece>* writer) override;
  grpc::Status ListLatents(grpc::ServerContext* context,
                           const latentd::v1::ListLatentsRequest* request,
                           latentd::v1::ListLatentsResponse* response) override;
  grpc::Status LatentsOnRows(grpc::ServerContext* context,
                             const latentd::v1::LatentsOnRowsRequest* request,
                             latentd::v1::LatentsOnRowsResponse* response) override;
  grpc::Status SparseProbe(grpc::ServerContext* context,
                           const latentd::v1::SparseProbeRequest* request,
                           latentd::v1::SparseProbeResponse* response) override;
  grpc::Status ProjectRows(grpc::ServerContext* context,
                           const latentd::v1::ProjectRowsRequest* request,
                           latentd::v1::ProjectRowsResponse* response) override;
  grpc::Status SetExplanations(grpc::ServerContext* context,
                               const latentd::v1::SetExplanationsRequest* request,
                               latentd::v1::SetExplanationsResponse* response) override;
  grpc::Status SearchExplanations(grpc::ServerContext* context,
                                  const latentd::v1::SearchExplanationsRequest* request,
                                  latentd::v1::SearchExplanationsResponse* response) override;
  grpc::Status GetLatentWeights(grpc::ServerContext* context,
                                const latentd::v1::GetLatentWeightsRequest* request,
                                latentd::v1::GetLatentWeightsResponse* response) override;
  grpc::Status CompareSaes(grpc::ServerContext* context,
                           const latentd::v1::CompareSaesRequest* request,
                           latentd::v1::CompareSaesResponse* response) override;
  grpc::Status LatentScaling(grpc::ServerContext* context,
                             const latentd::v1::LatentScalingRequest* request,
                             latentd::v1::LatentScalingResponse* response) override;
  grpc::Status EncodePrompt(grpc::ServerContext* context,
                            const latentd::v1::EncodePromptRequest* request,
                            latentd::v1::EncodePromptResponse* response) override;
  grpc::Status SteerPrompt(grpc::ServerContext* context,
                           const latentd::v1::SteerPromptRequest* request,
                           latentd::v1::SteerPromptResponse* response) override;
  grpc::Status AttributePrompt(grpc::ServerContext* context,
                               const latentd::v1::AttributePromptRequest* request,
                               latentd::v1::AttributePromptResponse* response) override;
  grpc::Status AttributionGraph(
      grpc::ServerContext* context, const latentd::v1::AttributionGraphRequest* request,
      grpc::ServerWriter<latentd::v1::AttributionGraphEvent>* writer) override;
  grpc::Status ExportDataset(grpc::ServerContext* context,
                             const latentd::v1::ExportDatasetRequest* request,
                             latentd::v1::ExportDatasetResponse* response) override;
  grpc::Status DeleteDataset(grpc::ServerContext* context,
                             const latentd::v1::DeleteDatasetRequest* request,
                             latentd::v1::DeleteDatasetResponse* response) override;
  grpc::Status ListArtifacts(grpc::ServerContext* context,
                             const latentd::v1::ListArtifactsRequest* request,
                             latentd::v1::ListArtifactsResponse* response) override;
  grpc::Status DeleteArtifact(grpc::ServerContext* context,
                              const latentd::v1::DeleteArtifactRequest* request,
                              latentd::v1::DeleteArtifactResponse* response) override;

 private:
  grpc::Status Authorize(const grpc::ServerContext& context) const;
  // options_.unfinished_jobs(), or none.
  std::vector<latentd::v1::Job> UnfinishedJobs() const;
  // Which EXTRACT job, SAE and model made a SPARSE dataset, for the calls DatasetModels answers:
  // NOT_FOUND for an unknown dataset, FAILED_PRECONDITION for a DENSE one or without models.
  absl::StatusOr<engine::DatasetSource> ModelSource(uint64_t dataset_id) const;
  // ModelSource of a target latent's dataset, its errors naming target_latent.dataset_id.
  absl::StatusOr<engine::DatasetSource> TargetSource(
      const latentd::v1::AttributionTarget& target) const;

  storage::ChunkStore* const store_;
  storage::ArtifactStore* const artifacts_;
  const DatasetsServiceOptions options_;
  const TokenAuth* const auth_;
};

}  // namespace latentd::server

#endif  // LATENTD_SERVER_DATASETS_SERVICE_H_
