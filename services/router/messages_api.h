// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on the chat path,
// for clients written against it (Claude Code, the anthropic SDK).
//
// A request becomes a chat call: `system` (a string or text blocks) as a first system
// message; each message's content (a string or blocks) as chat messages: text blocks joined,
// an assistant's `tool_use` blocks as its tool calls (input as the arguments' JSON), a user's
// `tool_result` blocks as tool messages before its text, `thinking` blocks dropped (templates
// drop earlier reasoning); `tools` ({name, description, input_schema}) as function tools,
// `tool_choice` auto / any / tool / none as chat's auto / required / named / none;
// `max_tokens` (required), `stop_sequences`, `temperature`, `top_p`, `top_k` and `stream`
// as chat's; `output_config.format` (a JSON schema) as a json_schema response format. Images,
// documents, server tools and the like are refused, naming the field.
//
// The reply is a message object: content blocks `thinking` (with a reasoning parser), `text`
// and one `tool_use` per call; `stop_reason` end_turn, max_tokens, stop_sequence (with
// `stop_sequence`) or tool_use; usage input/output tokens (cached ones as
// cache_read_input_tokens). Streamed, the API's events: message_start, content_block_start /
// content_block_delta (text_delta, thinking_delta, input_json_delta) / content_block_stop per
// block, message_delta (stop_reason, output usage), message_stop; an error after the start
// is an `error` event. Errors are Anthropic's shape: {"type": "error", "error": {"type",
// "message"}} (anthropicError()).
//
// Threading: a MessagesRenderer belongs to one request.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "services/router/openai_requests.h"
#include "services/router/openai_responses.h"
#include "services/router/reply_renderer.h"

namespace cleave::router::openai {

// The chat call of a Messages API request (Endpoint::kMessages, one choice). `counting`:
// for count_tokens, where max_tokens is not needed.
absl::StatusOr<Call> parseMessagesRequest(const nlohmann::json& body, bool counting = false);

// An OpenAI-shaped error body ({"error": {"message", ...}}) of HTTP status `status` in
// Anthropic's shape.
std::string anthropicError(int status, const std::string& openai_body);

class MessagesRenderer final : public ReplyRenderer {
 public:
  // `id` ("msg_...") and `model` name the message.
  MessagesRenderer(std::string id, std::string model);

  // message_start waits for the first message (it carries the prompt's token count).
  std::string started() override { return ""; }
  std::string progress(const ResponseBuilder& reply) override;
  std::string finished(const ResponseBuilder& reply) override;
  std::string failed(const ApiError& error) override;
  nlohmann::json body(const ResponseBuilder& reply) const override;

 private:
  enum class Block { kNone, kThinking, kText };
  nlohmann::json message(nlohmann::json content, const ResponseBuilder* reply) const;
  // The tool_use blocks of a finished reply.
  nlohmann::json toolUses(const ResponseBuilder& reply) const;
  std::string event(const char* type, nlohmann::json fields) const;
  std::string start(const ResponseBuilder& reply);
  std::string open(Block block);
  std::string close();

  std::string id_;
  std::string model_;
  // Streamed: message_start sent; the open block and the blocks so far; what was sent.
  bool started_ = false;
  Block open_ = Block::kNone;
  int blocks_ = 0;
  size_t reasoning_sent_ = 0, text_sent_ = 0;
};

}  // namespace cleave::router::openai
