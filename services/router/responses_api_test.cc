// The Responses API on the chat path: requests into chat calls (input items, instructions,
// tools, text.format, limits) and refusals naming the field; replies into response objects
// and into the API's event stream, whose deltas add up to the object's text.
#include "services/router/responses_api.h"

#include "services/router/reply_test_util.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cleave::router::openai {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

TEST(ResponsesRequestTest, InputItemsBecomeChatMessages) {
  auto call = parseResponsesRequest(Json::parse(R"({"input": "Hi", "instructions": "Be brief.",
      "max_output_tokens": 7, "temperature": 0.5, "seed": 3})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->endpoint, Endpoint::kResponses);
  EXPECT_EQ(chatMessages(*call), Json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"}])"));
  EXPECT_EQ(call->request.stopping().max_new_tokens(), 7u);
  EXPECT_FLOAT_EQ(call->request.sampling().temperature(), 0.5f);
  EXPECT_EQ(call->request.sampling().seed(), 3u);

  call = parseResponsesRequest(Json::parse(R"({"input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                      {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"type": "message", "role": "assistant",
       "content": [{"type": "output_text", "text": "Let me look."}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
      {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "2"},
      {"type": "function_call_output", "call_id": "c2", "output": "3"}]})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(chatMessages(*call), Json::parse(R"([
      {"role": "system", "content": "Use tools."},
      {"role": "user", "content": "a\nb"},
      {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {}}}]},
      {"role": "tool", "content": "2", "tool_call_id": "c1"},
      {"role": "tool", "content": "3", "tool_call_id": "c2"}])"));
}

TEST(ResponsesRequestTest, ToolsAndFormatsTakeTheChatShapes) {
  auto call = parseResponsesRequest(Json::parse(R"({"input": "x",
      "tools": [{"type": "function", "name": "get_weather", "description": "d",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
      "tool_choice": {"type": "function", "name": "get_weather"}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(Json::parse(call->request.chat().tools_json()), Json::parse(R"([{"type": "function",
      "function": {"name": "get_weather", "description": "d",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])"));
  EXPECT_EQ(call->forced_tool, "get_weather");

  call = parseResponsesRequest(Json::parse(R"({"input": "x", "text": {"format": {
      "type": "json_schema", "name": "cat", "schema": {"type": "object",
      "properties": {"age": {"type": "integer"}}}}}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.sampling().response_format(), v1::RESPONSE_FORMAT_JSON_SCHEMA);
  EXPECT_EQ(Json::parse(call->request.sampling().json_schema()),
            Json::parse(R"({"type": "object", "properties": {"age": {"type": "integer"}}})"));

  call = parseResponsesRequest(Json::parse(R"({"input": "x", "top_logprobs": 2,
      "include": ["message.output_text.logprobs"]})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_TRUE(call->logprobs);
  EXPECT_EQ(call->request.logprobs(), 2u);
}

// A stored conversation (the items of earlier turns) comes after the new instructions and
// before the new input; the earlier turns' outputs read as input items.
TEST(ResponsesRequestTest, AStoredConversationComesBeforeTheInput) {
  const Json body = Json::parse(R"({"input": "And 3?", "instructions": "Be brief.",
      "previous_response_id": "resp_1", "store": false})");
  const Json history = Json::parse(R"([
      {"id": "msg_a", "type": "message", "role": "user",
       "content": [{"type": "input_text", "text": "2?"}]},
      {"id": "rs_b", "type": "reasoning", "status": "completed", "summary": [],
       "content": [{"type": "reasoning_text", "text": "hm"}]},
      {"id": "msg_c", "type": "message", "status": "completed", "role": "assistant",
       "content": [{"type": "output_text", "text": "Two.", "annotations": []}]}])");
  auto call = parseResponsesRequest(body, &history);
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(chatMessages(*call), Json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "2?"}, {"role": "assistant", "content": "Two."},
      {"role": "user", "content": "And 3?"}])"));
  // Without a store to read it from, previous_response_id is refused; so is a store that
  // is not a boolean.
  EXPECT_THAT(parseResponsesRequest(body).status().message(), HasSubstr("keeps no responses"));
  EXPECT_EQ(parseResponsesRequest(Json::parse(R"({"input": "x", "store": "yes"})"))
                .status()
                .GetPayload(kParamPayload)
                .value_or(absl::Cord("")),
            "store");
}

