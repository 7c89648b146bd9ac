// The client-facing cleave.v1.Generation service of the router.
//
// Threading: gRPC calls every handler on its own threads, concurrently; the service keeps
// no mutable state of its own beyond thread-safe metrics.
#pragma once

#include <chrono>

#include "cleave/v1/generation.grpc.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"

namespace cleave::router {

struct GenerationServiceOptions {
  // Capacity of the admission queue, reported by GetServerInfo.
  uint32_t queue_capacity = 1024;
};

class GenerationService final : public v1::Generation::Service {
 public:
  explicit GenerationService(GenerationServiceOptions options);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context, const v1::DetokenizeRequest* request,
                          v1::DetokenizeResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::GetServerInfoResponse* response) override;

 private:
  // Counts one finished call in cleave_router_requests_total and passes the status through.
  grpc::Status finish(const char* method, grpc::Status status);

  GenerationServiceOptions options_;
  std::chrono::system_clock::time_point started_at_;
  prometheus::Family<prometheus::Counter>& requests_;
};

}  // namespace cleave::router
