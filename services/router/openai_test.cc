// The OpenAI-compatible API's translation: request fields into cleave.v1 requests (and the
// refusals naming the field), Generate streams into OpenAI's objects and events.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "grpcpp/support/status.h"
#include "gtest/gtest.h"
#include "services/engine/json_schema.h"
#include "services/router/openai_requests.h"
#include "services/router/openai_responses.h"

namespace cleave::router::openai {
namespace {

using Json = nlohmann::json;

TEST(OpenAiRequestTest, CompletionFieldsBecomeAGenerateRequest) {
  auto call = parseCompletionRequest(Json::parse(R"({
      "model": "m", "prompt": "Once upon", "max_tokens": 7, "temperature": 0.5,
      "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": -1, "presence_penalty": 0.25,
      "frequency_penalty": 0.5, "repetition_penalty": 1.1, "stop": ["\n", "The"],
      "stop_token_ids": [2, 7], "ignore_eos": true, "logprobs": 3, "stream": true,
      "stream_options": {"include_usage": true}, "user": "u", "n": 1, "priority": -5,
      "logit_bias": {"17": -100, "4": 2.5}, "allowed_token_ids": [4, 17, 30], "min_tokens": 2,
      "unknown": {}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  const v1::GenerateRequest& r = call->request;
  EXPECT_EQ(r.model(), "m");
  EXPECT_EQ(r.text(), "Once upon");
  EXPECT_TRUE(r.add_special_tokens());
  EXPECT_TRUE(r.parse_special_tokens());
  EXPECT_EQ(r.stopping().max_new_tokens(), 7u);
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(r.sampling().top_p(), 0.9f);
  EXPECT_EQ(r.sampling().top_k(), 40);
  EXPECT_FLOAT_EQ(r.sampling().min_p(), 0.05f);
  EXPECT_EQ(r.sampling().seed(), ~uint64_t{0});
  EXPECT_FLOAT_EQ(r.sampling().presence_penalty(), 0.25f);
  EXPECT_FLOAT_EQ(r.sampling().frequency_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(r.sampling().repetition_penalty(), 1.1f);
  ASSERT_EQ(r.stopping().stop_size(), 2);
  EXPECT_EQ(r.stopping().stop(1), "The");
  ASSERT_EQ(r.stopping().stop_token_ids_size(), 2);
  EXPECT_EQ(r.stopping().stop_token_ids(1), 7u);
  EXPECT_TRUE(r.stopping().ignore_eos());
  EXPECT_EQ(r.logprobs(), 3u);
  EXPECT_TRUE(call->stream);
  EXPECT_TRUE(call->include_usage);
  EXPECT_TRUE(call->logprobs);
  EXPECT_EQ(r.priority(), -5);
  ASSERT_EQ(r.sampling().logit_bias_size(), 2);
  EXPECT_FLOAT_EQ(r.sampling().logit_bias().at(17), -100.0f);
  EXPECT_FLOAT_EQ(r.sampling().logit_bias().at(4), 2.5f);
  EXPECT_THAT(r.sampling().allowed_token_ids(), ::testing::ElementsAre(4, 17, 30));
  EXPECT_EQ(r.stopping().min_new_tokens(), 2u);
}

// echo with logprobs scores the prompt (an evaluation harness's loglikelihood request).
TEST(OpenAiRequestTest, EchoWithLogprobsScoresThePrompt) {
  auto call = parseCompletionRequest(
      Json::parse(R"({"prompt": "a b", "echo": true, "logprobs": 2, "max_tokens": 1})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.prompt_logprobs(), 2u);
  call = parseCompletionRequest(Json::parse(R"({"prompt": "a b", "logprobs": 2})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_FALSE(call->request.has_prompt_logprobs());
}

TEST(OpenAiRequestTest, SeveralPromptsMakeOneRequestEach) {
  auto call = parseCompletionRequest(
      Json::parse(R"({"prompt": ["one", [5, 6]], "max_tokens": 3, "temperature": 0, "n": 2})"));
  ASSERT_TRUE(call.ok()) << call.status();
  ASSERT_EQ(call->prompts.size(), 2u);
  EXPECT_EQ(call->prompts[0].text(), "one");
  EXPECT_EQ(call->prompts[1].token_ids().ids_size(), 2);
  for (const v1::GenerateRequest& r : call->prompts) {
    EXPECT_EQ(r.stopping().max_new_tokens(), 3u);
    EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.0f);
  }
  EXPECT_EQ(call->n, 2);
}

TEST(OpenAiRequestTest, CompletionDefaultsAreOpenAis) {
  auto call = parseCompletionRequest(Json::parse(R"({"prompt": [[5, 6, 7]], "top_k": -1})"));
  ASSERT_TRUE(call.ok()) << call.status();
  const v1::GenerateRequest& r = call->request;
  ASSERT_EQ(r.token_ids().ids_size(), 3);
  EXPECT_EQ(r.token_ids().ids(2), 7u);
  EXPECT_EQ(r.stopping().max_new_tokens(), 16u);  // OpenAI's default for completions
  EXPECT_EQ(r.sampling().top_k(), 0);             // Set: off, whatever the model recommends.
  EXPECT_TRUE(r.sampling().has_top_k());
  EXPECT_FALSE(r.sampling().has_temperature());
  EXPECT_FALSE(r.has_logprobs());
  EXPECT_FALSE(call->stream);
  EXPECT_FALSE(call->logprobs);
}

TEST(OpenAiRequestTest, ChatMessagesKeepTheirFieldsForTheTemplate) {
  auto call = parseChatRequest(Json::parse(R"({
      "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": null,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": "{\"a\": [1]}"}},
                        {"id": "c2", "type": "function",
                         "function": {"name": "f", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}],
      "tools": [{"type": "function", "function": {"name": "f"}}],
      "chat_template_kwargs": {"enable_thinking": false},
      "add_generation_prompt": false,
      "max_tokens": 5, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 2})"));
  ASSERT_TRUE(call.ok()) << call.status();
  const v1::Chat& chat = call->request.chat();
  ASSERT_EQ(chat.messages_size(), 4);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(0).content(), "Be brief.");
  EXPECT_EQ(chat.messages(0).fields_json(), "");
  EXPECT_EQ(chat.messages(1).content(), "Hi\nthere");  // text parts joined
  EXPECT_EQ(chat.messages(1).fields_json(), "");
  const Json assistant = Json::parse(chat.messages(2).fields_json());
  EXPECT_TRUE(assistant["content"].is_null());
  EXPECT_EQ(assistant["tool_calls"][0]["id"], "c1");
  // Arguments reach the template as the object they encode (as vLLM passes them); text that
  // encodes none stays text.
  EXPECT_EQ(assistant["tool_calls"][0]["function"]["arguments"], Json::parse(R"({"a": [1]})"));
  EXPECT_EQ(assistant["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(chat.messages(3).content(), "42");
  EXPECT_EQ(Json::parse(chat.messages(3).fields_json()), Json::parse(R"({"tool_call_id": "c1"})"));
  EXPECT_EQ(Json::parse(chat.tools_json())[0]["function"]["name"], "f");
  EXPECT_EQ(Json::parse(chat.template_kwargs_json()), Json::parse(R"({"enable_thinking": false})"));
  ASSERT_TRUE(chat.has_add_generation_prompt());
  EXPECT_FALSE(chat.add_generation_prompt());
  EXPECT_EQ(call->request.stopping().max_new_tokens(), 9u);  // max_completion_tokens wins
  EXPECT_EQ(call->request.logprobs(), 2u);
}

// A named function (or "required" with one tool) is decoded as its parameters' schema.
TEST(OpenAiRequestTest, AForcedToolCallIsDecodedAsItsParameters) {
  auto call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "a"}},
                {"type": "function", "function": {"name": "b", "parameters": {"type": "object",
                  "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}],
      "tool_choice": {"type": "function", "function": {"name": "b"}}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->forced_tool, "b");
  EXPECT_EQ(call->request.sampling().response_format(), v1::RESPONSE_FORMAT_JSON_SCHEMA);
  EXPECT_EQ(Json::parse(call->request.sampling().json_schema()),
            Json::parse(R"({"type": "object", "properties": {"n": {"type": "integer"}},
                            "required": ["n"]})"));
  EXPECT_FALSE(call->request.chat().tools_json().empty());  // The template sees the tools.
  call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "a"}}], "tool_choice": "required"})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->forced_tool, "a");
  EXPECT_EQ(Json::parse(call->request.sampling().json_schema()),
            Json::parse(R"({"type": "object", "properties": {}})"));
  // "required" with several tools: a union of {name, arguments} told apart by the name.
  auto any = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "a"}},
                {"type": "function", "function": {"name": "b", "parameters": {"type": "object",
                  "properties": {"n": {"type": "integer"}}}}}], "tool_choice": "required"})"));
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_TRUE(any->forced_any_tool);
  auto schema = engine::JsonSchema::compile(any->request.sampling().json_schema());
  ASSERT_TRUE(schema.ok()) << schema.status();
  engine::JsonSchemaGrammar grammar(schema->get());
  EXPECT_TRUE(grammar.pushAll(R"({"name": "b", "arguments": {"n": 2}})") && grammar.complete());
  ResponseBuilder picked(*any, "chatcmpl-2", "m", 0);
  v1::GenerateResponse reply;
  reply.set_text(R"({"name": "b", "arguments": {"n": 2}})");
  reply.mutable_final()->set_finish_reason(v1::FINISH_REASON_STOP_TOKEN);
  picked.add(reply);
  const Json any_choice = picked.choiceBody();
  EXPECT_EQ(any_choice["finish_reason"], "tool_calls");  // "required": a call, as vLLM's
  ASSERT_EQ(any_choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(any_choice["message"]["tool_calls"][0]["function"]["name"], "b");
  EXPECT_EQ(Json::parse(
                any_choice["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            Json::parse(R"({"n": 2})"));
  // The reply is the call: its arguments, and "tool_calls" for "required" (a named
  // function's call ends "stop", as OpenAI's do).
  ResponseBuilder builder(*call, "chatcmpl-1", "m", 0);
  v1::GenerateResponse message;
  message.set_text(R"({"n": )");
  builder.add(message);
  message.set_text("3}");
  message.mutable_final()->set_finish_reason(v1::FINISH_REASON_STOP_TOKEN);
  builder.add(message);
  const Json choice = builder.choiceBody();
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "a");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"n": 3})");
  Call named = *call;
  named.required_tool = false;
  ResponseBuilder by_name(named, "chatcmpl-3", "m", 0);
  by_name.add(message);
  EXPECT_EQ(by_name.choiceBody()["finish_reason"], "stop");
}