TEST(ResponsesRequestTest, InputItemsAreKeptAsItemsWithIds) {
  Json items = inputItems(Json::parse(R"({"input": "Hi"})"));
  ASSERT_EQ(items.size(), 1u);
  EXPECT_THAT(items[0]["id"].get<std::string>(), ::testing::StartsWith("msg_"));
  items[0].erase("id");
  EXPECT_EQ(items[0], Json::parse(R"({"type": "message", "role": "user",
      "content": [{"type": "input_text", "text": "Hi"}]})"));
  items = inputItems(Json::parse(R"({"input": [{"role": "assistant", "content": "A"},
      {"type": "function_call_output", "call_id": "c", "output": "1", "id": "mine"}]})"));
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0]["content"], Json::parse(R"([{"type": "output_text", "text": "A"}])"));
  EXPECT_EQ(items[0]["type"], "message");
  EXPECT_EQ(items[1]["id"], "mine");
  // What was kept parses back to the same messages.
  auto again = parseResponsesRequest(Json{{"input", items}});
  ASSERT_TRUE(again.ok()) << again.status();
  // Items of any shape are kept as they are (the parser refuses them first).
  items = inputItems(Json::parse(R"({"input": [{"type": 5, "role": 3, "content": "x"}, 7]})"));
  EXPECT_EQ(items[1], 7);
  EXPECT_FALSE(itemsPage(items, {.after = "x"}).ok());
  EXPECT_TRUE(itemsPage(Json::parse("[7, {}]"), {}).ok());
}

TEST(ResponsesRequestTest, InputItemsArePagedNewestFirstByDefault) {
  Json items = Json::array();
  for (int i = 0; i < 5; ++i) items.push_back({{"id", "i" + std::to_string(i)}});
  auto ids = [](const Json& page) {
    std::string out;
    for (const Json& item : page["data"]) out += item["id"].get<std::string>() + " ";
    return out;
  };
  auto page = itemsPage(items, {});
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(ids(*page), "i4 i3 i2 i1 i0 ");
  EXPECT_EQ((*page)["first_id"], "i4");
  EXPECT_EQ((*page)["last_id"], "i0");
  EXPECT_EQ((*page)["has_more"], false);
  page = itemsPage(items, {.limit = "2", .order = "asc"});
  EXPECT_EQ(ids(*page), "i0 i1 ");
  EXPECT_EQ((*page)["has_more"], true);
  page = itemsPage(items, {.limit = "2", .order = "asc", .after = "i1"});
  EXPECT_EQ(ids(*page), "i2 i3 ");
  EXPECT_EQ((*page)["has_more"], true);
  page = itemsPage(items, {.after = "i1"});
  EXPECT_EQ(ids(*page), "i0 ");
  EXPECT_EQ((*page)["has_more"], false);
  page = itemsPage(items, {.after = "i0"});
  EXPECT_TRUE((*page)["data"].empty());
  EXPECT_TRUE((*page)["first_id"].is_null());
  for (const auto& [query, param] :
       std::vector<std::pair<ItemsQuery, std::string>>{{{.limit = "0"}, "limit"},
                                                       {{.limit = "101"}, "limit"},
                                                       {{.limit = "x"}, "limit"},
                                                       {{.order = "up"}, "order"},
                                                       {{.after = "nope"}, "after"}}) {
    auto bad = itemsPage(items, query);
    ASSERT_FALSE(bad.ok()) << param;
    EXPECT_EQ(bad.status().GetPayload(kParamPayload).value_or(absl::Cord("")), param);
  }
}

TEST(ResponsesRequestTest, RefusalsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id"},
      {R"({"input": "x", "conversation": "conv_1"})", "conversation"},
      {R"({"input": "x", "background": true})", "background"},
      {R"({"input": ""})", "input"},
      {R"({"instructions": "x"})", "input"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})",
       "input[0].content[0].type"},
      {R"({"input": [{"role": "robot", "content": "x"}]})", "input[0].role"},
      {R"({"input": [{"type": "computer_call"}]})", "input[0].type"},
      {R"({"input": [{"type": "item_reference", "id": "msg_1"}]})", "input[0]"},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})",
       "input[0].call_id"},
      {R"({"input": "x", "tools": [{"type": "web_search_preview"}]})", "tools[0].type"},
      {R"({"input": "x", "tool_choice": {"type": "web_search_preview"}})", "tool_choice"},
      {R"({"input": "x", "text": {"format": {"type": "yaml"}}})", "text.format.type"},
      {R"({"input": "x", "max_output_tokens": 0})", "max_completion_tokens"},
  };
  for (const auto& [body, param] : cases) {
    auto call = parseResponsesRequest(Json::parse(body));
    ASSERT_FALSE(call.ok()) << body;
    EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument) << body;
    const auto payload = call.status().GetPayload(kParamPayload);
    ASSERT_TRUE(payload.has_value()) << body;
    EXPECT_EQ(std::string(*payload), param) << body << ": " << call.status();
  }
}

