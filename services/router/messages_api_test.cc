// Anthropic's Messages API on the chat path: requests into chat calls (system, content
// blocks, tool use and results, tools, tool_choice, output formats) and refusals naming the
// field; replies into message objects and into the API's event stream; errors in its shape.
#include "services/router/messages_api.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router/reply_test_util.h"

namespace cleave::router::openai {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MessagesRequestTest, BlocksBecomeChatMessages) {
  auto call = parseMessagesRequest(Json::parse(R"({"model": "m", "max_tokens": 9,
      "system": [{"type": "text", "text": "Be brief."}], "stop_sequences": ["END"],
      "temperature": 0.5, "top_k": 3, "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
        "content": [{"type": "text", "text": "Sunny"}]}, {"type": "text", "text": "And?"}]},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "w",
        "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2"}]}]})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->endpoint, Endpoint::kMessages);
  EXPECT_EQ(chatMessages(*call), Json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "Looking.", "tool_calls": [{"id": "t1", "type": "function",
        "function": {"name": "w", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
      {"role": "user", "content": "And?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "t2", "type": "function",
        "function": {"name": "w", "arguments": {}}}]},
      {"role": "tool", "tool_call_id": "t2", "content": ""}])"));
  EXPECT_EQ(call->request.stopping().max_new_tokens(), 9u);
  EXPECT_THAT(call->request.stopping().stop(), ElementsAre("END"));
  EXPECT_FLOAT_EQ(call->request.sampling().temperature(), 0.5f);
  EXPECT_EQ(call->request.sampling().top_k(), 3);
  // The prompt's ids come back only for a stream's message_start.
  EXPECT_FALSE(call->request.echo_prompt_token_ids());
  EXPECT_FALSE(call->request.chat().continue_final_message());
}

// Consecutive assistant turns are one (Anthropic merges them): their tool calls add up. A
// last assistant turn of text is a prefill the reply continues.
TEST(MessagesRequestTest, AssistantTurnsMergeAndALastOneIsContinued) {
  auto call = parseMessagesRequest(Json::parse(R"({"model": "m", "max_tokens": 9,
      "stream": true, "messages": [
      {"role": "user", "content": "Both cities?"},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "w",
        "input": {"city": "Paris"}}]},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "b", "name": "w",
        "input": {"city": "Rome"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"},
        {"type": "tool_result", "tool_use_id": "b", "content": "2"}]}]})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(chatMessages(*call), Json::parse(R"([
      {"role": "user", "content": "Both cities?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "w", "arguments": {"city": "Paris"}}},
        {"id": "b", "type": "function", "function": {"name": "w", "arguments": {"city": "Rome"}}}]},
      {"role": "tool", "tool_call_id": "a", "content": "1"},
      {"role": "tool", "tool_call_id": "b", "content": "2"}])"));
  EXPECT_TRUE(call->request.echo_prompt_token_ids());
  EXPECT_FALSE(call->request.chat().continue_final_message());

  auto prefilled = parseMessagesRequest(Json::parse(R"({"model": "m", "max_tokens": 9,
      "messages": [{"role": "user", "content": "JSON please"},
                   {"role": "assistant", "content": "{\"a\":"}]})"));
  ASSERT_TRUE(prefilled.ok()) << prefilled.status();
  EXPECT_TRUE(prefilled->request.chat().continue_final_message());
  EXPECT_FALSE(prefilled->request.chat().add_generation_prompt());
}

TEST(MessagesRequestTest, ToolsChoicesAndFormatsTakeTheChatShapes) {
  const char* tools = R"("tools": [{"name": "w", "description": "d",
      "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])";
  auto with = [&](const std::string& rest) {
    return parseMessagesRequest(Json::parse(
        absl::StrCat(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], )", tools,
                     rest, "}")));
  };
  auto call = with("");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_TRUE(call->offers_tools);
  EXPECT_EQ(Json::parse(call->request.chat().tools_json()), Json::parse(R"([{"type": "function",
      "function": {"name": "w", "description": "d", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}}}}])"));
  call = with(R"(, "tool_choice": {"type": "tool", "name": "w"})");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->forced_tool, "w");
  call = with(R"(, "tool_choice": {"type": "any"})");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->forced_tool, "w");  // "required" with one tool: that one.
  call = with(R"(, "tool_choice": {"type": "none"})");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_FALSE(call->offers_tools);
  EXPECT_FALSE(call->single_tool_call);
  call = with(R"(, "tool_choice": {"type": "auto", "disable_parallel_tool_use": true})");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_TRUE(call->single_tool_call);
  call = parseMessagesRequest(Json::parse(R"({"max_tokens": 5, "messages": [{"role": "user",
      "content": "x"}], "output_config": {"effort": "low", "format": {"type": "json_schema",
      "schema": {"type": "object"}}}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.sampling().response_format(), v1::RESPONSE_FORMAT_JSON_SCHEMA);
  // count_tokens needs no max_tokens.
  EXPECT_TRUE(parseMessagesRequest(Json::parse(R"({"messages": [{"role": "user",
      "content": "x"}]})"),
                                   /*counting=*/true)
                  .ok());
}

