// Per-row activation quantization on the GPU against a host quantizer written from the
// formats' definitions: fp8 (e4m3 codes, one f32 scale per 128 elements) and nvfp4 (E2M1
// codes, e4m3 scales per 16, a row scale), codes and scales bit for bit, on rows of very
// different magnitudes, a row of zeros and a group of zeros; rows past the live tiles are
// left alone.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/log.h"
#include "common/model/tensor_type.h"
#include "kernels/cpu/kv_format.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/quantize_rows.h"

namespace cleave::cuda {
namespace {

using testing::bf16;
using testing::DeviceBuffer;
using testing::toFloat;

// Rows scaled by 10^[-3, 3], row 1 all zeros, the second 16-element group of row 2 zeros.
std::vector<bf16> randomRows(int64_t rows, int64_t stride, std::mt19937& rng) {
  std::vector<bf16> x = testing::randomBf16(rows * stride, rng);
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = r == 1 ? 0.0f : std::pow(10.0f, exponent(rng));
    for (int64_t c = 0; c < stride; ++c)
      x[r * stride + c] = __float2bfloat16(toFloat(x[r * stride + c]) * scale);
  }
  for (int64_t c = 16; c < 32; ++c) x[2 * stride + c] = __float2bfloat16(0.0f);
  return x;
}

float e4m3Value(uint8_t code) {
  float v = 0;
  CLEAVE_CHECK_OK(model::dequantize(model::TensorType::kF8E4M3, &code, 1, &v));
  return v;
}

// The E2M1 code nearest to v (ties to the even code), saturated at 6: by search, not by
// thresholds.
uint8_t e2m1Nearest(float v) {
  static const float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = std::fabs(v);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const float d = std::fabs(kMagnitudes[i] - a), bd = std::fabs(kMagnitudes[best] - a);
    if (d < bd || (d == bd && i % 2 == 0)) best = i;
  }
  return static_cast<uint8_t>(best | (v < 0 ? 8 : 0));
}

struct Expected {
  std::vector<uint8_t> codes, group_scales;
  std::vector<float> scales;
};

Expected quantizeOnHost(RowQuantization kind, const std::vector<float>& x, int64_t rows,
                        int64_t stride, int64_t k) {
  Expected e;
  if (kind == RowQuantization::kFp8Block128) {
    e.codes.resize(rows * k);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < k / 128; ++b) {
        const float* v = x.data() + r * stride + b * 128;
        float amax = 0;
        for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(v[i]));
        const float scale = amax > 0 ? amax / 448.0f : 1.0f;
        e.scales.push_back(scale);
        for (int i = 0; i < 128; ++i) e.codes[r * k + b * 128 + i] = cpu::floatToE4m3(v[i] / scale);
      }
    }
    return e;
  }
  e.codes.assign(rows * k / 2, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * stride;
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(row[c]));
    const float global = amax > 0 ? amax / (6.0f * 448.0f) : 1.0f;
    e.scales.push_back(global);
    for (int64_t g = 0; g < k / 16; ++g) {
      float group_max = 0;
      for (int i = 0; i < 16; ++i) group_max = std::max(group_max, std::fabs(row[g * 16 + i]));
      const uint8_t scale = cpu::floatToE4m3(group_max / 6.0f / global);
      e.group_scales.push_back(scale);
      const float denominator = e4m3Value(scale) * global;
      for (int i = 0; i < 16; ++i) {
        const int64_t c = g * 16 + i;
        const uint8_t code = e4m3Value(scale) > 0 ? e2m1Nearest(row[c] / denominator) : 0;
        e.codes[r * k / 2 + c / 2] |= static_cast<uint8_t>(code << (4 * (c % 2)));
      }
    }
  }
  return e;
}

template <typename T>
std::vector<T> download(const T* device, size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

template <typename T>
int64_t mismatches(const std::vector<T>& got, const std::vector<T>& want) {
  EXPECT_EQ(got.size(), want.size());
  int64_t n = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) ++n;
  }
  return n;
}

TEST(QuantizeRowsTest, MatchesTheFormatsDefinitionsBitForBit) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  for (RowQuantization kind : {RowQuantization::kFp8Block128, RowQuantization::kNvfp4}) {
    const bool fp8 = kind == RowQuantization::kFp8Block128;
    SCOPED_TRACE(fp8 ? "fp8" : "nvfp4");
    const int64_t rows = 37, k = fp8 ? 384 : 208, stride = k + 24;
    const std::vector<bf16> x = randomRows(rows, stride, rng);
    DeviceBuffer<bf16> dx(x);
    DeviceBuffer<uint8_t> scratch(quantizedRowsBytes(kind, rows, k));  // poisoned
    const QuantizedRows q = carveQuantizedRows(kind, rows, k, scratch.get());
    ASSERT_TRUE(
        quantizeRows(
            {.kind = kind, .x = dx.get(), .x_stride = stride, .rows = rows, .k = k, .out = q},
            nullptr)
            .ok());
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    const Expected want = quantizeOnHost(kind, toFloat(x), rows, stride, k);
    EXPECT_EQ(mismatches(download(q.codes, want.codes.size()), want.codes), 0);
    EXPECT_EQ(mismatches(download(q.scales, want.scales.size()), want.scales), 0);
    if (!fp8) {
      EXPECT_EQ(mismatches(download(q.group_scales, want.group_scales.size()), want.group_scales),
                0);
    }
  }
}

TEST(QuantizeRowsTest, LeavesRowsPastTheLiveTilesAlone) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  const int64_t rows = 64, k = 128, live = 2;  // two 16-row tiles of four
  const std::vector<bf16> x = randomRows(rows, k, rng);
  DeviceBuffer<bf16> dx(x);
  DeviceBuffer<int32_t> tiles(std::vector<int32_t>{static_cast<int32_t>(live)});
  DeviceBuffer<uint8_t> scratch(quantizedRowsBytes(RowQuantization::kFp8Block128, rows, k));
  const QuantizedRows q = carveQuantizedRows(RowQuantization::kFp8Block128, rows, k, scratch.get());
  ASSERT_TRUE(quantizeRows({.x = dx.get(),
                            .x_stride = k,
                            .rows = rows,
                            .k = k,
                            .out = q,
                            .live_tiles = tiles.get(),
                            .tile_rows = 16},
                           nullptr)
                  .ok());
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> scales = download(q.scales, rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (r < live * 16) {
      EXPECT_TRUE(std::isfinite(scales[r])) << r;
    } else {
      EXPECT_TRUE(std::isnan(scales[r])) << "row " << r << " was written";
    }
  }
}

TEST(QuantizeRowsTest, RefusesShapesItCannotTake) {
  uint8_t dummy[64];
  QuantizeRowsArgs args{.x = dummy,
                        .x_stride = 96,
                        .rows = 1,
                        .k = 96,
                        .out = {.codes = dummy, .scales = reinterpret_cast<float*>(dummy)}};
  absl::Status s = quantizeRows(args, nullptr);
  EXPECT_NE(s.message().find("K % 128"), std::string::npos) << s;
  args.kind = RowQuantization::kNvfp4;
  s = quantizeRows(args, nullptr);
  EXPECT_NE(s.message().find("every output part"), std::string::npos) << s;
  args.out.group_scales = dummy;
  args.x_stride = 100;
  s = quantizeRows(args, nullptr);
  EXPECT_NE(s.message().find("x_stride"), std::string::npos) << s;
}

}  // namespace
}  // namespace cleave::cuda
