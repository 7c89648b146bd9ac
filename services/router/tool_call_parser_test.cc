#include "services/router/tool_call_parser.h"

#include <fstream>
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
  std::string tools = "";                                  // the request's, chat's JSON
};

// The reply whole, and fed in pieces of every size up to 7: the same content and calls.
void check(const Case& c) {
  std::vector<ParsedReply> results = {parseToolCalls(c.format, c.reply, c.tools)};
  for (size_t step = 1; step <= 7; ++step) {
    ToolCallStream stream(c.format, c.tools);
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

TEST(ToolCallParserTest, Mistral) {
  using F = ToolCallFormat;
  const Case cases[] = {
      {F::kMistral, "No tools needed.", "No tools needed.", {}},
      // Mistral 7B v0.3 / Mixtral 8x22B: one JSON array of calls.
      {F::kMistral,
       R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, )"
       R"({"name": "get_time", "arguments": {"tz": "CET"}}])",
       "",
       {{"get_weather", R"({"city": "Paris"})"}, {"get_time", R"({"tz": "CET"})"}}},
      // Later models: NAME[ARGS]{...} after each [TOOL_CALLS], after some text.
      {F::kMistral,
       R"(Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris [FR]"}[TOOL_CALLS]get_time)"
       R"([ARGS]{})",
       "Checking.",
       {{"get_weather", R"({"city": "Paris [FR]"})"}, {"get_time", "{}"}}},
      // Broken calls: the reply stays content.
      {F::kMistral, "[TOOL_CALLS] [{\"name\": ", "[TOOL_CALLS] [{\"name\": ", {}},
      {F::kMistral, "[TOOL_CALLS]get_weather{}", "[TOOL_CALLS]get_weather{}", {}},
      {F::kMistral, "a [TOOL", "a [TOOL", {}},
  };
  for (const Case& c : cases) check(c);
}

// DeepSeek-V3's own chat template, rendered by transformers (the chat template goldens),
// writes a tool-call turn; parsed back, it gives the calls it was rendered from.
TEST(ToolCallParserTest, DeepSeekV3ReadsWhatItsTemplateWrites) {
  std::ifstream in(std::string(CLEAVE_GOLDEN_DIR) + "/chat_templates/golden.json");
  ASSERT_TRUE(in) << "tests/golden/gen_chat_templates.py";
  const Json golden = Json::parse(in);
  const Json* rendered = nullptr;
  for (const Json& c : golden["cases"]) {
    if (c["name"] == "deepseek_tools") rendered = &c;
  }
  ASSERT_NE(rendered, nullptr);
  const std::string text = (*rendered)["expected"];
  const std::string open = "<｜Assistant｜>", end = "<｜end▁of▁sentence｜>";
  const size_t from = text.find(open) + open.size();
  const std::string reply = text.substr(from, text.find(end, from) - from);
  ASSERT_NE(reply.find("<｜tool▁calls▁begin｜>"), std::string::npos) << reply;
  Case c{ToolCallFormat::kDeepSeekV3, reply, "", {}};
  for (const Json& call : (*rendered)["context"]["messages"][2]["tool_calls"]) {
    c.calls.push_back({call["function"]["name"], call["function"]["arguments"].dump()});
  }
  ASSERT_EQ(c.calls.size(), 2u);
  check(c);
  // After text; V3.1's form; a broken fence stays content.
  check({ToolCallFormat::kDeepSeekV3,
         "Let me see.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
         "{\"tz\": \"UTC\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
         "Let me see.",
         {{"get_time", R"({"tz": "UTC"})"}}});
  const std::string broken =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}<｜tool▁call▁end｜>";
  check({ToolCallFormat::kDeepSeekV3, broken, broken, {}});
}

