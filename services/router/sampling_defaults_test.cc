#include "services/router/sampling_defaults.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace cleave::router {
namespace {

using ::testing::HasSubstr;

class SamplingDefaultsTest : public ::testing::Test {
 protected:
  std::string folder(const std::string& generation_config) {
    std::ofstream(dir_ / "generation_config.json") << generation_config;
    return dir_.string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_ = [] {
    auto d =
        std::filesystem::temp_directory_path() /
        ("cleave-sampling-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(d);
    return d;
  }();
};

TEST_F(SamplingDefaultsTest, AModelsRecommendationsFillWhatARequestLeavesUnset) {
  // Qwen3's, with do_sample (which vLLM ignores too) and fields that are not sampling.
  auto defaults = readSamplingDefaults(folder(R"({"do_sample": true, "eos_token_id": [1, 2],
      "temperature": 0.6, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.05})"));
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(describeSamplingDefaults(*defaults),
            "temperature 0.6, top_p 0.95, top_k 20, repetition_penalty 1.05");
  v1::SamplingParams request;
  request.set_temperature(0);  // Greedy, as the client asked.
  request.set_top_k(0);        // Off, as the client asked.
  applySamplingDefaults(*defaults, request);
  EXPECT_EQ(request.temperature(), 0);
  EXPECT_EQ(request.top_k(), 0);
  EXPECT_FLOAT_EQ(request.top_p(), 0.95f);
  EXPECT_FLOAT_EQ(request.repetition_penalty(), 1.05f);
  EXPECT_FALSE(request.has_min_p());
  // top_k -1 in a model's file is no filter, as in a request.
  defaults = readSamplingDefaults(folder(R"({"top_k": -1, "min_p": 0.0})"));
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->top_k(), 0);
  EXPECT_TRUE(defaults->has_min_p());
}

TEST_F(SamplingDefaultsTest, NoFileOrAGgufRecommendsNothing) {
  auto none = readSamplingDefaults(dir_.string());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(describeSamplingDefaults(*none), "");
  auto file = readSamplingDefaults((dir_ / "model.gguf").string());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(describeSamplingDefaults(*file), "");
}

TEST_F(SamplingDefaultsTest, ValuesNoRequestCouldSetNameTheFileAndField) {
  for (const auto& [text, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"temperature": -1})", "temperature"},
           {R"({"top_p": 0})", "top_p"},
           {R"({"top_k": 2.5})", "top_k"},
           {R"({"min_p": "a"})", "min_p"},
           {R"({"repetition_penalty": 0})", "repetition_penalty"},
           {R"([1])", "not a JSON object"}}) {
    auto defaults = readSamplingDefaults(folder(text));
    ASSERT_FALSE(defaults.ok()) << text;
    EXPECT_THAT(defaults.status().message(), HasSubstr("generation_config.json")) << text;
    EXPECT_THAT(defaults.status().message(), HasSubstr(field)) << text;
  }
}

}  // namespace
}  // namespace cleave::router
