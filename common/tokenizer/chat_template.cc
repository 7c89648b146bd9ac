#include "common/tokenizer/chat_template.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jinja/builtins.h"
#include "common/jinja/template.h"
#include "common/json_shape.h"
#include "common/model/gguf_file.h"
#include "common/status_macros.h"
#include "common/tokenizer/loaders.h"

namespace cleave::tokenizer {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr size_t kMaxTemplateBytes = size_t{1} << 20;
constexpr size_t kMaxConfigBytes = size_t{16} << 20;

// JSON as a template sees it (Python's json.loads): key order kept, 2 an int and 2.0 a float.
jinja::Value toValue(const OrderedJson& j) {
  switch (j.type()) {
    case OrderedJson::value_t::null: return jinja::Value::none();
    case OrderedJson::value_t::boolean: return jinja::Value(j.get<bool>());
    case OrderedJson::value_t::number_integer: return jinja::Value(j.get<int64_t>());
    case OrderedJson::value_t::number_unsigned:
      return j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                 ? jinja::Value(static_cast<int64_t>(j.get<uint64_t>()))
                 : jinja::Value(static_cast<double>(j.get<uint64_t>()));
    case OrderedJson::value_t::number_float: return jinja::Value(j.get<double>());
    case OrderedJson::value_t::string: return jinja::Value(j.get<std::string>());
    case OrderedJson::value_t::array: {
      jinja::List items;
      for (const auto& item : j) items.push_back(toValue(item));
      return jinja::Value(std::move(items));
    }
    case OrderedJson::value_t::object: {
      jinja::Dict dict;
      for (const auto& [k, v] : j.items()) dict.set(k, toValue(v));
      return jinja::Value(std::move(dict));
    }
    default: return jinja::Value::none();
  }
}

absl::StatusOr<OrderedJson> parseJson(absl::string_view text, absl::string_view field) {
  CLEAVE_RETURN_IF_ERROR(checkJsonShape(text, field));
  OrderedJson j = OrderedJson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(field, ": not valid JSON"));
  return j;
}

absl::StatusOr<std::string> tokenText(const Tokenizer& tokenizer, std::optional<TokenId> id) {
  if (!id) return std::string();
  auto piece = tokenizer.piece(*id);
  return piece.ok() ? *piece : std::string();
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::fromSource(const std::string& source,
                                                      std::string bos_token, std::string eos_token,
                                                      const std::string& tool_source) {
  auto parsed = jinja::Template::parse(source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", parsed.status().message()));
  }
  std::shared_ptr<const jinja::Template> tools;
  if (!tool_source.empty()) {
    auto parsed_tools = jinja::Template::parse(tool_source);
    if (!parsed_tools.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tool_use chat template: ", parsed_tools.status().message()));
    }
    tools = std::make_shared<const jinja::Template>(*std::move(parsed_tools));
  }
  return ChatTemplate(std::make_shared<const jinja::Template>(*std::move(parsed)), std::move(tools),
                      std::move(bos_token), std::move(eos_token));
}

absl::StatusOr<ChatTemplate> ChatTemplate::load(const std::string& model_path,
                                                const Tokenizer& tokenizer,
                                                const std::string& template_file) {
  if (!template_file.empty()) return loadFile(template_file, tokenizer);
  CLEAVE_ASSIGN_OR_RETURN(std::string bos, tokenText(tokenizer, tokenizer.bosId()));
  CLEAVE_ASSIGN_OR_RETURN(std::string eos, tokenText(tokenizer, tokenizer.eosId()));
  const std::filesystem::path p(model_path);
  std::error_code ec;
  const auto none = [&](absl::string_view where) {
    return absl::NotFoundError(absl::StrCat(model_path, ": no chat template (", where,
                                            "); pass one with --chat-template FILE"));
  };
  if (std::filesystem::is_directory(p, ec)) {
    const auto jinja_file = p / "chat_template.jinja";
    if (std::filesystem::is_regular_file(jinja_file, ec))
      return loadFile(jinja_file.string(), tokenizer);
    const auto config_path = p / "tokenizer_config.json";
    if (!std::filesystem::is_regular_file(config_path, ec)) {
      return none("no chat_template.jinja or tokenizer_config.json");
    }
    CLEAVE_ASSIGN_OR_RETURN(std::string text,
                            readFileLimited(config_path.string(), kMaxConfigBytes));
    // A model file, not a request: no shape limits beyond the file size.
    const OrderedJson config = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": not valid JSON"));
    }
    const auto it = config.is_object() ? config.find("chat_template") : config.end();
    if (it == config.end() || it->is_null())
      return none("tokenizer_config.json has no chat_template");
    std::string source, tool_source;
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      // Named templates: "default", and "tool_use" for requests that pass tools.
      for (const auto& entry : *it) {
        if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string()) {
          continue;
        }
        const std::string name = entry.value("name", "");
        if (name == "default") source = entry["template"].get<std::string>();
        if (name == "tool_use") tool_source = entry["template"].get<std::string>();
      }
      if (source.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            config_path.string(), ": field 'chat_template': no entry named \"default\""));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path.string(),
                       ": field 'chat_template': must be a string or a list of {name, template}"));
    }
    auto t = fromSource(source, bos, eos, tool_source);
    if (!t.ok())
      return absl::InvalidArgumentError(
          absl::StrCat(config_path.string(), ": ", t.status().message()));
    return t;
  }
  CLEAVE_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> file, model::GgufFile::open(model_path));
  if (file->find("tokenizer.chat_template") == nullptr) return none("no tokenizer.chat_template");
  CLEAVE_ASSIGN_OR_RETURN(std::string source, file->getString("tokenizer.chat_template"));
  std::string tool_source;
  if (file->find("tokenizer.chat_template.tool_use") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(tool_source, file->getString("tokenizer.chat_template.tool_use"));
  }
  auto t = fromSource(source, bos, eos, tool_source);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": tokenizer.chat_template: ", t.status().message()));
  }
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::loadFile(const std::string& path,
                                                    const Tokenizer& tokenizer) {
  CLEAVE_ASSIGN_OR_RETURN(std::string bos, tokenText(tokenizer, tokenizer.bosId()));
  CLEAVE_ASSIGN_OR_RETURN(std::string eos, tokenText(tokenizer, tokenizer.eosId()));
  CLEAVE_ASSIGN_OR_RETURN(std::string source, readFileLimited(path, kMaxTemplateBytes));
  auto t = fromSource(source, bos, eos);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", t.status().message()));
  return t;
}