TEST(MessagesRequestTest, RefusalsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"messages": [{"role": "user", "content": "x"}]})", "max_tokens"},
      {R"({"max_tokens": 5, "messages": []})", "messages"},
      {R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})",
       "messages[0].role"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image",
          "source": {}}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use",
          "id": "a", "name": "b", "input": {}}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use",
          "id": "a", "name": "b", "input": 3}]}]})",
       "messages[0].content[0].input"},
      {R"({"max_tokens": 5, "system": [{"type": "image"}], "messages": [{"role": "user",
          "content": "x"}]})",
       "system[0].type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "bash_20250124", "name": "bash"}]})",
       "tools[0].type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "tools": [{"name": "w"}]})",
       "tools[0].input_schema"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "tool_choice": {"type": "sometimes"}})",
       "tool_choice"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "output_config": {"format": {"type": "yaml"}}})",
       "output_config.format"},
  };
  for (const auto& [body, param] : cases) {
    auto call = parseMessagesRequest(Json::parse(body));
    ASSERT_FALSE(call.ok()) << body;
    EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_EQ(std::string(call.status().GetPayload(kParamPayload).value_or(absl::Cord(""))), param)
        << body << ": " << call.status();
  }
}

TEST(MessagesErrorTest, ErrorsAreInAnthropicsShape) {
  const Json e = Json::parse(anthropicError(
      429, R"({"error": {"message": "slow down", "type": "rate_limit_error", "code": 429}})"));
  EXPECT_EQ(e, Json::parse(R"({"type": "error", "error": {"type": "rate_limit_error",
      "message": "slow down"}})"));
  EXPECT_EQ(Json::parse(anthropicError(400, "{}"))["error"]["type"], "invalid_request_error");
  EXPECT_EQ(Json::parse(anthropicError(503, "not json"))["error"]["message"], "not json");
  EXPECT_EQ(Json::parse(anthropicError(500, "x"))["error"]["type"], "api_error");
}

// The reply fed as `pieces` then `final_text` ending for `reason`, whole and streamed.
Rendered render(const char* request, const std::vector<std::string>& pieces,
                const std::string& final_text, v1::FinishReason reason,
                ToolCallFormat tools = ToolCallFormat::kNone,
                ReasoningFormat reasoning = ReasoningFormat::kNone) {
  absl::StatusOr<Call> call = parseMessagesRequest(Json::parse(request));
  EXPECT_TRUE(call.ok()) << call.status();
  if (call->offers_tools) call->tool_calls = tools;
  call->reasoning = reasoning;
  v1::GenerateResponse end = last(final_text, reason);
  if (reason == v1::FINISH_REASON_STOP_STRING) end.mutable_final()->set_matched_stop("END");
  return renderReply(
      *call, [] { return std::make_unique<MessagesRenderer>("msg_1", "m"); }, pieces, end);
}

constexpr char kAsk[] = R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})";

TEST(MessagesRendererTest, ATextReplyIsOneTextBlockWholeOrStreamed) {
  const Rendered r = render(kAsk, {"Hel", "lo, "}, "world", v1::FINISH_REASON_STOP_TOKEN);
  EXPECT_EQ(r.body, Json::parse(R"({"id": "msg_1", "type": "message", "role": "assistant",
      "model": "m", "content": [{"type": "text", "text": "Hello, world"}],
      "stop_reason": "end_turn", "stop_sequence": null, "usage": {"input_tokens": 7,
      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4, "output_tokens": 5}})"));
  EXPECT_THAT(types(r.events),
              ElementsAre("message_start", "content_block_start", "content_block_delta",
                          "content_block_delta", "content_block_delta", "content_block_stop",
                          "message_delta", "message_stop"));
  // message_start counts the prompt as the end does: what the cache supplied apart.
  EXPECT_EQ(r.events[0]["message"]["usage"]["input_tokens"], 7);
  EXPECT_EQ(r.events[0]["message"]["usage"]["cache_read_input_tokens"], 4);
  EXPECT_TRUE(r.events[0]["message"]["content"].empty());
  std::string text;
  for (const Json& e : r.events) {
    if (e["type"] == "content_block_delta") text += e["delta"]["text"].get<std::string>();
    if (e.contains("index")) EXPECT_EQ(e["index"], 0) << e;
  }
  EXPECT_EQ(text, "Hello, world");
  EXPECT_EQ(r.events[6]["delta"], Json::parse(R"({"stop_reason": "end_turn",
      "stop_sequence": null})"));
  EXPECT_EQ(r.events[6]["usage"], r.body["usage"]);
}

