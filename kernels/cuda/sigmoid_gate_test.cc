// The sigmoid gates against float64 on fresh random bf16 inputs: gated attention's per-value
// gate over strided rows (a qkv row's gate columns), and the shared expert's per-row gate
// σ(input · weight) with rows wider and narrower than a block. Values past each row stay as
// they were (poison checked).
#include "kernels/cuda/sigmoid_gate.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_test_util.h"

namespace cleave::cuda {
namespace {

using testing::bf16;
using testing::DeviceBuffer;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(SigmoidGateTest, EachValueTimesSigmoidOfItsGate) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  const int64_t rows = 5, cols = 300, stride = 311, gate_stride = 700;
  std::vector<bf16> x = testing::randomBf16(rows * stride, rng, 2.0f);
  for (int64_t r = 0; r < rows; ++r)  // poison past each row's values
    for (int64_t i = cols; i < stride; ++i) x[r * stride + i] = __float2bfloat16(NAN);
  const std::vector<bf16> gate = testing::randomBf16(rows * gate_stride, rng, 4.0f);
  DeviceBuffer<bf16> d_x(x), d_gate(gate);
  ASSERT_TRUE(
      sigmoidGate(d_x.get(), stride, d_gate.get() + 17, gate_stride, rows, cols, nullptr).ok());
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> got = testing::toFloat(d_x.copyToHost());
  std::vector<float> got_rows, want;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) {
      got_rows.push_back(got[r * stride + i]);
      want.push_back(static_cast<float>(testing::toFloat(x[r * stride + i]) *
                                        sigmoid(testing::toFloat(gate[r * gate_stride + 17 + i]))));
    }
    for (int64_t i = cols; i < stride; ++i) EXPECT_TRUE(std::isnan(got[r * stride + i]));
  }
  const testing::Difference d = testing::compare(got_rows, want);
  EXPECT_EQ(d.non_finite, 0);
  EXPECT_LE(d.relative_l2, 8e-3);
}

TEST(SigmoidGateTest, EachRowTimesSigmoidOfItsDotProduct) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (const int64_t in_cols : {19, 1000}) {
    SCOPED_TRACE(in_cols);
    const int64_t rows = 6, cols = 130, stride = 140;
    std::vector<bf16> x = testing::randomBf16(rows * stride, rng, 2.0f);
    const std::vector<bf16> input = testing::randomBf16(rows * in_cols, rng);
    std::vector<float> weight(in_cols);
    for (float& w : weight) w = 3.0f * unit(rng) / std::sqrt(static_cast<float>(in_cols));
    DeviceBuffer<bf16> d_x(x), d_input(input);
    DeviceBuffer<float> d_weight(weight);
    ASSERT_TRUE(sigmoidRowGate(d_x.get(), stride, d_input.get(), in_cols, d_weight.get(), in_cols,
                               rows, cols, nullptr)
                    .ok());
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    const std::vector<float> got = testing::toFloat(d_x.copyToHost());
    std::vector<float> got_rows, want;
    for (int64_t r = 0; r < rows; ++r) {
      double dot = 0;
      for (int64_t k = 0; k < in_cols; ++k)
        dot += double(testing::toFloat(input[r * in_cols + k])) * weight[k];
      for (int64_t i = 0; i < cols; ++i) {
        got_rows.push_back(got[r * stride + i]);
        want.push_back(static_cast<float>(testing::toFloat(x[r * stride + i]) * sigmoid(dot)));
      }
      for (int64_t i = cols; i < stride; ++i)  // untouched
        EXPECT_EQ(got[r * stride + i], testing::toFloat(x[r * stride + i]));
    }
    const testing::Difference d = testing::compare(got_rows, want);
    EXPECT_EQ(d.non_finite, 0);
    EXPECT_LE(d.relative_l2, 8e-3);
  }
}

}  // namespace
}  // namespace cleave::cuda
