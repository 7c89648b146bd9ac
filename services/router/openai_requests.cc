#include "services/router/openai_requests.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/json_shape.h"
#include "common/status_macros.h"
#include "services/router/openai_fields.h"

namespace cleave::router::openai {

using Json = nlohmann::json;

absl::Status invalid(const std::string& param, const std::string& what) {
  absl::Status status = absl::InvalidArgumentError(absl::StrCat(param, ": ", what));
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

const std::string* stringField(const Json& object, const char* name) {
  const Json* v = object.is_object() ? field(object, name) : nullptr;
  return v != nullptr && v->is_string() ? &v->get_ref<const std::string&>() : nullptr;
}

absl::StatusOr<bool> boolean(const Json& body, const char* name, bool fallback) {
  const Json* v = field(body, name);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return invalid(name, "must be true or false");
  return v->get<bool>();
}

absl::StatusOr<std::optional<int64_t>> integer(const Json& body, const char* name, int64_t lo,
                                               int64_t hi) {
  const Json* v = field(body, name);
  if (v == nullptr) return std::optional<int64_t>();
  // A whole number written as a float (1024.0) is that integer, as Python clients send it.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::trunc(d) || d < static_cast<double>(lo) ||
        d > static_cast<double>(hi)) {
      return invalid(name, absl::StrCat("must be an integer in ", lo, "..", hi));
    }
    return std::optional<int64_t>(static_cast<int64_t>(d));
  }
  if (!v->is_number_integer()) return invalid(name, "must be an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return invalid(name, absl::StrCat("must be at most ", hi));
  }
  const int64_t i =
      v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
  if (i < lo || i > hi) return invalid(name, absl::StrCat("must be in ", lo, "..", hi));
  return std::optional<int64_t>(i);
}

absl::StatusOr<int32_t> truncatePromptTokens(const Json& body) {
  CLEAVE_ASSIGN_OR_RETURN(
      std::optional<int64_t> truncate,
      integer(body, "truncate_prompt_tokens", -1, std::numeric_limits<int32_t>::max()));
  if (truncate && *truncate == 0)
    return invalid("truncate_prompt_tokens", "must be -1 or at least 1");
  return static_cast<int32_t>(truncate.value_or(0));
}

absl::StatusOr<std::string> cacheSalt(const Json& body) {
  const Json* salt = field(body, "cache_salt");
  if (salt == nullptr) return std::string();
  if (!salt->is_string() || salt->get_ref<const std::string&>().empty())
    return invalid("cache_salt", "must be a non-empty string");
  return salt->get<std::string>();
}

absl::StatusOr<std::vector<uint32_t>> tokenIds(const Json& v, const std::string& name) {
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& id = v[i];
    if (!id.is_number_integer() || (!id.is_number_unsigned() && id.get<int64_t>() < 0) ||
        id.get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
      return invalid(absl::StrCat(name, "[", i, "]"), "must be a token id (an integer >= 0)");
    }
    ids.push_back(id.get<uint32_t>());
  }
  return ids;
}

