// Generation.Embed: one input's embedding, computed by a worker that prefills.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "grpcpp/client_context.h"
#include "services/engine/kv_block_pool.h"
#include "services/router/context_overflow.h"
#include "services/router/generation_service.h"
#include "services/router/prefix_index.h"
#include "services/router/prompt_tokens.h"
#include "services/router/request_validation.h"

namespace cleave::router {
namespace {

// Workers tried for one input before its call fails: one that died or left mid-call, or
// cannot compute hidden states (a GPU worker), is passed over for the next.
constexpr int kEmbedAttempts = 3;

// The worker is gone or going (UNAVAILABLE, or no answer), or computes no hidden states
// (UNIMPLEMENTED): another may compute it.
bool anotherMay(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::UNIMPLEMENTED;
}

}  // namespace

grpc::Status GenerationService::Embed(grpc::ServerContext* context, const v1::EmbedRequest* request,
                                      v1::EmbedResponse* response) {
  const auto started = std::chrono::steady_clock::now();
  std::string client;
  // Computing a prompt counts against the key's rate as a Generate call does.
  grpc::Status status = authorize(*context, /*generate=*/true, &client);
  if (status.ok()) status = embed(context, *request, *response);
  if (options_.log_requests) {
    // As Generate's line: sizes and times, never the input.
    std::string line = absl::StrCat("embed ",
                                    !response->request_id().empty()  ? response->request_id()
                                    : !request->request_id().empty() ? request->request_id()
                                                                     : std::string("-"),
                                    " key=", client.empty() ? "-" : client,
                                    " model=", request->model().empty() ? "-" : request->model());
    if (status.ok()) {
      absl::StrAppend(&line, " prompt=", response->prompt_tokens(),
                      " cached=", response->cached_prompt_tokens());
    }
    absl::StrAppendFormat(
        &line, " total_ms=%.1f",
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count());
    absl::StrAppend(&line, " -> ",
                    status.ok()
                        ? "OK"
                        : absl::StrCat(absl::StatusCodeToString(
                                           static_cast<absl::StatusCode>(status.error_code())),
                                       ": ", status.error_message()));
    CLEAVE_LOG(INFO) << line;
  }
  return finish("Embed", status);
}

grpc::Status GenerationService::embed(grpc::ServerContext* context, const v1::EmbedRequest& request,
                                      v1::EmbedResponse& response) {
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("request_id must be at most ", kMaxRequestIdBytes, " bytes")};
  }
  if (request.cache_salt().size() > engine::kMaxCacheSaltBytes) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("cache_salt must be at most ", engine::kMaxCacheSaltBytes, " bytes")};
  }
  std::optional<WorkerPool::ModelView> model = pool_.model();
  if (!model) {
    return {grpc::StatusCode::UNAVAILABLE,
            "no worker is registered with this router; start cleave-worker with --router "
            "pointing at it"};
  }
  absl::StatusOr<const WorkerPool::AdapterView*> adapter = adapterNamed(*model, request.model());
  if (!adapter.ok()) return toGrpcStatus(adapter.status());
  std::vector<uint32_t> prompt;
  if (request.has_text()) {
    if (tokenizer_ == nullptr) {
      return {grpc::StatusCode::FAILED_PRECONDITION, kNoPromptTokenizer};
    }
    prompt = tokenizer_->encode(
        request.text(),
        {.add_special_tokens = !request.has_add_special_tokens() || request.add_special_tokens()});
  } else if (request.has_chat()) {
    if (absl::Status valid = validateChat(request.chat()); !valid.ok()) return toGrpcStatus(valid);
    absl::StatusOr<ChatPrompt> chat = chatPrompt(request.chat());
    if (!chat.ok()) return toGrpcStatus(chat.status());
    prompt = std::move(chat->ids);
  } else if (request.has_token_ids()) {
    prompt.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
  }
  if (prompt.empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, request.has_text() || request.has_chat()
                                                    ? "the input tokenizes to no tokens"
                                                    : "set text, token_ids or chat"};
  }
  const int64_t context_length = model->context_length;
  // An input may fill the context (no new token follows it): -1 keeps that many.
  if (absl::Status s = truncatePrompt(request.truncate_prompt_tokens(), context_length + 1, prompt);
      !s.ok()) {
    return toGrpcStatus(s);
  }
  if (absl::Status s = checkVocabulary(prompt, model->vocab_size); !s.ok()) return toGrpcStatus(s);
  const int64_t tokens = static_cast<int64_t>(prompt.size());
  if (tokens > context_length) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat(kContextOverflow, context_length, " tokens. However, your input has ",
                         tokens, " tokens. Please reduce the length of the input.")};
  }
  // Workers know it by the router's own id, unique among its requests.
  const std::string own = absl::StrCat(relay_.routerId(), "-", next_request_++);
  const std::string& id = request.request_id().empty() ? own : request.request_id();
  v1::EmbedPromptRequest work;
  work.set_request_id(own);
  work.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  work.set_adapter(*adapter ? (*adapter)->name : std::string());
  work.set_cache_salt(request.cache_salt());
  const uint64_t root = engine::KvBlockPool::saltedRoot(
      *adapter ? engine::KvBlockPool::adapterRoot((*adapter)->sha256) : 0, request.cache_salt());
  const std::vector<uint64_t> prefix = PrefixIndex::blockHashes(prompt, model->block_size, root);

  std::vector<std::string> passed;  // Workers that failed this call in a way another may not.
  v1::EmbedPromptResponse done;
  grpc::Status status;
  for (int attempt = 0; attempt < kEmbedAttempts; ++attempt) {
    absl::StatusOr<PrefillLease> lease = pool_.pickEmbedder(tokens, prefix, passed);
    // None left to try: the last one's answer says why.
    if (!lease.ok()) return passed.empty() ? toGrpcStatus(lease.status()) : status;
    std::unique_ptr<grpc::ClientContext> call = grpc::ClientContext::FromServerContext(*context);
    status = lease->worker->prefill->Embed(call.get(), work, &done);
    pool_.releasePrefill(*lease, status.ok());
    if (status.ok() || !anotherMay(status) || context->IsCancelled()) break;
    CLEAVE_LOG(WARNING) << "embedding " << id << ": worker " << lease->worker->id << " failed ("
                        << status.error_message() << "); trying another";
    passed.push_back(lease->worker->id);
  }
  if (!status.ok()) return status;
  if (static_cast<int64_t>(done.hidden_size()) == 0) {
    return {grpc::StatusCode::INTERNAL, "the worker returned an empty hidden state"};
  }
  double norm = 0;
  for (float v : done.hidden()) norm += static_cast<double>(v) * v;
  norm = std::sqrt(norm);
  const bool normalize = (!request.has_normalize() || request.normalize()) && norm > 0;
  response.mutable_embedding()->Reserve(done.hidden_size());
  for (float v : done.hidden())
    response.add_embedding(normalize ? static_cast<float>(v / norm) : v);
  response.set_prompt_tokens(static_cast<uint32_t>(tokens));
  response.set_cached_prompt_tokens(done.cached_prompt_tokens());
  response.set_request_id(id);
  return grpc::Status::OK;
}

}  // namespace cleave::router
