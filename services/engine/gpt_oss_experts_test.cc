#include "services/engine/gpt_oss_experts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/model/dequant_kernels.h"

namespace cleave::engine {
namespace {

// E2M1 code x 2^(exponent - 127), written from the format's definition.
float mxfp4Value(uint8_t code, uint8_t exponent) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = std::ldexp(kMagnitude[code & 7], int{exponent} - 127);
  return code & 8 ? -v : v;
}

// Every code with exponents across the half-float range (subnormal 2^-24 to 2^15) becomes the
// same value as a Q8_0 element; an exponent a half cannot hold, or E8M0's NaN, leaves E2M1.
TEST(Mxfp4AsQ8_0Test, HoldsTheSameValuesWhereAHalfHoldsTheScale) {
  std::mt19937 rng(9);
  const int64_t rows = 7, cols = 96;
  std::vector<uint8_t> codes(rows * cols / 2), exps(rows * cols / 32);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng());
  const uint8_t edges[] = {104, 113, 114, 127, 128, 143};  // 2^(e - 128): -24, -15, -14, ...
  for (size_t g = 0; g < exps.size(); ++g) exps[g] = edges[g % 6];
  auto q8 = mxfp4AsQ8_0(codes, exps, rows, cols);
  ASSERT_TRUE(q8.has_value());
  std::vector<float> got(rows * cols);
  model::dequant::q8_0((*q8)->data(), got.data(), rows * cols / 32);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const uint8_t code = i % 2 == 0 ? codes[i / 2] & 0x0f : codes[i / 2] >> 4;
    ASSERT_EQ(got[i], mxfp4Value(code, exps[i / 32])) << "element " << i;
  }
  for (uint8_t beyond : {uint8_t{103}, uint8_t{144}, uint8_t{0xFF}}) {
    exps[5] = beyond;
    EXPECT_FALSE(mxfp4AsQ8_0(codes, exps, rows, cols).has_value()) << int{beyond};
  }
}

}  // namespace
}  // namespace cleave::engine
