#include "services/router/tool_call_parser.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/json_shape.h"
#include "services/router/partial_tag.h"

namespace cleave::router {
namespace {

using Json = nlohmann::ordered_json;  // arguments keep the model's key order

// JSON written compactly (", " and ": " as Python's json.dumps writes them), invalid UTF-8
// replaced.
std::string compactJson(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A call object: {"name": "...", "arguments" (or "parameters"): ...}; nullopt otherwise
// (JSON without both keys is an answer, not a call).
std::optional<ToolCall> callFrom(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) {
    return std::nullopt;
  }
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end()) return std::nullopt;
  ToolCall call{.name = name->get<std::string>()};
  if (args->is_string()) {
    // Arguments given as JSON text stay as they are; other text becomes a JSON string.
    const std::string& given = args->get_ref<const std::string&>();
    const bool json_text = checkJsonShape(given, "arguments").ok() &&
                           !Json::parse(given, nullptr, /*allow_exceptions=*/false).is_discarded();
    call.arguments = json_text ? given : compactJson(*args);
  } else {
    call.arguments = compactJson(*args);
  }
  return call;
}

// JSON text the model wrote (bounded in shape); discarded when it is not JSON.
Json jsonOf(absl::string_view text) {
  if (!checkJsonShape(text, "tool call").ok()) return Json(Json::value_t::discarded);
  return Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

std::optional<ToolCall> callFrom(absl::string_view text) { return callFrom(jsonOf(text)); }

// A call's arguments written as a JSON object, compacted (keys in the model's order).
std::optional<std::string> argumentsFrom(absl::string_view text) {
  const Json j = jsonOf(absl::StripAsciiWhitespace(text));
  if (!j.is_object()) return std::nullopt;
  return compactJson(j);
}

// hermes: <tool_call>{...}</tool_call>, any number (`text` starts at the first).
std::optional<std::vector<ToolCall>> hermesCalls(absl::string_view text) {
  constexpr absl::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  std::vector<ToolCall> calls;
  size_t at = text.find(kOpen);
  while (at != absl::string_view::npos) {
    const size_t begin = at + kOpen.size();
    const size_t end = text.find(kClose, begin);
    std::optional<ToolCall> call = callFrom(absl::StripAsciiWhitespace(text.substr(
        begin, end == absl::string_view::npos ? absl::string_view::npos : end - begin)));
    if (!call) return std::nullopt;
    calls.push_back(*std::move(call));
    if (end == absl::string_view::npos) break;
    at = text.find(kOpen, end + kClose.size());
  }
  return calls;
}

// llama3_json: {...}; {...} (the whole reply).
std::optional<std::vector<ToolCall>> llama3Calls(absl::string_view text) {
  std::vector<ToolCall> calls;
  text = absl::StripAsciiWhitespace(text);
  while (!text.empty()) {
    if (text[0] != '{') return std::nullopt;
    const size_t end = jsonContainerEnd(text);
    if (end == absl::string_view::npos) return std::nullopt;
    std::optional<ToolCall> call = callFrom(text.substr(0, end));
    if (!call) return std::nullopt;
    calls.push_back(*std::move(call));
    text = absl::StripLeadingAsciiWhitespace(text.substr(end));
    if (absl::ConsumePrefix(&text, ";")) text = absl::StripLeadingAsciiWhitespace(text);
  }
  return calls;
}

// mistral: [TOOL_CALLS] followed by a JSON array of call objects (Mistral 7B v0.3, Mixtral
// 8x22B), or by NAME[ARGS]{...} (later models, one [TOOL_CALLS] per call).
std::optional<std::vector<ToolCall>> mistralCalls(absl::string_view text) {
  constexpr absl::string_view kOpen = "[TOOL_CALLS]", kArgs = "[ARGS]";
  std::vector<ToolCall> calls;
  while (absl::ConsumePrefix(&text, kOpen)) {
    text = absl::StripLeadingAsciiWhitespace(text);
    if (!text.empty() && (text[0] == '[' || text[0] == '{')) {
      const size_t end = jsonContainerEnd(text);
      if (end == absl::string_view::npos) return std::nullopt;
      const Json j = jsonOf(text.substr(0, end));
      for (const Json& one : j.is_array() ? j : Json::array({j})) {
        std::optional<ToolCall> call = callFrom(one);
        if (!call) return std::nullopt;
        calls.push_back(*std::move(call));
      }
      text = absl::StripLeadingAsciiWhitespace(text.substr(end));
      continue;
    }
    const size_t args = text.find(kArgs);
    if (args == absl::string_view::npos) return std::nullopt;
    const absl::string_view name = absl::StripAsciiWhitespace(text.substr(0, args));
    absl::string_view rest = absl::StripLeadingAsciiWhitespace(text.substr(args + kArgs.size()));
    const size_t end =
        rest.empty() || rest[0] != '{' ? absl::string_view::npos : jsonContainerEnd(rest);
    if (name.empty() || end == absl::string_view::npos) return std::nullopt;
    std::optional<std::string> arguments = argumentsFrom(rest.substr(0, end));
    if (!arguments) return std::nullopt;
    calls.push_back({.name = std::string(name), .arguments = *std::move(arguments)});
    text = absl::StripLeadingAsciiWhitespace(rest.substr(end));
  }
  return calls;
}

// deepseek_v3: <｜tool▁calls▁begin｜> then per call <｜tool▁call▁begin｜>function<｜tool▁sep｜>
// NAME\n```json\nARGS\n```<｜tool▁call▁end｜> (V3, R1), or <｜tool▁call▁begin｜>NAME
// <｜tool▁sep｜>ARGS<｜tool▁call▁end｜> (V3.1 and later).
std::optional<std::vector<ToolCall>> deepseekCalls(absl::string_view text) {
  constexpr absl::string_view kBegin = "<｜tool▁call▁begin｜>", kSep = "<｜tool▁sep｜>",
                              kEnd = "<｜tool▁call▁end｜>";
  std::vector<ToolCall> calls;
  for (size_t at = text.find(kBegin); at != absl::string_view::npos;) {
    const size_t begin = at + kBegin.size();
    const size_t end = text.find(kEnd, begin);
    const absl::string_view body =
        text.substr(begin, end == absl::string_view::npos ? absl::string_view::npos : end - begin);
    const size_t sep = body.find(kSep);
    if (sep == absl::string_view::npos) return std::nullopt;
    absl::string_view name = absl::StripAsciiWhitespace(body.substr(0, sep));
    absl::string_view args = body.substr(sep + kSep.size());
    if (name == "function") {  // V3: the name on its own line, the arguments fenced.
      const size_t line = args.find('\n');
      if (line == absl::string_view::npos) return std::nullopt;
      name = absl::StripAsciiWhitespace(args.substr(0, line));
      args = absl::StripAsciiWhitespace(args.substr(line + 1));
      if (!absl::ConsumePrefix(&args, "```json") || !absl::ConsumeSuffix(&args, "```"))
        return std::nullopt;
    }
    std::optional<std::string> arguments = argumentsFrom(args);
    if (name.empty() || !arguments) return std::nullopt;
    calls.push_back({.name = std::string(name), .arguments = *std::move(arguments)});
    if (end == absl::string_view::npos) break;
    at = text.find(kBegin, end + kEnd.size());
  }
  return calls;
}

// A parameter's value as Qwen3-Coder writes it (text), as the JSON its schema types it:
// strings stay text; numbers, booleans, null, objects and arrays are read as JSON when they
// are such (else they stay text). A parameter the schema does not type stays text.
Json typedValue(const std::string& value, const Json* schema) {
  std::string type = "string";
  if (schema != nullptr && schema->is_object() && schema->contains("type")) {
    const Json& t = (*schema)["type"];
    if (t.is_string()) type = t.get<std::string>();
    for (const Json& one : t.is_array() ? t : Json::array()) {
      if (one.is_string() && one != "null") {
        type = one.get<std::string>();
        break;
      }
    }
  }
  if (type == "string") return value;
  const absl::string_view text = absl::StripAsciiWhitespace(value);
  if (type == "boolean") {
    if (absl::EqualsIgnoreCase(text, "true")) return true;
    if (absl::EqualsIgnoreCase(text, "false")) return false;
    return value;
  }
  const Json j = jsonOf(text);
  const bool fits = (type == "integer" && j.is_number_integer()) ||
                    (type == "number" && j.is_number()) || (type == "object" && j.is_object()) ||
                    (type == "array" && j.is_array()) || (type == "null" && j.is_null());
  return fits ? j : Json(value);
}

// pythonic: a reply that is a Python list of calls with literal keyword arguments,
// [get_weather(city="Paris", days=3), f()] (Llama 3.2, Llama 4).
class PythonCalls {
 public:
  explicit PythonCalls(absl::string_view text) : text_(text) {}

  std::optional<std::vector<ToolCall>> read() {
    std::vector<ToolCall> calls;
    if (!take('[')) return std::nullopt;
    while (!take(']')) {
      if (!calls.empty() && !take(',')) return std::nullopt;
      if (take(']')) break;  // A trailing comma.
      std::optional<ToolCall> call = readCall();
      if (!call) return std::nullopt;
      calls.push_back(*std::move(call));
    }
    blanks();
    if (at_ != text_.size()) return std::nullopt;  // More than the list: not calls.
    return calls;
  }

 private:
  static constexpr int kMaxDepth = 64;

  void blanks() {
    while (at_ < text_.size() && absl::ascii_isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  bool take(char c) {
    blanks();
    if (at_ >= text_.size() || text_[at_] != c) return false;
    ++at_;
    return true;
  }
  std::string name() {
    blanks();
    const size_t from = at_;
    while (at_ < text_.size() && (absl::ascii_isalnum(static_cast<unsigned char>(text_[at_])) ||
                                  text_[at_] == '_' || (at_ > from && text_[at_] == '.'))) {
      ++at_;
    }
    return std::string(text_.substr(from, at_ - from));
  }
  std::optional<ToolCall> readCall() {
    ToolCall call{.name = name()};
    if (call.name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(call.name[0])) ||
        !take('(')) {
      return std::nullopt;
    }
    Json arguments = Json::object();
    while (!take(')')) {
      if (!arguments.empty() && !take(',')) return std::nullopt;
      if (take(')')) break;
      const std::string key = name();
      if (key.empty() || !take('=')) return std::nullopt;
      std::optional<Json> value = readValue(0);
      if (!value) return std::nullopt;
      arguments[key] = *std::move(value);
    }
    call.arguments = compactJson(arguments);
    return call;
  }
  // A literal: a string, a number, True, False, None, a list, tuple or dict of literals.
  std::optional<Json> readValue(int depth) {
    blanks();
    if (at_ >= text_.size() || depth > kMaxDepth) return std::nullopt;
    const char c = text_[at_];
    if (c == '"' || c == '\'') return readString(c);
    if (c == '[' || c == '(') return readSequence(c == '[' ? ']' : ')', depth);
    if (c == '{') return readDict(depth);
    const std::string word = absl::ascii_isalpha(static_cast<unsigned char>(c)) ? name() : "";
    if (word == "True") return Json(true);
    if (word == "False") return Json(false);
    if (word == "None") return Json(nullptr);
    if (!word.empty()) return std::nullopt;
    const size_t from = at_;
    while (at_ < text_.size() &&
           absl::string_view("+-.0123456789eE").find(text_[at_]) != absl::string_view::npos) {
      ++at_;
    }
    const Json number = jsonOf(text_.substr(from, at_ - from));
    return number.is_number() ? std::optional<Json>(number) : std::nullopt;
  }
  std::optional<Json> readSequence(char close, int depth) {
    ++at_;
    Json list = Json::array();
    while (!take(close)) {
      if (!list.empty() && !take(',')) return std::nullopt;
      if (take(close)) break;
      std::optional<Json> value = readValue(depth + 1);
      if (!value) return std::nullopt;
      list.push_back(*std::move(value));
    }
    return list;
  }
  std::optional<Json> readDict(int depth) {
    ++at_;
    Json dict = Json::object();
    while (!take('}')) {
      if (!dict.empty() && !take(',')) return std::nullopt;
      if (take('}')) break;
      std::optional<Json> key = readValue(depth + 1);
      if (!key || !key->is_string() || !take(':')) return std::nullopt;
      std::optional<Json> value = readValue(depth + 1);
      if (!value) return std::nullopt;
      dict[key->get<std::string>()] = *std::move(value);
    }
    return dict;
  }
  std::optional<Json> readString(char quote) {
    std::string out;
    for (++at_; at_ < text_.size(); ++at_) {
      const char c = text_[at_];
      if (c == quote) {
        ++at_;
        return Json(std::move(out));
      }
      if (c == '\n') return std::nullopt;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (++at_ >= text_.size()) return std::nullopt;
      switch (const char e = text_[at_]) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'x':
        case 'u': {
          const size_t digits = e == 'x' ? 2 : 4;
          uint32_t cp = 0;
          if (at_ + digits >= text_.size() ||
              !absl::SimpleHexAtoi(text_.substr(at_ + 1, digits), &cp) ||
              (cp >= 0xD800 && cp <= 0xDFFF)) {
            return std::nullopt;
          }
          appendUtf8(cp, out);
          at_ += digits;
          break;
        }
        default: out += e;  // \\, \', \" and others as the character.
      }
    }
    return std::nullopt;
  }
  static void appendUtf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  absl::string_view text_;
  size_t at_ = 0;
};

std::optional<std::vector<ToolCall>> pythonicCalls(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  // Llama 4 may wrap the list in its python tags.
  absl::ConsumePrefix(&text, "<|python_start|>");
  absl::ConsumeSuffix(&text, "<|python_end|>");
  if (text.size() > (1 << 20)) return std::nullopt;
  return PythonCalls(text).read();
}

// The parameters' schemas of the tool named `name` in `tools` (chat's shape, or flat), or
// null.
const Json* propertiesOf(const Json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const Json& tool : tools) {
    const Json* f = tool.is_object() && tool.contains("function") ? &tool["function"] : &tool;
    if (!f->is_object() || !f->contains("name") || (*f)["name"] != name) continue;
    const auto parameters = f->find("parameters");
    if (parameters == f->end() || !parameters->is_object()) return nullptr;
    const auto properties = parameters->find("properties");
    return properties != parameters->end() && properties->is_object() ? &*properties : nullptr;
  }
  return nullptr;
}

// Each <tool_call>...</tool_call> body of `text` (the last may be unclosed) as `read` reads
// it into a call; nullopt when one does not read.
template <typename Read>
std::optional<std::vector<ToolCall>> taggedCalls(absl::string_view text, Read read) {
  constexpr absl::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  std::vector<ToolCall> calls;
  for (size_t at = text.find(kOpen); at != absl::string_view::npos;) {
    const size_t begin = at + kOpen.size();
    const size_t end = text.find(kClose, begin);
    std::optional<ToolCall> call = read(
        text.substr(begin, end == absl::string_view::npos ? absl::string_view::npos : end - begin));
    if (!call) return std::nullopt;
    calls.push_back(*std::move(call));
    if (end == absl::string_view::npos) break;
    at = text.find(kOpen, end + kClose.size());
  }
  return calls;
}

// The schema `properties` (propertiesOf) gives parameter `key`, or null.
const Json* schemaOf(const Json* properties, const std::string& key) {
  if (properties == nullptr) return nullptr;
  const auto declared = properties->find(key);
  return declared != properties->end() ? &*declared : nullptr;
}

ToolCall callOf(std::string name, const Json& arguments) {
  return {.name = std::move(name), .arguments = compactJson(arguments)};
}

// qwen3_coder: <tool_call><function=NAME><parameter=P>VALUE</parameter>...</function>
// </tool_call>, any number (`text` starts at the first); values typed by `tools`' schemas.
std::optional<std::vector<ToolCall>> qwen3CoderCalls(absl::string_view text, const Json& tools) {
  constexpr absl::string_view kFunction = "<function=", kParameter = "<parameter=",
                              kParameterEnd = "</parameter>", kFunctionEnd = "</function>";
  return taggedCalls(text, [&](absl::string_view body) -> std::optional<ToolCall> {
    const size_t function = body.find(kFunction);
    const size_t name_end = body.find('>', function);
    if (function == absl::string_view::npos || name_end == absl::string_view::npos)
      return std::nullopt;
    const std::string name(absl::StripAsciiWhitespace(
        body.substr(function + kFunction.size(), name_end - function - kFunction.size())));
    if (name.empty()) return std::nullopt;
    body = body.substr(name_end + 1);
    body = body.substr(0, body.find(kFunctionEnd));
    const Json* properties = propertiesOf(tools, name);
    Json arguments = Json::object();
    for (size_t p = body.find(kParameter); p != absl::string_view::npos;) {
      const size_t key_end = body.find('>', p);
      if (key_end == absl::string_view::npos) return std::nullopt;
      const std::string key(absl::StripAsciiWhitespace(
          body.substr(p + kParameter.size(), key_end - p - kParameter.size())));
      size_t value_end = body.find(kParameterEnd, key_end);
      const size_t next = body.find(kParameter, key_end);
      if (value_end == absl::string_view::npos || value_end > next) value_end = next;
      absl::string_view value =
          body.substr(key_end + 1, value_end == absl::string_view::npos ? absl::string_view::npos
                                                                        : value_end - key_end - 1);
      absl::ConsumePrefix(&value, "\n");
      absl::ConsumeSuffix(&value, "\n");
      if (key.empty()) return std::nullopt;
      arguments[key] = typedValue(std::string(value), schemaOf(properties, key));
      p = next;
    }
    return callOf(name, arguments);
  });
}

// glm45: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>, any
// number (`text` starts at the first), as GLM-4.5's template writes them: a string value bare,
// others as JSON. A value is text where `tools` declares the parameter a string, else JSON
// where it reads as JSON (Python's True, False, None too), else text.
std::optional<std::vector<ToolCall>> glm45Calls(absl::string_view text, const Json& tools) {
  constexpr absl::string_view kKey = "<arg_key>", kKeyEnd = "</arg_key>", kValue = "<arg_value>",
                              kValueEnd = "</arg_value>";
  return taggedCalls(text, [&](absl::string_view body) -> std::optional<ToolCall> {
    const size_t name_end = std::min(body.find('\n'), body.find(kKey));
    const std::string name(absl::StripAsciiWhitespace(body.substr(0, name_end)));
    if (name.empty() || name.find_first_of("<>{}") != std::string::npos) return std::nullopt;
    const Json* properties = propertiesOf(tools, name);
    Json arguments = Json::object();
    for (size_t k = body.find(kKey); k != absl::string_view::npos; k = body.find(kKey, k)) {
      const size_t key_end = body.find(kKeyEnd, k);
      const size_t value = body.find(kValue, key_end);
      const size_t value_end = body.find(kValueEnd, value);
      if (key_end == absl::string_view::npos || value == absl::string_view::npos ||
          value_end == absl::string_view::npos ||
          !absl::StripAsciiWhitespace(
               body.substr(key_end + kKeyEnd.size(), value - key_end - kKeyEnd.size()))
               .empty()) {
        return std::nullopt;
      }
      const std::string key(
          absl::StripAsciiWhitespace(body.substr(k + kKey.size(), key_end - k - kKey.size())));
      if (key.empty()) return std::nullopt;
      const absl::string_view raw = absl::StripAsciiWhitespace(
          body.substr(value + kValue.size(), value_end - value - kValue.size()));
      const Json* schema = schemaOf(properties, key);
      const bool string =
          schema != nullptr && schema->is_object() && schema->value("type", Json()) == "string";
      Json typed;  // None: null.
      if (string) {
        typed = std::string(raw);
      } else if (Json j = jsonOf(raw); !j.is_discarded()) {
        typed = std::move(j);
      } else if (raw == "True" || raw == "False") {
        typed = raw == "True";
      } else if (raw != "None") {
        typed = std::string(raw);
      }
      arguments[key] = std::move(typed);
      k = value_end + kValueEnd.size();
    }
    return callOf(name, arguments);
  });
}

// openai: <|channel|>commentary to=functions.NAME<|message|>ARGS<|call|>, any number (`text`
// starts at the first), as HarmonySplitter passes gpt-oss's calls on.
std::optional<std::vector<ToolCall>> harmonyCalls(absl::string_view text) {
  constexpr absl::string_view kOpen = "<|channel|>", kMessage = "<|message|>", kCall = "<|call|>",
                              kTo = "to=functions.";
  std::vector<ToolCall> calls;
  size_t at = text.find(kOpen);
  while (at != absl::string_view::npos) {
    const size_t message = text.find(kMessage, at);
    if (message == absl::string_view::npos) return std::nullopt;
    const absl::string_view header = text.substr(at, message - at);
    const size_t to = header.find(kTo);
    if (to == absl::string_view::npos) return std::nullopt;  // Not a function's call.
    absl::string_view name = header.substr(to + kTo.size());
    name = name.substr(0, std::min(name.find_first_of(" \t\n<"), name.size()));
    const size_t begin = message + kMessage.size();
    const size_t end = text.find(kCall, begin);
    std::optional<std::string> arguments = argumentsFrom(
        text.substr(begin, end == absl::string_view::npos ? absl::string_view::npos : end - begin));
    if (name.empty() || !arguments) return std::nullopt;
    calls.push_back({.name = std::string(name), .arguments = *std::move(arguments)});
    if (end == absl::string_view::npos) break;
    at = text.find(kOpen, end + kCall.size());
  }
  return calls;
}

// How a format's calls are found: from a marker that may follow content, or (no marker)
// when the reply starts with one of `leads`; `parse` reads them from the marker (or the
// start) on, with the request's tools (a JSON array; null when none were sent).
struct Format {
  absl::string_view open;
  std::array<absl::string_view, 2> leads;
  std::optional<std::vector<ToolCall>> (*parse)(absl::string_view, const Json& tools);
};

// Whether `reply` (after blanks) starts with one of a format's leads; kMaybe while it is
// the start of one.
enum class Lead { kYes, kNo, kMaybe };
Lead leadOf(const Format& f, absl::string_view reply) {
  reply = absl::StripLeadingAsciiWhitespace(reply);
  Lead answer = Lead::kNo;
  for (absl::string_view lead : f.leads) {
    if (lead.empty()) continue;
    if (absl::StartsWith(reply, lead)) return Lead::kYes;
    if (absl::StartsWith(lead, reply)) answer = Lead::kMaybe;
  }
  return answer;
}

template <std::optional<std::vector<ToolCall>> (*Read)(absl::string_view)>
std::optional<std::vector<ToolCall>> untyped(absl::string_view text, const Json&) {
  return Read(text);
}

const Format& formatOf(ToolCallFormat format) {
  static const Format kHermes{"<tool_call>", {}, untyped<hermesCalls>};
  static const Format kLlama3{"", {"{"}, untyped<llama3Calls>};
  static const Format kMistral{"[TOOL_CALLS]", {}, untyped<mistralCalls>};
  static const Format kDeepSeek{"<｜tool▁calls▁begin｜>", {}, untyped<deepseekCalls>};
  static const Format kQwen3Coder{"<tool_call>", {}, qwen3CoderCalls};
  static const Format kGlm45{"<tool_call>", {}, glm45Calls};
  static const Format kPythonic{"", {"[", "<|python_start|>"}, untyped<pythonicCalls>};
  static const Format kOpenAi{"<|channel|>", {}, untyped<harmonyCalls>};
  switch (format) {
    case ToolCallFormat::kLlama3Json: return kLlama3;
    case ToolCallFormat::kMistral: return kMistral;
    case ToolCallFormat::kDeepSeekV3: return kDeepSeek;
    case ToolCallFormat::kQwen3Coder: return kQwen3Coder;
    case ToolCallFormat::kGlm45: return kGlm45;
    case ToolCallFormat::kPythonic: return kPythonic;
    case ToolCallFormat::kOpenAi: return kOpenAi;
    default: return kHermes;
  }
}

}  // namespace