// Whole numbers written as floats are those integers (Python clients send 1024.0); a
// top_logprobs of 0 needs no logprobs.
TEST(OpenAiRequestTest, WholeFloatsAreIntegersAndZeroTopLogprobsIsNothing) {
  auto call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "max_tokens": 7.0, "n": 2.0, "top_logprobs": 0})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.stopping().max_new_tokens(), 7u);
  EXPECT_EQ(call->n, 2);
  EXPECT_FALSE(call->request.has_logprobs());
  for (const char* bad :
       {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 7.5})",
        R"({"messages": [{"role": "user", "content": "x"}], "n": 1e300})",
        R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})"}) {
    EXPECT_EQ(parseChatRequest(Json::parse(bad)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(OpenAiRequestTest, JsonObjectFormatConstrainsSampling) {
  auto call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_object"}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.sampling().response_format(), v1::RESPONSE_FORMAT_JSON_OBJECT);
  call = parseCompletionRequest(
      Json::parse(R"({"prompt": "x", "response_format": {"type": "text"}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.sampling().response_format(), v1::RESPONSE_FORMAT_TEXT);
  call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
          "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.sampling().response_format(), v1::RESPONSE_FORMAT_JSON_SCHEMA);
  EXPECT_EQ(Json::parse(call->request.sampling().json_schema()),
            Json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}})"));
}

// vLLM's guided_regex / guided_choice, and its structured_outputs, become regex and choice.
TEST(OpenAiRequestTest, GuidedRegexAndChoiceConstrainSampling) {
  auto call = parseCompletionRequest(Json::parse(R"({"prompt": "x", "guided_regex": "\\d+"})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.sampling().regex(), "\\d+");
  call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "guided_choice": ["yes", "no"]})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_THAT(call->request.sampling().choice(), ::testing::ElementsAre("yes", "no"));
  call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "structured_outputs": {"choice": ["a"]}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_THAT(call->request.sampling().choice(), ::testing::ElementsAre("a"));
  call =
      parseCompletionRequest(Json::parse(R"({"prompt": "x", "guided_grammar": "root ::= \"a\""})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.sampling().grammar(), "root ::= \"a\"");
  call = parseCompletionRequest(
      Json::parse(R"({"prompt": "x", "structured_outputs": {"grammar": "root ::= [ab]"}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.sampling().grammar(), "root ::= [ab]");
  EXPECT_EQ(parseCompletionRequest(Json::parse(R"({"prompt": "x", "guided_grammar": 1})"))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  call = parseCompletionRequest(
      Json::parse(R"({"prompt": "x", "structured_outputs": {"regex": "[ab]"}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.sampling().regex(), "[ab]");
  for (const char* bad :
       {R"({"prompt": "x", "guided_regex": 5})", R"({"prompt": "x", "guided_choice": []})",
        R"({"prompt": "x", "guided_choice": ["a", 1]})",
        R"({"prompt": "x", "structured_outputs": {"choice": "a"}})",
        R"({"prompt": "x", "structured_outputs": 3})"}) {
    EXPECT_EQ(parseCompletionRequest(Json::parse(bad)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// vLLM's guided_json (a schema, or its JSON text) and structured_outputs.json /
// .json_object are the JSON response formats; with response_format too they are refused.
TEST(OpenAiRequestTest, GuidedJsonIsAJsonSchemaFormat) {
  const Json schema =
      Json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}})");
  for (const Json& body : {Json{{"prompt", "x"}, {"guided_json", schema}},
                           Json{{"prompt", "x"}, {"guided_json", schema.dump()}},
                           Json{{"prompt", "x"}, {"structured_outputs", {{"json", schema}}}}}) {
    auto call = parseCompletionRequest(body);
    ASSERT_TRUE(call.ok()) << body << ": " << call.status();
    EXPECT_EQ(call->request.sampling().response_format(), v1::RESPONSE_FORMAT_JSON_SCHEMA);
    EXPECT_EQ(Json::parse(call->request.sampling().json_schema()), schema);
  }
  auto call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "structured_outputs": {"json_object": true}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.sampling().response_format(), v1::RESPONSE_FORMAT_JSON_OBJECT);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"prompt": "x", "guided_json": "{not json"})", "guided_json"},
      {R"({"prompt": "x", "guided_json": [1]})", "guided_json"},
      {R"({"prompt": "x", "guided_json": {}, "response_format": {"type": "json_object"}})",
       "guided_json"},
      {R"({"prompt": "x", "structured_outputs": {"json_object": "yes"}})",
       "structured_outputs.json_object"},
  };
  for (const auto& [body, param] : bad) {
    auto refused = parseCompletionRequest(Json::parse(body));
    ASSERT_FALSE(refused.ok()) << body;
    EXPECT_EQ(std::string(refused.status().GetPayload(kParamPayload).value_or(absl::Cord(""))),
              param)
        << body;
  }
}

// vLLM's truncate_prompt_tokens: N > 0 or -1 travel as they are; 0 and below -1 are refused.
TEST(OpenAiRequestTest, TruncatePromptTokensTravels) {
  auto call =
      parseCompletionRequest(Json::parse(R"({"prompt": "x", "truncate_prompt_tokens": 5})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.truncate_prompt_tokens(), 5);
  call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "truncate_prompt_tokens": -1})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.truncate_prompt_tokens(), -1);
  for (const char* bad : {R"({"prompt": "x", "truncate_prompt_tokens": 0})",
                          R"({"prompt": "x", "truncate_prompt_tokens": -2})",
                          R"({"prompt": "x", "truncate_prompt_tokens": "5"})"}) {
    auto refused = parseCompletionRequest(Json::parse(bad));
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(std::string(refused.status().GetPayload(kParamPayload).value_or(absl::Cord(""))),
              "truncate_prompt_tokens");
  }
}

TEST(OpenAiRequestTest, ChatWithoutMaxTokensRunsToTheContextAndToolChoiceNoneOffersNoTools) {
  // The template sees the tools (as vLLM's); no call is looked for.
  auto call = parseChatRequest(Json::parse(
      R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none",
          "tools": [{"type": "function", "function": {"name": "f"}}]})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_FALSE(call->request.stopping().has_max_new_tokens());
  EXPECT_THAT(call->request.chat().tools_json(), ::testing::HasSubstr("\"f\""));
  EXPECT_FALSE(call->request.chat().has_add_generation_prompt());
  EXPECT_FALSE(call->request.has_logprobs());
  EXPECT_FALSE(call->offers_tools);
  EXPECT_FALSE(call->thinking_off);
  // An empty tool list reaches the template but offers nothing to call.
  call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [], "chat_template_kwargs": {"enable_thinking": false},
      "skip_special_tokens": false})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.chat().tools_json(), "[]");
  EXPECT_FALSE(call->offers_tools);
  EXPECT_TRUE(call->thinking_off);
  EXPECT_FALSE(call->request.skip_special_tokens());
  call = parseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}]})"));
  EXPECT_TRUE(call->offers_tools);
}