// Qwen3-Coder writes each parameter's value as text, as its template prints them (strings
// bare, numbers and Python's True, objects as JSON); the tools' schemas type them back.
TEST(ToolCallParserTest, Qwen3CoderTypesValuesByTheToolsSchemas) {
  using F = ToolCallFormat;
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "coords": {"type": "object"}, "zip": {"type": "string"}, "ratio": {"type": ["number", "null"]},
        "tags": {"type": "array"}}}}}])";
  const Case cases[] = {
      {F::kQwen3Coder, "Nothing to call.", "Nothing to call.", {}, tools},
      {F::kQwen3Coder,
       "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n"
       "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
       "<parameter=coords>\n{\"lat\": 37.7, \"lon\": -122.4}\n</parameter>\n<parameter=zip>\n"
       "94103\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=tags>\n[\"a\"]\n"
       "</parameter>\n</function>\n</tool_call>",
       "I'll check.\n",
       {{"get_weather", R"({"city": "San Francisco", "days": 3, "metric": true,
           "coords": {"lat": 37.7, "lon": -122.4}, "zip": "94103", "ratio": 0.5, "tags": ["a"]})"}},
       tools},
      // Two calls; a value over several lines; a value its type does not fit stays text; a
      // parameter the schema does not name stays text.
      {F::kQwen3Coder,
       "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n"
       "<parameter=days>\nthree\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n"
       "</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>",
       "",
       {{"get_weather", R"({"city": "New\nYork", "days": "three", "extra": "7"})"}, {"noop", "{}"}},
       tools},
      // Without the request's tools every value is text.
      {F::kQwen3Coder,
       "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>",
       "",
       {{"f", R"({"n": "3"})"}}},
      {F::kQwen3Coder, "<tool_call>\n<function=f\n", "<tool_call>\n<function=f\n", {}, tools},
  };
  for (const Case& c : cases) check(c);
}

// GLM-4.5's calls as its template writes them: a key and a value per argument, strings bare,
// everything else as JSON; the tools' schemas keep declared strings text.
TEST(ToolCallParserTest, Glm45ReadsKeysAndValues) {
  using F = ToolCallFormat;
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "zip": {"type": "string"}, "days": {"type": "integer"}}}}}])";
  const Case cases[] = {
      {F::kGlm45, "No call.", "No call.", {}, tools},
      {F::kGlm45,
       "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing"
       "</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>100000</arg_value>\n<arg_key>days"
       "</arg_key>\n<arg_value>3</arg_value>\n<arg_key>units</arg_key>\n<arg_value>{\"t\": "
       "\"C\"}</arg_value>\n</tool_call>",
       "Let me check.\n",
       {{"get_weather", R"({"city": "Beijing", "zip": "100000", "days": 3, "units": {"t": "C"}})"}},
       tools},
      // Two calls, one without arguments; without tools, values read as JSON where they are.
      {F::kGlm45,
       "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n<arg_key>s</arg_key>\n"
       "<arg_value>New\nYork</arg_value>\n<arg_key>b</arg_key>\n<arg_value>True</arg_value>\n"
       "</tool_call>\n<tool_call>get_time\n</tool_call>",
       "",
       {{"f", R"({"n": 7, "s": "New\nYork", "b": true})"}, {"get_time", "{}"}}},
      // A key without its value, or text between them: content, whole.
      {F::kGlm45,
       "<tool_call>f\n<arg_key>n</arg_key>\n</tool_call>",
       "<tool_call>f\n<arg_key>n</arg_key>\n</tool_call>",
       {}},
      {F::kGlm45,
       "<tool_call>f\n<arg_key>n</arg_key>x<arg_value>1</arg_value></tool_call>",
       "<tool_call>f\n<arg_key>n</arg_key>x<arg_value>1</arg_value></tool_call>",
       {}},
  };
  for (const Case& c : cases) check(c);
}

// A GLM-4.5-style template (the chat template goldens, rendered by transformers) writes a
// tool-call turn; parsed back with the request's tools, it gives the calls it was rendered
// from, a number the schema does not declare read back as a number.
TEST(ToolCallParserTest, Glm45ReadsWhatItsTemplateWrites) {
  std::ifstream in(std::string(CLEAVE_GOLDEN_DIR) + "/chat_templates/golden.json");
  ASSERT_TRUE(in) << "tests/golden/gen_chat_templates.py";
  const Json golden = Json::parse(in);
  const Json* rendered = nullptr;
  for (const Json& c : golden["cases"]) {
    if (c["name"] == "glm45_tools") rendered = &c;
  }
  ASSERT_NE(rendered, nullptr);
  const std::string text = (*rendered)["expected"];
  const std::string open = "</think>", end = "<|observation|>";
  const size_t from = text.find(open) + open.size();
  const std::string reply = text.substr(from, text.find(end, from) - from);
  ASSERT_NE(reply.find("<arg_key>"), std::string::npos) << reply;
  Case c{ToolCallFormat::kGlm45, reply, "\n", {}, (*rendered)["context"]["tools"].dump()};
  for (const Json& call : (*rendered)["context"]["messages"][2]["tool_calls"]) {
    c.calls.push_back({call["function"]["name"], call["function"]["arguments"].dump()});
  }
  ASSERT_EQ(c.calls.size(), 2u);
  check(c);
}

