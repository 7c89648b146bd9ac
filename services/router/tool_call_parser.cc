#include "services/router/tool_call_parser.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/json_shape.h"
#include "services/router/partial_tag.h"

namespace cleave::router {
namespace {

using Json = nlohmann::ordered_json;  // arguments keep the model's key order

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
    call.arguments = json_text ? given : args->dump(-1, ' ', false, Json::error_handler_t::replace);
  } else {
    call.arguments = args->dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  return call;
}

// JSON text the model wrote (bounded in shape); discarded when it is not JSON.
Json parsed(absl::string_view text) {
  if (!checkJsonShape(text, "tool call").ok()) return Json(Json::value_t::discarded);
  return Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

std::optional<ToolCall> callFrom(absl::string_view text) { return callFrom(parsed(text)); }

// A call's arguments written as a JSON object, compacted (keys in the model's order).
std::optional<std::string> argumentsFrom(absl::string_view text) {
  const Json j = parsed(absl::StripAsciiWhitespace(text));
  if (!j.is_object()) return std::nullopt;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
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
      const Json j = parsed(text.substr(0, end));
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

// How a format's calls are found: from a marker that may follow content, or (no marker)
// when the reply starts with `lead`; `parse` reads them from the marker (or the start) on.
struct Format {
  absl::string_view open;
  char lead;
  std::optional<std::vector<ToolCall>> (*parse)(absl::string_view);
};

const Format& formatOf(ToolCallFormat format) {
  static const Format kHermes{"<tool_call>", 0, hermesCalls};
  static const Format kLlama3{"", '{', llama3Calls};
  static const Format kMistral{"[TOOL_CALLS]", 0, mistralCalls};
  static const Format kDeepSeek{"<｜tool▁calls▁begin｜>", 0, deepseekCalls};
  switch (format) {
    case ToolCallFormat::kLlama3Json: return kLlama3;
    case ToolCallFormat::kMistral: return kMistral;
    case ToolCallFormat::kDeepSeekV3: return kDeepSeek;
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
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool call parser '", name,
                   "': use hermes, llama3_json, mistral or deepseek_v3 (or none)"));
}

ParsedReply parseToolCalls(ToolCallFormat format, absl::string_view reply) {
  ParsedReply parsed{.content = std::string(reply)};
  if (format == ToolCallFormat::kNone) return parsed;
  const Format& f = formatOf(format);
  size_t first = 0;
  if (f.open.empty()) {
    if (!absl::StartsWith(absl::StripLeadingAsciiWhitespace(reply), std::string(1, f.lead)))
      return parsed;
  } else {
    first = reply.find(f.open);
    if (first == absl::string_view::npos) return parsed;
  }
  if (auto calls = f.parse(reply.substr(first)); calls && !calls->empty()) {
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
  // A reply is calls when it starts (after blanks) with the lead.
  const absl::string_view start = absl::StripLeadingAsciiWhitespace(held_);
  if (start.empty()) return "";
  if (start[0] == f.lead) {
    calling_ = true;
    return "";
  }
  passing_ = true;
  return std::exchange(held_, std::string());
}

ParsedReply ToolCallStream::finish() {
  if (!calling_) return {.content = std::exchange(held_, std::string())};
  ParsedReply parsed = parseToolCalls(format_, held_);
  held_.clear();
  return parsed;
}

}  // namespace cleave::router
