#include "services/router/request_validation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

namespace cleave::router {
namespace {

using ::testing::HasSubstr;

v1::GenerateRequest validRequest() {
  v1::GenerateRequest request;
  request.set_text("Hello");
  request.mutable_sampling()->set_temperature(0.7f);
  request.mutable_sampling()->set_top_p(0.9f);
  request.mutable_sampling()->set_top_k(40);
  request.mutable_sampling()->set_min_p(0.05f);
  request.mutable_sampling()->set_repetition_penalty(1.1f);
  request.mutable_sampling()->set_presence_penalty(-2.0f);
  request.mutable_sampling()->set_frequency_penalty(2.0f);
  request.mutable_stopping()->set_max_new_tokens(16);
  request.mutable_stopping()->add_stop("\n\n");
  request.set_logprobs(kMaxLogprobs);
  return request;
}

// A JSON schema is compiled where the request arrives: what the decoder cannot enforce is
// refused there, naming the keyword; a schema without its format, or with ignore_eos, too.
TEST(RequestValidationTest, JsonSchemasAreCheckedOnArrival) {
  v1::GenerateRequest r = validRequest();
  r.mutable_sampling()->set_response_format(v1::RESPONSE_FORMAT_JSON_SCHEMA);
  r.mutable_sampling()->set_json_schema(R"({"type": "object", "properties": {"a": {}}})");
  EXPECT_TRUE(validateGenerateRequest(r).ok()) << validateGenerateRequest(r);
  r.mutable_sampling()->set_json_schema(R"({"type": "object", "minProperties": 1})");
  EXPECT_EQ(validateGenerateRequest(r).code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(validateGenerateRequest(r).message()),
              ::testing::HasSubstr("sampling.json_schema: at /: \"minProperties\""));
  r.mutable_sampling()->set_json_schema("{");
  EXPECT_EQ(validateGenerateRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.mutable_sampling()->set_json_schema(std::string(kMaxJsonSchemaBytes + 1, ' '));
  EXPECT_EQ(validateGenerateRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.mutable_sampling()->set_json_schema(R"({"type": "object"})");
  r.mutable_sampling()->set_response_format(v1::RESPONSE_FORMAT_TEXT);
  EXPECT_EQ(validateGenerateRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.mutable_sampling()->set_response_format(v1::RESPONSE_FORMAT_JSON_SCHEMA);
  r.mutable_stopping()->set_ignore_eos(true);
  EXPECT_EQ(validateGenerateRequest(r).code(), absl::StatusCode::kInvalidArgument);
}

// A regex or choice is compiled on arrival too; it cannot be combined with the other
// constraints, nor with ignore_eos or min_new_tokens (its end is the end-of-sequence token).
TEST(RequestValidationTest, RegexesAndChoicesAreCheckedOnArrival) {
  auto message = [](const v1::GenerateRequest& r) {
    return std::string(validateGenerateRequest(r).message());
  };
  v1::GenerateRequest r = validRequest();
  r.mutable_sampling()->set_regex(R"(\d{3}-[a-z]+)");
  EXPECT_TRUE(validateGenerateRequest(r).ok()) << validateGenerateRequest(r);
  r.mutable_sampling()->set_regex("(a)\\1");
  EXPECT_EQ(validateGenerateRequest(r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message(r), ::testing::HasSubstr("sampling.regex: "));
  EXPECT_THAT(message(r), ::testing::HasSubstr("backreference"));
  r.mutable_sampling()->set_regex("a");
  r.mutable_sampling()->add_choice("b");
  EXPECT_THAT(message(r), ::testing::HasSubstr("cannot both be set"));
  r.mutable_sampling()->clear_regex();
  EXPECT_TRUE(validateGenerateRequest(r).ok()) << validateGenerateRequest(r);
  r.mutable_sampling()->set_response_format(v1::RESPONSE_FORMAT_JSON_OBJECT);
  EXPECT_THAT(message(r), ::testing::HasSubstr("JSON response_format"));
  r.mutable_sampling()->set_response_format(v1::RESPONSE_FORMAT_TEXT);
  r.mutable_sampling()->add_allowed_token_ids(3);
  EXPECT_THAT(message(r), ::testing::HasSubstr("allowed_token_ids"));
  r.mutable_sampling()->clear_allowed_token_ids();
  r.mutable_stopping()->set_ignore_eos(true);
  EXPECT_THAT(message(r), ::testing::HasSubstr("ignore_eos"));
  r.mutable_stopping()->set_ignore_eos(false);
  r.mutable_sampling()->add_choice("");
  EXPECT_THAT(message(r), ::testing::HasSubstr("sampling.choice[1]"));
}

// A grammar is compiled on arrival, and alone among the output constraints.
TEST(RequestValidationTest, GrammarsAreCheckedOnArrival) {
  auto message = [](const v1::GenerateRequest& r) {
    return std::string(validateGenerateRequest(r).message());
  };
  v1::GenerateRequest r = validRequest();
  r.mutable_sampling()->set_grammar(R"(root ::= "a" [0-9]*)");
  EXPECT_TRUE(validateGenerateRequest(r).ok()) << validateGenerateRequest(r);
  r.mutable_sampling()->set_grammar("root ::= x");
  EXPECT_EQ(validateGenerateRequest(r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message(r), ::testing::HasSubstr("sampling.grammar: the grammar uses rule 'x'"));
  r.mutable_sampling()->set_grammar(R"(root ::= "a")");
  r.mutable_sampling()->set_regex("a");
  EXPECT_THAT(message(r), ::testing::HasSubstr("cannot be combined with sampling.regex"));
  r.mutable_sampling()->clear_regex();
  r.mutable_sampling()->set_response_format(v1::RESPONSE_FORMAT_JSON_OBJECT);
  EXPECT_THAT(message(r), ::testing::HasSubstr("sampling.grammar cannot be combined with a JSON"));
  r.mutable_sampling()->set_response_format(v1::RESPONSE_FORMAT_TEXT);
  r.mutable_stopping()->set_min_new_tokens(2);
  EXPECT_THAT(message(r), ::testing::HasSubstr("min_new_tokens must not be set"));
}

TEST(RequestValidationTest, AcceptsAValidRequestAndUnsetOptionals) {
  EXPECT_TRUE(validateGenerateRequest(validRequest()).ok());
  v1::GenerateRequest minimal;
  minimal.mutable_token_ids()->add_ids(1);
  EXPECT_TRUE(validateGenerateRequest(minimal).ok());
}

struct Case {
  const char* field;
  std::function<void(v1::GenerateRequest&)> mutate;
};

TEST(RequestValidationTest, EachBadValueIsNamedInTheError) {
  const std::vector<Case> cases = {
      {"no input", [](auto& r) { r.clear_input(); }},
      {"text is empty", [](auto& r) { r.set_text(""); }},
      {"token_ids.ids is empty", [](auto& r) { r.mutable_token_ids(); }},
      {"sampling.temperature", [](auto& r) { r.mutable_sampling()->set_temperature(-0.1f); }},
      {"sampling.temperature", [](auto& r) { r.mutable_sampling()->set_temperature(NAN); }},
      {"sampling.top_p", [](auto& r) { r.mutable_sampling()->set_top_p(0.0f); }},
      {"sampling.top_p", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }},
      {"sampling.top_k", [](auto& r) { r.mutable_sampling()->set_top_k(-1); }},
      {"sampling.min_p", [](auto& r) { r.mutable_sampling()->set_min_p(1.01f); }},
      {"sampling.repetition_penalty",
       [](auto& r) { r.mutable_sampling()->set_repetition_penalty(0.0f); }},
      {"sampling.presence_penalty",
       [](auto& r) { r.mutable_sampling()->set_presence_penalty(2.5f); }},
      {"sampling.frequency_penalty",
       [](auto& r) { r.mutable_sampling()->set_frequency_penalty(-3.0f); }},
      {"stopping.max_new_tokens", [](auto& r) { r.mutable_stopping()->set_max_new_tokens(0); }},
      {"stopping.min_new_tokens", [](auto& r) { r.mutable_stopping()->set_min_new_tokens(17); }},
      {"stopping.stop[1]", [](auto& r) { r.mutable_stopping()->add_stop(""); }},
      {"stopping.stop[1]",
       [](auto& r) { r.mutable_stopping()->add_stop(std::string(kMaxStopStringBytes + 1, 'x')); }},
      {"stopping.stop",
       [](auto& r) {
         for (size_t i = 0; i < kMaxStopStrings; ++i) r.mutable_stopping()->add_stop("s");
       }},
      {"sampling.logit_bias[3]",
       [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[3] = 100.5f; }},
      {"sampling.logit_bias",
       [](auto& r) {
         for (uint32_t t = 0; t <= kMaxLogitBiasEntries; ++t)
           (*r.mutable_sampling()->mutable_logit_bias())[t] = 1.0f;
       }},
      {"sampling.allowed_token_ids",
       [](auto& r) {
         for (int t = 0; t <= kMaxAllowedTokens; ++t)
           r.mutable_sampling()->add_allowed_token_ids(1);
       }},
      {"sampling.allowed_token_ids cannot be combined with a JSON response_format",
       [](auto& r) {
         r.mutable_sampling()->set_response_format(v1::RESPONSE_FORMAT_JSON_OBJECT);
         r.mutable_sampling()->add_allowed_token_ids(5);
       }},
      {"stopping.min_new_tokens cannot hold off the end of a JSON output",
       [](auto& r) {
         r.mutable_sampling()->set_response_format(v1::RESPONSE_FORMAT_JSON_OBJECT);
         r.mutable_stopping()->set_min_new_tokens(2);
       }},
      {"logprobs", [](auto& r) { r.set_logprobs(kMaxLogprobs + 1); }},
      {"request_id", [](auto& r) { r.set_request_id(std::string(kMaxRequestIdBytes + 1, 'r')); }},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest request = validRequest();
    c.mutate(request);
    absl::Status status = validateGenerateRequest(request);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(status.message(), HasSubstr(c.field));
  }
}

}  // namespace
}  // namespace cleave::router