struct Refusal {
  const char* body;
  const char* param;
};

TEST(OpenAiRequestTest, RefusalsNameTheField) {
  const Refusal completions[] = {
      {R"({})", "prompt"},
      {R"({"prompt": ""})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": ["a", ""]})", "prompt[1]"},
      {R"({"prompt": ["a", [1, -1]]})", "prompt[1][1]"},
      {R"({"prompt": ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o",
                     "p", "q"], "n": 16})",
       "prompt"},
      {R"({"prompt": [1, -2]})", "prompt[1]"},
      {R"({"prompt": [1, 4294967296]})", "prompt[1]"},
      {R"({"prompt": "a", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 1.5})", "max_tokens"},
      {R"({"prompt": "a", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "a", "n": 17})", "n"},
      {R"({"prompt": "a", "n": 0})", "n"},
      {R"({"prompt": "a", "n": 2, "best_of": 3})", "best_of"},
      {R"({"prompt": "a", "logit_bias": {"x": 10}})", "logit_bias"},
      {R"({"prompt": "a", "logit_bias": {"5": "high"}})", "logit_bias[\"5\"]"},
      {R"({"prompt": "a", "logit_bias": [5]})", "logit_bias"},
      {R"({"prompt": "a", "allowed_token_ids": [1, -1]})", "allowed_token_ids[1]"},
      {R"({"prompt": "a", "suffix": "end"})", "suffix"},
      {R"({"prompt": "a", "stop": 5})", "stop"},
      {R"({"prompt": "a", "stop": ["x", 1]})", "stop[1]"},
      {R"({"prompt": "a", "stop_token_ids": "2"})", "stop_token_ids"},
      {R"({"prompt": "a", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "a", "stream": "yes"})", "stream"},
      {R"({"prompt": "a", "top_k": -2})", "top_k"},
      {R"({"prompt": "a", "include_stop_str_in_output": 1})", "include_stop_str_in_output"},
      {R"({"prompt": "a", "model": 7})", "model"},
      {R"({"prompt": "a", "min_tokens": -3})", "min_tokens"},
      {R"({"prompt": "a", "priority": 1.5})", "priority"},
      {R"({"prompt": "a", "priority": 4294967296})", "priority"},
  };
  for (const Refusal& r : completions) {
    auto call = parseCompletionRequest(Json::parse(r.body));
    ASSERT_FALSE(call.ok()) << r.body;
    EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument) << r.body;
    EXPECT_EQ(apiError(call.status()).http_status, 400);
    EXPECT_EQ(Json::parse(apiError(call.status()).body)["error"]["param"], r.param) << r.body;
    EXPECT_TRUE(absl::StartsWith(call.status().message(), r.param)) << call.status();
  }
  const Refusal chats[] = {
      {R"({})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": ["hi"]})", "messages[0]"},
      {R"({"messages": [{"content": "hi"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
       "messages[0].content[0].text"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
       "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
           "tools": [{"type": "function", "function": {"name": "a"}},
                     {"type": "function", "function": {}}]})",
       "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "tool_choice": {"type": "function", "function": {"name": "c"}},
           "tools": [{"type": "function", "function": {"name": "a"}}]})",
       "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "any",
           "tools": [{"type": "function", "function": {"name": "a"}}]})",
       "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"},
           "tool_choice": {"type": "function", "function": {"name": "a"}},
           "tools": [{"type": "function", "function": {"name": "a"}}]})",
       "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "response_format": {"type": "json_schema", "json_schema": {}}})",
       "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []})",
       "chat_template_kwargs"},
      {R"({"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": true,
           "add_generation_prompt": true})",
       "add_generation_prompt"},
  };
  for (const Refusal& r : chats) {
    auto call = parseChatRequest(Json::parse(r.body));
    ASSERT_FALSE(call.ok()) << r.body;
    EXPECT_EQ(Json::parse(apiError(call.status()).body)["error"]["param"], r.param) << r.body;
  }
}