TEST(ToolCallParserTest, Pythonic) {
  using F = ToolCallFormat;
  const Case cases[] = {
      {F::kPythonic, "It is sunny.", "It is sunny.", {}},
      {F::kPythonic,
       R"([get_weather(city='San Francisco', metric="celsius", days=3), get_time()])",
       "",
       {{"get_weather", R"({"city": "San Francisco", "metric": "celsius", "days": 3})"},
        {"get_time", "{}"}}},
      // Every literal: escapes, numbers, True/False/None, lists, tuples, dicts; a trailing
      // comma; Llama 4's tags.
      {F::kPythonic,
       "<|python_start|>[f(s='it\\'s \\\"x\\\"\\n\\u00e9', n=-1.5e3, b=True, c=False, z=None, "
       "l=[1, (2, 3)], d={'k': {'j': []}},)]<|python_end|>",
       "",
       {{"f", R"({"s": "it's \"x\"\n\u00e9", "n": -1500.0, "b": true, "c": false, "z": null,
                  "l": [1, [2, 3]], "d": {"k": {"j": []}}})"}}},
      // Not a list of calls: content, whole.
      {F::kPythonic, "[1] is a citation.", "[1] is a citation.", {}},
      {F::kPythonic, "[f(x=y)]", "[f(x=y)]", {}},
      {F::kPythonic, "[f(1)]", "[f(1)]", {}},
      {F::kPythonic, "[f(x='open", "[f(x='open", {}},
      {F::kPythonic, "[f(x=1)] and more", "[f(x=1)] and more", {}},
  };
  for (const Case& c : cases) check(c);
  const std::string deep = "[f(x=" + std::string(1000, '[') + std::string(1000, ']') + ")]";
  EXPECT_TRUE(parseToolCalls(F::kPythonic, deep).calls.empty());
}

// gpt-oss's calls as the openai_gptoss reasoning parser passes them on (harmony_splitter.h).
TEST(ToolCallParserTest, OpenAiHarmonyCalls) {
  using F = ToolCallFormat;
  const std::string open = "<|channel|>commentary to=functions.";
  const Case cases[] = {
      {F::kOpenAi, "It is sunny.", "It is sunny.", {}},
      {F::kOpenAi,
       "Checking." + open + "get_weather<|message|>{\"city\": \"Paris\"}<|call|>",
       "Checking.",
       {{"get_weather", R"({"city": "Paris"})"}}},
      {F::kOpenAi,
       open + "a<|message|>{}<|call|>" + open + "b<|message|> {\"x\": [1]} <|call|>",
       "",
       {{"a", "{}"}, {"b", R"({"x": [1]})"}}},
      // Arguments that are not a JSON object, or a tool that is not a function: content.
      {F::kOpenAi,
       open + "f<|message|>not json<|call|>",
       open + "f<|message|>not json<|call|>",
       {}},
      {F::kOpenAi,
       "<|channel|>commentary to=browser.search<|message|>{}<|call|>",
       "<|channel|>commentary to=browser.search<|message|>{}<|call|>",
       {}},
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
  EXPECT_EQ(*toolCallFormat("mistral"), ToolCallFormat::kMistral);
  EXPECT_EQ(*toolCallFormat("deepseek_v3"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(*toolCallFormat("deepseek_v31"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(*toolCallFormat("qwen3_coder"), ToolCallFormat::kQwen3Coder);
  EXPECT_EQ(*toolCallFormat("pythonic"), ToolCallFormat::kPythonic);
  EXPECT_EQ(*toolCallFormat("glm45"), ToolCallFormat::kGlm45);
  EXPECT_EQ(*toolCallFormat("openai"), ToolCallFormat::kOpenAi);
  EXPECT_FALSE(toolCallFormat("granite").ok());
}

}  // namespace
}  // namespace cleave::router
