#include "services/engine/logit_adjustments.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace cleave::engine {
namespace {

using ::testing::HasSubstr;

constexpr float kNever = -std::numeric_limits<float>::infinity();

std::vector<float> randomRow(size_t n) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> row(n);
  for (float& x : row) x = normal(rng);
  return row;
}

TEST(LogitAdjustmentsTest, BadValuesNameTheirField) {
  EXPECT_TRUE(validate({.bias = {{3, -100.0f}, {9, 100.0f}}, .allowed = {0, 9}}, 10).ok());
  EXPECT_THAT(validate({.bias = {{10, 1.0f}}}, 10).message(), HasSubstr("logit_bias: token id 10"));
  EXPECT_THAT(validate({.bias = {{2, 100.5f}}}, 10).message(), HasSubstr("logit_bias"));
  EXPECT_THAT(validate({.bias = {{2, std::nanf("")}}}, 10).message(), HasSubstr("logit_bias"));
  EXPECT_THAT(validate({.allowed = {1, 12}}, 10).message(),
              HasSubstr("allowed_token_ids: token id 12"));
  EXPECT_TRUE(validate({.banned = {{1}, {2, 3, 9}}}, 10).ok());
  EXPECT_THAT(validate({.banned = {{1}, {2, 10}}}, 10).message(),
              HasSubstr("bad_words_token_ids[1]: token id 10"));
  EXPECT_THAT(validate({.banned = {{}}}, 10).message(), HasSubstr("bad_words_token_ids[0]"));
  EXPECT_THAT(
      validate({.banned = std::vector<std::vector<uint32_t>>(kMaxBannedSequences + 1, {1})}, 10)
          .message(),
      HasSubstr("bad_words_token_ids"));
}

// A banned sequence's last token is -infinity exactly where the output ends with the rest of
// it: every output of up to 4 tokens over a vocabulary of 3, against a direct check.
TEST(LogitAdjustmentsTest, BannedSequencesEndNowhere) {
  const LogitAdjustments banned{.banned = {{2}, {0, 1}, {1, 1, 0}}};
  const std::vector<float> model = randomRow(3);
  int checked = 0;
  for (int length = 0; length <= 4; ++length) {
    for (int code = 0; code < (1 << (2 * length)); ++code) {
      std::vector<uint32_t> output;
      bool valid = true;
      for (int i = 0; i < length; ++i) {
        const uint32_t t = (code >> (2 * i)) & 3;
        valid = valid && t < 3;
        output.push_back(t);
      }
      if (!valid) continue;
      std::vector<float> row = model;
      applyAdjustments(banned, output, {}, row);
      auto endsWith = [&](std::vector<uint32_t> tail) {
        return output.size() >= tail.size() &&
               std::equal(tail.begin(), tail.end(), output.end() - tail.size());
      };
      const bool ban[3] = {endsWith({1, 1}), endsWith({0}), true};
      for (uint32_t t = 0; t < 3; ++t) EXPECT_EQ(row[t], ban[t] ? kNever : model[t]) << length;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 1 + 3 + 9 + 27 + 81);
}

TEST(LogitAdjustmentsTest, BiasThenAllowedThenHeldOff) {
  const std::vector<float> model = randomRow(8);
  std::vector<float> row = model;
  applyAdjustments({.bias = {{1, 2.5f}, {4, -1.0f}}}, {}, {}, row);
  for (size_t t = 0; t < row.size(); ++t) {
    const float want = model[t] + (t == 1 ? 2.5f : t == 4 ? -1.0f : 0.0f);
    EXPECT_FLOAT_EQ(row[t], want) << t;
  }
  row = model;
  const uint32_t held[] = {5};
  applyAdjustments({.bias = {{3, 1.0f}}, .allowed = {3, 5, 6}}, {}, held, row);
  EXPECT_THAT(row, ::testing::ElementsAre(kNever, kNever, kNever, model[3] + 1.0f, kNever, kNever,
                                          model[6], kNever));
  // A held-off token stays possible when nothing else is.
  row = model;
  applyAdjustments({.allowed = {5}}, {}, held, row);
  EXPECT_FLOAT_EQ(row[5], model[5]);
}

}  // namespace
}  // namespace cleave::engine
