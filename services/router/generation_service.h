// The client-facing cleave.v1.Generation service of the router.
//
// Generate runs one request through the worker protocol (proto/cleave/v1/worker.proto):
// admission on a decode worker (WorkerPool), Reserve, Prefill, StartDecode, then the
// sequence's events from the TokenRelay, turned into UTF-8-safe text deltas for the client.
// Whatever ends the call — the last token, an error, the client cancelling or its
// deadline — releases the reservation on the worker and the admission in the router.
//
// Threading: gRPC calls every handler on its own threads, concurrently; shared state is in
// the thread-safe WorkerPool and TokenRelay.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "cleave/v1/generation.grpc.pb.h"
#include "common/tokenizer/tokenizer.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "services/router/token_relay.h"
#include "services/router/worker_pool.h"

namespace cleave::router {

struct GenerationServiceOptions {
  // Capacity of the admission queue, reported by GetServerInfo.
  uint32_t queue_capacity = 1024;
};

class GenerationService final : public v1::Generation::Service {
 public:
  // `tokenizer` (may be null: then only token-id prompts are served) is the served model's.
  GenerationService(GenerationServiceOptions options, WorkerPool& pool, TokenRelay& relay,
                    std::shared_ptr<const tokenizer::Tokenizer> tokenizer);

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
  grpc::Status generate(grpc::ServerContext* context, const v1::GenerateRequest& request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer);
  // The tokenizer for `model` (empty: the served one), or the error to return.
  absl::StatusOr<const tokenizer::Tokenizer*> tokenizerFor(const std::string& model) const;

  GenerationServiceOptions options_;
  WorkerPool& pool_;
  TokenRelay& relay_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  std::atomic<uint64_t> next_request_{1};
  std::chrono::system_clock::time_point started_at_;
  prometheus::Family<prometheus::Counter>& requests_;
  // Latencies of successful requests, s (cleave_router_*_seconds).
  prometheus::Histogram& queue_wait_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& inter_token_;
  prometheus::Histogram& request_time_;
  prometheus::Histogram& kv_transfer_;
  prometheus::Histogram& prefill_;
};

}  // namespace cleave::router
