// The OpenAI-compatible HTTP API's responses, built from a cleave.v1 Generate stream:
// whole bodies ("text_completion", "chat.completion") and server-sent event streams of
// chunks ("chat.completion.chunk"), with usage, finish reasons, logprobs in each
// endpoint's format, and OpenAI's error objects.
//
// Threading: a ResponseBuilder belongs to one request.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cleave/v1/generation.pb.h"
#include "nlohmann/json.hpp"
#include "services/router/openai_requests.h"

namespace cleave::router::openai {

// One choice of a response: the objects and events of one Generate stream.
class ResponseBuilder {
 public:
  // `id` ("cmpl-...") and `model` are echoed in every object; `created` is Unix seconds;
  // `index` is the choice's.
  ResponseBuilder(const Call& call, std::string id, std::string model, int64_t created,
                  int index = 0);

  // Completions with echo: the prompt's text, which the response text starts with.
  void setEcho(std::string prompt_text) { echo_ = std::move(prompt_text); }

  // Takes one message of the stream; for a streamed call, returns the events it makes
  // ("data: {...}\n\n", possibly several, possibly none).
  std::string add(const v1::GenerateResponse& message);
  // After the stream's final message: the choice, whole.
  nlohmann::json choiceBody() const;
  // An object of the response ("choices" holding `choice` unless null).
  nlohmann::json chunk(nlohmann::json choice) const;

  bool finished() const { return final_.has_value(); }
  const v1::Usage& usage() const { return final_->usage(); }
  // Chat-like endpoints, so far: the reply's text and reasoning (tool calls held back),
  // its tool calls (chat's "tool_calls", known at the end) and its logprobs (chat's
  // "content" entries).
  const std::string& text() const { return text_; }
  const std::string& reasoning() const { return reasoning_; }
  const nlohmann::json& toolCalls() const { return tool_calls_; }
  const nlohmann::json& logprobs() const { return logprobs_; }
  const v1::FinalInfo& final() const { return *final_; }
  // return_token_ids: the prompt's token ids.
  const std::vector<uint32_t>& promptTokenIds() const { return prompt_ids_; }
  // Of the prompt's tokens, those a KV cache supplied (known from the first message).
  uint32_t cachedPromptTokens() const { return cached_prompt_tokens_; }

 private:
  nlohmann::json completionLogprobs(const v1::GenerateResponse& message);
  // The choice's stop_reason: what stopped it (null at a length or the model's own end).
  nlohmann::json stopReasonOf(const v1::FinalInfo& final) const;
  // Completions with echo and logprobs: the prompt's tokens (the first without a
  // log-probability), from the first message's prompt_logprobs.
  nlohmann::json promptLogprobs(const v1::GenerateResponse& message);
  // Appends completions-format entries of `tokens` to `lp` and to the response's, from
  // text_offset_ on; returns `lp`.
  nlohmann::json appendLogprobs(const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& tokens,
                                nlohmann::json lp);
  nlohmann::json chatLogprobs(const v1::GenerateResponse& message) const;
  // A token's name in logprobs: its text, or "token_id:ID" (return_tokens_as_token_ids).
  std::string tokenName(uint32_t id, const std::string& text) const;
  const char* object() const;
  // "tool_calls" when the reply called tools, else finishReason()'s.
  const char* finishReasonOf(const v1::FinalInfo& final) const;

  const Call& call_;
  std::string id_;
  std::string model_;
  int64_t created_;
  int index_;
  std::string echo_;
  bool started_ = false;
  ReasoningSplitter splitter_;
  ToolCallStream tools_;
  std::string text_;
  std::string reasoning_;
  std::string arguments_;  // call.forced_tool's, as they arrive
  nlohmann::json tool_calls_ = nlohmann::json::array();
  nlohmann::json logprobs_;  // the whole response's, in the endpoint's format
  // return_token_ids: the prompt's (from the first message) and the reply's.
  std::vector<uint32_t> prompt_ids_, token_ids_;
  uint32_t cached_prompt_tokens_ = 0;
  bool prompt_ids_sent_ = false;  // Streamed completions: with a choice's first tokens.
  int64_t text_offset_ = 0;       // completions logprobs: where the next token's text starts
  std::optional<v1::FinalInfo> final_;
};

// The usage of a response whose choices all finished: each prompt counted once (choices
// p * call.n + i share prompt p).
nlohmann::json usageOf(const Call& call,
                       const std::vector<std::unique_ptr<ResponseBuilder>>& choices);
// The whole body of a response that is not streamed.
nlohmann::json responseBody(const Call& call,
                            const std::vector<std::unique_ptr<ResponseBuilder>>& choices);
// The end of a streamed response: the usage chunk when asked for, then "data: [DONE]".
std::string endOfStream(const Call& call,
                        const std::vector<std::unique_ptr<ResponseBuilder>>& choices);

// 24 random hex digits.
std::string randomId();

// "stop" or "length".
const char* finishReason(v1::FinishReason reason);

// An error as OpenAI's API reports it: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 500;
  std::string body;
  int64_t retry_after_ms = 0;  // > 0: sent as Retry-After (whole seconds) and retry-after-ms.
};
// From a gRPC status code and message (the router's, or a parse error's with its param);
// the error's "code" is the HTTP status unless `code` names one (as OpenAI's
// "previous_response_not_found").
ApiError apiError(int grpc_code, const std::string& message, const std::string& param = "",
                  const std::string& code = "");
ApiError apiError(const absl::Status& status);  // With its retry hint (retry_hint.h).

// Serializes with invalid UTF-8 replaced, never throwing.
std::string dumpJson(const nlohmann::json& j);

}  // namespace cleave::router::openai