namespace {

// What continue_final_message appends to the last text, to find where it ends.
constexpr absl::string_view kMark = "CLEAVE_CONTINUE_FINAL_MESSAGE ";

// transformers 5's aliases: a message's reasoning, under any of its names, is also given as
// `reasoning_content` (what templates read) and `thinking` (gpt-oss templates).
void aliasReasoning(jinja::Dict& message) {
  const jinja::Value* found = nullptr;
  for (const char* name : {"reasoning_content", "thinking", "reasoning"}) {
    if (found == nullptr) found = message.find(name);
  }
  if (found == nullptr) return;
  const jinja::Value reasoning = *found;
  jinja::Dict aliased;
  aliased.set("thinking", reasoning);
  for (auto& [k, v] : message.items) aliased.set(k, std::move(v));
  aliased.set("reasoning_content", reasoning);
  message = std::move(aliased);
}

// Appends kMark to the last message's text: its content, or the last text part of a list.
absl::Status markFinalText(jinja::Dict& message) {
  const jinja::Value* content = message.find("content");
  if (content != nullptr && content->isString()) {
    message.set("content", jinja::Value(content->asString() + std::string(kMark)));
    return absl::OkStatus();
  }
  if (content != nullptr && content->isList()) {
    jinja::List parts = content->asList();
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
      const jinja::Value* text = it->isDict() ? it->asDict().find("text") : nullptr;
      if (text == nullptr || !text->isString()) continue;
      jinja::Dict part = it->asDict();
      part.set("text", jinja::Value(text->asString() + std::string(kMark)));
      *it = jinja::Value(std::move(part));
      message.set("content", jinja::Value(std::move(parts)));
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      "continue_final_message: the last message has no text content to continue");
}

}  // namespace

