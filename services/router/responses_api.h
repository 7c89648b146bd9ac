// OpenAI's Responses API (POST /v1/responses) on the chat path.
//
// A request becomes a chat call: `input` (a string, or items: messages of any role with text
// content, function_call and function_call_output items; reasoning items are dropped, as chat
// templates drop earlier turns' reasoning) as the messages, `instructions` as a first system
// message, function `tools` and `tool_choice` in chat's shapes, `text.format` as
// response_format, `max_output_tokens` as the token limit; the sampling fields the chat API
// takes pass through; `previous_response_id` puts a stored conversation (response_store.h)
// before the input. Item references, `conversation`, `background` and tools other than
// functions are refused, naming the field.
//
// The chat reply becomes a response object whose output holds a reasoning item (with a
// reasoning parser), a message item with one output_text part, and a function_call item per
// tool call; "incomplete" with reason max_output_tokens when the limit cut it. Streamed, it is
// the API's typed events: response.created, response.in_progress, output_item.added /
// content_part.added / output_text.delta ... / done, function_call_arguments.delta / done,
// and response.completed (or response.incomplete), each as "event: TYPE" + "data: {...}" with
// a sequence_number.
//
// Threading: a ResponsesRenderer belongs to one request.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "services/router/openai_requests.h"
#include "services/router/openai_responses.h"
#include "services/router/reply_renderer.h"

namespace cleave::router::openai {

// The chat call of a Responses API request (Endpoint::kResponses, one choice). `history`:
// the items of the stored conversation its previous_response_id continues (they come after
// the instructions and before `input`); without it, previous_response_id is refused.
absl::StatusOr<Call> parseResponsesRequest(const nlohmann::json& body,
                                           const nlohmann::json* history = nullptr);

// The request's input items as a stored response keeps them: a string input as a user
// message, string contents as text parts, an id on every item.
nlohmann::json inputItems(const nlohmann::json& body);

// GET /v1/responses/ID/input_items's query: at most `limit` items (1-100, default 20), in
// `order` ("asc", or "desc": newest first, the default), those after the item `after`.
struct ItemsQuery {
  std::optional<std::string> limit, order, after;
};
// A page of `items` (oldest first) as OpenAI lists them: {"object": "list", "data",
// "first_id", "last_id", "has_more"}; InvalidArgument naming a bad parameter.
absl::StatusOr<nlohmann::json> itemsPage(const nlohmann::json& items, const ItemsQuery& query);

// The response object of one call, whole or as events.
class ResponsesRenderer final : public ReplyRenderer {
 public:
  // `request`: the request's body (its settings are echoed); `id` ("resp_..."), `model`
  // and `created` (Unix seconds) name the response.
  ResponsesRenderer(const nlohmann::json& request, std::string id, std::string model,
                    int64_t created);

  // Streamed: response.created and response.in_progress.
  std::string started() override;
  // Streamed: the events for what `reply` holds beyond what earlier calls saw.
  std::string progress(const ResponseBuilder& reply) override;
  // Streamed, after the reply's final message: the events closing its items, its function
  // calls, and response.completed or response.incomplete.
  std::string finished(const ResponseBuilder& reply) override;
  // Streamed: an error after the stream began (an "error" event, then response.failed).
  std::string failed(const ApiError& error) override;
  // The response object of a reply that finished (not streamed).
  nlohmann::json body(const ResponseBuilder& reply) const override;
  // Streamed, after finished(): the response object response.completed carried.
  nlohmann::json streamed(const ResponseBuilder& reply) const;

 private:
  // The response object with `output`, in `status` (usage from `reply` when it finished).
  nlohmann::json response(const char* status, nlohmann::json output,
                          const ResponseBuilder* reply) const;
  nlohmann::json messageItem(const std::string& text, const nlohmann::json& logprobs,
                             const char* status) const;
  nlohmann::json reasoningItem(const std::string& text, const char* status) const;
  // Function calls of a finished reply, as output items.
  nlohmann::json callItems(const ResponseBuilder& reply) const;
  std::string event(const char* type, nlohmann::json fields);
  // Streamed: closes the open reasoning or message item.
  std::string closeOpenItem(const ResponseBuilder& reply);
  // Streamed: opens a message item with its one output_text part.
  std::string openMessage();

  nlohmann::json request_;
  std::string id_;
  std::string model_;
  int64_t created_;
  bool logprobs_;  // include: message.output_text.logprobs
  std::string message_id_, reasoning_id_;
  // Streamed: the output items done, the one open (none, reasoning, message), how much
  // reasoning and text have been sent, the events' count.
  nlohmann::json output_ = nlohmann::json::array();
  enum class Open { kNone, kReasoning, kMessage } open_ = Open::kNone;
  size_t reasoning_sent_ = 0, text_sent_ = 0, logprobs_sent_ = 0;
  int64_t sequence_ = 0;
};

}  // namespace cleave::router::openai
