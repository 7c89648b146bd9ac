#include "services/router/generation_service.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/retry_hint.h"
#include "common/tokenizer/utf8.h"
#include "common/version.h"
#include "services/router/prompt_tokens.h"
#include "services/router/request_validation.h"

namespace cleave::router {
namespace {

// LLM latencies: a millisecond to ten minutes.
prometheus::Histogram& latency(const std::string& name, const std::string& help) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
      1,     2.5,    5,     10,   30,    60,   120, 300,  600};
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Register(metricsRegistry())
      .Add({}, kBuckets);
}

constexpr char kNoTokenizer[] =
    "this router has no tokenizer: start cleave-router with --model (the model file or folder "
    "its workers serve)";

}  // namespace

GenerationService::GenerationService(GenerationServiceOptions options, WorkerPool& pool,
                                     TokenRelay& relay,
                                     std::shared_ptr<const tokenizer::Tokenizer> tokenizer)
    : options_(options),
      pool_(pool),
      relay_(relay),
      tokenizer_(std::move(tokenizer)),
      started_at_(std::chrono::system_clock::now()),
      requests_(prometheus::BuildCounter()
                    .Name("cleave_router_requests_total")
                    .Help("Finished client calls by method and gRPC status code")
                    .Register(metricsRegistry())),
      queue_wait_(latency("cleave_router_queue_wait_seconds",
                          "Time a request waited for admission on a decode worker")),
      ttft_(latency("cleave_router_time_to_first_token_seconds",
                    "Time from receiving a request to sending its first token")),
      inter_token_(latency("cleave_router_inter_token_latency_seconds",
                           "Time between two tokens of a stream (per token)")),
      request_time_(latency("cleave_router_request_seconds",
                            "Time from receiving a request to its final message")),
      kv_transfer_(latency("cleave_router_kv_transfer_seconds",
                           "Time the prefill worker spent moving a prompt's KV cache")),
      prefill_(latency("cleave_router_prefill_seconds",
                       "Time a prefill worker took to compute a prompt's first token")),
      decode_wait_(latency("cleave_router_decode_wait_seconds",
                           "Time a prefilled request waited on its decode worker for a place in "
                           "the decode batch")),
      migrations_(plainCounter("cleave_router_migrations_total",
                               "Streaming requests moved to another decode worker after losing "
                               "theirs")) {}

grpc::Status GenerationService::finish(const char* method, grpc::Status status) {
  std::string code = absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
  requests_.Add({{"method", method}, {"code", code}}).Increment();
  return status;
}

grpc::Status GenerationService::authorize(grpc::ServerContext& context, bool generate,
                                          std::string* client) const {
  if (options_.api_keys == nullptr) return grpc::Status::OK;
  absl::StatusOr<std::string> key = options_.api_keys->check(context);
  if (!key.ok()) return toGrpcStatus(key.status());
  if (client != nullptr) *client = *key;
  return generate ? toGrpcStatus(options_.api_keys->takeRequest(*key), context) : grpc::Status::OK;
}

