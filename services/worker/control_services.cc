#include "services/worker/control_services.h"

#include "common/grpc_status.h"

namespace cleave::worker {

grpc::Status DecodeService::Reserve(grpc::ServerContext* context, const v1::ReserveRequest* request,
                                    v1::ReserveResponse* response) {
  absl::StatusOr<v1::ReserveResponse> reserved = core_.reserve(*request, context);
  if (!reserved.ok()) return toGrpcStatus(reserved.status());
  *response = std::move(*reserved);
  return grpc::Status::OK;
}

grpc::Status DecodeService::StartDecode(grpc::ServerContext*, const v1::StartDecodeRequest* request,
                                        v1::StartDecodeResponse*) {
  return toGrpcStatus(core_.startDecode(*request));
}

grpc::Status DecodeService::Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) {
  *response = core_.release(*request);
  return grpc::Status::OK;
}

grpc::Status DecodeService::StreamTokens(grpc::ServerContext* context,
                                         const v1::StreamTokensRequest* request,
                                         grpc::ServerWriter<v1::TokenEvents>* writer) {
  return core_.streamTokens(request->router_id(), context, writer);
}

grpc::Status DecodeService::Cancel(grpc::ServerContext*, const v1::CancelRequest* request,
                                   v1::CancelResponse* response) {
  response->set_found(core_.cancel(request->request_id()));
  return grpc::Status::OK;
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const v1::PrefillRequest* request,
                                     v1::PrefillResponse* response) {
  absl::StatusOr<v1::PrefillResponse> done = core_.prefill(*request, context);
  if (!done.ok()) return toGrpcStatus(done.status());
  *response = std::move(*done);
  return grpc::Status::OK;
}

grpc::Status PrefillService::Embed(grpc::ServerContext* context,
                                   const v1::EmbedPromptRequest* request,
                                   v1::EmbedPromptResponse* response) {
  absl::StatusOr<v1::EmbedPromptResponse> done = core_.embed(*request, context);
  if (!done.ok()) return toGrpcStatus(done.status());
  *response = std::move(*done);
  return grpc::Status::OK;
}

grpc::Status PrefillService::CancelPrefill(grpc::ServerContext*, const v1::CancelRequest* request,
                                           v1::CancelResponse* response) {
  response->set_found(core_.cancel(request->request_id()));
  return grpc::Status::OK;
}

}  // namespace cleave::worker
