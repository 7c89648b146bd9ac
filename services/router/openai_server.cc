#include "services/router/openai_server.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <ctime>
#include <deque>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/retry_hint.h"
#include "common/version.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "services/router/messages_api.h"
#include "services/router/openai_embeddings.h"
#include "services/router/openai_fields.h"
#include "services/router/openai_requests.h"
#include "services/router/openai_responses.h"
#include "services/router/responses_api.h"

namespace cleave::router {
namespace {

using Json = nlohmann::json;
using Headers = std::vector<std::pair<std::string, std::string>>;

int send(HttpResponse& response, int status, const Json& body, const Headers& headers = {}) {
  response.send(status, "application/json", openai::dumpJson(body), headers);
  return status;
}

int sendError(HttpResponse& response, const openai::ApiError& error, Headers headers = {}) {
  if (error.retry_after_ms > 0) {
    headers.emplace_back("retry-after", absl::StrCat((error.retry_after_ms + 999) / 1000));
    headers.emplace_back("retry-after-ms", absl::StrCat(error.retry_after_ms));
  }
  response.send(error.http_status, "application/json", error.body, headers);
  return error.http_status;
}

int sendError(HttpResponse& response, const grpc::Status& status) {
  return sendError(response, openai::apiError(status.error_code(), status.error_message()));
}

// A context for one call on the router, carrying the HTTP request's credentials; null when
// they cannot travel as gRPC metadata (then `error` says why).
// The request's credentials as an authorization value: its Authorization header, or
// Anthropic's clients' x-api-key as a bearer key; empty when it has neither.
std::string credentials(const HttpRequest& request) {
  if (!request.header("authorization").empty()) return std::string(request.header("authorization"));
  if (!request.header("x-api-key").empty())
    return "Bearer " + std::string(request.header("x-api-key"));
  return "";
}

std::unique_ptr<grpc::ClientContext> callContext(const HttpRequest& request,
                                                 openai::ApiError& error) {
  auto context = std::make_unique<grpc::ClientContext>();
  const std::string auth = credentials(request);
  for (unsigned char c : auth) {
    if (c < 0x20 || c > 0x7e) {
      error = openai::apiError(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED),
                               "the Authorization header holds characters outside printable "
                               "ASCII; send 'Bearer KEY'");
      return nullptr;
    }
  }
  if (!auth.empty()) context->AddMetadata("authorization", auth);
  return context;
}

// The routes and their methods; anything else is 404 or 405.
struct Route {
  const char* path;
  const char* methods;  // Comma-separated, as an Allow header lists them.
};
// A path ending in '/' takes any rest ("/v1/models/ID").
constexpr Route kRoutes[] = {{"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
                             {"/v1/responses", "POST"},   {"/v1/responses/", "GET, DELETE"},
                             {"/v1/models", "GET"},       {"/v1/embeddings", "POST"},
                             {"/v1/models/", "GET"},      {"/tokenize", "POST"},
                             {"/detokenize", "POST"},     {"/health", "GET"},
                             {"/version", "GET"},         {"/metrics", "GET"},
                             {"/v1/messages", "POST"},    {"/v1/messages/count_tokens", "POST"}};

bool allows(const Route& route, absl::string_view method) {
  for (absl::string_view allowed : absl::StrSplit(route.methods, ", ")) {
    if (allowed == method) return true;
  }
  return false;
}

const Route* routeOf(const std::string& path) {
  for (const Route& r : kRoutes) {
    const std::string_view route = r.path;
    if (route.ends_with('/') ? path.starts_with(route) && path.size() > route.size()
                             : path == route) {
      return &r;
    }
  }
  return nullptr;
}

// A response whose errors are in Anthropic's shape (the Messages API's routes).
class AnthropicErrors final : public HttpResponse {
 public:
  explicit AnthropicErrors(HttpResponse& inner) : inner_(inner) {}
  void send(int status, std::string_view content_type, std::string_view body,
            const Headers& headers) override {
    if (status < 400) return inner_.send(status, content_type, body, headers);
    inner_.send(status, content_type, openai::anthropicError(status, std::string(body)), headers);
  }
  bool startStream(int status, std::string_view content_type, const Headers& headers) override {
    return inner_.startStream(status, content_type, headers);
  }
  bool write(std::string_view data) override { return inner_.write(data); }
  void endStream() override { inner_.endStream(); }
  bool clientGone() override { return inner_.clientGone(); }

 private:
  HttpResponse& inner_;
};

// The messages of several Generate streams in arrival order; a null message ends a stream.
class Arrivals {
 public:
  void push(int choice, std::optional<v1::GenerateResponse> message) {
    absl::MutexLock lock(&mu_);
    queue_.emplace_back(choice, std::move(message));
  }
  // Waits for the next arrival.
  std::pair<int, std::optional<v1::GenerateResponse>> pop() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Arrivals::ready));
    auto next = std::move(queue_.front());
    queue_.pop_front();
    return next;
  }

 private:
  bool ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty(); }
  absl::Mutex mu_;
  std::deque<std::pair<int, std::optional<v1::GenerateResponse>>> queue_ ABSL_GUARDED_BY(mu_);
};

