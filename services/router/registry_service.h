// The router's Registry service (proto/cleave/v1/worker.proto): workers join, renew their
// lease and leave through it; the WorkerPool keeps the state.
#pragma once

#include "cleave/v1/worker.grpc.pb.h"
#include "services/router/worker_pool.h"

namespace cleave::router {

class RegistryService final : public v1::Registry::Service {
 public:
  // With `require_worker_cert`, every call must come over TLS from a peer whose client
  // certificate the server verified (else UNAUTHENTICATED).
  RegistryService(WorkerPool& pool, bool require_worker_cert)
      : pool_(pool), require_worker_cert_(require_worker_cert) {}
  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status Deregister(grpc::ServerContext* context, const v1::DeregisterRequest* request,
                          v1::DeregisterResponse* response) override;

 private:
  grpc::Status checkPeer(const grpc::ServerContext& context) const;

  WorkerPool& pool_;
  const bool require_worker_cert_;
};

}  // namespace cleave::router