// The chat fields of `body` into `chat`: messages, tools, template arguments.
absl::Status parseChat(const Json& body, v1::Chat& chat) {
  const Json* messages = field(body, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return invalid("messages", "must be a non-empty array of {\"role\", \"content\"} objects");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string name = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return invalid(name, "must be an object");
    const Json* role = field(m, "role");
    if (role == nullptr || !role->is_string() || role->get<std::string>().empty()) {
      return invalid(name + ".role", "must be a non-empty string");
    }
    v1::ChatMessage& out = *chat.add_messages();
    out.set_role(role->get<std::string>());
    Json rest = Json::object();
    for (const auto& [key, value] : m.items()) {
      if (key == "role") continue;
      if (key == "content" && value.is_string()) {
        out.set_content(value.get<std::string>());
        continue;
      }
      if (key == "content" && value.is_array()) {
        // Text parts are joined into one text (with newlines, as vLLM does): most
        // templates print content as a string.
        std::string joined;
        for (size_t j = 0; j < value.size(); ++j) {
          const Json& part = value[j];
          const std::string part_name = absl::StrCat(name, ".content[", j, "]");
          const Json* type = part.is_object() ? field(part, "type") : nullptr;
          if (type == nullptr || *type != "text") {
            return invalid(part_name + ".type",
                           "only \"text\" parts are supported (this deployment serves text)");
          }
          const Json* text = field(part, "text");
          if (text == nullptr || !text->is_string()) {
            return invalid(part_name + ".text", "must be a string");
          }
          absl::StrAppend(&joined, j == 0 ? "" : "\n", text->get<std::string>());
        }
        out.set_content(std::move(joined));
        continue;
      } else if (key == "content" && !value.is_null()) {
        return invalid(name + ".content", "must be a string, an array of text parts, or null");
      }
      rest[key] = value;
    }
    // A call's arguments come back as the JSON text the reply gave; templates print them
    // as an object (|tojson, |items), so they get the object, as vLLM gives them. Text that
    // is no JSON object stays text.
    if (auto calls = rest.find("tool_calls"); calls != rest.end() && calls->is_array()) {
      for (Json& call : *calls) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          continue;
        Json& function = call["function"];
        if (auto args = function.find("arguments"); args != function.end() && args->is_string()) {
          Json parsed = Json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
          if (parsed.is_object()) *args = std::move(parsed);
        }
      }
    }
    if (!rest.empty()) out.set_fields_json(rest.dump());
  }
  if (const Json* tools = field(body, "tools"); tools != nullptr) {
    if (!tools->is_array()) return invalid("tools", "must be an array of tool schemas");
    // Under tool_choice "none" too, as vLLM: the model knows the tools, and calls none.
    chat.set_tools_json(tools->dump());
  }
  if (const Json* kwargs = field(body, "chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) return invalid("chat_template_kwargs", "must be an object");
    if (!kwargs->empty()) chat.set_template_kwargs_json(kwargs->dump());
  }
  CLEAVE_ASSIGN_OR_RETURN(bool continue_final, boolean(body, "continue_final_message", false));
  chat.set_continue_final_message(continue_final);
  if (field(body, "add_generation_prompt") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(bool add, boolean(body, "add_generation_prompt", true));
    // Both true is refused only when the client said so; the default yields.
    if (add && continue_final) {
      return invalid("add_generation_prompt",
                     "cannot be true with continue_final_message (a reply either starts a new "
                     "turn or continues the last one)");
    }
    chat.set_add_generation_prompt(add);
  }
  return absl::OkStatus();
}