// The next message of a single call read on the calling thread, as Arrivals::pop() gives it.
std::pair<int, std::optional<v1::GenerateResponse>> readOne(
    grpc::ClientReader<v1::GenerateResponse>& reader) {
  std::pair<int, std::optional<v1::GenerateResponse>> next(0, v1::GenerateResponse());
  if (!reader.Read(&*next.second)) next.second.reset();
  return next;
}

// X-Request-Id's limit: the router's 128 characters for a request id, less a choice's "-255".
constexpr size_t kMaxRequestIdLength = 124;
static_assert(openai::kMaxCompletions <= 1000, "a choice's suffix is at most 4 characters");

}  // namespace

OpenAiServer::OpenAiServer(std::shared_ptr<grpc::Channel> router, const OpenAiOptions& options)
    : stub_(v1::Generation::NewStub(std::move(router))),
      reasoning_(options.reasoning),
      tool_calls_(options.tool_calls),
      sampling_defaults_(options.sampling_defaults),
      cors_(options.allowed_origins),
      requests_(prometheus::BuildCounter()
                    .Name("cleave_http_requests_total")
                    .Help("Requests to the OpenAI-compatible HTTP API, by path and HTTP status")
                    .Register(metricsRegistry())) {
  if (options.response_store_bytes > 0)
    store_ = std::make_unique<ResponseStore>(options.response_store_bytes);
}

OpenAiServer::~OpenAiServer() { http_.reset(); }

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::start(
    const HttpServerOptions& options, std::shared_ptr<grpc::Channel> router,
    const OpenAiOptions& openai) {
  std::unique_ptr<OpenAiServer> server(new OpenAiServer(std::move(router), openai));
  OpenAiServer* self = server.get();
  HttpServerOptions http_options = options;
  // The server's own errors (a body too large, too slow) are readable by the pages too.
  http_options.error_headers = [self](const HttpRequest& request) {
    return self->cors_.responseHeaders(request.header("origin"));
  };
  auto http =
      HttpServer::start(http_options, [self](const HttpRequest& request, HttpResponse& response) {
        self->handle(request, response);
      });
  if (!http.ok()) return http.status();
  server->http_ = std::move(*http);
  return server;
}

void OpenAiServer::handle(const HttpRequest& request, HttpResponse& raw) {
  CorsResponse response(raw, cors_.responseHeaders(request.header("origin")));
  AnthropicErrors anthropic(response);
  const bool messages = request.path.starts_with("/v1/messages");
  const Route* found = routeOf(request.path);
  int status = found != nullptr ? cors_.answerPreflight(request, found->methods, raw) : 0;
  if (status == 0)
    status = route(request, messages ? anthropic : static_cast<HttpResponse&>(response));
  requests_
      .Add({{"path", found != nullptr ? found->path : "other"}, {"code", std::to_string(status)}})
      .Increment();
  CLEAVE_LOG(DEBUG) << "http " << request.method << " " << request.path << " -> " << status;
}

