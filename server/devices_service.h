// gRPC handler of latentd.v1.Devices.
#ifndef LATENTD_SERVER_DEVICES_SERVICE_H_
#define LATENTD_SERVER_DEVICES_SERVICE_H_

#include "engine/device_pool.h"
#include "proto/latentd/v1/devices.grpc.pb.h"
#include "server/auth.h"

namespace latentd::server {

class DevicesService final : public latentd::v1::Devices::Service {
 public:
  DevicesService(const engine::DevicePool* pool, const TokenAuth* auth)
      : pool_(pool), auth_(auth) {}

  grpc::Status ListDevices(grpc::ServerContext* context,
                           const latentd::v1::ListDevicesRequest* request,
                           latentd::v1::ListDevicesResponse* response) override;

 private:
  const engine::DevicePool* const pool_;
  const TokenAuth* const auth_;
};

}  // namespace latentd::server

#endif  // LATENTD_SERVER_DEVICES_SERVICE_H_