grpc::Status GenerationService::Generate(grpc::ServerContext* context,
                                         const v1::GenerateRequest* request,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const auto started = std::chrono::steady_clock::now();
  std::string client;
  Record record{.id = request->request_id()};
  grpc::Status status = authorize(*context, /*generate=*/true, &client);
  if (status.ok()) status = toGrpcStatus(validateGenerateRequest(*request));
  if (status.ok()) status = generate(context, *request, writer, client, record);
  if (options_.log_requests) {
    // Sizes and times only: what an operator correlates with metrics and client reports.
    std::string line = absl::StrCat("request ", record.id.empty() ? "-" : record.id,
                                    " key=", client.empty() ? "-" : client,
                                    " model=", request->model().empty() ? "-" : request->model());
    if (record.prompt_tokens >= 0) {
      absl::StrAppend(&line, " prompt=", record.prompt_tokens, " cached=", record.cached_tokens,
                      " completion=", record.completion_tokens);
    }
    if (record.ttft_ms >= 0) absl::StrAppendFormat(&line, " ttft_ms=%.1f", record.ttft_ms);
    absl::StrAppendFormat(
        &line, " total_ms=%.1f",
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count());
    if (!record.workers.empty()) absl::StrAppend(&line, " workers=", record.workers);
    if (status.ok()) {
      absl::StrAppend(
          &line, " -> OK",
          record.finish ? absl::StrCat(" ", v1::FinishReason_Name(*record.finish)) : std::string());
    } else {
      absl::StrAppend(&line, " -> ",
                      absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
    }
    CLEAVE_LOG(INFO) << line;
  }
  return finish("Generate", status);
}

absl::StatusOr<const tokenizer::Tokenizer*> GenerationService::tokenizerFor(
    const std::string& model) const {
  if (tokenizer_ == nullptr) return absl::FailedPreconditionError(kNoTokenizer);
  std::optional<WorkerPool::ModelView> served = pool_.model();
  if (!model.empty() && (!served || (!served->isBase(model) && !served->adapter(model)))) {
    return absl::NotFoundError(absl::StrCat(
        "unknown model '", model, "'", served ? "; this router serves " + served->served() : ""));
  }
  return tokenizer_.get();
}

absl::StatusOr<GenerationService::ChatPrompt> GenerationService::chatPrompt(
    const v1::Chat& chat) const {
  if (tokenizer_ == nullptr) {
    return absl::FailedPreconditionError(kNoPromptTokenizer);
  }
  if (options_.chat_template == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("this router has no chat template (", options_.no_chat_template_reason,
                     "); start it with --chat-template FILE, or send text"));
  }
  tokenizer::ChatInput input{.tools_json = chat.tools_json(),
                             .kwargs_json = chat.template_kwargs_json(),
                             .continue_final_message = chat.continue_final_message()};
  if (chat.has_add_generation_prompt()) {
    if (chat.add_generation_prompt() && chat.continue_final_message()) {
      return absl::InvalidArgumentError(
          "chat: add_generation_prompt and continue_final_message cannot both be true (a reply "
          "either starts a new turn or continues the last one)");
    }
    input.add_generation_prompt = chat.add_generation_prompt();
  }
  for (const v1::ChatMessage& m : chat.messages()) {
    input.messages.push_back({m.role(), m.content(), m.fields_json()});
  }
  absl::StatusOr<std::string> text = options_.chat_template->render(input);
  if (!text.ok()) {
    // INVALID_ARGUMENT for what the conversation asks (or the template refuses);
    // RESOURCE_EXHAUSTED when rendering hit its limits.
    return absl::Status(text.status().code(), absl::StrCat("chat: ", text.status().message()));
  }
  // The template places the special tokens; none are added.
  ChatPrompt prompt{.text = *std::move(text)};
  prompt.ids =
      tokenizer_->encode(prompt.text, {.add_special_tokens = false, .parse_special = true});
  if (prompt.ids.empty()) return absl::InvalidArgumentError("chat: the template renders no tokens");
  return prompt;
}