namespace {

// A float field copied into `set` when present.
template <typename Set>
absl::Status number(const Json& body, const char* name, Set set) {
  const Json* v = field(body, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return invalid(name, "must be a number");
  const double d = v->get<double>();
  if (!std::isfinite(d)) return invalid(name, "must be finite");
  set(static_cast<float>(d));
  return absl::OkStatus();
}

// "model", optional, into `request.model`.
template <typename Request>
absl::Status parseModel(const Json& body, Request& request) {
  const Json* model = field(body, "model");
  if (model == nullptr) return absl::OkStatus();
  if (!model->is_string()) return invalid("model", "must be a string");
  request.set_model(model->get<std::string>());
  return absl::OkStatus();
}

// What the API asks for and Cleave does not do.
absl::Status refuseUnsupported(const Json& body) {
  if (const Json* s = field(body, "suffix"); s != nullptr && !(s->is_string() && s->empty())) {
    return invalid("suffix", "is not supported");
  }

  return absl::OkStatus();
}

// tool_choice naming a function, or "required" with one tool: the reply is that function's
// arguments, decoded as an instance of its parameters' schema. Sets `call.forced_tool`.
absl::Status parseToolChoice(const Json& body, Call& call) {
  const Json* choice = field(body, "tool_choice");
  if (choice == nullptr || *choice == "auto" || *choice == "none") return absl::OkStatus();
  const Json* tools = field(body, "tools");
  if (tools == nullptr || !tools->is_array() || tools->empty())
    return invalid("tool_choice", "forces a tool call, but the request has no tools");
  std::string name;
  if (*choice == "required" && tools->size() > 1) {
    // One call of any tool: {"name": ..., "arguments": ...}, the name picking the schema.
    if (call.request.sampling().response_format() != v1::RESPONSE_FORMAT_TEXT)
      return invalid("tool_choice", "cannot force a tool call and a response_format at once");
    Json branches = Json::array();
    for (const Json& tool : *tools) {
      const Json* function = tool.is_object() ? field(tool, "function") : nullptr;
      const Json* tool_name =
          function != nullptr && function->is_object() ? field(*function, "name") : nullptr;
      if (tool_name == nullptr || !tool_name->is_string())
        return invalid("tools", "every tool needs function.name");
      const Json* parameters = field(*function, "parameters");
      branches.push_back(
          {{"type", "object"},
           {"properties",
            {{"name", {{"const", *tool_name}}},
             {"arguments", parameters != nullptr ? *parameters : Json{{"type", "object"}}}}},
           {"required", {"name", "arguments"}}});
    }
    call.forced_any_tool = true;
    call.required_tool = true;
    v1::SamplingParams& s = *call.request.mutable_sampling();
    s.set_response_format(v1::RESPONSE_FORMAT_JSON_SCHEMA);
    s.set_json_schema(
        Json{{"anyOf", branches}, {"discriminator", {{"propertyName", "name"}}}}.dump());
    return absl::OkStatus();
  }
  if (*choice != "required") {
    const Json* function = choice->is_object() ? field(*choice, "function") : nullptr;
    const Json* named =
        function != nullptr && function->is_object() ? field(*function, "name") : nullptr;
    if (named == nullptr || !named->is_string()) {
      return invalid("tool_choice",
                     "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                     "\"function\": {\"name\": ...}}");
    }
    name = named->get<std::string>();
  }
  for (const Json& tool : *tools) {
    const Json* function = tool.is_object() ? field(tool, "function") : nullptr;
    const Json* tool_name =
        function != nullptr && function->is_object() ? field(*function, "name") : nullptr;
    if (tool_name == nullptr || !tool_name->is_string()) continue;
    if (!name.empty() && *tool_name != name) continue;
    if (call.request.sampling().response_format() != v1::RESPONSE_FORMAT_TEXT)
      return invalid("tool_choice", "cannot force a tool call and a response_format at once");
    const Json* parameters = field(*function, "parameters");
    call.forced_tool = tool_name->get<std::string>();
    call.required_tool = *choice == "required";
    v1::SamplingParams& s = *call.request.mutable_sampling();
    s.set_response_format(v1::RESPONSE_FORMAT_JSON_SCHEMA);
    s.set_json_schema(parameters != nullptr ? parameters->dump()
                                            : R"({"type": "object", "properties": {}})");
    return absl::OkStatus();
  }
  return invalid("tool_choice", absl::StrCat("names \"", name, "\", which is not in tools"));
}

// vLLM's guided_json, guided_regex, guided_choice and guided_grammar, or its
// structured_outputs {"json": ...}, {"json_object": true}, {"regex": ...}, {"choice": [...]}
// or {"grammar": ...}: a JSON schema or JSON object response format, SamplingParams.regex,
// .choice and .grammar.
absl::Status parseGuidedOutputs(const Json& body, v1::SamplingParams& s) {
  const Json* structured = field(body, "structured_outputs");
  if (structured != nullptr && !structured->is_object())
    return invalid("structured_outputs", "must be an object");
  auto either = [&](const char* guided, const char* key) -> std::pair<const Json*, std::string> {
    if (const Json* j = field(body, guided); j != nullptr) return {j, guided};
    if (structured != nullptr) {
      if (const Json* j = field(*structured, key); j != nullptr)
        return {j, absl::StrCat("structured_outputs.", key)};
    }
    return {nullptr, ""};
  };
  // A JSON format replaces none given by response_format.
  auto format = [&](const std::string& name, v1::ResponseFormat f, std::string schema) {
    if (s.response_format() != v1::RESPONSE_FORMAT_TEXT)
      return invalid(name, "cannot be combined with a JSON response_format");
    s.set_response_format(f);
    if (!schema.empty()) s.set_json_schema(std::move(schema));
    return absl::OkStatus();
  };
  if (auto [json, name] = either("guided_json", "json"); json != nullptr) {
    // The schema, or its JSON text.
    const Json schema = json->is_string() ? Json::parse(json->get<std::string>(), nullptr,
                                                        /*allow_exceptions=*/false)
                                          : *json;
    if (!schema.is_object())
      return invalid(name, "must be a JSON schema: an object, or a string holding one");
    CLEAVE_RETURN_IF_ERROR(format(name, v1::RESPONSE_FORMAT_JSON_SCHEMA, schema.dump()));
  }
  if (structured != nullptr) {
    if (const Json* object = field(*structured, "json_object"); object != nullptr) {
      if (!object->is_boolean())
        return invalid("structured_outputs.json_object", "must be true or false");
      if (*object == true) {
        CLEAVE_RETURN_IF_ERROR(
            format("structured_outputs.json_object", v1::RESPONSE_FORMAT_JSON_OBJECT, ""));
      }
    }
  }
  if (auto [regex, name] = either("guided_regex", "regex"); regex != nullptr) {
    if (!regex->is_string()) return invalid(name, "must be a string");
    s.set_regex(regex->get<std::string>());
  }
  if (auto [grammar, name] = either("guided_grammar", "grammar"); grammar != nullptr) {
    if (!grammar->is_string()) return invalid(name, "must be a string (a GBNF grammar)");
    s.set_grammar(grammar->get<std::string>());
  }
  if (auto [choice, name] = either("guided_choice", "choice"); choice != nullptr) {
    if (!choice->is_array() || choice->empty())
      return invalid(name, "must be a non-empty array of strings");
    for (const Json& c : *choice) {
      if (!c.is_string()) return invalid(name, "must be a non-empty array of strings");
      s.add_choice(c.get<std::string>());
    }
  }
  return absl::OkStatus();
}

// The sampling, stopping and streaming fields both endpoints share.
absl::Status parseCommon(const Json& body, Call& call) {
  CLEAVE_RETURN_IF_ERROR(refuseUnsupported(body));
  CLEAVE_ASSIGN_OR_RETURN(std::optional<int64_t> n, integer(body, "n", 1, kMaxChoices));
  call.n = n.value_or(1);
  CLEAVE_ASSIGN_OR_RETURN(std::optional<int64_t> best_of, integer(body, "best_of", 1, 1 << 20));
  if (best_of && *best_of != call.n) {
    return invalid("best_of", "only equal to n is supported (every sample is returned)");
  }
  v1::GenerateRequest& r = call.request;
  CLEAVE_RETURN_IF_ERROR(parseModel(body, r));
  v1::SamplingParams& s = *r.mutable_sampling();
  if (const Json* format = field(body, "response_format"); format != nullptr) {
    const Json* type = format->is_object() ? field(*format, "type") : nullptr;
    if (type == nullptr || (*type != "text" && *type != "json_object" && *type != "json_schema")) {
      return invalid("response_format",
                     "type must be \"text\", \"json_object\" or \"json_schema\"");
    }
    if (*type == "json_object") s.set_response_format(v1::RESPONSE_FORMAT_JSON_OBJECT);
    if (*type == "json_schema") {
      const Json* wrapper = field(*format, "json_schema");
      const Json* schema =
          wrapper != nullptr && wrapper->is_object() ? field(*wrapper, "schema") : nullptr;
      if (schema == nullptr || !schema->is_object()) {
        return invalid("response_format",
                       "json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
      }
      s.set_response_format(v1::RESPONSE_FORMAT_JSON_SCHEMA);
      s.set_json_schema(schema->dump());
    }
  }
  CLEAVE_RETURN_IF_ERROR(parseGuidedOutputs(body, s));
  CLEAVE_RETURN_IF_ERROR(number(body, "temperature", [&](float f) { s.set_temperature(f); }));
  CLEAVE_RETURN_IF_ERROR(number(body, "top_p", [&](float f) { s.set_top_p(f); }));
  CLEAVE_RETURN_IF_ERROR(number(body, "min_p", [&](float f) { s.set_min_p(f); }));
  CLEAVE_RETURN_IF_ERROR(
      number(body, "presence_penalty", [&](float f) { s.set_presence_penalty(f); }));
  CLEAVE_RETURN_IF_ERROR(
      number(body, "frequency_penalty", [&](float f) { s.set_frequency_penalty(f); }));
  CLEAVE_RETURN_IF_ERROR(
      number(body, "repetition_penalty", [&](float f) { s.set_repetition_penalty(f); }));
  // top_k -1 (or 0) means no top-k filter, as in vLLM (and overrides the model's default).
  CLEAVE_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, integer(body, "top_k", -1, 1 << 30));
  if (top_k) s.set_top_k(static_cast<int32_t>(std::max<int64_t>(0, *top_k)));
  // A negative seed names the same 64 bits as its two's complement.
  CLEAVE_ASSIGN_OR_RETURN(std::optional<int64_t> seed,
                          integer(body, "seed", std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max()));
  if (seed) s.set_seed(static_cast<uint64_t>(*seed));

  v1::StoppingCriteria& stop = *r.mutable_stopping();
  if (const Json* v = field(body, "stop"); v != nullptr) {
    if (v->is_string()) {
      if (!v->get<std::string>().empty()) stop.add_stop(v->get<std::string>());
    } else if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i) {
        if (!(*v)[i].is_string()) return invalid(absl::StrCat("stop[", i, "]"), "must be a string");
        stop.add_stop((*v)[i].get<std::string>());
      }
    } else {
      return invalid("stop", "must be a string or an array of strings");
    }
  }
  if (const Json* v = field(body, "stop_token_ids"); v != nullptr) {
    if (!v->is_array()) return invalid("stop_token_ids", "must be an array of token ids");
    CLEAVE_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, tokenIds(*v, "stop_token_ids"));
    stop.mutable_stop_token_ids()->Add(ids.begin(), ids.end());
  }
  CLEAVE_ASSIGN_OR_RETURN(bool include_stop, boolean(body, "include_stop_str_in_output", false));
  stop.set_include_stop_str_in_output(include_stop);
  CLEAVE_ASSIGN_OR_RETURN(bool ignore_eos, boolean(body, "ignore_eos", false));
  stop.set_ignore_eos(ignore_eos);
  CLEAVE_ASSIGN_OR_RETURN(std::optional<int64_t> min_tokens,
                          integer(body, "min_tokens", 0, std::numeric_limits<uint32_t>::max()));
  if (min_tokens && *min_tokens > 0) stop.set_min_new_tokens(static_cast<uint32_t>(*min_tokens));
  // {"token id": bias}, as OpenAI's; vLLM's allowed_token_ids.
  if (const Json* v = field(body, "logit_bias"); v != nullptr && !v->is_null()) {
    if (!v->is_object()) return invalid("logit_bias", "must be an object of token id: bias");
    for (const auto& [key, bias] : v->items()) {
      uint32_t id = 0;
      if (!absl::SimpleAtoi(key, &id))
        return invalid("logit_bias", absl::StrCat("key \"", key, "\" is not a token id"));
      if (!bias.is_number())
        return invalid(absl::StrCat("logit_bias[\"", key, "\"]"), "must be a number");
      (*s.mutable_logit_bias())[id] = bias.get<float>();
    }
  }
  // vLLM's bad_words: the router tokenizes them.
  if (const Json* v = field(body, "bad_words"); v != nullptr) {
    if (!v->is_array()) return invalid("bad_words", "must be an array of strings");
    for (const Json& word : *v) {
      if (!word.is_string()) return invalid("bad_words", "must be an array of strings");
      s.add_bad_words(word.get<std::string>());
    }
  }
  if (const Json* v = field(body, "allowed_token_ids"); v != nullptr && !v->is_null()) {
    if (!v->is_array()) return invalid("allowed_token_ids", "must be an array of token ids");
    CLEAVE_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, tokenIds(*v, "allowed_token_ids"));
    s.mutable_allowed_token_ids()->Add(ids.begin(), ids.end());
  }

  CLEAVE_ASSIGN_OR_RETURN(call.stream, boolean(body, "stream", false));
  if (const Json* options = field(body, "stream_options"); options != nullptr) {
    if (!options->is_object()) return invalid("stream_options", "must be an object");
    if (!call.stream) return invalid("stream_options", "is only allowed with \"stream\": true");
    CLEAVE_ASSIGN_OR_RETURN(call.include_usage, boolean(*options, "include_usage", false));
    CLEAVE_ASSIGN_OR_RETURN(call.continuous_usage,
                            boolean(*options, "continuous_usage_stats", false));
    // The prompt's size comes with the first message.
    if (call.continuous_usage) r.set_echo_prompt_token_ids(true);
  }
  if (field(body, "skip_special_tokens") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(bool skip, boolean(body, "skip_special_tokens", true));
    r.set_skip_special_tokens(skip);
  }
  if (const Json* user = field(body, "user"); user != nullptr && !user->is_string()) {
    return invalid("user", "must be a string");
  }
  CLEAVE_ASSIGN_OR_RETURN(const int32_t truncate, truncatePromptTokens(body));
  r.set_truncate_prompt_tokens(truncate);
  CLEAVE_ASSIGN_OR_RETURN(call.token_ids, boolean(body, "return_token_ids", false));
  if (call.token_ids) r.set_echo_prompt_token_ids(true);
  CLEAVE_ASSIGN_OR_RETURN(call.tokens_as_ids, boolean(body, "return_tokens_as_token_ids", false));
  // vLLM's extension: lower is admitted first while requests wait.
  CLEAVE_ASSIGN_OR_RETURN(std::optional<int64_t> priority,
                          integer(body, "priority", std::numeric_limits<int32_t>::min(),
                                  std::numeric_limits<int32_t>::max()));
  if (priority) r.set_priority(static_cast<int32_t>(*priority));
  CLEAVE_ASSIGN_OR_RETURN(std::string salt, cacheSalt(body));
  r.set_cache_salt(std::move(salt));
  return absl::OkStatus();
}

