#include "services/router/responses_api.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/router/openai_fields.h"

namespace cleave::router::openai {
namespace {

using Json = nlohmann::json;

// Fields the chat API reads the same way, passed through (vLLM's extensions included).
constexpr const char* kPassed[] = {"model",
                                   "temperature",
                                   "top_p",
                                   "top_k",
                                   "min_p",
                                   "seed",
                                   "stop",
                                   "presence_penalty",
                                   "frequency_penalty",
                                   "repetition_penalty",
                                   "logit_bias",
                                   "priority",
                                   "cache_salt",
                                   "ignore_eos",
                                   "min_tokens",
                                   "stop_token_ids",
                                   "allowed_token_ids",
                                   "skip_special_tokens",
                                   "include_stop_str_in_output",
                                   "parallel_tool_calls",
                                   "chat_template_kwargs",
                                   "user",
                                   "stream",
                                   "guided_regex",
                                   "guided_choice",
                                   "structured_outputs"};

constexpr char kLogprobsInclude[] = "message.output_text.logprobs";

// A message's or an output's content: a string, or text parts joined with newlines.
absl::StatusOr<std::string> textOf(const Json& content, const std::string& name) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return invalid(name, "must be a string or an array of text parts");
  std::string joined;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string part_name = absl::StrCat(name, "[", j, "]");
    const Json* type = part.is_object() ? field(part, "type") : nullptr;
    if (type == nullptr || (*type != "input_text" && *type != "output_text" && *type != "text")) {
      return invalid(part_name + ".type",
                     "only text parts (input_text, output_text) are supported (this deployment "
                     "serves text)");
    }
    const Json* text = field(part, "text");
    if (text == nullptr || !text->is_string())
      return invalid(part_name + ".text", "must be a string");
    absl::StrAppend(&joined, j == 0 ? "" : "\n", text->get<std::string>());
  }
  return joined;
}

