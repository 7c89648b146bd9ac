#include "services/router/openai_server.h"

#include <algorithm>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/version.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "services/router/openai_requests.h"
#include "services/router/openai_responses.h"

namespace cleave::router {
namespace {

using Json = nlohmann::json;
using Headers = std::vector<std::pair<std::string, std::string>>;

int send(HttpResponse& response, int status, const Json& body, const Headers& headers = {}) {
  response.send(status, "application/json", openai::dumpJson(body), headers);
  return status;
}

int sendError(HttpResponse& response, const openai::ApiError& error) {
  response.send(error.http_status, "application/json", error.body);
  return error.http_status;
}

int sendError(HttpResponse& response, const grpc::Status& status) {
  return sendError(response, openai::apiError(status.error_code(), status.error_message()));
}

// A context for one call on the router, carrying the HTTP request's credentials; null when
// they cannot travel as gRPC metadata (then `error` says why).
std::unique_ptr<grpc::ClientContext> callContext(const HttpRequest& request,
                                                 openai::ApiError& error) {
  auto context = std::make_unique<grpc::ClientContext>();
  const std::string_view auth = request.header("authorization");
  for (unsigned char c : auth) {
    if (c < 0x20 || c > 0x7e) {
      error = openai::apiError(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED),
                               "the Authorization header holds characters outside printable "
                               "ASCII; send 'Bearer KEY'");
      return nullptr;
    }
  }
  if (!auth.empty()) context->AddMetadata("authorization", std::string(auth));
  return context;
}

// The routes and their methods; anything else is 404 or 405.
struct Route {
  const char* path;
  const char* method;
};
constexpr Route kRoutes[] = {{"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
                             {"/v1/models", "GET"},       {"/tokenize", "POST"},
                             {"/detokenize", "POST"},     {"/health", "GET"},
                             {"/version", "GET"}};

}  // namespace

OpenAiServer::OpenAiServer(std::shared_ptr<grpc::Channel> router)
    : stub_(v1::Generation::NewStub(std::move(router))),
      requests_(prometheus::BuildCounter()
                    .Name("cleave_http_requests_total")
                    .Help("Requests to the OpenAI-compatible HTTP API, by path and HTTP status")
                    .Register(metricsRegistry())) {}

OpenAiServer::~OpenAiServer() { http_.reset(); }

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::start(
    const HttpServerOptions& options, std::shared_ptr<grpc::Channel> router) {
  std::unique_ptr<OpenAiServer> server(new OpenAiServer(std::move(router)));
  OpenAiServer* self = server.get();
  auto http =
      HttpServer::start(options, [self](const HttpRequest& request, HttpResponse& response) {
        self->handle(request, response);
      });
  if (!http.ok()) return http.status();
  server->http_ = std::move(*http);
  return server;
}

void OpenAiServer::handle(const HttpRequest& request, HttpResponse& response) {
  const int status = route(request, response);
  std::string path = "other";
  for (const Route& r : kRoutes) {
    if (request.path == r.path) path = r.path;
  }
  requests_.Add({{"path", path}, {"code", std::to_string(status)}}).Increment();
  CLEAVE_LOG(DEBUG) << "http " << request.method << " " << request.path << " -> " << status;
}

int OpenAiServer::route(const HttpRequest& request, HttpResponse& response) {
  const Route* found = nullptr;
  for (const Route& r : kRoutes) {
    if (request.path == r.path) found = &r;
  }
  if (found == nullptr) {
    return sendError(response, openai::apiError(static_cast<int>(grpc::StatusCode::NOT_FOUND),
                                                absl::StrCat("no route ", request.path)));
  }
  if (request.method != found->method) {
    response.send(
        405, "application/json",
        openai::dumpJson(Json{{"error",
                               {{"message", absl::StrCat(request.path, " takes ", found->method)},
                                {"type", "invalid_request_error"},
                                {"param", nullptr},
                                {"code", 405}}}}),
        {{"Allow", found->method}});
    return 405;
  }
  const std::string_view path = found->path;
  if (path == "/health") return send(response, 200, Json::object());
  if (path == "/version") return send(response, 200, Json{{"version", versionString()}});
  if (path == "/v1/models") return listModels(request, response);
  if (path == "/tokenize") return tokenize(false, request, response);
  if (path == "/detokenize") return tokenize(true, request, response);
  return generate(path == "/v1/chat/completions", request, response);
}

int OpenAiServer::listModels(const HttpRequest& request, HttpResponse& response) {
  openai::ApiError error;
  std::unique_ptr<grpc::ClientContext> context = callContext(request, error);
  if (context == nullptr) return sendError(response, error);
  v1::ListModelsResponse models;
  grpc::Status status = stub_->ListModels(context.get(), v1::ListModelsRequest(), &models);
  if (!status.ok()) return sendError(response, status);
  Json data = Json::array();
  for (const v1::ModelInfo& m : models.models()) {
    data.push_back({{"id", m.id()},
                    {"object", "model"},
                    {"created", static_cast<int64_t>(std::time(nullptr))},
                    {"owned_by", "cleave"},
                    {"root", m.id()},
                    {"max_model_len", m.context_length()}});
  }
  return send(response, 200, Json{{"object", "list"}, {"data", std::move(data)}});
}

int OpenAiServer::tokenize(bool detokenize, const HttpRequest& request, HttpResponse& response) {
  absl::StatusOr<Json> body = openai::parseBody(request.body);
  if (!body.ok()) return sendError(response, openai::apiError(body.status()));
  openai::ApiError error;
  std::unique_ptr<grpc::ClientContext> context = callContext(request, error);
  if (context == nullptr) return sendError(response, error);
  if (detokenize) {
    absl::StatusOr<v1::DetokenizeRequest> parsed = openai::parseDetokenizeRequest(*body);
    if (!parsed.ok()) return sendError(response, openai::apiError(parsed.status()));
    v1::DetokenizeResponse text;
    grpc::Status status = stub_->Detokenize(context.get(), *parsed, &text);
    if (!status.ok()) return sendError(response, status);
    return send(response, 200, Json{{"prompt", text.text()}});
  }
  absl::StatusOr<v1::TokenizeRequest> parsed = openai::parseTokenizeRequest(*body);
  if (!parsed.ok()) return sendError(response, openai::apiError(parsed.status()));
  v1::TokenizeResponse ids;
  grpc::Status status = stub_->Tokenize(context.get(), *parsed, &ids);
  if (!status.ok()) return sendError(response, status);
  Json out{{"count", ids.ids_size()},
           {"tokens", Json(std::vector<uint32_t>(ids.ids().begin(), ids.ids().end()))}};
  if (parsed->return_pieces()) {
    out["token_strs"] = std::vector<std::string>(ids.pieces().begin(), ids.pieces().end());
  }
  if (parsed->has_chat()) out["prompt"] = ids.chat_text();
  return send(response, 200, out);
}

int OpenAiServer::generate(bool chat, const HttpRequest& request, HttpResponse& response) {
  absl::StatusOr<Json> body = openai::parseBody(request.body);
  if (!body.ok()) return sendError(response, openai::apiError(body.status()));
  absl::StatusOr<openai::Call> call =
      chat ? openai::parseChatRequest(*body) : openai::parseCompletionRequest(*body);
  if (!call.ok()) return sendError(response, openai::apiError(call.status()));
  const std::string_view request_id = request.header("x-request-id");
  if (!request_id.empty()) {
    const bool printable = std::all_of(request_id.begin(), request_id.end(),
                                       [](unsigned char c) { return c >= 0x21 && c <= 0x7e; });
    if (!printable || request_id.size() > 128) {
      return sendError(response,
                       openai::apiError(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT),
                                        "the X-Request-Id header must be at most 128 printable "
                                        "ASCII characters",
                                        "x-request-id"));
    }
    call->request.set_request_id(std::string(request_id));
  }
  const int64_t created = static_cast<int64_t>(std::time(nullptr));