int OpenAiServer::route(const HttpRequest& request, HttpResponse& response) {
  const Route* found = routeOf(request.path);
  if (found == nullptr) {
    return sendError(response, openai::apiError(static_cast<int>(grpc::StatusCode::NOT_FOUND),
                                                absl::StrCat("no route ", request.path)));
  }
  if (!allows(*found, request.method)) {
    response.send(
        405, "application/json",
        openai::dumpJson(Json{{"error",
                               {{"message", absl::StrCat(request.path, " takes ", found->methods)},
                                {"type", "invalid_request_error"},
                                {"param", nullptr},
                                {"code", 405}}}}),
        {{"Allow", found->methods}});
    return 405;
  }
  const std::string_view path = found->path;
  if (path == "/health") return send(response, 200, Json::object());
  if (path == "/version") return send(response, 200, Json{{"version", versionString()}});
  if (path == "/metrics") {  // The metrics port's text, where vLLM's clients look for it.
    response.send(200, "text/plain; version=0.0.4", metricsText());
    return 200;
  }
  if (path == "/v1/models" || path == "/v1/models/") return listModels(request, response);
  if (path == "/tokenize") return tokenize(false, request, response);
  if (path == "/detokenize") return tokenize(true, request, response);
  if (path == "/v1/responses") return generate(openai::Endpoint::kResponses, request, response);
  if (path == "/v1/responses/") return storedResponse(request, response);
  if (path == "/v1/messages") return generate(openai::Endpoint::kMessages, request, response);
  if (path == "/v1/messages/count_tokens") return countTokens(request, response);
  if (path == "/v1/embeddings") return embeddings(request, response);
  return generate(path == "/v1/chat/completions" ? openai::Endpoint::kChatCompletions
                                                 : openai::Endpoint::kCompletions,
                  request, response);
}

int OpenAiServer::servedModels(const HttpRequest& request, HttpResponse& response,
                               v1::ListModelsResponse& models) {
  openai::ApiError error;
  std::unique_ptr<grpc::ClientContext> context = callContext(request, error);
  if (context == nullptr) return sendError(response, error);
  grpc::Status status = stub_->ListModels(context.get(), v1::ListModelsRequest(), &models);
  if (!status.ok()) return sendError(response, status);
  return 0;
}

int OpenAiServer::listModels(const HttpRequest& request, HttpResponse& response) {
  v1::ListModelsResponse models;
  if (const int sent = servedModels(request, response, models); sent != 0) return sent;
  Json data = Json::array();
  for (const v1::ModelInfo& m : models.models()) {
    data.push_back({{"id", m.id()},
                    {"object", "model"},
                    {"created", static_cast<int64_t>(std::time(nullptr))},
                    {"owned_by", "cleave"},
                    {"root", m.id()},
                    {"parent", m.parent().empty() ? Json(nullptr) : Json(m.parent())},
                    {"max_model_len", m.context_length()},
                    {"vocab_size", m.vocab_size()}});
  }
  if (request.path == "/v1/models") {
    return send(response, 200, Json{{"object", "list"}, {"data", std::move(data)}});
  }
  // GET /v1/models/ID: that model.
  const std::string id = request.path.substr(std::string_view("/v1/models/").size());
  for (const Json& model : data) {
    if (model["id"] == id) return send(response, 200, model);
  }
  return sendError(response, openai::apiError(static_cast<int>(grpc::StatusCode::NOT_FOUND),
                                              absl::StrCat("unknown model '", id, "'")));
}

