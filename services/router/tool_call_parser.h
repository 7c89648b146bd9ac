// Finds the tool calls in a chat reply (cleave-router --tool-call-parser), as vLLM's parsers
// of the same names do, so that the HTTP API returns them as `tool_calls`:
//
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number, after
//                optional text (Qwen2.5, Qwen3, Hermes 2/3 and others trained on that format);
//   llama3_json  a reply that is JSON objects {"name": ..., "parameters": {...}} separated by
//                ';' (Llama 3.1 and later with JSON tool calling);
//   mistral      [TOOL_CALLS] and a JSON array of {"name", "arguments"} (Mistral 7B v0.3,
//                Mixtral 8x22B), or [TOOL_CALLS]NAME[ARGS]{...} per call (later Mistral
//                models), after optional text;
//   deepseek_v3  <｜tool▁calls▁begin｜> and per call <｜tool▁call▁begin｜>function<｜tool▁sep｜>
//                NAME, the arguments in a ```json fence, <｜tool▁call▁end｜> (DeepSeek-V3, R1;
//                also V3.1's <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS; "deepseek_v31" names it
//                too), after optional text;
//   qwen3_coder  <tool_call><function=NAME><parameter=P>VALUE</parameter>...</function>
//                </tool_call>, any number, after optional text (Qwen3-Coder); each value
//                typed as the request's tools declare the parameter (a string stays text;
//                numbers, booleans, objects, arrays are read as JSON);
//   glm45        <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...
//                </tool_call>, any number, after optional text (GLM-4.5, GLM-4.6); a value is
//                text where the tools declare the parameter a string, else JSON where it
//                reads as JSON;
//   pythonic     a reply that is a Python list of calls with literal keyword arguments,
//                [f(city="Paris", days=3), g()] (Llama 3.2, Llama 4; inside
//                <|python_start|> <|python_end|> too);
//   openai       gpt-oss's harmony tool calls as --reasoning-parser openai_gptoss passes them
//                on (harmony_splitter.h): <|channel|>commentary to=functions.NAME<|message|>
//                ARGS<|call|>, any number, after optional content.
//
// A reply whose calls do not parse is content, whole. While a reply streams, text before a
// call passes through (a possible start of one held back until decided); calls are given
// whole once the reply ends.
//
// Threading: one ToolCallStream per reply.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cleave::router {

enum class ToolCallFormat {
  kNone,
  kHermes,
  kLlama3Json,
  kMistral,
  kDeepSeekV3,
  kQwen3Coder,
  kGlm45,
  kPythonic,
  kOpenAi
};

// "hermes", "llama3_json", "mistral", "deepseek_v3", "qwen3_coder", "glm45", "pythonic" or
// "openai"
// ("" and "none": kNone); InvalidArgument naming the choices.
absl::StatusOr<ToolCallFormat> toolCallFormat(absl::string_view name);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ParsedReply {
  std::string content;
  std::vector<ToolCall> calls;
};

// A whole reply; `tools_json` is the request's tools (chat's JSON array; "" when none).
ParsedReply parseToolCalls(ToolCallFormat format, absl::string_view reply,
                           absl::string_view tools_json = "");

class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format, std::string tools_json = "")
      : format_(format), tools_json_(std::move(tools_json)) {}

  // The content a text delta adds (possibly less than the delta: text that may start a
  // call is held).
  std::string push(absl::string_view text);
  // At the end of the reply: the rest of the content and the calls.
  ParsedReply finish();

 private:
  const ToolCallFormat format_;
  const std::string tools_json_;
  bool calling_ = false;  // A call has started: everything from there is held.
  bool passing_ = false;  // A reply that must start with calls does not: all is content.
  std::string held_;
};

}  // namespace cleave::router