// A reply made by feeding `pieces` (then `final_text` with `reason`) through a builder,
// rendered whole and streamed.
Rendered render(const char* request, ToolCallFormat tools, const std::vector<std::string>& pieces,
                const std::string& final_text, v1::FinishReason reason,
                ReasoningFormat reasoning = ReasoningFormat::kNone) {
  const Json body = Json::parse(request);
  absl::StatusOr<Call> call = parseResponsesRequest(body);
  EXPECT_TRUE(call.ok()) << call.status();
  if (call->offers_tools) call->tool_calls = tools;
  call->reasoning = reasoning;
  return renderReply(
      *call, [&] { return std::make_unique<ResponsesRenderer>(body, "resp_1", "m", 5); }, pieces,
      last(final_text, reason));
}

TEST(ResponsesRendererTest, ATextReplyIsOneMessageWholeOrStreamed) {
  const Rendered r =
      render(R"({"input": "x", "max_output_tokens": 20, "metadata": {"k": "v"}})",
             ToolCallFormat::kNone, {"Hel", "lo, "}, "world", v1::FINISH_REASON_STOP_TOKEN);
  EXPECT_EQ(r.body["object"], "response");
  EXPECT_EQ(r.body["id"], "resp_1");
  EXPECT_EQ(r.body["status"], "completed");
  EXPECT_EQ(r.body["max_output_tokens"], 20);
  EXPECT_EQ(r.body["metadata"], Json::parse(R"({"k": "v"})"));
  ASSERT_EQ(r.body["output"].size(), 1u);
  const Json& message = r.body["output"][0];
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["content"][0], Json::parse(R"({"type": "output_text", "text": "Hello, world",
                                                  "annotations": []})"));
  EXPECT_EQ(r.body["usage"], Json::parse(R"({"input_tokens": 11,
      "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 5,
      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 16})"));

  EXPECT_THAT(types(r.events),
              ::testing::ElementsAre("response.created", "response.in_progress",
                                     "response.output_item.added", "response.content_part.added",
                                     "response.output_text.delta", "response.output_text.delta",
                                     "response.output_text.delta", "response.output_text.done",
                                     "response.content_part.done", "response.output_item.done",
                                     "response.completed"));
  std::string streamed;
  for (size_t i = 0; i < r.events.size(); ++i) {
    EXPECT_EQ(r.events[i]["sequence_number"], i);
    if (r.events[i]["type"] == "response.output_text.delta") {
      streamed += r.events[i]["delta"].get<std::string>();
      EXPECT_EQ(r.events[i]["item_id"], r.events[2]["item"]["id"]);
    }
  }
  EXPECT_EQ(streamed, "Hello, world");
  for (const Json& e : r.events) {  // The SDK's text events always carry logprobs.
    if (e["type"] == "response.output_text.delta" || e["type"] == "response.output_text.done")
      EXPECT_EQ(e["logprobs"], Json::array()) << e;
  }
  EXPECT_EQ(r.events[0]["response"]["status"], "in_progress");
  EXPECT_EQ(r.events[0]["response"]["usage"], nullptr);
  const Json& done = r.events.back()["response"];
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "Hello, world");
  EXPECT_EQ(done["usage"], r.body["usage"]);
}