int OpenAiServer::storedResponse(const HttpRequest& request, HttpResponse& response) {
  // The credentials must be good ones (the router checks them on any call) and the
  // response's own.
  v1::ListModelsResponse models;
  if (const int sent = servedModels(request, response, models); sent != 0) return sent;
  absl::string_view rest = absl::string_view(request.path).substr(strlen("/v1/responses/"));
  const bool items = absl::ConsumeSuffix(&rest, "/input_items");
  const std::string id(rest);
  auto notFound = [&](std::string why) {
    return sendError(response,
                     openai::apiError(static_cast<int>(grpc::StatusCode::NOT_FOUND), why));
  };
  if (store_ == nullptr) {
    return notFound("this router keeps no responses (started with --http-response-store-mib=0)");
  }
  if (id.empty() || id.find('/') != std::string::npos || (items && request.method != "GET")) {
    return notFound(absl::StrCat("no route ", request.method, " ", request.path));
  }
  const std::string owner = credentials(request);
  if (request.method == "DELETE") {
    if (!store_->erase(id, owner)) return notFound(absl::StrCat("no stored response '", id, "'"));
    return send(response, 200, Json{{"id", id}, {"object", "response"}, {"deleted", true}});
  }
  std::optional<ResponseStore::Response> stored = store_->get(id, owner);
  if (!stored) return notFound(absl::StrCat("no stored response '", id, "'"));
  if (!items) return send(response, 200, stored->response);
  absl::StatusOr<Json> page = openai::itemsPage(
      stored->input, {request.param("limit"), request.param("order"), request.param("after")});
  if (!page.ok()) return sendError(response, openai::apiError(page.status()));
  return send(response, 200, *page);
}

int OpenAiServer::embeddings(const HttpRequest& request, HttpResponse& response) {
  absl::StatusOr<Json> body = openai::parseBody(request.body);
  if (!body.ok()) return sendError(response, openai::apiError(body.status()));
  absl::StatusOr<openai::EmbeddingsCall> call = openai::parseEmbeddingsRequest(*body);
  if (!call.ok()) return sendError(response, openai::apiError(call.status()));
  const size_t n = call->inputs.size();
  openai::ApiError error;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
  for (auto& context : contexts) {
    context = callContext(request, error);
    if (context == nullptr) return sendError(response, error);
  }
  std::string model = call->inputs[0].model();
  if (model.empty()) {  // The response names the model the router serves.
    v1::ListModelsResponse models;
    if (const int sent = servedModels(request, response, models); sent != 0) return sent;
    if (models.models_size() > 0) model = models.models(0).id();
  }
  // The inputs' calls, a few at a time: each is a prompt computed on a worker. The first
  // that fails, or the client leaving, cancels the rest.
  constexpr size_t kParallel = 16;
  std::vector<v1::EmbedResponse> answers(n);
  std::vector<grpc::Status> statuses(n);
  std::atomic<size_t> next{0};
  auto cancelAll = [&] {
    for (auto& context : contexts) context->TryCancel();
  };
  std::atomic<bool> left{false};
  const ClientWatch::Ticket watching = watch_.watch(response, [&] {
    left = true;
    cancelAll();
  });
  auto work = [&] {
    for (size_t i; (i = next++) < n;) {
      statuses[i] = stub_->Embed(contexts[i].get(), call->inputs[i], &answers[i]);
      if (!statuses[i].ok()) cancelAll();
    }
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < std::min(n, kParallel); ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {  // Fewer threads: those started, and this one.
      break;
    }
  }
  work();
  for (std::thread& helper : helpers) helper.join();
  if (left) return 499;
  // The first failure is the cause; the calls it cancelled say only that.
  const grpc::Status* failed = nullptr;
  for (const grpc::Status& status : statuses) {
    if (status.ok()) continue;
    if (failed == nullptr || failed->error_code() == grpc::StatusCode::CANCELLED) failed = &status;
  }
  if (failed != nullptr) return sendError(response, *failed);
  return send(response, 200, openai::embeddingsResponse(answers, call->base64, model));
}

