#include "services/router/tool_call_parser.h"

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"

namespace cleave::router {
namespace {

using Json = nlohmann::json;

struct Case {
  ToolCallFormat format;
  std::string reply;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments as JSON
};

// The reply whole, and fed in pieces of every size up to 7: the same content and calls.
void check(const Case& c) {
  std::vector<ParsedReply> results = {parseToolCalls(c.format, c.reply)};
  for (size_t step = 1; step <= 7; ++step) {
    ToolCallStream stream(c.format);
    ParsedReply streamed;
    for (size_t at = 0; at < c.reply.size(); at += step) {
      streamed.content += stream.push(c.reply.substr(at, step));
    }
    ParsedReply rest = stream.finish();
    streamed.content += rest.content;
    streamed.calls = rest.calls;
    results.push_back(streamed);
  }
  for (const ParsedReply& got : results) {
    EXPECT_EQ(got.content, c.content) << c.reply;
    ASSERT_EQ(got.calls.size(), c.calls.size()) << c.reply;
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(got.calls[i].name, c.calls[i].first);
      EXPECT_EQ(Json::parse(got.calls[i].arguments), Json::parse(c.calls[i].second)) << c.reply;
    }
  }
}

TEST(ToolCallParserTest, Hermes) {
  using F = ToolCallFormat;
  const Case cases[] = {
      {F::kHermes, "Plain answer, no calls.", "Plain answer, no calls.", {}},
      {F::kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
       "</tool_call>",
       "",
       {{"get_weather", R"({"city": "Paris"})"}}},
      {F::kHermes,
       "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>",
       "Let me check both.\n",
       {{"a", R"({"x": 1})"}, {"b", "{}"}}},
      // Cut off before its closing tag: still a call, as vLLM reads it.
      {F::kHermes,
       "<tool_call>{\"name\": \"a\", \"arguments\": {\"q\": \"</\"}}",
       "",
       {{"a", R"({"q": "</"})"}}},
      // Not JSON, or no name: the reply stays content.
      {F::kHermes, "<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", {}},
      {F::kHermes,
       "x <tool_call>{\"arguments\": {}}</tool_call>",
       "x <tool_call>{\"arguments\": {}}</tool_call>",
       {}},
      {F::kHermes, "a < b and <tool", "a < b and <tool", {}},
      {F::kNone,
       "<tool_call>{\"name\": \"a\"}</tool_call>",
       "<tool_call>{\"name\": \"a\"}</tool_call>",
       {}},
  };
  for (const Case& c : cases) check(c);
}

TEST(ToolCallParserTest, Llama3Json) {
  using F = ToolCallFormat;
  const Case cases[] = {
      {F::kLlama3Json, "The weather is fine.", "The weather is fine.", {}},
      {F::kLlama3Json,
       " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
       "",
       {{"get_weather", R"({"city": "Paris"})"}}},
      {F::kLlama3Json,
       "{\"name\": \"a\", \"parameters\": {\"s\": \"}{;\"}}; {\"name\": \"b\", \"parameters\": {}}",
       "",
       {{"a", R"({"s": "}{;"})"}, {"b", "{}"}}},
      {F::kLlama3Json,
       "{\"name\": \"a\", \"parameters\": {}} and then prose",
       "{\"name\": \"a\", \"parameters\": {}} and then prose",
       {}},
      {F::kLlama3Json, "Use {braces} later", "Use {braces} later", {}},
      // JSON that names no arguments is an answer, not a call.
      {F::kLlama3Json,
       "{\"name\": \"Alice\", \"email\": \"a@x.io\"}",
       "{\"name\": \"Alice\", \"email\": \"a@x.io\"}",
       {}},
      // Arguments as text: JSON text stays, other text becomes a JSON string.
      {F::kLlama3Json, "{\"name\": \"f\", \"parameters\": \"Paris\"}", "", {{"f", "\"Paris\""}}},
      {F::kLlama3Json,
       "{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}",
       "",
       {{"f", R"({"x": 1})"}}},
      {F::kLlama3Json, "{\"name\": \"f\", \"parameters\": [1, 2]}", "", {{"f", "[1, 2]"}}},
  };
  for (const Case& c : cases) check(c);
}

TEST(ToolCallParserTest, ArgumentsKeepTheModelsKeyOrderAndDeepJsonIsNoCall) {
  ParsedReply reply =
      parseToolCalls(ToolCallFormat::kHermes,
                     R"(<tool_call>{"name": "f", "arguments": {"b": 1, "a": 2}}</tool_call>)");
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].arguments, R"({"b":1,"a":2})");
  const std::string deep =
      "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(100000, '[') +
      std::string(100000, ']') + "}</tool_call>";
  reply = parseToolCalls(ToolCallFormat::kHermes, deep);
  EXPECT_TRUE(reply.calls.empty());
  EXPECT_EQ(reply.content, deep);
}

TEST(ToolCallParserTest, NamesItsFormats) {
  EXPECT_EQ(*toolCallFormat("hermes"), ToolCallFormat::kHermes);
  EXPECT_EQ(*toolCallFormat("llama3_json"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(*toolCallFormat("none"), ToolCallFormat::kNone);
  EXPECT_FALSE(toolCallFormat("mistral").ok());
}

}  // namespace
}  // namespace cleave::router
