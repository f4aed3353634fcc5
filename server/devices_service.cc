#include "server/devices_service.h"

namespace latentd::server {

grpc::Status DevicesService::ListDevices(grpc::ServerContext* context,
                                         const latentd::v1::ListDevicesRequest* /*request*/,
                                         latentd::v1::ListDevicesResponse* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return s;
  for (const engine::DeviceStatus& status : pool_->Snapshot()) {
    latentd::v1::Device* d = response->add_devices();
    d->set_kind(status.device.kind == engine::DeviceKind::kCuda ? latentd::v1::CUDA
                                                                : latentd::v1::CPU);
    d->set_index(status.device.index);
    d->set_name(status.device.name);
    d->set_description(status.description);
    d->set_memory_total_bytes(status.device.memory_total_bytes);
    d->set_memory_used_bytes(status.memory_used_bytes);
    d->set_held_by_job(status.held_by_job);
  }
  return grpc::Status::OK;
}

}  // namespace latentd::server