TEST(ResponsesRendererTest, AReplyCutShortIsIncomplete) {
  const Rendered r =
      render(R"({"input": "x"})", ToolCallFormat::kNone, {"ab"}, "c", v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(r.body["status"], "incomplete");
  EXPECT_EQ(r.body["incomplete_details"], Json::parse(R"({"reason": "max_output_tokens"})"));
  EXPECT_EQ(r.events.back()["type"], "response.incomplete");
  EXPECT_EQ(r.events.back()["response"]["output"][0]["content"][0]["text"], "abc");
}

TEST(ResponsesRendererTest, ToolCallsAreFunctionCallItems) {
  const char* request = R"({"input": "Weather in Paris?", "tools": [{"type": "function",
      "name": "get_weather", "parameters": {"type": "object"}}]})";
  const Rendered r = render(
      request, ToolCallFormat::kHermes, {"Checking. <tool_call>{\"name\": \"get_weather\", "},
      "\"arguments\": {\"city\": \"Paris\"}}</tool_call>", v1::FINISH_REASON_STOP_TOKEN);
  ASSERT_EQ(r.body["output"].size(), 2u) << r.body.dump();
  EXPECT_EQ(r.body["output"][0]["content"][0]["text"], "Checking. ");
  const Json& call = r.body["output"][1];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(Json::parse(call["arguments"].get<std::string>()), Json::parse(R"({"city": "Paris"})"));
  EXPECT_THAT(call["call_id"].get<std::string>(), ::testing::StartsWith("call_"));
  EXPECT_THAT(call["id"].get<std::string>(), ::testing::StartsWith("fc_"));
  EXPECT_EQ(r.body["tools"][0]["name"], "get_weather");

  std::vector<std::string> t = types(r.events);
  EXPECT_EQ(std::count(t.begin(), t.end(), "response.function_call_arguments.done"), 1);
  const Json& done = r.events.back()["response"];
  ASSERT_EQ(done["output"].size(), 2u);
  EXPECT_EQ(done["output"][1]["arguments"], call["arguments"]);
  EXPECT_EQ(done["output"][1]["status"], "completed");
}

// With a reasoning parser, the reasoning is an item of its own before the message, whole
// or streamed (its item done before the message's is added).
TEST(ResponsesRendererTest, ReasoningIsAnItemBeforeTheMessage) {
  const Rendered r = render(R"({"input": "x"})", ToolCallFormat::kNone,
                            {"Paris is the ", "capital.</th", "ink>It is "}, "Paris.",
                            v1::FINISH_REASON_STOP_TOKEN, ReasoningFormat::kDeepSeekR1);
  ASSERT_EQ(r.body["output"].size(), 2u) << r.body.dump();
  EXPECT_EQ(r.body["output"][0]["type"], "reasoning");
  EXPECT_EQ(r.body["output"][0]["content"][0]["text"], "Paris is the capital.");
  EXPECT_EQ(r.body["output"][1]["content"][0]["text"], "It is Paris.");
  std::string reasoning, text;
  std::vector<std::string> order;
  for (const Json& e : r.events) {
    if (e["type"] == "response.reasoning_text.delta") reasoning += e["delta"].get<std::string>();
    if (e["type"] == "response.output_text.delta") text += e["delta"].get<std::string>();
    if (e["type"] == "response.output_item.added" || e["type"] == "response.output_item.done") {
      order.push_back(e["type"].get<std::string>().substr(21) + " " +
                      e["item"]["type"].get<std::string>() + " " +
                      std::to_string(e["output_index"].get<int>()));
    }
  }
  EXPECT_EQ(reasoning, "Paris is the capital.");
  EXPECT_EQ(text, "It is Paris.");
  EXPECT_THAT(order, ::testing::ElementsAre("added reasoning 0", "done reasoning 0",
                                            "added message 1", "done message 1"));
  // The same items as the whole response's (ids are each renderer's own).
  Json streamed = r.events.back()["response"]["output"], whole = r.body["output"];
  for (Json* items : {&streamed, &whole}) {
    for (Json& item : *items) item.erase("id");
  }
  EXPECT_EQ(streamed, whole);
}

TEST(ResponsesRendererTest, AnEmptyReplyIsAnEmptyMessageAndAFailureIsAnEvent) {
  const Rendered r =
      render(R"({"input": "x"})", ToolCallFormat::kNone, {}, "", v1::FINISH_REASON_STOP_TOKEN);
  ASSERT_EQ(r.body["output"].size(), 1u);
  EXPECT_EQ(r.body["output"][0]["content"][0]["text"], "");
  ASSERT_EQ(r.events.back()["response"]["output"].size(), 1u);
  EXPECT_EQ(r.events.back()["response"]["output"][0]["content"][0]["text"], "");

  ResponsesRenderer renderer(Json::parse(R"({"input": "x"})"), "resp_2", "m", 5);
  std::string stream = renderer.started();
  stream += renderer.failed(apiError(14, "the decode worker went away"));
  const std::vector<Json> failed = events(stream);
  ASSERT_EQ(failed.size(), 4u);
  EXPECT_EQ(failed[2]["type"], "error");
  EXPECT_EQ(failed[2]["message"], "the decode worker went away");
  EXPECT_EQ(failed[3]["response"]["status"], "failed");
  EXPECT_EQ(failed[3]["response"]["error"]["message"], "the decode worker went away");
}

}  // namespace
}  // namespace cleave::router::openai
