#include "server/jobs_service.h"

#include "server/grpc_status.h"

namespace latentd::server {
namespace {

// Copies a StatusOr's value into the response, or returns its error.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status JobsService::SubmitJob(grpc::ServerContext* context,
                                    const latentd::v1::SubmitJobRequest* request,
                                    latentd::v1::Job* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return s;
  return Reply(manager_->Submit(request->request_id(), request->spec()), response);
}

grpc::Status JobsService::PlanJob(grpc::ServerContext* context,
                                  const latentd::v1::SubmitJobRequest* request,
                                  latentd::v1::JobPlan* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return s;
  return Reply(manager_->Plan(request->spec()), response);
}

grpc::Status JobsService::GetJob(grpc::ServerContext* context,
                                 const latentd::v1::GetJobRequest* request,
                                 latentd::v1::Job* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return s;
  return Reply(manager_->Get(request->job_id()), response);
}

grpc::Status JobsService::ListJobs(grpc::ServerContext* context,
                                   const latentd::v1::ListJobsRequest* request,
                                   latentd::v1::ListJobsResponse* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return s;
  JobFilter filter;
  filter.state = request->state();
  filter.type = request->type();
  filter.label = request->label();
  auto result = manager_->List(filter, request->page_size(), request->page_token());
  if (!result.ok()) return ToGrpcStatus(result.status());
  for (auto& job : result->jobs) *response->add_jobs() = std::move(job);
  response->set_next_page_token(result->next_page_token);
  return grpc::Status::OK;
}

grpc::Status JobsService::WatchJob(grpc::ServerContext* context,
                                   const latentd::v1::WatchJobRequest* request,
                                   grpc::ServerWriter<latentd::v1::JobEvent>* writer) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return s;
  absl::Status status = manager_->Watch(
      request->job_id(), request->after_sequence(),
      [writer](const latentd::v1::JobEvent& event) { return writer->Write(event); },
      [context] { return context->IsCancelled(); });
  return ToGrpcStatus(status);
}

grpc::Status JobsService::CancelJob(grpc::ServerContext* context,
                                    const latentd::v1::CancelJobRequest* request,
                                    latentd::v1::Job* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return s;
  return Reply(manager_->Cancel(request->job_id()), response);
}

grpc::Status JobsService::DeleteJob(grpc::ServerContext* context,
                                    const latentd::v1::DeleteJobRequest* request,
                                    latentd::v1::DeleteJobResponse*) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return s;
  return ToGrpcStatus(manager_->Delete(request->job_id()));
}

}  // namespace latentd::server
