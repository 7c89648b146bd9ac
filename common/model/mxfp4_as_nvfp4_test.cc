// mxfp4AsNvfp4 against the MXFP4 values as model::dequantize decodes them (bit for bit with
// ggml): random codes, exponents spread over each row; bit-identical where a row's exponents
// span at most 17 below its largest, within the documented rounding where they span more.
#include "common/model/mxfp4_as_nvfp4.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/model/tensor_type.h"

namespace cleave::model {
namespace {

constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float e2m1(uint8_t code) { return (code & 8 ? -1.0f : 1.0f) * kE2m1[code & 7]; }

float e4m3(uint8_t byte) {
  float v = 0.0f;
  EXPECT_TRUE(dequantize(TensorType::kF8E4M3, &byte, 1, &v).ok());
  return v;
}

// The values the NVFP4 rows hold: e2m1 x e4m3 group scale x row scale.
std::vector<float> values(const Nvfp4Rows& n, int64_t rows, int64_t cols) {
  std::vector<float> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = n.codes[(r * cols + c) / 2];
      const uint8_t code = c % 2 == 0 ? byte & 0x0f : byte >> 4;
      out[r * cols + c] = e2m1(code) * e4m3(n.scales[(r * cols + c) / 16]) * n.row_scales[r];
    }
  return out;
}

// MXFP4 rows of random codes; row r's largest exponent tops[r], its other blocks' exponents
// drawn `span` or fewer below it.
std::vector<uint8_t> randomRows(const std::vector<int>& tops, int64_t cols, int span,
                                std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255), below(0, span);
  std::vector<uint8_t> out;
  for (int top : tops) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      // The first block carries the top exponent; the rest lie below it, never under 0.
      out.push_back(static_cast<uint8_t>(b == 0 ? top : std::max(0, top - below(rng))));
      for (int i = 0; i < 16; ++i) out.push_back(static_cast<uint8_t>(byte(rng)));
    }
  }
  return out;
}

std::vector<float> mxfp4Values(const std::vector<uint8_t>& blocks, int64_t count) {
  std::vector<float> out(count);
  EXPECT_TRUE(dequantize(TensorType::kMXFP4, blocks.data(), count, out.data()).ok());
  return out;
}

uint32_t seed() {
  const uint32_t s = std::random_device{}();
  std::printf("seed %u\n", s);
  return s;
}

TEST(Mxfp4AsNvfp4Test, RowsSpanningEighteenExponentsAreExact) {
  std::mt19937 rng(seed());
  // Tops at both ends of E8M0 (2^-127 and 2^128 scales) and in between.
  const std::vector<int> tops = {0, 17, 127, 130, 200, 255};
  const int64_t cols = 256;
  const std::vector<uint8_t> blocks = randomRows(tops, cols, 17, rng);
  const Nvfp4Rows n = mxfp4AsNvfp4(blocks.data(), static_cast<int64_t>(tops.size()), cols);
  EXPECT_EQ(n.rounded_blocks, 0);
  const std::vector<float> want = mxfp4Values(blocks, tops.size() * cols);
  const std::vector<float> got = values(n, static_cast<int64_t>(tops.size()), cols);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(got[i], want[i]) << "row " << i / cols << " column " << i % cols;
}

TEST(Mxfp4AsNvfp4Test, BlocksFurtherBelowAreRoundedWithinTheBound) {
  std::mt19937 rng(seed());
  const std::vector<int> tops = {140, 120, 60};
  const int64_t cols = 512, rows = static_cast<int64_t>(tops.size());
  const std::vector<uint8_t> blocks = randomRows(tops, cols, 40, rng);
  int64_t far = 0;  // blocks more than 17 exponents below their row's top
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b) far += blocks[(r * cols / 32 + b) * 17] < tops[r] - 17;
  ASSERT_GT(far, 0);
  const Nvfp4Rows n = mxfp4AsNvfp4(blocks.data(), rows, cols);
  EXPECT_EQ(n.rounded_blocks, far);
  const std::vector<float> want = mxfp4Values(blocks, rows * cols);
  const std::vector<float> got = values(n, rows, cols);
  int64_t moved = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const int64_t r = i / cols;
    const bool near = blocks[(i / 32) * 17] >= tops[r] - 17;
    if (near) {
      ASSERT_EQ(got[i], want[i]) << "row " << r << " column " << i % cols;
    } else {
      ASSERT_LE(std::fabs(got[i] - want[i]), std::ldexp(n.row_scales[r], -10))
          << "row " << r << " column " << i % cols;
      moved += got[i] != want[i];
    }
  }
  EXPECT_GT(moved, 0);  // The rounding happened: some far values are not exact.
}

}  // namespace
}  // namespace cleave::model