absl::StatusOr<ToolCallFormat> toolCallFormat(absl::string_view name) {
  if (name.empty() || name == "none") return ToolCallFormat::kNone;
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (name == "mistral") return ToolCallFormat::kMistral;
  if (name == "deepseek_v3" || name == "deepseek_v31") return ToolCallFormat::kDeepSeekV3;
  if (name == "qwen3_coder") return ToolCallFormat::kQwen3Coder;
  if (name == "glm45") return ToolCallFormat::kGlm45;
  if (name == "pythonic") return ToolCallFormat::kPythonic;
  if (name == "openai") return ToolCallFormat::kOpenAi;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown tool call parser '", name,
      "': use hermes, llama3_json, mistral, deepseek_v3, qwen3_coder, glm45, pythonic or openai "
      "(or none)"));
}

ParsedReply parseToolCalls(ToolCallFormat format, absl::string_view reply,
                           absl::string_view tools_json) {
  ParsedReply parsed{.content = std::string(reply)};
  if (format == ToolCallFormat::kNone) return parsed;
  const Format& f = formatOf(format);
  size_t first = 0;
  if (f.open.empty()) {
    if (leadOf(f, reply) != Lead::kYes) return parsed;
  } else {
    first = reply.find(f.open);
    if (first == absl::string_view::npos) return parsed;
  }
  const Json tools = tools_json.empty() ? Json() : jsonOf(tools_json);
  if (auto calls = f.parse(reply.substr(first), tools); calls && !calls->empty()) {
    parsed.content = std::string(reply.substr(0, first));
    parsed.calls = *std::move(calls);
  }
  return parsed;
}

std::string ToolCallStream::push(absl::string_view text) {
  held_.append(text.data(), text.size());
  if (calling_) return "";
  if (format_ == ToolCallFormat::kNone || passing_) return std::exchange(held_, std::string());
  const Format& f = formatOf(format_);
  if (!f.open.empty()) {  // Content until the marker; a possible start of it held back.
    const size_t open = absl::string_view(held_).find(f.open);
    const size_t keep =
        open != std::string::npos ? held_.size() - open : partialTagLength(held_, f.open);
    calling_ = open != std::string::npos;
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }
  // A reply is calls when it starts (after blanks) with a lead.
  switch (leadOf(f, held_)) {
    case Lead::kYes: calling_ = true; return "";
    case Lead::kMaybe: return "";
    case Lead::kNo: passing_ = true; return std::exchange(held_, std::string());
  }
  return "";
}

ParsedReply ToolCallStream::finish() {
  if (!calling_) return {.content = std::exchange(held_, std::string())};
  ParsedReply parsed = parseToolCalls(format_, held_, tools_json_);
  held_.clear();
  return parsed;
}

}  // namespace cleave::router