int OpenAiServer::countTokens(const HttpRequest& request, HttpResponse& response) {
  absl::StatusOr<Json> body = openai::parseBody(request.body);
  if (!body.ok()) return sendError(response, openai::apiError(body.status()));
  absl::StatusOr<openai::Call> call = openai::parseMessagesRequest(*body, /*counting=*/true);
  if (!call.ok()) return sendError(response, openai::apiError(call.status()));
  openai::ApiError error;
  std::unique_ptr<grpc::ClientContext> context = callContext(request, error);
  if (context == nullptr) return sendError(response, error);
  v1::TokenizeRequest tokenize;
  tokenize.set_model(call->request.model());
  *tokenize.mutable_chat() = call->request.chat();
  v1::TokenizeResponse ids;
  grpc::Status status = stub_->Tokenize(context.get(), tokenize, &ids);
  if (!status.ok()) return sendError(response, status);
  return send(response, 200, Json{{"input_tokens", ids.ids_size()}});
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

int OpenAiServer::generate(openai::Endpoint endpoint, const HttpRequest& request,
                           HttpResponse& response) {
  absl::StatusOr<Json> body = openai::parseBody(request.body);
  if (!body.ok()) return sendError(response, openai::apiError(body.status()));
  const bool chat = endpoint != openai::Endpoint::kCompletions;
  const bool responses = endpoint == openai::Endpoint::kResponses;
  // A response belongs to the credentials that made it (response_store.h).
  const std::string owner = credentials(request);
  const Json* previous = responses ? openai::field(*body, "previous_response_id") : nullptr;
  std::optional<Json> history;  // The stored conversation it continues.
  if (previous != nullptr && store_ != nullptr) {
    if (!previous->is_string()) {
      return sendError(
          response, openai::apiError(openai::invalid("previous_response_id", "must be a string")));
    }
    absl::StatusOr<Json> turns = store_->history(previous->get<std::string>(), owner);
    if (!turns.ok()) {  // As OpenAI answers: clients then send the whole conversation.
      return sendError(
          response,
          openai::apiError(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT),
                           absl::StrCat("previous_response_id: ", turns.status().message()),
                           "previous_response_id", "previous_response_not_found"));
    }
    history = std::move(*turns);
  }
  const bool messages = endpoint == openai::Endpoint::kMessages;
  absl::StatusOr<openai::Call> call =
      responses  ? openai::parseResponsesRequest(*body, history ? &*history : nullptr)
      : messages ? openai::parseMessagesRequest(*body)
      : chat     ? openai::parseChatRequest(*body)
                 : openai::parseCompletionRequest(*body);
  if (!call.ok()) return sendError(response, openai::apiError(call.status()));
  if (chat) {
    // A Qwen3 template asked not to think closes the block itself: the reply is content.
    if (!(reasoning_ == ReasoningFormat::kQwen3 && call->thinking_off)) {
      call->reasoning = reasoning_;
    }
    // Calls are looked for in replies to requests that offered tools; with no parser to
    // find them, only a forced call can be answered (as vLLM refuses "auto").
    if (call->offers_tools && tool_calls_ == ToolCallFormat::kNone && call->forced_tool.empty() &&
        !call->forced_any_tool) {
      return sendError(
          response,
          openai::apiError(
              static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT),
              "\"auto\" tool choice needs a tool-call parser to find the calls in "
              "replies: start the router with --tool-call-parser (hermes, "
              "llama3_json, mistral, deepseek_v3, qwen3_coder, glm45, pythonic or openai), "
              "or send "
              "tool_choice \"none\", \"required\" or a named function",
              "tool_choice"));
    }
    if (call->offers_tools) call->tool_calls = tool_calls_;
    // A JSON-object reply is the object: no reasoning block, no call to look for.
    if (call->request.sampling().response_format() != v1::RESPONSE_FORMAT_TEXT) {
      call->reasoning = ReasoningFormat::kNone;
      call->tool_calls = ToolCallFormat::kNone;
    }
    // The parsers read tags a vocabulary may mark special: they must reach the text.
    if ((call->reasoning != ReasoningFormat::kNone || call->tool_calls != ToolCallFormat::kNone) &&
        !call->request.has_skip_special_tokens()) {
      call->request.set_skip_special_tokens(false);
    }
  }
  // The request's id: the client's X-Request-Id, else a new one. It names the response
  // ("cmpl-ID"), comes back in X-Request-Id, and is each call's request_id ("ID-i" for
  // choice i of several), so the router's logs name it too.
  std::string request_id(request.header("x-request-id"));
  if (!request_id.empty()) {
    const bool printable = std::all_of(request_id.begin(), request_id.end(),
                                       [](unsigned char c) { return c >= 0x21 && c <= 0x7e; });
    if (!printable || request_id.size() > kMaxRequestIdLength) {
      return sendError(
          response,
          openai::apiError(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT),
                           absl::StrCat("the X-Request-Id header must be at most ",
                                        kMaxRequestIdLength, " printable ASCII characters"),
                           "x-request-id"));
    }
  } else {
    request_id = openai::randomId();
  }
  const Headers headers = {{"X-Request-Id", request_id}};
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
  // The prompts (several for a batch of completions); each makes n choices.
  const std::vector<v1::GenerateRequest> prompts =
      call->prompts.empty() ? std::vector<v1::GenerateRequest>{call->request} : call->prompts;
  std::vector<std::string> echoes(prompts.size());
  for (size_t p = 0; p < prompts.size() && call->echo; ++p) {
    if (prompts[p].has_text()) {
      echoes[p] = prompts[p].text();
      continue;
    }
    std::unique_ptr<grpc::ClientContext> context = callContext(request, error);
    if (context == nullptr) return sendError(response, error);
    v1::DetokenizeRequest ids;
    ids.set_model(prompts[p].model());
    *ids.mutable_ids() = prompts[p].token_ids().ids();
    v1::DetokenizeResponse text;
    grpc::Status status = stub_->Detokenize(context.get(), ids, &text);
    if (!status.ok()) return sendError(response, status);
    echoes[p] = text.text();
  }

  // One Generate call per choice (choice p * n + i: sample i of prompt p), each read on a
  // thread of its own into one queue (a single call, on this thread); this thread answers
  // with what arrives.
  const int per_prompt = call->n;
  const int n = static_cast<int>(prompts.size()) * per_prompt;
  // A stored response's id is new whatever X-Request-Id says: a conversation's chain never
  // meets an id twice.
  const std::string id = responses  ? absl::StrCat("resp_", openai::randomId())
                         : messages ? absl::StrCat("msg_", request_id)
                                    : absl::StrCat(chat ? "chatcmpl-" : "cmpl-", request_id);
  // The Responses and Messages APIs render the one reply as their own objects and events.
  std::unique_ptr<openai::ReplyRenderer> renderer;
  const Json* store = responses ? openai::field(*body, "store") : nullptr;
  const bool storing = responses && store_ != nullptr && !(store != nullptr && *store == false);
  if (responses) {
    Json echoed = *body;
    echoed["store"] = storing;
    // What the reply was sampled with: the model's recommendation where the request is silent.
    // (Rounded: 0.6 is echoed as 0.6, not as the float's 0.6000000238.)
    auto echo = [&](const char* key, bool set, float value) {
      if (set && openai::field(echoed, key) == nullptr)
        echoed[key] = std::round(static_cast<double>(value) * 1e6) / 1e6;
    };
    echo("temperature", sampling_defaults_.has_temperature(), sampling_defaults_.temperature());
    echo("top_p", sampling_defaults_.has_top_p(), sampling_defaults_.top_p());
    renderer = std::make_unique<openai::ResponsesRenderer>(echoed, id, model, created);
  }
  if (messages) renderer = std::make_unique<openai::MessagesRenderer>(id, model);
  // Kept before the client has it: a follow-up may name it at once.
  auto keep = [&](const Json& object) {
    if (!storing) return;
    store_->put(id, {.owner = owner,
                     .previous = previous != nullptr ? previous->get<std::string>() : "",
                     .input = openai::inputItems(*body),
                     .response = object});
  };
  std::vector<std::unique_ptr<openai::ResponseBuilder>> builders;
  std::vector<v1::GenerateRequest> requests;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (int k = 0; k < n; ++k) {
    const int p = k / per_prompt, i = k % per_prompt;
    builders.push_back(std::make_unique<openai::ResponseBuilder>(*call, id, model, created, k));
    builders.back()->setEcho(echoes[p]);
    v1::GenerateRequest& one = requests.emplace_back(prompts[p]);
    one.set_request_id(n > 1 ? absl::StrCat(request_id, "-", k) : request_id);
    if (i > 0 && one.sampling().has_seed()) {
      one.mutable_sampling()->set_seed(one.sampling().seed() + i);
    }
    contexts.push_back(callContext(request, error));
    if (contexts.back() == nullptr) return sendError(response, error);
  }
  auto cancelAll = [&] {
    for (auto& context : contexts) context->TryCancel();  // Frees the requests' KV blocks.
  };
  // A client that leaves before its response is written cancels it too (a response sent
  // whole writes nothing until then).
  std::atomic<bool> left{false};
  const ClientWatch::Ticket watching = watch_.watch(response, [&] {
    left = true;
    cancelAll();
  });
  Arrivals arrivals;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>> readers(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    readers[i] = stub_->Generate(contexts[i].get(), requests[i]);
    if (n == 1) break;  // One call is read on this thread.
    try {
      threads.emplace_back([&arrivals, reader = readers[i].get(), i] {
        v1::GenerateResponse message;
        while (reader->Read(&message)) arrivals.push(i, std::move(message));
        arrivals.push(i, std::nullopt);
      });
    } catch (const std::system_error&) {  // No thread to spare: undo what started.
      cancelAll();
      for (int j = 0; j <= i; ++j) {
        if (j == i) {
          v1::GenerateResponse message;
          while (readers[j]->Read(&message)) {
          }
        }
        if (j < i) threads[j].join();
        readers[j]->Finish();
      }
      return sendError(response,
                       openai::apiError(static_cast<int>(grpc::StatusCode::UNAVAILABLE),
                                        "the router has no thread to spare; retry"),
                       headers);
    }
  }
  bool streaming = false;
  bool gone = false;
  std::optional<openai::ApiError> failed;
  // Headers wait until every choice has its first message (or has ended), so that a
  // refusal (a bad value, a full queue) gets its own HTTP status even when streaming;
  // events until then are held.
  std::vector<bool> heard(n, false);
  int heard_from = 0;
  std::string held = renderer && call->stream ? renderer->started() : "";
  for (int open = n; open > 0;) {
    auto [i, message] = n > 1 ? arrivals.pop() : readOne(*readers[0]);
    gone = gone || left;
    if (!heard[i]) {
      heard[i] = true;
      ++heard_from;
    }
    if (!message) {  // Choice i's stream is over: its reader is done with the call.
      --open;
      const grpc::Status status = readers[i]->Finish();
      if ((!status.ok() || !builders[i]->finished()) && !failed && !gone) {
        failed = status.ok()
                     ? openai::apiError(static_cast<int>(grpc::StatusCode::INTERNAL),
                                        "the generation stream ended without its final message")
                     : openai::apiError(status.error_code(), status.error_message());
        if (std::optional<std::chrono::milliseconds> after = retryAfter(*contexts[i]))
          failed->retry_after_ms = after->count();
        cancelAll();  // One choice failed: the response has failed.
      }
      continue;
    }
    if (failed || gone) continue;  // Draining what the cancelled calls still send.
    held += builders[i]->add(*message);
    if (renderer && call->stream && !message->has_final()) held += renderer->progress(*builders[i]);
    if (!call->stream || heard_from < n) continue;
    if (!streaming) {
      streaming = true;
      gone = !response.startStream(200, "text/event-stream", headers);
    }
    if (!gone) gone = !response.write(held);
    held.clear();
    if (gone) cancelAll();
  }
  for (std::thread& t : threads) t.join();
  if (gone) return 499;
  if (failed) {
    if (!streaming) return sendError(response, *failed, headers);
    // Mid-stream: the error as one more event.
    response.write(renderer ? renderer->failed(*failed)
                            : absl::StrCat("data: ", failed->body, "\n\ndata: [DONE]\n\n"));
    response.endStream();
    return failed->http_status;
  }
  if (call->stream) {
    const std::string rest =
        held + (renderer ? renderer->finished(*builders[0]) : openai::endOfStream(*call, builders));
    if (responses) keep(static_cast<openai::ResponsesRenderer&>(*renderer).streamed(*builders[0]));
    if (!streaming && !response.startStream(200, "text/event-stream", headers)) return 499;
    response.write(rest);
    response.endStream();
    return 200;
  }
  const Json out = renderer ? renderer->body(*builders[0]) : openai::responseBody(*call, builders);
  if (responses) keep(out);
  return send(response, 200, out, headers);
}

}  // namespace cleave::router
