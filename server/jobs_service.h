// gRPC handler of latentd.v1.Jobs: authentication, then a call into the JobManager.
#ifndef LATENTD_SERVER_JOBS_SERVICE_H_
#define LATENTD_SERVER_JOBS_SERVICE_H_

#include "proto/latentd/v1/jobs.grpc.pb.h"
#include "server/auth.h"
#include "server/job_manager.h"

namespace latentd::server {

class JobsService final : public latentd::v1::Jobs::Service {
 public:
  JobsService(JobManager* manager, const TokenAuth* auth) : manager_(manager), auth_(auth) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const latentd::v1::SubmitJobRequest* request,
                         latentd::v1::Job* response) override;
  grpc::Status PlanJob(grpc::ServerContext* context, const latentd::v1::SubmitJobRequest* request,
                       latentd::v1::JobPlan* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const latentd::v1::GetJobRequest* request,
                      latentd::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const latentd::v1::ListJobsRequest* request,
                        latentd::v1::ListJobsResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const latentd::v1::WatchJobRequest* request,
                        grpc::ServerWriter<latentd::v1::JobEvent>* writer) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const latentd::v1::CancelJobRequest* request,
                         latentd::v1::Job* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const latentd::v1::DeleteJobRequest* request,
                         latentd::v1::DeleteJobResponse* response) override;

 private:
  JobManager* const manager_;
  const TokenAuth* const auth_;
};

}  // namespace latentd::server

#endif  // LATENTD_SERVER_JOBS_SERVICE_H_
