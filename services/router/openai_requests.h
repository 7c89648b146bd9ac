// The OpenAI-compatible HTTP API's requests (POST /v1/completions, /v1/chat/completions,
// /tokenize, /detokenize) turned into cleave.v1 requests.
//
// Field names and defaults follow OpenAI's API, with vLLM's extensions (top_k, min_p,
// repetition_penalty, stop_token_ids, ignore_eos, min_tokens, chat_template_kwargs,
// add_generation_prompt, continue_final_message, add_special_tokens). Unknown fields are
// ignored. Values the router checks (ranges, lengths) are checked there; here only types
// and what the API cannot express: best_of other than n, logit_bias, suffix and content
// parts other than text are refused.
//
// A refusal is InvalidArgument whose message names the field; the field itself is also
// attached as the status payload kParamPayload (OpenAI's error "param").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cleave/v1/generation.pb.h"
#include "nlohmann/json_fwd.hpp"
#include "services/router/reasoning_splitter.h"
#include "services/router/tool_call_parser.h"

namespace cleave::router::openai {

inline constexpr char kParamPayload[] = "type.cleave/openai.param";

// kResponses: OpenAI's Responses API (responses_api.h), a chat call whose reply is rendered
// as a response object; the fields marked "Chat" hold for it too.
// kMessages: Anthropic's Messages API (messages_api.h), likewise.
enum class Endpoint { kCompletions, kChatCompletions, kResponses, kMessages };

// One generation call.
struct Call {
  Endpoint endpoint = Endpoint::kCompletions;
  v1::GenerateRequest request;
  bool stream = false;
  // stream_options.include_usage: a last chunk with the usage and no choices.
  bool include_usage = false;
  // stream_options.continuous_usage_stats (vLLM's): every chunk carries the usage so far.
  bool continuous_usage = false;
  // Completions: the response text starts with the prompt text.
  bool echo = false;
  // Report logprobs (completions: `logprobs` was a number; chat: `logprobs` was true).
  bool logprobs = false;
  // vLLM's return_token_ids: each choice's token ids ("token_ids") and its prompt's
  // ("prompt_token_ids").
  bool token_ids = false;
  // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:ID", not by text.
  bool tokens_as_ids = false;
  // Choices per prompt: each its own Generate call (with seed + i when a seed is set).
  int n = 1;
  // Completions: one request per prompt (several prompts make choices p * n + i); the
  // first is also `request`. Empty for chat.
  std::vector<v1::GenerateRequest> prompts;
  // Chat: how replies split into reasoning and content (the server's, not the request's).
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  // Chat: how tool calls are found in replies (the server's, when the request offers tools).
  ToolCallFormat tool_calls = ToolCallFormat::kNone;
  // Chat: the request offers tools (a non-empty list, tool_choice not "none").
  bool offers_tools = false;
  // Chat: the template was asked not to think (chat_template_kwargs.enable_thinking false).
  bool thinking_off = false;
  // Chat: the function tool_choice forces (named, or "required" with one tool): the reply,
  // an instance of its parameters' schema, is its arguments, returned as its one call.
  std::string forced_tool;
  // Chat: tool_choice "required" with several tools: the reply is {"name", "arguments"} of
  // one of them (a schema of their union), returned as that call.
  bool forced_any_tool = false;
  // Chat: the forced call came from tool_choice "required" (not a named function): it ends
  // as "tool_calls", a named one as "stop" (as OpenAI and vLLM answer).
  bool required_tool = false;
  // Chat: parallel_tool_calls false: a reply's first call is returned, no more (as vLLM).
  bool single_tool_call = false;
};

// The most choices one request may ask for per prompt (n), and in all.
inline constexpr int kMaxChoices = 16;
inline constexpr int kMaxCompletions = 256;

absl::StatusOr<Call> parseCompletionRequest(const nlohmann::json& body);
absl::StatusOr<Call> parseChatRequest(const nlohmann::json& body);
// POST /tokenize: {"prompt": ...} or {"messages": ...} (as the chat request).
absl::StatusOr<v1::TokenizeRequest> parseTokenizeRequest(const nlohmann::json& body);
// POST /detokenize: {"tokens": [ids]}.
absl::StatusOr<v1::DetokenizeRequest> parseDetokenizeRequest(const nlohmann::json& body);

// The body as JSON: bounded in depth and container size (as chat request JSON), an
// object. InvalidArgument saying what is wrong otherwise.
absl::StatusOr<nlohmann::json> parseBody(const std::string& body);

}  // namespace cleave::router::openai
