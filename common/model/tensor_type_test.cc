#include "common/model/tensor_type.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/model/dequant_kernels.h"
#include "common/model/gguf_file.h"

namespace cleave::model {
namespace {

uint64_t fnv1a64(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(FloatFormatsTest, HalfConversionIsExactForEveryValue) {
  // Against an independent computation of the binary16 value for all 65536 encodings.
  for (uint32_t h = 0; h < 65536; ++h) {
    int sign = (h >> 15) ? -1 : 1;
    int exponent = (h >> 10) & 31;
    int mantissa = h & 1023;
    float got = dequant::halfToFloat(static_cast<uint16_t>(h));
    if (exponent == 31) {
      EXPECT_TRUE(mantissa ? std::isnan(got) : std::isinf(got)) << h;
      continue;
    }
    double expected =
        exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
    ASSERT_EQ(bits(got), bits(static_cast<float>(sign * expected))) << h;
  }
}

// Every finite half goes back to itself; values between two halves go to the nearer (ties
// to the even one); past the largest half, infinity.
TEST(FloatFormatsTest, FloatToHalfRoundsToNearestEven) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00) continue;  // Inf and NaN.
    ASSERT_EQ(dequant::floatToHalf(dequant::halfToFloat(h)), h) << bits;
    if ((h & 0x7fff) == 0x7bff) continue;  // The largest: no next half above it.
    const double low = dequant::halfToFloat(h), high = dequant::halfToFloat(h + 1);
    const double middle = (low + high) / 2;  // Exact in float: halves have 11-bit mantissas.
    const uint16_t even = (h & 1) == 0 ? h : static_cast<uint16_t>(h + 1);
    ASSERT_EQ(dequant::floatToHalf(static_cast<float>(middle)), even) << bits;
    ASSERT_EQ(dequant::floatToHalf(static_cast<float>(low + (high - low) / 4)), h) << bits;
    ASSERT_EQ(dequant::floatToHalf(static_cast<float>(high - (high - low) / 4)), h + 1) << bits;
  }
  EXPECT_EQ(dequant::floatToHalf(70000.0f), 0x7c00);
  EXPECT_EQ(dequant::floatToHalf(-70000.0f), 0xfc00);
  EXPECT_EQ(dequant::floatToHalf(-0.0f), 0x8000);
}

TEST(FloatFormatsTest, Fp8FormatsMatchTheirDefinitions) {
  EXPECT_EQ(dequant::fp8e4m3ToFloat(0x38), 1.0f);     // 0.0111.000
  EXPECT_EQ(dequant::fp8e4m3ToFloat(0x7e), 448.0f);   // Largest finite.
  EXPECT_EQ(dequant::fp8e4m3ToFloat(0x01), 0x1p-9f);  // Smallest subnormal.
  EXPECT_EQ(dequant::fp8e4m3ToFloat(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(dequant::fp8e4m3ToFloat(0x7f)));
  EXPECT_EQ(dequant::fp8e5m2ToFloat(0x3c), 1.0f);
  EXPECT_EQ(dequant::fp8e5m2ToFloat(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(dequant::fp8e5m2ToFloat(0x7c)));
  EXPECT_EQ(dequant::bf16ToFloat(0x3f80), 1.0f);
}

// E2M1: value = (-1)^s * 2^(e - 1) * (1 + m / 2), subnormal (e = 0) m / 2; two codes per
// byte, the even element in the low nibble.
TEST(FloatFormatsTest, E2m1MatchesItsDefinition) {
  std::vector<uint8_t> bytes(256);
  for (int b = 0; b < 256; ++b) bytes[b] = static_cast<uint8_t>(b);
  std::vector<float> out(512, std::nanf("poison"));
  ASSERT_TRUE(dequantize(TensorType::kE2M1, bytes.data(), 512, out.data()).ok());
  auto definition = [](int code) {
    const int e = (code >> 1) & 3, m = code & 1;
    const double magnitude = e == 0 ? m * 0.5 : std::ldexp(1.0 + m * 0.5, e - 1);
    return static_cast<float>((code & 8) ? -magnitude : magnitude);
  };
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(out[2 * b], definition(b & 15)) << b;
    EXPECT_EQ(out[2 * b + 1], definition(b >> 4)) << b;
  }
  EXPECT_EQ(*tensorBytes(TensorType::kE2M1, 64), 32u);
  EXPECT_FALSE(tensorBytes(TensorType::kE2M1, 31).has_value());
  // compressed-tensors' int4: the nibble less 8, low nibble first.
  ASSERT_TRUE(dequantize(TensorType::kI4, bytes.data(), 512, out.data()).ok());
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(out[2 * b], (b & 15) - 8) << b;
    EXPECT_EQ(out[2 * b + 1], (b >> 4) - 8) << b;
  }
}