TEST(MessagesRendererTest, StopReasonsAreTheApis) {
  EXPECT_EQ(render(kAsk, {"a"}, "b", v1::FINISH_REASON_LENGTH).body["stop_reason"], "max_tokens");
  const Rendered stopped = render(kAsk, {"a"}, "b", v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(stopped.body["stop_reason"], "stop_sequence");
  EXPECT_EQ(stopped.body["stop_sequence"], "END");
  EXPECT_EQ(stopped.events.back()["type"], "message_stop");
  // An empty reply still has its (empty) text block.
  const Rendered empty = render(kAsk, {}, "", v1::FINISH_REASON_STOP_TOKEN);
  EXPECT_EQ(empty.body["content"], Json::parse(R"([{"type": "text", "text": ""}])"));
  EXPECT_THAT(types(empty.events),
              ElementsAre("message_start", "content_block_start", "content_block_stop",
                          "message_delta", "message_stop"));
}

TEST(MessagesRendererTest, ToolCallsAreToolUseBlocksAfterTheText) {
  const Rendered r = render(
      R"({"max_tokens": 50, "messages": [{"role": "user", "content": "x"}],
          "tools": [{"name": "w", "input_schema": {"type": "object"}}]})",
      {"Sure. "}, R"(<tool_call>{"name": "w", "arguments": {"city": "Paris"}}</tool_call>)",
      v1::FINISH_REASON_STOP_TOKEN, ToolCallFormat::kHermes);
  ASSERT_EQ(r.body["content"].size(), 2u) << r.body;
  EXPECT_EQ(r.body["content"][0], Json::parse(R"({"type": "text", "text": "Sure. "})"));
  const Json& use = r.body["content"][1];
  EXPECT_EQ(use["type"], "tool_use");
  EXPECT_EQ(use["name"], "w");
  EXPECT_EQ(use["input"], Json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(r.body["stop_reason"], "tool_use");
  EXPECT_THAT(types(r.events),
              ElementsAre("message_start", "content_block_start", "content_block_delta",
                          "content_block_stop", "content_block_start", "content_block_delta",
                          "content_block_stop", "message_delta", "message_stop"));
  EXPECT_EQ(r.events[4]["index"], 1);
  EXPECT_EQ(r.events[4]["content_block"]["input"], Json::object());
  EXPECT_EQ(Json::parse(r.events[5]["delta"]["partial_json"].get<std::string>()), use["input"]);
  EXPECT_EQ(r.events[7]["delta"]["stop_reason"], "tool_use");
}

TEST(MessagesRendererTest, ReasoningIsAThinkingBlockBeforeTheText) {
  const Rendered r =
      render(kAsk, {"<think>hm", "m</think>", "Hi"}, "!", v1::FINISH_REASON_STOP_TOKEN,
             ToolCallFormat::kNone, ReasoningFormat::kQwen3);
  EXPECT_EQ(r.body["content"], Json::parse(R"([{"type": "thinking", "thinking": "hmm",
      "signature": ""}, {"type": "text", "text": "Hi!"}])"));
  std::string thinking, text;
  for (const Json& e : r.events) {
    if (e["type"] != "content_block_delta") continue;
    if (e["delta"]["type"] == "thinking_delta") {
      EXPECT_EQ(e["index"], 0);
      thinking += e["delta"]["thinking"].get<std::string>();
    } else {
      EXPECT_EQ(e["index"], 1);
      text += e["delta"]["text"].get<std::string>();
    }
  }
  EXPECT_EQ(thinking, "hmm");
  EXPECT_EQ(text, "Hi!");
}

TEST(MessagesRendererTest, AFailureIsAnErrorEvent) {
  MessagesRenderer renderer("msg_1", "m");
  const std::vector<Json> e = events(renderer.failed(apiError(14, "worker gone")));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], Json::parse(R"({"type": "error", "error": {"type": "overloaded_error",
      "message": "worker gone"}})"));
}

}  // namespace
}  // namespace cleave::router::openai
