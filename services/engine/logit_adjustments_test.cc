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
}

TEST(LogitAdjustmentsTest, BiasThenAllowedThenHeldOff) {
  const std::vector<float> model = randomRow(8);
  std::vector<float> row = model;
  applyAdjustments({.bias = {{1, 2.5f}, {4, -1.0f}}}, {}, row);
  for (size_t t = 0; t < row.size(); ++t) {
    const float want = model[t] + (t == 1 ? 2.5f : t == 4 ? -1.0f : 0.0f);
    EXPECT_FLOAT_EQ(row[t], want) << t;
  }
  row = model;
  const uint32_t held[] = {5};
  applyAdjustments({.bias = {{3, 1.0f}}, .allowed = {3, 5, 6}}, held, row);
  EXPECT_THAT(row, ::testing::ElementsAre(kNever, kNever, kNever, model[3] + 1.0f, kNever, kNever,
                                          model[6], kNever));
  // A held-off token stays possible when nothing else is.
  row = model;
  applyAdjustments({.allowed = {5}}, held, row);
  EXPECT_FLOAT_EQ(row[5], model[5]);
}

}  // namespace
}  // namespace cleave::engine