TEST(OpenAiRequestTest, BodiesMustBeBoundedJsonObjects) {
  EXPECT_FALSE(parseBody("{").ok());
  EXPECT_FALSE(parseBody("[1]").ok());
  EXPECT_FALSE(parseBody(std::string(40, '[') + std::string(40, ']')).ok());
  std::string many = R"({"prompt": [)";
  for (int i = 0; i < 9000; ++i) many += "[{},{},{},{},{},{},{},{},{},{},{},{}],";
  many += "[]]}";
  EXPECT_EQ(parseBody(many).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(parseBody(many).status().message(), "arrays and objects"));
  EXPECT_TRUE(parseBody(R"({"prompt": "a"})").ok());
}

TEST(OpenAiRequestTest, TokenizeTakesAPromptOrMessages) {
  auto text = parseTokenizeRequest(Json::parse(R"({"prompt": "a b", "return_token_strs": true})"));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->text(), "a b");
  EXPECT_TRUE(text->add_special_tokens());
  EXPECT_TRUE(text->return_pieces());
  auto chat =
      parseTokenizeRequest(Json::parse(R"({"messages": [{"role": "user", "content": "q"}]})"));
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->chat().messages(0).content(), "q");
  EXPECT_FALSE(parseTokenizeRequest(Json::parse(R"({"prompt": 5})")).ok());
  auto ids = parseDetokenizeRequest(Json::parse(R"({"tokens": [3, 4]})"));
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->ids_size(), 2);
  EXPECT_FALSE(parseDetokenizeRequest(Json::parse(R"({"tokens": [-1]})")).ok());
}