// max_tokens (and, for chat, max_completion_tokens, which wins).
absl::Status parseMaxTokens(const Json& body, const char* name, Call& call) {
  CLEAVE_ASSIGN_OR_RETURN(std::optional<int64_t> max,
                          integer(body, name, 1, std::numeric_limits<uint32_t>::max()));
  if (max) call.request.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(*max));
  return absl::OkStatus();
}

// A completion's prompts: a string, a list of token ids, or a list of several of those.
// Each into a request holding only its input.
absl::StatusOr<std::vector<v1::GenerateRequest>> parsePrompts(const Json& body) {
  const Json* prompt = field(body, "prompt");
  if (prompt == nullptr) return invalid("prompt", "is required");
  std::vector<const Json*> items;
  if (prompt->is_array() && !prompt->empty() &&
      ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    for (const Json& item : *prompt) items.push_back(&item);
  } else {
    items.push_back(prompt);
  }
  std::vector<v1::GenerateRequest> prompts(items.size());
  for (size_t k = 0; k < items.size(); ++k) {
    const Json& p = *items[k];
    const std::string name = items.size() > 1 ? absl::StrCat("prompt[", k, "]") : "prompt";
    if (p.is_string() && !p.get<std::string>().empty()) {
      prompts[k].set_text(p.get<std::string>());
    } else if (p.is_array() && !p.empty()) {
      CLEAVE_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, tokenIds(p, name));
      prompts[k].mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
    } else {
      return invalid(name, "must be a non-empty string or a non-empty array of token ids");
    }
  }
  return prompts;
}

}  // namespace