  openai::ApiError error;
  std::string model = call->request.model();
  if (model.empty()) {  // The response names the model the router serves.
    std::unique_ptr<grpc::ClientContext> context = callContext(request, error);
    if (context == nullptr) return sendError(response, error);
    v1::ListModelsResponse models;
    if (stub_->ListModels(context.get(), v1::ListModelsRequest(), &models).ok() &&
        models.models_size() > 0) {
      model = models.models(0).id();
    }
  }
  std::string echo;
  if (call->echo) {
    if (call->request.has_text()) {
      echo = call->request.text();
    } else {
      std::unique_ptr<grpc::ClientContext> context = callContext(request, error);
      if (context == nullptr) return sendError(response, error);
      v1::DetokenizeRequest ids;
      ids.set_model(call->request.model());
      *ids.mutable_ids() = call->request.token_ids().ids();
      v1::DetokenizeResponse text;
      grpc::Status status = stub_->Detokenize(context.get(), ids, &text);
      if (!status.ok()) return sendError(response, status);
      echo = text.text();
    }
  }

  std::unique_ptr<grpc::ClientContext> context = callContext(request, error);
  if (context == nullptr) return sendError(response, error);
  openai::ResponseBuilder builder(*call, model, created);
  builder.setEcho(std::move(echo));
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(context.get(), call->request);
  Headers headers;
  v1::GenerateResponse message;
  bool streaming = false;
  bool gone = false;
  // Headers wait for the first message, so that refusals (bad values, a full queue) get
  // their own HTTP status even when streaming.
  while (reader->Read(&message)) {
    if (headers.empty() && !message.request_id().empty()) {
      headers.emplace_back("X-Request-Id", message.request_id());
    }
    std::string events = builder.add(message);
    if (!call->stream || gone) continue;
    if (!streaming) {
      streaming = true;
      gone = !response.startStream(200, "text/event-stream", headers);
    }
    if (!gone) gone = !response.write(events);
    if (gone) context->TryCancel();  // Frees the request's KV blocks.
  }
  const grpc::Status status = reader->Finish();
  if (gone) return 499;
  if (!status.ok() || !builder.finished()) {
    const openai::ApiError failed =
        status.ok() ? openai::apiError(static_cast<int>(grpc::StatusCode::INTERNAL),
                                       "the generation stream ended without its final message")
                    : openai::apiError(status.error_code(), status.error_message());
    if (!streaming) return sendError(response, failed);
    // Mid-stream: the error as one more event.
    response.write(absl::StrCat("data: ", failed.body, "\n\ndata: [DONE]\n\n"));
    response.endStream();
    return failed.http_status;
  }
  if (call->stream) {
    response.write(builder.endStream());
    response.endStream();
    return 200;
  }
  return send(response, 200, builder.body(), headers);
}

}  // namespace cleave::router
