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

constexpr absl::string_view kCallOpen = "<tool_call>";
constexpr absl::string_view kCallClose = "</tool_call>";

// A call object: {"name": "...", "arguments" (or "parameters"): ...}; nullopt otherwise
// (JSON without both keys is an answer, not a call).
std::optional<ToolCall> callFrom(absl::string_view text) {
  if (!checkJsonShape(text, "tool call").ok()) return std::nullopt;  // model output, bounded
  const Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
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

std::optional<std::vector<ToolCall>> hermesCalls(absl::string_view text) {
  std::vector<ToolCall> calls;
  size_t at = text.find(kCallOpen);
  while (at != absl::string_view::npos) {
    const size_t begin = at + kCallOpen.size();
    const size_t end = text.find(kCallClose, begin);
    std::optional<ToolCall> call = callFrom(absl::StripAsciiWhitespace(text.substr(
        begin, end == absl::string_view::npos ? absl::string_view::npos : end - begin)));
    if (!call) return std::nullopt;
    calls.push_back(*std::move(call));
    if (end == absl::string_view::npos) break;
    at = text.find(kCallOpen, end + kCallClose.size());
  }
  return calls;
}

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

}  // namespace

absl::StatusOr<ToolCallFormat> toolCallFormat(absl::string_view name) {
  if (name.empty() || name == "none") return ToolCallFormat::kNone;
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool call parser '", name, "': use hermes or llama3_json (or none)"));
}

ParsedReply parseToolCalls(ToolCallFormat format, absl::string_view reply) {
  ParsedReply parsed{.content = std::string(reply)};
  if (format == ToolCallFormat::kHermes) {
    const size_t first = reply.find(kCallOpen);
    if (first == absl::string_view::npos) return parsed;
    if (auto calls = hermesCalls(reply.substr(first)); calls && !calls->empty()) {
      parsed.content = std::string(reply.substr(0, first));
      parsed.calls = *std::move(calls);
    }
  } else if (format == ToolCallFormat::kLlama3Json) {
    if (!absl::StartsWith(absl::StripLeadingAsciiWhitespace(reply), "{")) return parsed;
    if (auto calls = llama3Calls(reply); calls && !calls->empty()) {
      parsed.content.clear();
      parsed.calls = *std::move(calls);
    }
  }
  return parsed;
}

std::string ToolCallStream::push(absl::string_view text) {
  held_.append(text.data(), text.size());
  if (calling_) return "";
  if (format_ == ToolCallFormat::kNone || passing_) return std::exchange(held_, std::string());
  std::string out;
  if (format_ == ToolCallFormat::kHermes) {
    const size_t open = absl::string_view(held_).find(kCallOpen);
    const size_t keep =
        open != std::string::npos ? held_.size() - open : partialTagLength(held_, kCallOpen);
    calling_ = open != std::string::npos;
    out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }
  // llama3_json: a reply is calls when it starts (after blanks) with '{'.
  const absl::string_view start = absl::StripLeadingAsciiWhitespace(held_);
  if (start.empty()) return "";
  if (start[0] == '{') {
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