grpc::Status GenerationService::Tokenize(grpc::ServerContext* context,
                                         const v1::TokenizeRequest* request,
                                         v1::TokenizeResponse* response) {
  // Rendering a chat template is work of its own (bounded, up to seconds): it counts
  // against the key's rate as a Generate call does.
  if (grpc::Status denied = authorize(*context, /*generate=*/request->has_chat()); !denied.ok()) {
    return finish("Tokenize", denied);
  }
  absl::StatusOr<const tokenizer::Tokenizer*> tok = tokenizerFor(request->model());
  if (!tok.ok()) return finish("Tokenize", toGrpcStatus(tok.status()));
  std::vector<uint32_t> ids;
  if (request->has_chat()) {
    if (!request->text().empty()) {
      return finish("Tokenize",
                    grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "set text or chat, not both"));
    }
    if (absl::Status valid = validateChat(request->chat()); !valid.ok()) {
      return finish("Tokenize", toGrpcStatus(valid));
    }
    absl::StatusOr<ChatPrompt> chat = chatPrompt(request->chat());
    if (!chat.ok()) return finish("Tokenize", toGrpcStatus(chat.status()));
    ids = std::move(chat->ids);
    response->set_chat_text(std::move(chat->text));
  } else {
    ids = (*tok)->encode(request->text(), {.add_special_tokens = request->add_special_tokens(),
                                           .parse_special = request->parse_special_tokens()});
  }
  for (uint32_t id : ids) {
    response->add_ids(id);
    if (request->return_pieces()) response->add_pieces((*tok)->piece(id).value_or(""));
  }
  return finish("Tokenize", grpc::Status::OK);
}

grpc::Status GenerationService::Detokenize(grpc::ServerContext* context,
                                           const v1::DetokenizeRequest* request,
                                           v1::DetokenizeResponse* response) {
  if (grpc::Status denied = authorize(*context); !denied.ok()) return finish("Detokenize", denied);
  absl::StatusOr<const tokenizer::Tokenizer*> tok = tokenizerFor(request->model());
  if (!tok.ok()) return finish("Detokenize", toGrpcStatus(tok.status()));
  for (uint32_t id : request->ids()) {
    if (id >= (*tok)->vocabSize()) {
      return finish("Detokenize",
                    grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 absl::StrCat("ids: ", id, " is outside the vocabulary (",
                                              (*tok)->vocabSize(), " tokens)")));
    }
  }
  std::vector<uint32_t> ids(request->ids().begin(), request->ids().end());
  response->set_text(tokenizer::sanitizeUtf8((*tok)->decode(ids, request->skip_special_tokens())));
  return finish("Detokenize", grpc::Status::OK);
}

grpc::Status GenerationService::ListModels(grpc::ServerContext* context,
                                           const v1::ListModelsRequest* request,
                                           v1::ListModelsResponse* response) {
  if (grpc::Status denied = authorize(*context); !denied.ok()) return finish("ListModels", denied);
  // The model of the registered workers; with none registered the list is empty.
  // Each name of the base model (the first is the one replies report), then its adapters.
  if (std::optional<WorkerPool::ModelView> model = pool_.model()) {
    v1::ModelInfo base;
    base.set_context_length(model->context_length);
    base.set_vocab_size(model->vocab_size);
    base.set_block_size(model->block_size);
    for (const std::string& name : model->names) {
      v1::ModelInfo* info = response->add_models();
      *info = base;
      info->set_id(name);
    }
    for (const WorkerPool::AdapterView& adapter : model->adapters) {
      v1::ModelInfo* lora = response->add_models();
      *lora = base;
      lora->set_id(adapter.name);
      lora->set_parent(model->names.front());
    }
  }
  return finish("ListModels", grpc::Status::OK);
}

grpc::Status GenerationService::GetServerInfo(grpc::ServerContext* context,
                                              const v1::GetServerInfoRequest* request,
                                              v1::GetServerInfoResponse* response) {
  if (grpc::Status denied = authorize(*context); !denied.ok())
    return finish("GetServerInfo", denied);
  response->set_version(version());
  response->set_git_commit(gitCommit());
  response->set_queue_depth(static_cast<uint32_t>(pool_.queueDepth()));
  for (v1::WorkerSummary& w : pool_.summaries()) *response->add_workers() = std::move(w);
  response->set_queue_capacity(options_.queue_capacity);
  auto since_epoch = started_at_.time_since_epoch();
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
  response->mutable_started_at()->set_seconds(seconds.count());
  response->mutable_started_at()->set_nanos(static_cast<int32_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch - seconds).count()));
  return finish("GetServerInfo", grpc::Status::OK);
}

}  // namespace cleave::router