TEST(TensorTypeTest, SizesOfBlockFormats) {
  EXPECT_EQ(*tensorBytes(TensorType::kQ4_0, 64), 36u);
  EXPECT_EQ(*tensorBytes(TensorType::kQ4_K, 512), 288u);
  EXPECT_EQ(*tensorBytes(TensorType::kQ6_K, 256), 210u);
  EXPECT_FALSE(tensorBytes(TensorType::kQ8_0, 33).has_value());
  EXPECT_FALSE(tensorTypeTraits(static_cast<TensorType>(77)).has_value());
  std::vector<float> out(32);
  std::vector<uint8_t> in(34);
  EXPECT_FALSE(dequantize(TensorType::kQ8_0, in.data(), 31, out.data()).ok());
  EXPECT_EQ(dequantize(TensorType::kQ2_K, in.data(), 256, out.data()).code(),
            absl::StatusCode::kUnimplemented);
}

// Synthetic files written by the `gguf` package, one per format: tensor "q" holds random
// blocks, tensor "expected" the package's own dequantization of them.
class DequantGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DequantGoldenTest, MatchesTheGgufPackageBitForBit) {
  std::string path = std::string(CLEAVE_GOLDEN_DIR) + "/gguf/quant_" + GetParam() + ".gguf";
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufTensor* q = (*file)->findTensor("q");
  const GgufTensor* expected = (*file)->findTensor("expected");
  ASSERT_NE(q, nullptr);
  ASSERT_NE(expected, nullptr);
  EXPECT_STREQ(tensorTypeName(q->type), GetParam());
  ASSERT_EQ(expected->type, TensorType::kF32);
  ASSERT_EQ(q->num_elements, expected->num_elements);
  std::vector<float> out(q->num_elements, std::nanf("poison"));
  ASSERT_TRUE(dequantize(q->type, q->data, q->num_elements, out.data()).ok());
  size_t mismatches = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    float want;
    std::memcpy(&want, expected->data + 4 * i, 4);
    if (bits(out[i]) != bits(want) && !(std::isnan(out[i]) && std::isnan(want))) {
      if (++mismatches < 5)
        ADD_FAILURE() << GetParam() << " element " << i << ": " << out[i] << " != " << want;
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, DequantGoldenTest,
                         ::testing::Values("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
                                           "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "MXFP4",
                                           "NVFP4"));

// NVFP4 blocks (the gguf package's random ones, every scale byte 0x7F and 0xFF included)
// rewritten as E2M1 codes and their scale bytes hold the values the package decodes:
// e2m1(code) x ue4m3(scale), where the ue4m3 value is twice nvfp4Scale's half.
TEST(Nvfp4AsE2M1Test, HoldsTheValuesOfTheBlocks) {
  auto file = GgufFile::open(std::string(CLEAVE_GOLDEN_DIR) + "/gguf/quant_NVFP4.gguf");
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufTensor* q = (*file)->findTensor("q");
  const GgufTensor* expected = (*file)->findTensor("expected");
  ASSERT_TRUE(q != nullptr && expected != nullptr);
  const uint64_t n = q->num_elements;
  std::vector<uint8_t> codes(n / 2, 0xAB), scales(n / 16, 0xAB);
  nvfp4AsE2M1(q->data, n, codes.data(), scales.data());
  std::vector<float> e2m1(n, std::nanf("poison"));
  ASSERT_TRUE(dequantize(TensorType::kE2M1, codes.data(), n, e2m1.data()).ok());
  for (uint64_t i = 0; i < n; ++i) {
    float want;
    std::memcpy(&want, expected->data + 4 * i, 4);
    ASSERT_EQ(e2m1[i] * (2.0f * dequant::nvfp4Scale(scales[i / 16])), want) << i;
  }
}

TEST(DequantSmolLm2Test, RealTensorsMatchTheGgufPackage) {
  std::string path = std::string(CLEAVE_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << path << " missing; run scripts/install-deps.sh";
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::ifstream in(std::string(CLEAVE_GOLDEN_DIR) + "/gguf/smollm2_dequant.json");
  ASSERT_TRUE(in.good());
  nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_GT(golden["tensors"].size(), 0u);
  for (const auto& expected : golden["tensors"]) {
    const GgufTensor* tensor = (*file)->findTensor(expected["name"].get<std::string>());
    ASSERT_NE(tensor, nullptr) << expected["name"];
    std::vector<float> out(tensor->num_elements, std::nanf("poison"));
    ASSERT_TRUE(dequantize(tensor->type, tensor->data, tensor->num_elements, out.data()).ok());
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(fnv1a64(out.data(), out.size() * 4)));
    EXPECT_EQ(hex, expected["fnv1a64"].get<std::string>()) << tensor->name;
    const auto& first = expected["first"];
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ(out[i], first[i].get<float>()) << tensor->name << "[" << i << "]";
    }
    for (const auto& at : expected["at"]) {
      EXPECT_EQ(out[at[0].get<size_t>()], at[1].get<float>()) << tensor->name;
    }
  }
}

}  // namespace
}  // namespace cleave::model
