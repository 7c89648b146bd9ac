#include "services/router/messages_api.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/router/openai_fields.h"

namespace cleave::router::openai {
namespace {

using Json = nlohmann::json;

// Text blocks ({"type": "text", "text"}) joined with newlines, or a string.
absl::StatusOr<std::string> textOf(const Json& content, const std::string& name) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return invalid(name, "must be a string or an array of text blocks");
  std::string joined;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string block = absl::StrCat(name, "[", i, "]");
    const std::string* type = stringField(content[i], "type");
    if (type == nullptr || *type != "text") {
      return invalid(block + ".type",
                     "only text blocks are supported here (this deployment "
                     "serves text)");
    }
    const std::string* text = stringField(content[i], "text");
    if (text == nullptr) return invalid(block + ".text", "must be a string");
    absl::StrAppend(&joined, i == 0 ? "" : "\n", *text);
  }
  return joined;
}

// One message's content blocks onto the chat messages.
absl::Status addMessage(const Json& message, const std::string& name, Json& messages) {
  const std::string* role = stringField(message, "role");
  if (role == nullptr || (*role != "user" && *role != "assistant"))
    return invalid(name + ".role", "must be \"user\" or \"assistant\"");
  const Json* content = message.is_object() ? field(message, "content") : nullptr;
  if (content == nullptr) return invalid(name + ".content", "is required");
  if (content->is_string()) {
    messages.push_back({{"role", *role}, {"content", *content}});
    return absl::OkStatus();
  }
  if (!content->is_array())
    return invalid(name + ".content", "must be a string or an array of content blocks");
  std::string text;
  Json calls = Json::array();
  for (size_t i = 0; i < content->size(); ++i) {
    const Json& block = (*content)[i];
    const std::string at = absl::StrCat(name, ".content[", i, "]");
    const std::string* type = stringField(block, "type");
    if (type == nullptr) return invalid(at + ".type", "must be a string");
    if (*type == "text") {
      const std::string* part = stringField(block, "text");
      if (part == nullptr) return invalid(at + ".text", "must be a string");
      absl::StrAppend(&text, text.empty() ? "" : "\n", *part);
    } else if (*type == "thinking" || *type == "redacted_thinking") {
      continue;  // Templates drop earlier reasoning.
    } else if (*type == "tool_use" && *role == "assistant") {
      const std::string* id = stringField(block, "id");
      const std::string* tool = stringField(block, "name");
      const Json* input = field(block, "input");
      if (id == nullptr || tool == nullptr) return invalid(at, "tool_use needs id and name");
      if (input == nullptr || !input->is_object())
        return invalid(at + ".input", "must be an object");
      calls.push_back({{"id", *id},
                       {"type", "function"},
                       {"function", {{"name", *tool}, {"arguments", input->dump()}}}});
    } else if (*type == "tool_result" && *role == "user") {
      const std::string* id = stringField(block, "tool_use_id");
      if (id == nullptr) return invalid(at + ".tool_use_id", "must be a string");
      std::string result;
      if (const Json* output = field(block, "content"); output != nullptr) {
        CLEAVE_ASSIGN_OR_RETURN(result, textOf(*output, at + ".content"));
      }
      messages.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", result}});
    } else {
      return invalid(at + ".type",
                     absl::StrCat("\"", *type, "\" blocks are not supported in ", *role,
                                  " messages (text, tool_use, tool_result and thinking are)"));
    }
  }
  if (!text.empty() || calls.empty()) {
    if (!(text.empty() && *role == "user" && !messages.empty() &&
          messages.back()["role"] == "tool")) {
      messages.push_back({{"role", *role}, {"content", text}});
    }
  }
  if (!calls.empty()) {
    if (messages.empty() || messages.back()["role"] != "assistant")
      messages.push_back({{"role", "assistant"}, {"content", ""}});
    // Consecutive assistant turns are one: their calls add up.
    Json& all = messages.back()["tool_calls"];
    if (!all.is_array()) all = Json::array();
    for (Json& call : calls) all.push_back(std::move(call));
  }
  return absl::OkStatus();
}

absl::Status addTools(const Json& body, Json& chat) {
  if (const Json* tools = field(body, "tools"); tools != nullptr) {
    if (!tools->is_array()) return invalid("tools", "must be an array of tools");
    Json out = Json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& tool = (*tools)[i];
      const std::string at = absl::StrCat("tools[", i, "]");
      const std::string* type = stringField(tool, "type");
      if (type != nullptr && *type != "custom") {
        return invalid(at + ".type", absl::StrCat("only client tools (name, input_schema) are "
                                                  "supported, not \"",
                                                  *type, "\""));
      }
      const std::string* name = stringField(tool, "name");
      if (name == nullptr) return invalid(at + ".name", "must be a string");
      const Json* schema = field(tool, "input_schema");
      if (schema == nullptr || !schema->is_object())
        return invalid(at + ".input_schema", "must be a JSON schema object");
      Json function{{"name", *name}, {"parameters", *schema}};
      if (const std::string* description = stringField(tool, "description"))
        function["description"] = *description;
      out.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    chat["tools"] = std::move(out);
  }
  if (const Json* choice = field(body, "tool_choice"); choice != nullptr) {
    const std::string* type = stringField(*choice, "type");
    if (type != nullptr && (*type == "auto" || *type == "none")) {
      chat["tool_choice"] = *type;
    } else if (type != nullptr && *type == "any") {
      chat["tool_choice"] = "required";
    } else if (type != nullptr && *type == "tool" && stringField(*choice, "name") != nullptr) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    } else {
      return invalid("tool_choice",
                     "must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} "
                     "or {\"type\": \"tool\", \"name\": ...}");
    }
    if (const Json* single = field(*choice, "disable_parallel_tool_use");
        single != nullptr && *single == true) {
      chat["parallel_tool_calls"] = false;
    }
  }
  return absl::OkStatus();
}

