// The router's OpenAI-compatible HTTP API (cleave-router --http-listen), on its own port:
//
//   POST /v1/completions        text or token-id prompts; "stream": true for server-sent events
//   POST /v1/chat/completions   conversations through the model's chat template
//   POST /v1/responses          OpenAI's Responses API on the chat path (responses_api.h)
//   GET, DELETE /v1/responses/ID, GET /v1/responses/ID/input_items
//                               stored responses (response_store.h)
//   POST /v1/messages, /v1/messages/count_tokens
//                               Anthropic's Messages API on the chat path (messages_api.h)
//   GET  /v1/models             the served model
//   POST /tokenize, /detokenize the model's tokenizer (vLLM's request shapes)
//   GET  /health, /version
//   GET  /metrics               the metrics port's Prometheus text (common/metrics.h)
//
// With a reasoning format (--reasoning-parser), chat replies come back split into
// `reasoning_content` and `content` (reasoning_splitter.h); with a tool call format
// (--tool-call-parser), the calls in replies to requests with tools come back as
// `tool_calls` (tool_call_parser.h).
//
// Every call is made on the router's own cleave.v1.Generation service through an
// in-process channel, so admission, API keys (the Authorization header is passed on),
// rate limits, validation and metrics are the gRPC API's. A request whose client goes away
// (a write fails, or ClientWatch sees the connection closed) cancels its calls, which frees
// their KV blocks. An X-Request-Id header names the
// request (as GenerateRequest.request_id) and is echoed. Web pages of other origins may
// call it (CORS, cors.h).
//
// Threading: start() and the destructor from one owning thread (the destructor waits for
// running requests); requests are served on the HTTP server's threads.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "cleave/v1/generation.grpc.pb.h"
#include "common/client_watch.h"
#include "common/http_server.h"
#include "prometheus/counter.h"
#include "services/router/cors.h"
#include "services/router/openai_requests.h"
#include "services/router/reasoning_splitter.h"
#include "services/router/response_store.h"
#include "services/router/tool_call_parser.h"

namespace cleave::router {

struct OpenAiOptions {
  // How chat replies split into reasoning and content (--reasoning-parser).
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  // How tool calls are found in chat replies to requests that offer tools
  // (--tool-call-parser).
  ToolCallFormat tool_calls = ToolCallFormat::kNone;
  // The memory kept for Responses API responses (--http-response-store-mib); 0 keeps none.
  int64_t response_store_bytes = int64_t{256} << 20;
  // Origins whose web pages may call the API (--http-allowed-origins, cors.h).
  std::string allowed_origins = "*";
  // What the router fills in where a request leaves sampling unset (--generation-config):
  // a Responses API response echoes the temperature and top_p the reply was sampled with.
  v1::SamplingParams sampling_defaults;
};

class OpenAiServer {
 public:
  // Serves on options.listen, calling the router through `router`.
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> start(const HttpServerOptions& options,
                                                             std::shared_ptr<grpc::Channel> router,
                                                             const OpenAiOptions& openai = {});
  ~OpenAiServer();

  int port() const { return http_->port(); }

 private:
  OpenAiServer(std::shared_ptr<grpc::Channel> router, const OpenAiOptions& options);
  void handle(const HttpRequest& request, HttpResponse& response);
  // Returns the HTTP status sent.
  int route(const HttpRequest& request, HttpResponse& response);
  int generate(openai::Endpoint endpoint, const HttpRequest& request, HttpResponse& response);
  int listModels(const HttpRequest& request, HttpResponse& response);
  // The router's models, asked with the request's credentials: 0, or the HTTP status of
  // the error sent.
  int servedModels(const HttpRequest& request, HttpResponse& response,
                   v1::ListModelsResponse& models);
  int tokenize(bool detokenize, const HttpRequest& request, HttpResponse& response);
  // GET or DELETE /v1/responses/ID, GET /v1/responses/ID/input_items.
  int storedResponse(const HttpRequest& request, HttpResponse& response);
  // POST /v1/messages/count_tokens: the prompt's tokens, as Anthropic's API counts them.
  int countTokens(const HttpRequest& request, HttpResponse& response);
  // POST /v1/embeddings: one Generation.Embed call per input, a few at a time.
  int embeddings(const HttpRequest& request, HttpResponse& response);

  std::unique_ptr<v1::Generation::Stub> stub_;
  const ReasoningFormat reasoning_;
  const ToolCallFormat tool_calls_;
  const v1::SamplingParams sampling_defaults_;
  const CorsPolicy cors_;
  prometheus::Family<prometheus::Counter>& requests_;
  std::unique_ptr<ResponseStore> store_;  // Null when none is kept.
  ClientWatch watch_;                     // Clients that leave before their response is written.
  // Last: destroyed first, so no request runs while the rest goes away.
  std::unique_ptr<HttpServer> http_;
};

}  // namespace cleave::router
