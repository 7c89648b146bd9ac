#include "services/router/openai_responses.h"

#include <algorithm>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/retry_hint.h"
#include "grpcpp/support/status.h"
#include "services/router/context_overflow.h"

namespace cleave::router::openai {
namespace {

using Json = nlohmann::json;

std::string event(const Json& j) { return absl::StrCat("data: ", dumpJson(j), "\n\n"); }

Json usageJson(uint64_t prompt, uint64_t cached, uint64_t completion) {
  return Json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

Json bytesOf(const std::string& text) {
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

std::string dumpJson(const Json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

std::string randomId() {
  static thread_local std::mt19937_64 random(std::random_device{}());
  return absl::StrCat(absl::Hex(random(), absl::kZeroPad16),
                      absl::Hex(random() >> 32, absl::kZeroPad8));
}

// A tool call's id: "call_" and 24 hex digits; for Mistral's format 9 letters and digits, the
// only ids its chat templates take back (as vLLM's Mistral parser makes them).
std::string toolCallId(ToolCallFormat format) {
  if (format != ToolCallFormat::kMistral) return absl::StrCat("call_", randomId());
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  static thread_local std::mt19937_64 random(std::random_device{}());
  std::string id(9, ' ');
  for (char& c : id) c = kAlphabet[random() % (sizeof(kAlphabet) - 1)];
  return id;
}

const char* finishReason(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
    case v1::FINISH_REASON_CONTEXT_LENGTH: return "length";
    default: return "stop";
  }
}

ResponseBuilder::ResponseBuilder(const Call& call, std::string id, std::string model,
                                 int64_t created, int index)
    : call_(call),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      index_(index),
      splitter_(call.endpoint != Endpoint::kCompletions ? call.reasoning : ReasoningFormat::kNone),
      tools_(call.endpoint != Endpoint::kCompletions ? call.tool_calls : ToolCallFormat::kNone,
             call.request.chat().tools_json()) {
  logprobs_ = call.endpoint != Endpoint::kCompletions ? Json{{"content", Json::array()}}
                                                      : Json{{"tokens", Json::array()},
                                                             {"token_logprobs", Json::array()},
                                                             {"top_logprobs", Json::array()},
                                                             {"text_offset", Json::array()}};
}

const char* ResponseBuilder::object() const {
  if (call_.endpoint == Endpoint::kCompletions) return "text_completion";
  return call_.stream ? "chat.completion.chunk" : "chat.completion";
}

const char* ResponseBuilder::finishReasonOf(const v1::FinalInfo& final) const {
  // A call of a named function ends as OpenAI's do: "stop" (or "length"); one forced by
  // "required" as a call ("tool_calls", unless cut short).
  const bool named = !call_.forced_tool.empty() && !call_.required_tool;
  if (tool_calls_.empty() || named) return finishReason(final.finish_reason());
  if (call_.required_tool && final.finish_reason() == v1::FINISH_REASON_LENGTH) return "length";
  return "tool_calls";
}

Json ResponseBuilder::stopReasonOf(const v1::FinalInfo& final) const {
  // As vLLM's: the stop string; the id of a stop_token_ids token, as a number; nothing for
  // the model's own end of sequence.
  const std::string& matched = final.matched_stop();
  if (matched.empty()) return nullptr;
  if (final.finish_reason() != v1::FINISH_REASON_STOP_TOKEN) return matched;
  uint32_t id = 0;
  const auto& asked = call_.request.stopping().stop_token_ids();
  if (!absl::SimpleAtoi(matched, &id) || std::find(asked.begin(), asked.end(), id) == asked.end())
    return nullptr;
  return id;
}

Json ResponseBuilder::chunk(Json choice) const {
  Json choices = Json::array();
  const bool streamed = !choice.is_null();
  if (streamed) choices.push_back(std::move(choice));
  Json out{{"id", id_},
           {"object", object()},
           {"created", created_},
           {"model", model_},
           {"choices", std::move(choices)}};
  // The usage so far (the prompt's cached tokens are known at the end).
  if (streamed && call_.stream && call_.continuous_usage) {
    out["usage"] = finished() ? usageJson(usage().prompt_tokens(), usage().cached_prompt_tokens(),
                                          usage().completion_tokens())
                              : usageJson(prompt_ids_.size(), 0, token_ids_.size());
  }
  return out;
}

Json ResponseBuilder::completionLogprobs(const v1::GenerateResponse& message) {
  return appendLogprobs(message.logprobs(), Json{{"tokens", Json::array()},
                                                 {"token_logprobs", Json::array()},
                                                 {"top_logprobs", Json::array()},
                                                 {"text_offset", Json::array()}});
}

Json ResponseBuilder::promptLogprobs(const v1::GenerateResponse& message) {
  // The first token's text: what the others' leave of the prompt's text.
  std::string rest;
  for (const v1::TokenLogprob& t : message.prompt_logprobs()) rest += t.text();
  const std::string head =
      absl::EndsWith(echo_, rest) ? echo_.substr(0, echo_.size() - rest.size()) : std::string();
  text_offset_ = static_cast<int64_t>(head.size());
  Json lp = appendLogprobs(message.prompt_logprobs(), Json{{"tokens", {head}},
                                                           {"token_logprobs", {nullptr}},
                                                           {"top_logprobs", {nullptr}},
                                                           {"text_offset", {0}}});
  // The completion's offsets count from the end of the echoed text, whether or not the
  // prompt's token texts add up to it (a tokenizer may render a lone token otherwise).
  text_offset_ = static_cast<int64_t>(echo_.size());
  return lp;
}

Json ResponseBuilder::appendLogprobs(
    const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& tokens, Json lp) {
  for (const v1::TokenLogprob& t : tokens) {
    lp["tokens"].push_back(tokenName(t.token_id(), t.text()));
    lp["token_logprobs"].push_back(t.logprob());
    Json top = Json::object();
    for (const v1::TopLogprob& alt : t.top())
      top[tokenName(alt.token_id(), alt.text())] = alt.logprob();
    lp["top_logprobs"].push_back(std::move(top));
    lp["text_offset"].push_back(text_offset_);
    text_offset_ += static_cast<int64_t>(t.text().size());
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const Json& v : lp[key]) logprobs_[key].push_back(v);
  }
  return lp;
}

std::string ResponseBuilder::tokenName(uint32_t id, const std::string& text) const {
  return call_.tokens_as_ids ? absl::StrCat("token_id:", id) : text;
}

Json ResponseBuilder::chatLogprobs(const v1::GenerateResponse& message) const {
  // Named by id, a token's bytes are its name's.
  auto bytes = [&](const std::string& name, const std::string& token_bytes) {
    return bytesOf(call_.tokens_as_ids ? name : token_bytes);
  };
  Json content = Json::array();
  for (const v1::TokenLogprob& t : message.logprobs()) {
    Json top = Json::array();
    for (const v1::TopLogprob& alt : t.top()) {
      const std::string name = tokenName(alt.token_id(), alt.text());
      top.push_back(
          {{"token", name}, {"logprob", alt.logprob()}, {"bytes", bytes(name, alt.token_bytes())}});
    }
    const std::string name = tokenName(t.token_id(), t.text());
    content.push_back({{"token", name},
                       {"logprob", t.logprob()},
                       {"bytes", bytes(name, t.token_bytes())},
                       {"top_logprobs", std::move(top)}});
  }
  return content;
}

std::string ResponseBuilder::add(const v1::GenerateResponse& message) {
  std::string events;
  if (!started_) {
    started_ = true;
    prompt_ids_.assign(message.prompt_token_ids().begin(), message.prompt_token_ids().end());
    cached_prompt_tokens_ = message.cached_prompt_tokens();
    text_offset_ = static_cast<int64_t>(echo_.size());
    text_ = echo_;
    Json echoed = nullptr;
    if (call_.echo && call_.logprobs && call_.endpoint == Endpoint::kCompletions)
      echoed = promptLogprobs(message);
    if (call_.stream && call_.endpoint == Endpoint::kChatCompletions) {
      Json first = chunk({{"index", index_},
                          {"delta", {{"role", "assistant"}, {"content", ""}}},
                          {"logprobs", nullptr},
                          {"finish_reason", nullptr}});
      if (call_.token_ids) first["prompt_token_ids"] = prompt_ids_;
      events += event(first);
    }
    if (call_.stream && !echo_.empty()) {
      Json choice{{"index", index_},
                  {"text", echo_},
                  {"logprobs", std::move(echoed)},
                  {"finish_reason", nullptr}};
      if (call_.token_ids) choice["prompt_token_ids"] = prompt_ids_;
      events += event(chunk(std::move(choice)));
    }
  }
  token_ids_.insert(token_ids_.end(), message.token_ids().begin(), message.token_ids().end());
  ReasoningSplitter::Parts parts = splitter_.push(message.text());
  Json calls = Json::array();
  if (message.has_final()) {
    ReasoningSplitter::Parts rest = splitter_.finish();
    parts.reasoning += rest.reasoning;
    parts.content += rest.content;
  }
  parts.content = tools_.push(parts.content);
  const bool forced = !call_.forced_tool.empty() || call_.forced_any_tool;
  if (forced) {  // The reply is the forced call (its arguments, or its name and arguments).
    arguments_ += parts.content;
    parts.content.clear();
  }
  if (message.has_final()) {
    ParsedReply rest = tools_.finish();
    parts.content += rest.content;
    if (!call_.forced_tool.empty())
      rest.calls = {{.name = call_.forced_tool, .arguments = arguments_}};
    if (call_.forced_any_tool) {
      const Json reply = Json::parse(arguments_, nullptr, /*allow_exceptions=*/false);
      if (reply.is_object() && reply.contains("name") && reply["name"].is_string() &&
          reply.contains("arguments")) {
        rest.calls = {
            {.name = reply["name"].get<std::string>(), .arguments = reply["arguments"].dump()}};
      } else {
        parts.content += arguments_;  // Cut short: not a call; the text, whole.
      }
    }
    if (call_.single_tool_call && rest.calls.size() > 1) rest.calls.resize(1);
    for (const ToolCall& call : rest.calls) {
      calls.push_back({{"index", calls.size()},
                       {"id", toolCallId(call_.tool_calls)},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    tool_calls_ = calls;
  }
  text_ += parts.content;
  reasoning_ += parts.reasoning;
  Json logprobs = nullptr;
  if (call_.logprobs) {
    if (call_.endpoint == Endpoint::kCompletions) {
      logprobs = completionLogprobs(message);
    } else {
      Json content = chatLogprobs(message);
      for (const Json& entry : content) logprobs_["content"].push_back(entry);
      logprobs = Json{{"content", std::move(content)}};
    }
  }
  if (message.has_final()) final_ = message.final();
  // A Responses or Messages API stream is made of its own events (reply_renderer.h).
  if (!call_.stream || call_.endpoint == Endpoint::kResponses ||
      call_.endpoint == Endpoint::kMessages) {
    return "";
  }
  const bool ids = call_.token_ids && !message.token_ids().empty();
  if (parts.content.empty() && parts.reasoning.empty() && message.logprobs().empty() &&
      !message.has_final() && !ids) {
    return events;
  }
  Json choice{{"index", index_}, {"logprobs", std::move(logprobs)}};
  if (call_.token_ids) {
    choice["token_ids"] =
        Json(std::vector<uint32_t>(message.token_ids().begin(), message.token_ids().end()));
    // Completions: the prompt's with the choice's first tokens (unless echoed before).
    if (call_.endpoint == Endpoint::kCompletions && echo_.empty() && !prompt_ids_sent_)
      choice["prompt_token_ids"] = prompt_ids_;
    prompt_ids_sent_ = true;
  }
  if (call_.endpoint == Endpoint::kCompletions) {
    choice["text"] = parts.content;
  } else {
    Json delta = Json::object();
    if (!parts.reasoning.empty()) {  // under vLLM's old name and its new one
      delta["reasoning_content"] = parts.reasoning;
      delta["reasoning"] = parts.reasoning;
    }
    if (!parts.content.empty()) delta["content"] = parts.content;
    if (!calls.empty()) delta["tool_calls"] = std::move(calls);
    choice["delta"] = std::move(delta);
  }
  choice["finish_reason"] =
      message.has_final() ? Json(finishReasonOf(message.final())) : Json(nullptr);
  if (message.has_final()) {
    if (Json reason = stopReasonOf(message.final()); !reason.is_null())
      choice["stop_reason"] = std::move(reason);
  }
  events += event(chunk(std::move(choice)));
  return events;
}

Json ResponseBuilder::choiceBody() const {
  Json choice{{"index", index_}, {"logprobs", call_.logprobs ? logprobs_ : Json(nullptr)}};
  if (call_.endpoint == Endpoint::kCompletions) {
    choice["text"] = text_;
  } else {
    choice["message"] = {{"role", "assistant"}, {"content", text_}};
    if (!tool_calls_.empty()) {
      if (text_.empty()) choice["message"]["content"] = nullptr;
      choice["message"]["tool_calls"] = tool_calls_;
    }
    if (call_.reasoning != ReasoningFormat::kNone) {
      // As vLLM's reasoning parsers: no text is null.
      if (text_.empty()) choice["message"]["content"] = nullptr;
      choice["message"]["reasoning_content"] =
          reasoning_.empty() ? Json(nullptr) : Json(reasoning_);
      choice["message"]["reasoning"] = choice["message"]["reasoning_content"];
    }
  }
  choice["finish_reason"] = finishReasonOf(*final_);
  choice["stop_reason"] = stopReasonOf(*final_);
  if (call_.token_ids) {
    choice["token_ids"] = token_ids_;
    if (call_.endpoint == Endpoint::kCompletions) choice["prompt_token_ids"] = prompt_ids_;
  }
  return choice;
}

Json usageOf(const Call& call, const std::vector<std::unique_ptr<ResponseBuilder>>& choices) {
  uint64_t prompt = 0, cached = 0, completion = 0;
  for (size_t k = 0; k < choices.size(); ++k) {
    const v1::Usage& u = choices[k]->usage();
    if (k % call.n == 0) {
      prompt += u.prompt_tokens();
      cached += u.cached_prompt_tokens();
    }
    completion += u.completion_tokens();
  }
  return usageJson(prompt, cached, completion);
}

Json responseBody(const Call& call, const std::vector<std::unique_ptr<ResponseBuilder>>& choices) {
  Json body = choices.front()->chunk(nullptr);
  for (const auto& c : choices) body["choices"].push_back(c->choiceBody());
  // Chat's one prompt, beside the choices.
  if (call.token_ids && call.endpoint != Endpoint::kCompletions)
    body["prompt_token_ids"] = choices.front()->promptTokenIds();
  body["usage"] = usageOf(call, choices);
  return body;
}

std::string endOfStream(const Call& call,
                        const std::vector<std::unique_ptr<ResponseBuilder>>& choices) {
  std::string events;
  if (call.include_usage) {
    Json last = choices.front()->chunk(nullptr);
    last["usage"] = usageOf(call, choices);
    events += event(last);
  }
  return events + "data: [DONE]\n\n";
}

ApiError apiError(int grpc_code, const std::string& message, const std::string& param,
                  const std::string& code) {
  int http = 500;
  const char* type = "server_error";
  switch (static_cast<grpc::StatusCode>(grpc_code)) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      http = 400;
      type = "invalid_request_error";
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      http = 401;
      type = "authentication_error";
      break;
    case grpc::StatusCode::PERMISSION_DENIED:
      http = 403;
      type = "permission_error";
      break;
    case grpc::StatusCode::NOT_FOUND:
      http = 404;
      type = "not_found_error";
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      http = 429;
      type = "rate_limit_error";
      break;
    case grpc::StatusCode::UNAVAILABLE:
      http = 503;
      type = "service_unavailable";
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      http = 504;
      type = "timeout";
      break;
    case grpc::StatusCode::UNIMPLEMENTED: http = 501; break;
    case grpc::StatusCode::CANCELLED:  // by the server (shutting down): worth a retry
      http = 503;
      type = "service_unavailable";
      break;
    default: break;
  }
  Json error{{"message", message},
             {"type", type},
             {"param", param.empty() ? Json(nullptr) : Json(param)},
             {"code", !code.empty()                           ? Json(code)
                      : message.starts_with(kContextOverflow) ? Json("context_length_exceeded")
                                                              : Json(http)}};
  return {http, dumpJson(Json{{"error", std::move(error)}})};
}

ApiError apiError(const absl::Status& status) {
  const auto param = status.GetPayload(kParamPayload);
  ApiError error = apiError(static_cast<int>(status.code()), std::string(status.message()),
                            param ? std::string(*param) : "");
  if (std::optional<std::chrono::milliseconds> after = retryAfter(status))
    error.retry_after_ms = after->count();
  return error;
}

}  // namespace cleave::router::openai
