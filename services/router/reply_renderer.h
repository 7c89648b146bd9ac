// The one reply of a chat call in a response format of its own (OpenAI's Responses API,
// Anthropic's Messages API): the whole object, or the format's events while it streams.
//
// Threading: a renderer belongs to one request.
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "services/router/openai_responses.h"

namespace cleave::router::openai {

class ReplyRenderer {
 public:
  virtual ~ReplyRenderer() = default;
  // Streamed: the events before the first message.
  virtual std::string started() = 0;
  // Streamed: the events for what `reply` holds beyond what earlier calls saw.
  virtual std::string progress(const ResponseBuilder& reply) = 0;
  // Streamed, after the reply's final message: the events that close it.
  virtual std::string finished(const ResponseBuilder& reply) = 0;
  // Streamed: an error after the stream began.
  virtual std::string failed(const ApiError& error) = 0;
  // The whole object of a reply that finished (not streamed).
  virtual nlohmann::json body(const ResponseBuilder& reply) const = 0;
};

}  // namespace cleave::router::openai