const char* anthropicType(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
  }
}

Json usageOf(const v1::Usage& u) {
  return Json{{"input_tokens", u.prompt_tokens() - u.cached_prompt_tokens()},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", u.cached_prompt_tokens()},
              {"output_tokens", u.completion_tokens()}};
}

// stop_reason and stop_sequence of a finished reply.
std::pair<const char*, Json> stopOf(const ResponseBuilder& reply) {
  if (std::string_view(finishReason(reply.final().finish_reason())) == "length")
    return {"max_tokens", nullptr};
  if (!reply.toolCalls().empty()) return {"tool_use", nullptr};
  if (reply.final().finish_reason() == v1::FINISH_REASON_STOP_STRING)
    return {"stop_sequence", reply.final().matched_stop()};
  return {"end_turn", nullptr};
}

}  // namespace

absl::StatusOr<Call> parseMessagesRequest(const Json& body, bool counting) {
  if (!body.is_object()) return invalid("body", "must be a JSON object");
  Json chat = Json::object();
  for (const char* key : {"model", "temperature", "top_p", "top_k", "stream"}) {
    if (field(body, key) != nullptr) chat[key] = body[key];
  }
  if (!counting) {
    const Json* max = field(body, "max_tokens");
    if (max == nullptr) return invalid("max_tokens", "is required");
    chat["max_completion_tokens"] = *max;
  }
  if (const Json* stops = field(body, "stop_sequences"); stops != nullptr) chat["stop"] = *stops;
  Json messages = Json::array();
  if (const Json* system = field(body, "system"); system != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(std::string text, textOf(*system, "system"));
    messages.push_back({{"role", "system"}, {"content", text}});
  }
  const Json* input = field(body, "messages");
  if (input == nullptr || !input->is_array() || input->empty())
    return invalid("messages", "must be a non-empty array of messages");
  for (size_t i = 0; i < input->size(); ++i) {
    CLEAVE_RETURN_IF_ERROR(addMessage((*input)[i], absl::StrCat("messages[", i, "]"), messages));
  }
  // A last assistant turn of text is a prefill: the reply continues it.
  if (const Json& last = messages.back();
      last["role"] == "assistant" && !last.contains("tool_calls")) {
    chat["continue_final_message"] = true;
    chat["add_generation_prompt"] = false;
  }
  chat["messages"] = std::move(messages);
  CLEAVE_RETURN_IF_ERROR(addTools(body, chat));
  // Structured outputs: output_config.format (output_format before it).
  for (const char* key : {"output_config", "output_format"}) {
    const Json* config = field(body, key);
    if (config == nullptr) continue;
    if (!config->is_object()) return invalid(key, "must be an object");
    const bool nested = std::string_view(key) == "output_config";
    const Json* format = nested ? field(*config, "format") : config;
    if (format == nullptr) continue;
    const std::string name = nested ? "output_config.format" : key;
    const std::string* type = stringField(*format, "type");
    const Json* schema = format->is_object() ? field(*format, "schema") : nullptr;
    if (type == nullptr || *type != "json_schema" || schema == nullptr || !schema->is_object())
      return invalid(name, "must be {\"type\": \"json_schema\", \"schema\": {...}}");
    chat["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
  }
  if (const Json* thinking = field(body, "thinking"); thinking != nullptr) {
    const std::string* type = stringField(*thinking, "type");
    if (type != nullptr && *type == "disabled")
      chat["chat_template_kwargs"] = {{"enable_thinking", false}};
  }
  CLEAVE_ASSIGN_OR_RETURN(Call call, parseChatRequest(chat));
  call.endpoint = Endpoint::kMessages;
  call.n = 1;
  // A stream's message_start reports the prompt's tokens: they come with the first message.
  call.request.set_echo_prompt_token_ids(call.stream);
  return call;
}

std::string anthropicError(int status, const std::string& openai_body) {
  const Json parsed = Json::parse(openai_body, nullptr, /*allow_exceptions=*/false);
  std::string message = openai_body;
  if (parsed.is_object() && parsed.contains("error") && parsed["error"].is_object()) {
    message = parsed["error"].value("message", openai_body);
  }
  return dumpJson(
      Json{{"type", "error"}, {"error", {{"type", anthropicType(status)}, {"message", message}}}});
}

MessagesRenderer::MessagesRenderer(std::string id, std::string model)
    : id_(std::move(id)), model_(std::move(model)) {}

Json MessagesRenderer::message(Json content, const ResponseBuilder* reply) const {
  Json m{{"id", id_},
         {"type", "message"},
         {"role", "assistant"},
         {"model", model_},
         {"content", std::move(content)},
         {"stop_reason", nullptr},
         {"stop_sequence", nullptr}};
  if (reply != nullptr && reply->finished()) {
    auto [reason, sequence] = stopOf(*reply);
    m["stop_reason"] = reason;
    m["stop_sequence"] = sequence;
    m["usage"] = usageOf(reply->usage());
  }
  return m;
}

Json MessagesRenderer::toolUses(const ResponseBuilder& reply) const {
  Json blocks = Json::array();
  for (const Json& call : reply.toolCalls()) {
    const std::string arguments = call["function"]["arguments"];
    Json input = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
    if (!input.is_object()) input = Json::object();  // Not an object: nothing to pass.
    blocks.push_back({{"type", "tool_use"},
                      {"id", call["id"]},
                      {"name", call["function"]["name"]},
                      {"input", std::move(input)}});
  }
  return blocks;
}

Json MessagesRenderer::body(const ResponseBuilder& reply) const {
  Json content = Json::array();
  if (!reply.reasoning().empty()) {
    content.push_back({{"type", "thinking"}, {"thinking", reply.reasoning()}, {"signature", ""}});
  }
  const Json calls = toolUses(reply);
  if (!reply.text().empty() || (content.empty() && calls.empty()))
    content.push_back({{"type", "text"}, {"text", reply.text()}});
  for (const Json& call : calls) content.push_back(call);
  return message(std::move(content), &reply);
}

std::string MessagesRenderer::event(const char* type, Json fields) const {
  fields["type"] = type;
  return absl::StrCat("event: ", type, "\ndata: ", dumpJson(fields), "\n\n");
}

std::string MessagesRenderer::start(const ResponseBuilder& reply) {
  if (started_) return "";
  started_ = true;
  Json m = message(Json::array(), nullptr);
  // As the end reports it: the prompt less what the cache supplied, and that apart.
  const int64_t prompt = static_cast<int64_t>(reply.promptTokenIds().size());
  const int64_t cached = std::min<int64_t>(reply.cachedPromptTokens(), prompt);
  m["usage"] = {{"input_tokens", prompt - cached},
                {"cache_creation_input_tokens", 0},
                {"cache_read_input_tokens", cached},
                {"output_tokens", 0}};
  return event("message_start", {{"message", std::move(m)}});
}

std::string MessagesRenderer::open(Block block) {
  if (open_ == block) return "";
  std::string out = close();
  open_ = block;
  const Json content = block == Block::kThinking
                           ? Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                           : Json{{"type", "text"}, {"text", ""}};
  return out + event("content_block_start", {{"index", blocks_}, {"content_block", content}});
}

std::string MessagesRenderer::close() {
  if (open_ == Block::kNone) return "";
  open_ = Block::kNone;
  return event("content_block_stop", {{"index", blocks_++}});
}

std::string MessagesRenderer::progress(const ResponseBuilder& reply) {
  std::string out = start(reply);
  if (reply.reasoning().size() > reasoning_sent_) {
    out += open(Block::kThinking);
    out += event(
        "content_block_delta",
        {{"index", blocks_},
         {"delta",
          {{"type", "thinking_delta"}, {"thinking", reply.reasoning().substr(reasoning_sent_)}}}});
    reasoning_sent_ = reply.reasoning().size();
  }
  if (reply.text().size() > text_sent_) {
    out += open(Block::kText);
    out += event("content_block_delta",
                 {{"index", blocks_},
                  {"delta", {{"type", "text_delta"}, {"text", reply.text().substr(text_sent_)}}}});
    text_sent_ = reply.text().size();
  }
  return out;
}

std::string MessagesRenderer::finished(const ResponseBuilder& reply) {
  std::string out = progress(reply);
  const Json calls = toolUses(reply);
  // No text at all: an empty text block still answers.
  if (blocks_ == 0 && open_ == Block::kNone && calls.empty()) out += open(Block::kText);
  out += close();
  for (Json call : calls) {
    const std::string input = call["input"].dump();
    call["input"] = Json::object();
    out += event("content_block_start", {{"index", blocks_}, {"content_block", call}});
    out += event(
        "content_block_delta",
        {{"index", blocks_}, {"delta", {{"type", "input_json_delta"}, {"partial_json", input}}}});
    out += event("content_block_stop", {{"index", blocks_++}});
  }
  auto [reason, sequence] = stopOf(reply);
  out += event("message_delta", {{"delta", {{"stop_reason", reason}, {"stop_sequence", sequence}}},
                                 {"usage", usageOf(reply.usage())}});
  return out + event("message_stop", Json::object());
}

std::string MessagesRenderer::failed(const ApiError& error) {
  const Json e = Json::parse(anthropicError(error.http_status, error.body));
  return event("error", {{"error", e["error"]}});
}

}  // namespace cleave::router::openai
