#include "services/router/generation_service.h"

#include "common/grpc_status.h"
#include "common/metrics.h"
#include "common/version.h"
#include "services/router/request_validation.h"

namespace cleave::router {
namespace {

// No worker can register yet, so no request can be served: say so plainly.
constexpr char kNoWorkers[] =
    "no decode worker is registered with this router; start cleave-worker with "
    "--router pointing at it";
constexpr char kNoTokenizer[] =
    "no model is registered with this router, so there is no tokenizer to use; start a "
    "cleave-worker with --router pointing at it";

}  // namespace

GenerationService::GenerationService(GenerationServiceOptions options)
    : options_(options),
      started_at_(std::chrono::system_clock::now()),
      requests_(prometheus::BuildCounter()
                    .Name("cleave_router_requests_total")
                    .Help("Finished client calls by method and gRPC status code")
                    .Register(metricsRegistry())) {}

grpc::Status GenerationService::finish(const char* method, grpc::Status status) {
  std::string code = absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
  requests_.Add({{"method", method}, {"code", code}}).Increment();
  return status;
}

grpc::Status GenerationService::Generate(grpc::ServerContext* context,
                                         const v1::GenerateRequest* request,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (absl::Status invalid = validateGenerateRequest(*request); !invalid.ok()) {
    return finish("Generate", toGrpcStatus(invalid));
  }
  return finish("Generate", grpc::Status(grpc::StatusCode::UNAVAILABLE, kNoWorkers));
}

grpc::Status GenerationService::Tokenize(grpc::ServerContext* context,
                                         const v1::TokenizeRequest* request,
                                         v1::TokenizeResponse* response) {
  return finish("Tokenize", grpc::Status(grpc::StatusCode::UNAVAILABLE, kNoTokenizer));
}

grpc::Status GenerationService::Detokenize(grpc::ServerContext* context,
                                           const v1::DetokenizeRequest* request,
                                           v1::DetokenizeResponse* response) {
  return finish("Detokenize", grpc::Status(grpc::StatusCode::UNAVAILABLE, kNoTokenizer));
}

grpc::Status GenerationService::ListModels(grpc::ServerContext* context,
                                           const v1::ListModelsRequest* request,
                                           v1::ListModelsResponse* response) {
  // Models come from registered workers; with none registered the list is empty.
  return finish("ListModels", grpc::Status::OK);
}

grpc::Status GenerationService::GetServerInfo(grpc::ServerContext* context,
                                              const v1::GetServerInfoRequest* request,
                                              v1::GetServerInfoResponse* response) {
  response->set_version(version());
  response->set_git_commit(gitCommit());
  response->set_queue_depth(0);
  response->set_queue_capacity(options_.queue_capacity);
  auto since_epoch = started_at_.time_since_epoch();
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
  response->mutable_started_at()->set_seconds(seconds.count());
  response->mutable_started_at()->set_nanos(static_cast<int32_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch - seconds).count()));
  return finish("GetServerInfo", grpc::Status::OK);
}

}  // namespace cleave::router