absl::StatusOr<std::string> ChatTemplate::render(const ChatInput& input) const {
  if (!input.continue_final_message) return renderTurns(input, false);
  // As transformers: mark the end of the last text, render, and cut at the mark.
  if (input.messages.empty()) {
    return absl::InvalidArgumentError("continue_final_message: there is no message to continue");
  }
  ChatInput marked = input;
  marked.add_generation_prompt = false;
  CLEAVE_ASSIGN_OR_RETURN(std::string text, renderTurns(marked, true));
  const absl::string_view bare = absl::StripTrailingAsciiWhitespace(kMark);
  const size_t at = absl::string_view(text).rfind(bare);
  if (at == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message: the chat template does not print the last message's content");
  }
  if (absl::string_view(text).substr(at, kMark.size()) == kMark) {
    text.resize(at);
  } else {
    text = std::string(absl::StripTrailingAsciiWhitespace(absl::string_view(text).substr(0, at)));
  }
  return text;
}

absl::StatusOr<std::string> ChatTemplate::renderTurns(const ChatInput& input,
                                                      bool mark_final) const {
  jinja::List messages;
  for (size_t i = 0; i < input.messages.size(); ++i) {
    const ChatMessage& m = input.messages[i];
    jinja::Dict message;
    message.set("role", jinja::Value(m.role));
    message.set("content", jinja::Value(m.content));
    if (!m.fields_json.empty()) {
      const std::string field = absl::StrCat("messages[", i, "].fields_json");
      CLEAVE_ASSIGN_OR_RETURN(OrderedJson fields, parseJson(m.fields_json, field));
      if (!fields.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": must be a JSON object"));
      }
      for (const auto& [k, v] : fields.items()) message.set(k, toValue(v));
    }
    // As transformers' apply_chat_template: a field set to null is left out (templates test
    // for presence).
    std::erase_if(message.items, [](const auto& item) { return item.second.isNone(); });
    aliasReasoning(message);
    if (mark_final && i + 1 == input.messages.size())
      CLEAVE_RETURN_IF_ERROR(markFinalText(message));
    messages.emplace_back(std::move(message));
  }
  jinja::Dict context;
  context.set("messages", jinja::Value(std::move(messages)));
  jinja::Value tools = jinja::Value::none();
  if (!input.tools_json.empty()) {
    CLEAVE_ASSIGN_OR_RETURN(OrderedJson parsed, parseJson(input.tools_json, "tools_json"));
    if (!parsed.is_array() && !parsed.is_null()) {
      return absl::InvalidArgumentError("tools_json: must be a JSON array of tool schemas");
    }
    tools = toValue(parsed);
  }
  const bool with_tools = tools.isList();  // as transformers: any list, even empty
  context.set("tools", std::move(tools));
  context.set("documents", jinja::Value::none());
  context.set("add_generation_prompt", jinja::Value(input.add_generation_prompt));
  context.set("bos_token", jinja::Value(bos_));
  context.set("eos_token", jinja::Value(eos_));
  if (!input.kwargs_json.empty()) {
    CLEAVE_ASSIGN_OR_RETURN(OrderedJson kwargs,
                            parseJson(input.kwargs_json, "template_kwargs_json"));
    if (!kwargs.is_object()) {
      return absl::InvalidArgumentError("template_kwargs_json: must be a JSON object");
    }
    for (const auto& [k, v] : kwargs.items()) {
      if (context.find(k) != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("template_kwargs_json: '", k, "' is set by the request itself"));
      }
      context.set(k, toValue(v));
    }
  }
  return renderWith(with_tools && tool_template_ ? *tool_template_ : *template_, context);
}

absl::StatusOr<std::string> ChatTemplate::renderContext(absl::string_view context_json) const {
  CLEAVE_ASSIGN_OR_RETURN(OrderedJson context, parseJson(context_json, "chat template context"));
  if (!context.is_object())
    return absl::InvalidArgumentError("chat template context: must be a JSON object");
  jinja::Value vars = toValue(context);
  return renderWith(*template_, vars.asDict());
}

absl::StatusOr<std::string> ChatTemplate::renderWith(const jinja::Template& t,
                                                     const jinja::Dict& context) const {
  auto rendered = t.render(context);
  if (rendered.ok()) return rendered;
  const absl::string_view message = rendered.status().message();
  if (absl::StartsWith(message, jinja::kRaisedPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat("the chat template refused the conversation: ",
                                                   message.substr(jinja::kRaisedPrefix.size())));
  }
  return absl::Status(rendered.status().code(), absl::StrCat("chat template: ", message));
}

}  // namespace cleave::tokenizer
