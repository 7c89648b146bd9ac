#include "services/router/openai_embeddings.h"

#include <gtest/gtest.h>

#include "services/router/openai_fields.h"
#include "services/router/openai_requests.h"

namespace cleave::router::openai {
namespace {

using Json = nlohmann::json;

TEST(EmbeddingsRequestTest, EachInputIsOneCallWithTheSharedSettings) {
  auto call = parseEmbeddingsRequest(Json::parse(R"({
      "model": "m", "input": ["a b", [5, 6, 7], "c"], "encoding_format": "base64",
      "truncate_prompt_tokens": 2, "normalize": false, "add_special_tokens": false})"));
  ASSERT_TRUE(call.ok()) << call.status();
  ASSERT_EQ(call->inputs.size(), 3u);
  EXPECT_TRUE(call->base64);
  EXPECT_EQ(call->inputs[0].text(), "a b");
  EXPECT_EQ(std::vector<uint32_t>(call->inputs[1].token_ids().ids().begin(),
                                  call->inputs[1].token_ids().ids().end()),
            (std::vector<uint32_t>{5, 6, 7}));
  for (const v1::EmbedRequest& r : call->inputs) {
    EXPECT_EQ(r.model(), "m");
    EXPECT_EQ(r.truncate_prompt_tokens(), 2);
    EXPECT_FALSE(r.normalize());
    EXPECT_FALSE(r.add_special_tokens());
  }
  // One input: a string, or token ids; settings left unset stay unset.
  call = parseEmbeddingsRequest(Json::parse(R"({"input": [1, 2]})"));
  ASSERT_TRUE(call.ok()) << call.status();
  ASSERT_EQ(call->inputs.size(), 1u);
  EXPECT_EQ(call->inputs[0].token_ids().ids_size(), 2);
  EXPECT_FALSE(call->inputs[0].has_normalize());
  EXPECT_FALSE(call->inputs[0].has_add_special_tokens());
  EXPECT_FALSE(call->base64);
}

TEST(EmbeddingsRequestTest, AConversationIsOneInputWithoutAReplyPrompt) {
  auto call = parseEmbeddingsRequest(
      Json::parse(R"({"messages": [{"role": "user", "content": "hi"}], "normalize": false})"));
  ASSERT_TRUE(call.ok()) << call.status();
  ASSERT_EQ(call->inputs.size(), 1u);
  ASSERT_TRUE(call->inputs[0].has_chat());
  EXPECT_EQ(call->inputs[0].chat().messages(0).content(), "hi");
  EXPECT_FALSE(call->inputs[0].chat().add_generation_prompt());
  EXPECT_FALSE(call->inputs[0].normalize());
  call = parseEmbeddingsRequest(Json::parse(
      R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_TRUE(call->inputs[0].chat().add_generation_prompt());
}

TEST(EmbeddingsRequestTest, RefusalsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({})", "input"},
      {R"({"input": ""})", "input"},
      {R"({"input": ["a", ""]})", "input[1]"},
      {R"({"input": [[1], []]})", "input[1]"},
      {R"({"input": [1, "a"]})", "input[1]"},
      {R"({"input": 3})", "input"},
      {R"({"input": "a", "encoding_format": "int8"})", "encoding_format"},
      {R"({"input": "a", "dimensions": 32})", "dimensions"},
      {R"({"input": "a", "truncate_prompt_tokens": 0})", "truncate_prompt_tokens"},
      {R"({"input": "a", "normalize": "yes"})", "normalize"},
      {R"({"input": "a", "model": 1})", "model"},
      {R"({"input": "a", "messages": [{"role": "user", "content": "b"}]})", "input"},
      {R"({"messages": []})", "messages"},
  };
  for (const auto& [body, param] : cases) {
    absl::StatusOr<EmbeddingsCall> call = parseEmbeddingsRequest(Json::parse(body));
    ASSERT_FALSE(call.ok()) << body;
    EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_EQ(std::string(call.status().GetPayload(kParamPayload).value_or(absl::Cord())), param)
        << body << ": " << call.status();
  }
}

TEST(EmbeddingsResponseTest, Base64CarriesLittleEndianFloat32) {
  v1::EmbedResponse e;
  e.add_embedding(1.0f);
  e.add_embedding(-2.5f);
  e.set_prompt_tokens(4);
  EXPECT_EQ(base64Floats(e.embedding()), "AACAPwAAIMA=");
  v1::EmbedResponse other = e;
  other.set_prompt_tokens(3);
  const Json body = embeddingsResponse({e, other}, /*base64=*/false, "m");
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
  ASSERT_EQ(body["data"].size(), 2u);
  EXPECT_EQ(body["data"][1]["index"], 1);
  EXPECT_EQ(body["data"][0]["object"], "embedding");
  EXPECT_EQ(body["data"][0]["embedding"], Json::parse("[1.0, -2.5]"));
  EXPECT_EQ(embeddingsResponse({e}, /*base64=*/true, "m")["data"][0]["embedding"], "AACAPwAAIMA=");
}

}  // namespace
}  // namespace cleave::router::openai
