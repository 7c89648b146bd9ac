// Plain floating-point element formats.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/model/dequant_kernels.h"

namespace cleave::model::dequant {
namespace {

float fromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return fromBits(sign | 0x7f800000 | (mantissa << 13));  // Inf/NaN.
  if (exponent == 0) {
    if (mantissa == 0) return fromBits(sign);
    // Subnormal: mantissa x 2^-24, exactly representable in binary32.
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return fromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

float bf16ToFloat(uint16_t bits) { return fromBits(static_cast<uint32_t>(bits) << 16); }

float fp8e4m3ToFloat(uint8_t b) {
  bool negative = b & 0x80;
  uint32_t exponent = (b >> 3) & 0xf;
  uint32_t mantissa = b & 0x7;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // mantissa/8 x 2^-6.
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), static_cast<int>(exponent) - 10);
  }
  return negative ? -magnitude : magnitude;
}

// E5M2 is the top byte of a binary16.
uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7fffffff;
  if (x > 0x7f800000) return sign | 0x7e00;   // NaN.
  if (x >= 0x477ff000) return sign | 0x7c00;  // Rounds past 65504: infinity.
  if (x < 0x38800000) {
    // A half subnormal (or zero): a multiple of 2^-24, rounded to nearest even.
    return sign | static_cast<uint16_t>(std::nearbyint(std::fabs(f) * 16777216.0f));
  }
  // Rebias the exponent (127 -> 15) and round the 23-bit mantissa to 10, ties to even.
  uint32_t h = (x >> 13) - ((127 - 15) << 10);
  const uint32_t rest = x & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float fp8e5m2ToFloat(uint8_t b) { return halfToFloat(static_cast<uint16_t>(b) << 8); }

float e2m1ToFloat(uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float magnitude = kMagnitude[code & 7];
  return (code & 8) ? -magnitude : magnitude;
}

void i4(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i) {
    dst[2 * i] = static_cast<float>(src[i] & 0x0f) - 8.0f;
    dst[2 * i + 1] = static_cast<float>(src[i] >> 4) - 8.0f;
  }
}

void e2m1(const uint8_t* src, float* dst, size_t blocks) {
  // Both codes of every byte value, low nibble first: one load per byte, no branches.
  static const auto* kPairs = [] {
    auto* pairs = new std::array<std::array<float, 2>, 256>;
    for (int b = 0; b < 256; ++b) {
      (*pairs)[b] = {e2m1ToFloat(static_cast<uint8_t>(b & 0x0f)),
                     e2m1ToFloat(static_cast<uint8_t>(b >> 4))};
    }
    return pairs;
  }();
  for (size_t i = 0; i < blocks; ++i) std::memcpy(dst + 2 * i, (*kPairs)[src[i]].data(), 8);
}

}  // namespace cleave::model::dequant