// A stream of three messages: "Hel" + "lo" + a final "!" that stops on a stop string.
std::vector<v1::GenerateResponse> stream() {
  std::vector<v1::GenerateResponse> messages(3);
  const char* texts[] = {"Hel", "lo", "!"};
  for (int i = 0; i < 3; ++i) {
    messages[i].add_token_ids(10 + i);
    messages[i].set_text(texts[i]);
    v1::TokenLogprob* lp = messages[i].add_logprobs();
    lp->set_token_id(10 + i);
    lp->set_logprob(-0.5f * (i + 1));
    lp->set_text(texts[i]);
    lp->set_token_bytes(texts[i]);
    v1::TopLogprob* top = lp->add_top();
    top->set_token_id(99);
    top->set_logprob(-0.25f);
    top->set_text("\xef\xbf\xbd");  // the first byte of "é" alone
    top->set_token_bytes("\xc3");
  }
  messages[0].set_request_id("r1");
  v1::FinalInfo& final = *messages[2].mutable_final();
  final.set_finish_reason(v1::FINISH_REASON_STOP_STRING);
  final.set_matched_stop("\n");
  final.mutable_usage()->set_prompt_tokens(4);
  final.mutable_usage()->set_completion_tokens(3);
  final.mutable_usage()->set_cached_prompt_tokens(2);
  return messages;
}

