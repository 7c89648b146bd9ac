// The worker's gRPC services, thin adapters over WorkerCore: DecodeControl and
// PrefillControl of proto/cleave/v1/worker.proto.
#pragma once

#include "cleave/v1/worker.grpc.pb.h"
#include "services/worker/worker_core.h"

namespace cleave::worker {

class DecodeService final : public v1::DecodeControl::Service {
 public:
  explicit DecodeService(WorkerCore& core) : core_(core) {}
  grpc::Status Reserve(grpc::ServerContext* context, const v1::ReserveRequest* request,
                       v1::ReserveResponse* response) override;
  grpc::Status StartDecode(grpc::ServerContext* context, const v1::StartDecodeRequest* request,
                           v1::StartDecodeResponse* response) override;
  grpc::Status Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override;
  grpc::Status StreamTokens(grpc::ServerContext* context, const v1::StreamTokensRequest* request,
                            grpc::ServerWriter<v1::TokenEvents>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override;

 private:
  WorkerCore& core_;
};

class PrefillService final : public v1::PrefillControl::Service {
 public:
  explicit PrefillService(WorkerCore& core) : core_(core) {}
  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                       v1::PrefillResponse* response) override;
  grpc::Status CancelPrefill(grpc::ServerContext* context, const v1::CancelRequest* request,
                             v1::CancelResponse* response) override;
  grpc::Status Embed(grpc::ServerContext* context, const v1::EmbedPromptRequest* request,
                     v1::EmbedPromptResponse* response) override;

 private:
  WorkerCore& core_;
};

}  // namespace cleave::worker
