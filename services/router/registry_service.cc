#include "services/router/registry_service.h"

#include "common/grpc_status.h"
#include "common/log.h"
#include "common/tls.h"

namespace cleave::router {

grpc::Status RegistryService::checkPeer(const grpc::ServerContext& context) const {
  if (!require_worker_cert_ || peerHasVerifiedCert(context)) return grpc::Status::OK;
  return {grpc::StatusCode::UNAUTHENTICATED,
          "a worker must present a client certificate signed by the router's --tls-client-ca "
          "(cleave-worker --tls-cert/--tls-key)"};
}

grpc::Status RegistryService::Register(grpc::ServerContext* context,
                                       const v1::RegisterRequest* request,
                                       v1::RegisterResponse* response) {
  if (grpc::Status peer = checkPeer(*context); !peer.ok()) return peer;
  absl::StatusOr<v1::RegisterResponse> added = pool_.add(*request);
  if (!added.ok()) {
    CLEAVE_LOG(ERROR) << "refused worker " << request->control_address() << ": "
                      << added.status().message();
    return toGrpcStatus(added.status());
  }
  *response = std::move(*added);
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* context,
                                        const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse* response) {
  if (grpc::Status peer = checkPeer(*context); !peer.ok()) return peer;
  if (request->worker_id().empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "worker_id is empty"};
  }
  response->set_reregister(!pool_.heartbeat(*request));
  return grpc::Status::OK;
}

grpc::Status RegistryService::Deregister(grpc::ServerContext* context,
                                         const v1::DeregisterRequest* request,
                                         v1::DeregisterResponse*) {
  if (grpc::Status peer = checkPeer(*context); !peer.ok()) return peer;
  if (request->worker_id().empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "worker_id is empty"};
  }
  pool_.remove(request->worker_id(),
               request->reason().empty() ? "deregistered" : request->reason());
  return grpc::Status::OK;
}

}  // namespace cleave::router
