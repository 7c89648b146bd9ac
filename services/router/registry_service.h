// The router's Registry service (proto/cleave/v1/worker.proto): workers join, renew their
// lease and leave through it; the WorkerPool keeps the state.
#pragma once

#include "cleave/v1/worker.grpc.pb.h"
#include "services/router/worker_pool.h"

namespace cleave::router {

class RegistryService final : public v1::Registry::Service {
 public:
  explicit RegistryService(WorkerPool& pool) : pool_(pool) {}
  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status Deregister(grpc::ServerContext* context, const v1::DeregisterRequest* request,
                          v1::DeregisterResponse* response) override;

 private:
  WorkerPool& pool_;
};

}  // namespace cleave::router