absl::StatusOr<Json> parseBody(const std::string& body) {
  CLEAVE_RETURN_IF_ERROR(checkJsonShape(body, "request body"));
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("request body: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("request body: must be a JSON object");
  return j;
}

absl::StatusOr<Call> parseCompletionRequest(const Json& body) {
  Call call{.endpoint = Endpoint::kCompletions};
  v1::GenerateRequest& r = call.request;
  CLEAVE_ASSIGN_OR_RETURN(std::vector<v1::GenerateRequest> prompts, parsePrompts(body));
  CLEAVE_RETURN_IF_ERROR(parseCommon(body, call));
  if (prompts.size() * call.n > static_cast<size_t>(kMaxCompletions)) {
    return invalid("prompt", absl::StrCat("prompts times n is ", prompts.size() * call.n,
                                          "; at most ", kMaxCompletions, " per request"));
  }
  // OpenAI's default for completions: 16 new tokens.
  r.mutable_stopping()->set_max_new_tokens(16);
  CLEAVE_RETURN_IF_ERROR(parseMaxTokens(body, "max_tokens", call));
  // Text is tokenized as Hugging Face tokenizers do by default: leading special tokens
  // added, special-token text parsed.
  CLEAVE_ASSIGN_OR_RETURN(bool add_special, boolean(body, "add_special_tokens", true));
  r.set_add_special_tokens(add_special);
  r.set_parse_special_tokens(true);
  CLEAVE_ASSIGN_OR_RETURN(call.echo, boolean(body, "echo", false));
  CLEAVE_ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, integer(body, "logprobs", 0, 1 << 20));
  if (logprobs) {
    call.logprobs = true;
    r.set_logprobs(static_cast<uint32_t>(*logprobs));
  }
  // echo with logprobs scores the prompt too (as an evaluation harness's loglikelihood).
  if (call.echo && logprobs)
    r.set_prompt_logprobs(static_cast<uint32_t>(std::min<int64_t>(*logprobs, 20)));
  // One request per prompt, sharing the rest.
  for (const v1::GenerateRequest& prompt : prompts) {
    v1::GenerateRequest& one = call.prompts.emplace_back(r);
    if (prompt.has_text()) {
      one.set_text(prompt.text());
    } else {
      *one.mutable_token_ids() = prompt.token_ids();
    }
  }
  call.request = call.prompts.front();
  return call;
}