// The JSON of each "data:" event.
std::vector<Json> events(const std::string& text) {
  std::vector<Json> out;
  size_t at = 0;
  while ((at = text.find("data: ", at)) != std::string::npos) {
    const size_t end = text.find("\n\n", at);
    const std::string data = text.substr(at + 6, end - at - 6);
    out.push_back(data == "[DONE]" ? Json("[DONE]") : Json::parse(data));
    at = end + 2;
  }
  return out;
}

TEST(OpenAiResponseTest, CompletionBodyHasTextUsageAndLogprobs) {
  Call call{.endpoint = Endpoint::kCompletions, .echo = true, .logprobs = true};
  std::vector<std::unique_ptr<ResponseBuilder>> choices;
  choices.push_back(std::make_unique<ResponseBuilder>(call, "cmpl-r1", "smol", 1700000000));
  ResponseBuilder& builder = *choices[0];
  builder.setEcho("Say: ");
  std::vector<v1::GenerateResponse> messages = stream();
  // echo with logprobs: the prompt's tokens from the second on, scored.
  for (const auto& [text, logprob] : {std::pair<std::string, float>{":", -2.0f}, {" ", -0.5f}}) {
    v1::TokenLogprob* lp = messages[0].add_prompt_logprobs();
    lp->set_text(text);
    lp->set_logprob(logprob);
  }
  for (const auto& m : messages) EXPECT_EQ(builder.add(m), "");
  ASSERT_TRUE(builder.finished());
  const Json body = responseBody(call, choices);
  EXPECT_EQ(body["id"], "cmpl-r1");
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "smol");
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["text"], "Say: Hello!");
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(choice["stop_reason"], "\n");
  EXPECT_EQ(choice["logprobs"]["tokens"], Json::parse(R"(["Say", ":", " ", "Hel", "lo", "!"])"));
  EXPECT_EQ(choice["logprobs"]["text_offset"], Json::parse("[0, 3, 4, 5, 8, 10]"));
  EXPECT_TRUE(choice["logprobs"]["token_logprobs"][0].is_null());
  EXPECT_TRUE(choice["logprobs"]["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(choice["logprobs"]["token_logprobs"][1].get<float>(), -2.0f);
  EXPECT_FLOAT_EQ(choice["logprobs"]["token_logprobs"][5].get<float>(), -1.5f);
  EXPECT_FLOAT_EQ(choice["logprobs"]["top_logprobs"][3]["\xef\xbf\xbd"].get<float>(), -0.25f);
  EXPECT_EQ(body["usage"], Json::parse(R"({"prompt_tokens": 4, "completion_tokens": 3,
      "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 2}})"));
}

TEST(OpenAiResponseTest, ChatStreamStartsWithTheRoleAndEndsWithUsageAndDone) {
  Call call{.endpoint = Endpoint::kChatCompletions,
            .stream = true,
            .include_usage = true,
            .logprobs = true};
  std::vector<std::unique_ptr<ResponseBuilder>> choices;
  choices.push_back(std::make_unique<ResponseBuilder>(call, "chatcmpl-r1", "smol", 1));
  std::string text;
  for (const auto& m : stream()) text += choices[0]->add(m);
  text += endOfStream(call, choices);
  const std::vector<Json> e = events(text);
  ASSERT_EQ(e.size(), 6u) << text;
  for (size_t i = 0; i + 1 < e.size(); ++i) {
    EXPECT_EQ(e[i]["id"], "chatcmpl-r1");
    EXPECT_EQ(e[i]["object"], "chat.completion.chunk");
  }
  EXPECT_EQ(e[0]["choices"][0]["delta"], Json::parse(R"({"role": "assistant", "content": ""})"));
  EXPECT_EQ(e[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_EQ(e[1]["choices"][0]["logprobs"]["content"][0]["token"], "Hel");
  EXPECT_EQ(e[1]["choices"][0]["logprobs"]["content"][0]["bytes"], Json::parse("[72, 101, 108]"));
  EXPECT_EQ(e[1]["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]["bytes"],
            Json::parse("[195]"));
  EXPECT_EQ(e[1]["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]["token"],
            "\xef\xbf\xbd");
  EXPECT_TRUE(e[1]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(e[3]["choices"][0]["delta"]["content"], "!");
  EXPECT_EQ(e[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(e[4]["choices"].empty());
  EXPECT_EQ(e[4]["usage"]["total_tokens"], 7);
  EXPECT_EQ(e[5], "[DONE]");
}

TEST(OpenAiResponseTest, ChatBodyHasTheAssistantMessage) {
  Call call{.endpoint = Endpoint::kChatCompletions};
  std::vector<std::unique_ptr<ResponseBuilder>> choices;
  choices.push_back(std::make_unique<ResponseBuilder>(call, "chatcmpl-r1", "smol", 1));
  std::vector<v1::GenerateResponse> messages = stream();
  messages[2].mutable_final()->set_finish_reason(v1::FINISH_REASON_LENGTH);
  messages[2].mutable_final()->clear_matched_stop();
  for (const auto& m : messages) choices[0]->add(m);
  const Json body = responseBody(call, choices);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"],
            Json::parse(R"({"role": "assistant", "content": "Hello!"})"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(body["choices"][0]["stop_reason"].is_null());
}

// stop_reason as vLLM's: a stop_token_ids token's id as a number; nothing for the model's
// own end of sequence (which the workers also report as a stop token).
TEST(OpenAiResponseTest, AStopTokensReasonIsItsIdUnlessItIsTheModelsEnd) {
  Call call{.endpoint = Endpoint::kChatCompletions};
  call.request.mutable_stopping()->add_stop_token_ids(7);
  for (const auto& [matched, want] :
       std::vector<std::pair<std::string, Json>>{{"7", Json(7)}, {"2", Json(nullptr)}}) {
    ResponseBuilder builder(call, "chatcmpl-s", "smol", 0);
    v1::GenerateResponse last;
    last.set_text("Hi");
    last.mutable_final()->set_finish_reason(v1::FINISH_REASON_STOP_TOKEN);
    last.mutable_final()->set_matched_stop(matched);
    builder.add(last);
    EXPECT_EQ(builder.choiceBody()["stop_reason"], want) << matched;
    EXPECT_EQ(builder.choiceBody()["finish_reason"], "stop");
  }
}

TEST(OpenAiResponseTest, SeveralChoicesShareTheIdAndCountThePromptOnce) {
  Call call{.endpoint = Endpoint::kCompletions, .stream = true, .include_usage = true, .n = 2};
  std::vector<std::unique_ptr<ResponseBuilder>> choices;
  std::string text;
  for (int i = 0; i < 2; ++i) {
    choices.push_back(std::make_unique<ResponseBuilder>(call, "cmpl-x", "smol", 1, i));
  }
  const std::vector<v1::GenerateResponse> messages = stream();
  for (const auto& m : messages) {  // interleaved, as they arrive
    for (int i = 0; i < 2; ++i) text += choices[i]->add(m);
  }
  text += endOfStream(call, choices);
  const std::vector<Json> e = events(text);
  ASSERT_EQ(e.size(), 8u) << text;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(e[i]["id"], "cmpl-x");
    EXPECT_EQ(e[i]["choices"][0]["index"], i % 2);
  }
  EXPECT_EQ(e[6]["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(e[6]["usage"]["completion_tokens"], 6);
  EXPECT_EQ(e[6]["usage"]["total_tokens"], 10);
  call.stream = false;
  const Json body = responseBody(call, choices);
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["text"], "Hello!");
}

// A reply that reasons, says a word and calls a tool, in deltas that split the tags.
std::vector<v1::GenerateResponse> toolReply() {
  const char* texts[] = {"<think>hm", "m</thi", "nk>On it.<tool", "_call>{\"name\": \"f\", ",
                         "\"arguments\": {\"x\": 1}}</tool_call>"};
  std::vector<v1::GenerateResponse> messages(5);
  for (int i = 0; i < 5; ++i) messages[i].set_text(texts[i]);
  messages[4].mutable_final()->set_finish_reason(v1::FINISH_REASON_STOP_TOKEN);
  return messages;
}

// Mistral's chat templates take back only ids of 9 letters and digits: its calls get such.
TEST(OpenAiResponseTest, MistralToolCallsHaveIdsItsTemplatesTake) {
  Call call{.endpoint = Endpoint::kChatCompletions, .tool_calls = ToolCallFormat::kMistral};
  ResponseBuilder builder(call, "chatcmpl-m", "m", 0);
  v1::GenerateResponse reply;
  reply.set_text(R"([TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}}, )"
                 R"({"name": "g", "arguments": {}}])");
  reply.mutable_final()->set_finish_reason(v1::FINISH_REASON_STOP_TOKEN);
  builder.add(reply);
  const Json calls = builder.choiceBody()["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  for (const Json& c : calls) {
    const std::string id = c["id"];
    EXPECT_EQ(id.size(), 9u) << id;
    EXPECT_TRUE(std::all_of(id.begin(), id.end(), [](char ch) { return std::isalnum(ch); })) << id;
  }
  EXPECT_NE(calls[0]["id"], calls[1]["id"]);
  // parallel_tool_calls false: the first call only.
  auto single = parseChatRequest(Json::parse(
      R"({"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": false})"));
  ASSERT_TRUE(single.ok()) << single.status();
  single->tool_calls = ToolCallFormat::kMistral;
  ResponseBuilder first(*single, "chatcmpl-n", "m", 0);
  first.add(reply);
  const Json one = first.choiceBody()["message"]["tool_calls"];
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["function"]["name"], "f");
}

TEST(OpenAiResponseTest, ReasoningAndToolCallsComeApart) {
  Call call{.endpoint = Endpoint::kChatCompletions,
            .reasoning = ReasoningFormat::kQwen3,
            .tool_calls = ToolCallFormat::kHermes};
  std::vector<std::unique_ptr<ResponseBuilder>> choices;
  choices.push_back(std::make_unique<ResponseBuilder>(call, "chatcmpl-t", "m", 1));
  for (const auto& m : toolReply()) choices[0]->add(m);
  const Json message = responseBody(call, choices)["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "hmm");
  EXPECT_EQ(message["content"], "On it.");
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_TRUE(absl::StartsWith(message["tool_calls"][0]["id"].get<std::string>(), "call_"));
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(Json::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            Json::parse(R"({"x": 1})"));
  EXPECT_EQ(responseBody(call, choices)["choices"][0]["finish_reason"], "tool_calls");

  call.stream = true;
  std::vector<std::unique_ptr<ResponseBuilder>> streamed;
  streamed.push_back(std::make_unique<ResponseBuilder>(call, "chatcmpl-t", "m", 1));
  std::string text;
  for (const auto& m : toolReply()) text += streamed[0]->add(m);
  std::string reasoning, content;
  Json calls;
  for (const Json& e : events(text)) {
    const Json& delta = e["choices"][0]["delta"];
    reasoning += delta.value("reasoning_content", "");
    content += delta.value("content", "");
    if (delta.contains("tool_calls")) calls = delta["tool_calls"];
    if (!e["choices"][0]["finish_reason"].is_null()) {
      EXPECT_EQ(e["choices"][0]["finish_reason"], "tool_calls");
    }
  }
  EXPECT_EQ(reasoning, "hmm");
  EXPECT_EQ(content, "On it.");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["name"], "f");
}

TEST(OpenAiResponseTest, ErrorsCarryOpenAisShapeAndHttpStatus) {
  const struct {
    grpc::StatusCode code;
    int http;
    const char* type;
  } cases[] = {{grpc::StatusCode::INVALID_ARGUMENT, 400, "invalid_request_error"},
               {grpc::StatusCode::UNAUTHENTICATED, 401, "authentication_error"},
               {grpc::StatusCode::NOT_FOUND, 404, "not_found_error"},
               {grpc::StatusCode::RESOURCE_EXHAUSTED, 429, "rate_limit_error"},
               {grpc::StatusCode::UNAVAILABLE, 503, "service_unavailable"},
               {grpc::StatusCode::CANCELLED, 503, "service_unavailable"},
               {grpc::StatusCode::UNIMPLEMENTED, 501, "server_error"},
               {grpc::StatusCode::INTERNAL, 500, "server_error"}};
  for (const auto& c : cases) {
    ApiError e = apiError(static_cast<int>(c.code), "why \xff");
    EXPECT_EQ(e.http_status, c.http);
    const Json body = Json::parse(e.body);
    EXPECT_EQ(body["error"]["type"], c.type);
    EXPECT_EQ(body["error"]["code"], c.http);
    EXPECT_TRUE(body["error"]["param"].is_null());
    EXPECT_EQ(body["error"]["message"], "why \xef\xbf\xbd");  // invalid UTF-8 replaced
  }
  // A context overflow carries OpenAI's code.
  const Json overflow =
      Json::parse(apiError(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT),
                           "This model's maximum context length is 8192 tokens. However, ...")
                      .body);
  EXPECT_EQ(overflow["error"]["code"], "context_length_exceeded");
}

}  // namespace
}  // namespace cleave::router::openai
