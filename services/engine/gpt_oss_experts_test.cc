#include "services/engine/gpt_oss_experts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/model/tensor_type.h"

namespace cleave::engine {
namespace {

// E2M1 code x 2^(exponent - 127), written from the OCP MX definition.
double mxfp4Value(uint8_t code, uint8_t exponent) {
  static constexpr double kMagnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  const double v = std::ldexp(kMagnitude[code & 7], int{exponent} - 127);
  return code & 8 ? -v : v;
}

// OpenAI's groups (element 2k in the low nibble of byte k) regrouped as GGUF MXFP4 blocks hold
// the same values, every code and exponents across E8M0's range (subnormal floats included).
TEST(Mxfp4BlocksTest, HoldTheValuesOfTheGroupsTheyComeFrom) {
  std::mt19937 rng(9);
  const int64_t groups = 64;
  std::vector<uint8_t> codes(groups * 16), exps(groups);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng());
  for (int64_t g = 0; g < groups; ++g) exps[g] = static_cast<uint8_t>(g < 4 ? g : rng() % 254);
  const std::vector<uint8_t> blocks = mxfp4Blocks(codes.data(), exps.data(), groups);
  ASSERT_EQ(blocks.size(), static_cast<size_t>(groups * 17));
  std::vector<float> got(groups * 32, std::nanf(""));
  ASSERT_TRUE(
      model::dequantize(model::TensorType::kMXFP4, blocks.data(), got.size(), got.data()).ok());
  for (int64_t i = 0; i < groups * 32; ++i) {
    const uint8_t code = i % 2 == 0 ? codes[i / 2] & 0x0f : codes[i / 2] >> 4;
    ASSERT_EQ(static_cast<double>(got[i]), mxfp4Value(code, exps[i / 32])) << "element " << i;
  }
}

}  // namespace
}  // namespace cleave::engine