absl::StatusOr<Call> parseChatRequest(const Json& body) {
  Call call{.endpoint = Endpoint::kChatCompletions};
  v1::GenerateRequest& r = call.request;
  CLEAVE_RETURN_IF_ERROR(parseChat(body, *r.mutable_chat()));
  CLEAVE_RETURN_IF_ERROR(parseCommon(body, call));
  const Json* tools = field(body, "tools");
  const Json* choice = field(body, "tool_choice");
  call.offers_tools =
      tools != nullptr && !tools->empty() && (choice == nullptr || *choice != "none");
  if (const Json* kwargs = field(body, "chat_template_kwargs"); kwargs != nullptr) {
    const Json* thinking = field(*kwargs, "enable_thinking");
    call.thinking_off = thinking != nullptr && *thinking == false;
  }
  CLEAVE_ASSIGN_OR_RETURN(const bool parallel, boolean(body, "parallel_tool_calls", true));
  call.single_tool_call = !parallel;
  CLEAVE_RETURN_IF_ERROR(parseMaxTokens(body, "max_tokens", call));
  CLEAVE_RETURN_IF_ERROR(parseMaxTokens(body, "max_completion_tokens", call));
  CLEAVE_ASSIGN_OR_RETURN(call.logprobs, boolean(body, "logprobs", false));
  CLEAVE_ASSIGN_OR_RETURN(std::optional<int64_t> top, integer(body, "top_logprobs", 0, 1 << 20));
  if (top && *top > 0 && !call.logprobs) return invalid("top_logprobs", "needs \"logprobs\": true");
  if (call.logprobs) r.set_logprobs(top ? static_cast<uint32_t>(*top) : 0);
  CLEAVE_RETURN_IF_ERROR(parseToolChoice(body, call));
  return call;
}