// One input item onto the chat messages.
absl::Status addItem(const Json& item, const std::string& name, Json& messages) {
  if (!item.is_object()) return invalid(name, "must be an object");
  const Json* type = field(item, "type");
  if (type != nullptr && !type->is_string()) return invalid(name + ".type", "must be a string");
  const std::string kind = type != nullptr ? type->get<std::string>() : "message";
  if (kind == "message") {
    const std::string* role = stringField(item, "role");
    if (role == nullptr ||
        (*role != "user" && *role != "system" && *role != "developer" && *role != "assistant")) {
      return invalid(name + ".role",
                     "must be \"user\", \"system\", \"developer\" or \"assistant\"");
    }
    const Json* content = field(item, "content");
    if (content == nullptr) return invalid(name + ".content", "is required");
    CLEAVE_ASSIGN_OR_RETURN(std::string text, textOf(*content, name + ".content"));
    messages.push_back({{"role", *role == "developer" ? "system" : *role}, {"content", text}});
    return absl::OkStatus();
  }
  if (kind == "function_call") {
    for (const char* key : {"call_id", "name", "arguments"}) {
      if (stringField(item, key) == nullptr)
        return invalid(absl::StrCat(name, ".", key), "must be a string");
    }
    Json call{{"id", item["call_id"]},
              {"type", "function"},
              {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
    // Calls right after an assistant turn belong to it. A turn of calls alone has empty
    // content (templates that know no tools print content whatever the turn holds).
    if (messages.empty() || messages.back()["role"] != "assistant") {
      messages.push_back({{"role", "assistant"}, {"content", ""}});
    }
    messages.back()["tool_calls"].push_back(std::move(call));
    return absl::OkStatus();
  }
  if (kind == "function_call_output") {
    const std::string* call_id = stringField(item, "call_id");
    if (call_id == nullptr) return invalid(name + ".call_id", "must be a string");
    const Json* output = field(item, "output");
    if (output == nullptr) return invalid(name + ".output", "is required");
    CLEAVE_ASSIGN_OR_RETURN(std::string text, textOf(*output, name + ".output"));
    messages.push_back({{"role", "tool"}, {"tool_call_id", *call_id}, {"content", text}});
    return absl::OkStatus();
  }
  if (kind == "reasoning") return absl::OkStatus();  // Templates drop earlier reasoning.
  if (kind == "item_reference") {
    return invalid(name,
                   "item references are not supported; send the item itself, or continue a "
                   "stored response with previous_response_id");
  }
  return invalid(name + ".type", absl::StrCat("\"", kind,
                                              "\" items are not supported (message, function_call, "
                                              "function_call_output and reasoning are)"));
}

absl::Status addTools(const Json& body, Json& chat) {
  if (const Json* tools = field(body, "tools"); tools != nullptr) {
    if (!tools->is_array()) return invalid("tools", "must be an array of tools");
    Json out = Json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& tool = (*tools)[i];
      const std::string name = absl::StrCat("tools[", i, "]");
      const std::string* type = tool.is_object() ? stringField(tool, "type") : nullptr;
      if (type == nullptr || *type != "function") {
        return invalid(name + ".type",
                       absl::StrCat("only \"function\" tools are supported",
                                    type != nullptr ? absl::StrCat(", not \"", *type, "\"") : ""));
      }
      if (stringField(tool, "name") == nullptr) return invalid(name + ".name", "must be a string");
      Json function{{"name", tool["name"]}};
      for (const char* key : {"description", "parameters", "strict"}) {
        if (field(tool, key) != nullptr) function[key] = tool[key];
      }
      out.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    chat["tools"] = std::move(out);
  }
  if (const Json* choice = field(body, "tool_choice"); choice != nullptr) {
    if (choice->is_string()) {
      chat["tool_choice"] = *choice;
    } else if (const std::string* type =
                   choice->is_object() ? stringField(*choice, "type") : nullptr;
               type != nullptr && *type == "function" && stringField(*choice, "name") != nullptr) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    } else {
      return invalid("tool_choice",
                     "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                     "\"name\": ...}");
    }
  }
  return absl::OkStatus();
}

// text.format: {"type": "text" | "json_object" | "json_schema", name, schema, strict}.
absl::Status addFormat(const Json& body, Json& chat) {
  const Json* text = field(body, "text");
  if (text == nullptr) return absl::OkStatus();
  if (!text->is_object()) return invalid("text", "must be an object");
  const Json* format = field(*text, "format");
  if (format == nullptr) return absl::OkStatus();
  const std::string* type = format->is_object() ? stringField(*format, "type") : nullptr;
  if (type == nullptr) return invalid("text.format.type", "must be a string");
  if (*type == "text") return absl::OkStatus();
  if (*type == "json_object") {
    chat["response_format"] = {{"type", "json_object"}};
    return absl::OkStatus();
  }
  if (*type != "json_schema") {
    return invalid("text.format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
  }
  Json schema = Json::object();
  for (const char* key : {"name", "schema", "strict", "description"}) {
    if (field(*format, key) != nullptr) schema[key] = (*format)[key];
  }
  chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  return absl::OkStatus();
}

Json usageOf(const v1::Usage& u) {
  return Json{{"input_tokens", u.prompt_tokens()},
              {"input_tokens_details", {{"cached_tokens", u.cached_prompt_tokens()}}},
              {"output_tokens", u.completion_tokens()},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", u.prompt_tokens() + u.completion_tokens()}};
}

const char* statusOf(const ResponseBuilder& reply) {
  return std::string_view(finishReason(reply.final().finish_reason())) == "length" ? "incomplete"
                                                                                   : "completed";
}

}  // namespace

absl::StatusOr<Call> parseResponsesRequest(const Json& body, const Json* history) {
  if (field(body, "conversation") != nullptr) {
    return invalid("conversation",
                   "this server keeps no conversations; send previous_response_id or the whole "
                   "conversation in \"input\"");
  }
  if (field(body, "previous_response_id") != nullptr && history == nullptr) {
    return invalid("previous_response_id",
                   "this server keeps no responses (started with --http-response-store-mib=0); "
                   "send the whole conversation in \"input\"");
  }
  if (const Json* store = field(body, "store"); store != nullptr && !store->is_boolean())
    return invalid("store", "must be true or false");
  if (const Json* background = field(body, "background");
      background != nullptr && *background == true) {
    return invalid("background", "is not supported: responses are returned as they are made");
  }
  Json chat = Json::object();
  for (const char* key : kPassed) {
    if (field(body, key) != nullptr) chat[key] = body[key];
  }
  Json messages = Json::array();
  if (const Json* instructions = field(body, "instructions"); instructions != nullptr) {
    if (!instructions->is_string()) return invalid("instructions", "must be a string");
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  }
  for (size_t i = 0; history != nullptr && i < history->size(); ++i) {
    CLEAVE_RETURN_IF_ERROR(
        addItem((*history)[i], absl::StrCat("previous_response_id: item ", i), messages));
  }
  const Json* input = field(body, "input");
  if (input != nullptr && input->is_string() && !input->get<std::string>().empty()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input != nullptr && input->is_array() && !input->empty()) {
    for (size_t i = 0; i < input->size(); ++i) {
      CLEAVE_RETURN_IF_ERROR(addItem((*input)[i], absl::StrCat("input[", i, "]"), messages));
    }
  } else {
    return invalid("input", "must be a non-empty string or a non-empty array of input items");
  }
  chat["messages"] = std::move(messages);
  CLEAVE_RETURN_IF_ERROR(addTools(body, chat));
  CLEAVE_RETURN_IF_ERROR(addFormat(body, chat));
  if (field(body, "max_output_tokens") != nullptr)
    chat["max_completion_tokens"] = body["max_output_tokens"];
  const Json* include = field(body, "include");
  if (include != nullptr && !include->is_array())
    return invalid("include", "must be an array of strings");
  const bool logprobs = (include != nullptr && std::find(include->begin(), include->end(),
                                                         kLogprobsInclude) != include->end()) ||
                        field(body, "top_logprobs") != nullptr;
  if (logprobs) {
    chat["logprobs"] = true;
    if (field(body, "top_logprobs") != nullptr) chat["top_logprobs"] = body["top_logprobs"];
  }
  CLEAVE_ASSIGN_OR_RETURN(Call call, parseChatRequest(chat));
  call.endpoint = Endpoint::kResponses;
  call.n = 1;
  return call;
}

Json inputItems(const Json& body) {
  const Json* input = field(body, "input");
  Json items = Json::array();
  if (input != nullptr && input->is_string()) {
    items.push_back({{"type", "message"},
                     {"role", "user"},
                     {"content", Json::array({{{"type", "input_text"}, {"text", *input}}})}});
  } else if (input != nullptr && input->is_array()) {
    items = *input;
  }
  for (Json& item : items) {
    if (!item.is_object()) continue;
    const std::string* type = stringField(item, "type");
    const std::string kind = type != nullptr ? *type : "message";
    item["type"] = kind;
    if (kind == "message" && item.contains("content") && item["content"].is_string()) {
      const std::string* role = stringField(item, "role");
      const bool output = role != nullptr && *role == "assistant";
      item["content"] = Json::array(
          {{{"type", output ? "output_text" : "input_text"}, {"text", item["content"]}}});
    }
    if (!item.contains("id")) {
      const char* prefix = kind == "message"                ? "msg_"
                           : kind == "function_call"        ? "fc_"
                           : kind == "function_call_output" ? "fco_"
                                                            : "item_";
      item["id"] = absl::StrCat(prefix, randomId());
    }
  }
  return items;
}

absl::StatusOr<Json> itemsPage(const Json& items, const ItemsQuery& query) {
  int64_t limit = 20;
  if (query.limit && (!absl::SimpleAtoi(*query.limit, &limit) || limit < 1 || limit > 100))
    return invalid("limit", "must be a whole number from 1 to 100");
  const std::string order = query.order.value_or("desc");
  if (order != "asc" && order != "desc") return invalid("order", "must be \"asc\" or \"desc\"");
  std::vector<const Json*> ordered;
  for (const Json& item : items) ordered.push_back(&item);
  if (order == "desc") std::reverse(ordered.begin(), ordered.end());
  size_t from = 0;
  if (query.after) {
    auto at = std::find_if(ordered.begin(), ordered.end(), [&](const Json* item) {
      const std::string* id = item->is_object() ? stringField(*item, "id") : nullptr;
      return id != nullptr && *id == *query.after;
    });
    if (at == ordered.end()) return invalid("after", "names no item of this response's input");
    from = static_cast<size_t>(at - ordered.begin()) + 1;
  }
  auto idOf = [](const Json& item) {
    return item.is_object() && item.contains("id") ? item["id"] : Json(nullptr);
  };
  Json data = Json::array();
  for (size_t i = from; i < ordered.size() && data.size() < static_cast<size_t>(limit); ++i)
    data.push_back(*ordered[i]);
  const bool more = from + data.size() < ordered.size();
  return Json{{"object", "list"},
              {"data", data},
              {"first_id", data.empty() ? Json(nullptr) : idOf(data.front())},
              {"last_id", data.empty() ? Json(nullptr) : idOf(data.back())},
              {"has_more", more}};
}

ResponsesRenderer::ResponsesRenderer(const Json& request, std::string id, std::string model,
                                     int64_t created)
    : request_(request),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      message_id_(absl::StrCat("msg_", randomId())),
      reasoning_id_(absl::StrCat("rs_", randomId())) {
  const Json* include = field(request_, "include");
  logprobs_ = field(request_, "top_logprobs") != nullptr ||
              (include != nullptr && include->is_array() &&
               std::find(include->begin(), include->end(), kLogprobsInclude) != include->end());
}

Json ResponsesRenderer::response(const char* status, Json output,
                                 const ResponseBuilder* reply) const {
  auto echo = [&](const char* key, Json fallback) {
    const Json* v = field(request_, key);
    return v != nullptr ? *v : fallback;
  };
  const Json* reasoning = field(request_, "reasoning");
  const Json* text = field(request_, "text");
  Json r{
      {"id", id_},
      {"object", "response"},
      {"created_at", created_},
      {"status", status},
      {"background", false},
      {"error", nullptr},
      {"incomplete_details", nullptr},
      {"instructions", echo("instructions", nullptr)},
      {"max_output_tokens", echo("max_output_tokens", nullptr)},
      {"metadata", echo("metadata", Json::object())},
      {"model", model_},
      {"output", std::move(output)},
      {"parallel_tool_calls", echo("parallel_tool_calls", true)},
      {"previous_response_id", echo("previous_response_id", nullptr)},
      {"reasoning",
       {{"effort", reasoning != nullptr && reasoning->is_object() && reasoning->contains("effort")
                       ? (*reasoning)["effort"]
                       : Json(nullptr)},
        {"summary", nullptr}}},
      {"store", echo("store", false)},
      {"temperature", echo("temperature", 1.0)},
      {"text",
       {{"format", text != nullptr && text->is_object() && text->contains("format")
                       ? (*text)["format"]
                       : Json{{"type", "text"}}}}},
      {"tool_choice", echo("tool_choice", "auto")},
      {"tools", echo("tools", Json::array())},
      {"top_p", echo("top_p", 1.0)},
      {"truncation", "disabled"},
      {"usage", nullptr},
      {"user", echo("user", nullptr)}};
  if (std::string_view(status) == "incomplete")
    r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (reply != nullptr && reply->finished()) r["usage"] = usageOf(reply->usage());
  return r;
}

Json ResponsesRenderer::messageItem(const std::string& text, const Json& logprobs,
                                    const char* status) const {
  Json part{{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}};
  if (logprobs_) part["logprobs"] = logprobs;
  return Json{{"id", message_id_},
              {"type", "message"},
              {"status", status},
              {"role", "assistant"},
              {"content", Json::array({std::move(part)})}};
}

Json ResponsesRenderer::reasoningItem(const std::string& text, const char* status) const {
  return Json{{"id", reasoning_id_},
              {"type", "reasoning"},
              {"status", status},
              {"summary", Json::array()},
              {"content", Json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

Json ResponsesRenderer::callItems(const ResponseBuilder& reply) const {
  Json items = Json::array();
  for (const Json& call : reply.toolCalls()) {
    items.push_back({{"id", absl::StrCat("fc_", randomId())},
                     {"type", "function_call"},
                     {"status", "completed"},
                     {"call_id", call["id"]},
                     {"name", call["function"]["name"]},
                     {"arguments", call["function"]["arguments"]}});
  }
  return items;
}

Json ResponsesRenderer::body(const ResponseBuilder& reply) const {
  Json output = Json::array();
  if (!reply.reasoning().empty()) output.push_back(reasoningItem(reply.reasoning(), "completed"));
  const Json calls = callItems(reply);
  if (!reply.text().empty() || (output.empty() && calls.empty())) {
    output.push_back(messageItem(reply.text(), reply.logprobs()["content"], "completed"));
  }
  for (const Json& call : calls) output.push_back(call);
  return response(statusOf(reply), std::move(output), &reply);
}

Json ResponsesRenderer::streamed(const ResponseBuilder& reply) const {
  return response(statusOf(reply), output_, &reply);
}

std::string ResponsesRenderer::event(const char* type, Json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence_++;
  return absl::StrCat("event: ", type, "\ndata: ", dumpJson(fields), "\n\n");
}

std::string ResponsesRenderer::started() {
  std::string out =
      event("response.created", {{"response", response("in_progress", Json::array(), nullptr)}});
  out += event("response.in_progress",
               {{"response", response("in_progress", Json::array(), nullptr)}});
  return out;
}

std::string ResponsesRenderer::closeOpenItem(const ResponseBuilder& reply) {
  std::string out;
  const size_t at = output_.size();
  if (open_ == Open::kReasoning) {
    const std::string text = reply.reasoning().substr(0, reasoning_sent_);
    out += event(
        "response.reasoning_text.done",
        {{"item_id", reasoning_id_}, {"output_index", at}, {"content_index", 0}, {"text", text}});
    Json item = reasoningItem(text, "completed");
    out += event("response.output_item.done", {{"output_index", at}, {"item", item}});
    output_.push_back(std::move(item));
  } else if (open_ == Open::kMessage) {
    const std::string text = reply.text().substr(0, text_sent_);
    Json item = messageItem(text, reply.logprobs()["content"], "completed");
    const Json& part = item["content"][0];
    out +=
        event("response.output_text.done", {{"item_id", message_id_},
                                            {"output_index", at},
                                            {"content_index", 0},
                                            {"text", text},
                                            {"logprobs", part.value("logprobs", Json::array())}});
    out += event(
        "response.content_part.done",
        {{"item_id", message_id_}, {"output_index", at}, {"content_index", 0}, {"part", part}});
    out += event("response.output_item.done", {{"output_index", at}, {"item", item}});
    output_.push_back(std::move(item));
  }
  open_ = Open::kNone;
  return out;
}

std::string ResponsesRenderer::openMessage() {
  Json item = messageItem("", Json::array(), "in_progress");
  Json part = item["content"][0];
  item["content"] = Json::array();
  std::string out =
      event("response.output_item.added", {{"output_index", output_.size()}, {"item", item}});
  out += event("response.content_part.added", {{"item_id", message_id_},
                                               {"output_index", output_.size()},
                                               {"content_index", 0},
                                               {"part", part}});
  open_ = Open::kMessage;
  return out;
}

std::string ResponsesRenderer::progress(const ResponseBuilder& reply) {
  std::string out;
  const std::string& reasoning = reply.reasoning();
  if (reasoning.size() > reasoning_sent_) {
    if (open_ != Open::kReasoning) {
      out += closeOpenItem(reply);
      Json item = reasoningItem("", "in_progress");
      item["content"] = Json::array();
      out +=
          event("response.output_item.added", {{"output_index", output_.size()}, {"item", item}});
      open_ = Open::kReasoning;
    }
    out += event("response.reasoning_text.delta", {{"item_id", reasoning_id_},
                                                   {"output_index", output_.size()},
                                                   {"content_index", 0},
                                                   {"delta", reasoning.substr(reasoning_sent_)}});
    reasoning_sent_ = reasoning.size();
  }
  const std::string& text = reply.text();
  if (text.size() > text_sent_) {
    if (open_ != Open::kMessage) {
      out += closeOpenItem(reply);  // First: it numbers events and items before the message.
      out += openMessage();
    }
    Json delta{{"item_id", message_id_},
               {"output_index", output_.size()},
               {"content_index", 0},
               {"delta", text.substr(text_sent_)}};
    // The SDK's event types always carry logprobs (empty unless asked for).
    delta["logprobs"] = Json::array();
    if (logprobs_) {
      const Json& all = reply.logprobs()["content"];
      delta["logprobs"] =
          Json(std::vector<Json>(all.begin() + static_cast<ptrdiff_t>(logprobs_sent_), all.end()));
      logprobs_sent_ = all.size();
    }
    out += event("response.output_text.delta", std::move(delta));
    text_sent_ = text.size();
  }
  return out;
}

std::string ResponsesRenderer::finished(const ResponseBuilder& reply) {
  std::string out = progress(reply);
  const Json calls = callItems(reply);
  // No text at all: an empty message still answers.
  if (open_ == Open::kNone && output_.empty() && calls.empty()) out += openMessage();
  out += closeOpenItem(reply);
  for (Json item : calls) {
    const size_t at = output_.size();
    const Json arguments = item["arguments"];
    item["status"] = "in_progress";
    item["arguments"] = "";
    out += event("response.output_item.added", {{"output_index", at}, {"item", item}});
    out += event("response.function_call_arguments.delta",
                 {{"item_id", item["id"]}, {"output_index", at}, {"delta", arguments}});
    out += event("response.function_call_arguments.done",
                 {{"item_id", item["id"]}, {"output_index", at}, {"arguments", arguments}});
    item["status"] = "completed";
    item["arguments"] = arguments;
    out += event("response.output_item.done", {{"output_index", at}, {"item", item}});
    output_.push_back(std::move(item));
  }
  const char* status = statusOf(reply);
  out +=
      event(std::string_view(status) == "completed" ? "response.completed" : "response.incomplete",
            {{"response", response(status, output_, &reply)}});
  return out;
}

std::string ResponsesRenderer::failed(const ApiError& error) {
  const Json parsed = Json::parse(error.body, nullptr, /*allow_exceptions=*/false);
  const Json e = parsed.is_object() && parsed.contains("error") ? parsed["error"] : Json::object();
  std::string out = event("error", {{"code", e.value("type", "server_error")},
                                    {"message", e.value("message", "")},
                                    {"param", e.value("param", Json(nullptr))}});
  Json r = response("failed", output_, nullptr);
  r["error"] = {{"code", e.value("type", "server_error")}, {"message", e.value("message", "")}};
  return out + event("response.failed", {{"response", std::move(r)}});
}

}  // namespace cleave::router::openai