absl::StatusOr<v1::TokenizeRequest> parseTokenizeRequest(const Json& body) {
  v1::TokenizeRequest r;
  CLEAVE_RETURN_IF_ERROR(parseModel(body, r));
  if (field(body, "messages") != nullptr) {
    CLEAVE_RETURN_IF_ERROR(parseChat(body, *r.mutable_chat()));
    return r;
  }
  const Json* prompt = field(body, "prompt");
  if (prompt == nullptr || !prompt->is_string()) {
    return invalid("prompt", "must be a string (or send \"messages\" instead)");
  }
  r.set_text(prompt->get<std::string>());
  CLEAVE_ASSIGN_OR_RETURN(bool add_special, boolean(body, "add_special_tokens", true));
  r.set_add_special_tokens(add_special);
  r.set_parse_special_tokens(true);
  CLEAVE_ASSIGN_OR_RETURN(bool pieces, boolean(body, "return_token_strs", false));
  r.set_return_pieces(pieces);
  return r;
}

absl::StatusOr<v1::DetokenizeRequest> parseDetokenizeRequest(const Json& body) {
  v1::DetokenizeRequest r;
  CLEAVE_RETURN_IF_ERROR(parseModel(body, r));
  const Json* tokens = field(body, "tokens");
  if (tokens == nullptr || !tokens->is_array()) {
    return invalid("tokens", "must be an array of token ids");
  }
  CLEAVE_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, tokenIds(*tokens, "tokens"));
  r.mutable_ids()->Add(ids.begin(), ids.end());
  r.set_skip_special_tokens(true);
  return r;
}

}  // namespace cleave::router::openai
