// The 32-element GGUF block formats. Each block starts with an fp16 scale `d` (and, for the
// _1 variants, an fp16 offset `m`); 4-bit values are packed two per byte, element j in
// the low nibble and j+16 in the high nibble; Q5 keeps the fifth bits in a 32-bit field.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/model/dequant_kernels.h"

namespace cleave::model::dequant {
namespace {

constexpr int kBlock = 32;

float loadHalf(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return halfToFloat(bits);
}

}  // namespace

// [d:f16][qs:16]
void q4_0(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 18, dst += kBlock) {
    const float d = loadHalf(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
      dst[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

const int8_t kMxfp4Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// The power of two built in a float's exponent bits (subnormal for e < 2), as ggml builds it.
float mxfp4Scale(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t{e} - 1) << 23;
  float d;
  std::memcpy(&d, &bits, 4);
  return d;
}

// [e:e8m0][qs:16]: 2 x e2m1 x 2^(e - 128).
void mxfp4(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 17, dst += kBlock) {
    const float d = mxfp4Scale(src[0]);
    const uint8_t* qs = src + 1;
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>(kMxfp4Twice[qs[j] & 0x0f]) * d;
      dst[j + 16] = static_cast<float>(kMxfp4Twice[qs[j] >> 4]) * d;
    }
  }
}

// Unsigned E4M3 (4 exponent bits biased by 7, 3 mantissa bits) halved, as ggml decodes it.
float nvfp4Scale(uint8_t d) {
  if (d == 0 || d == 0x7F) return 0.0f;
  const int exponent = (d >> 3) & 0x0f;
  const float mantissa = static_cast<float>(d & 0x07);
  const float value =
      exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return value * 0.5f;
}

// [d:ue4m3 x 4][qs:32]: 2 x e2m1 x ue4m3(d[s]) / 2, sub-block s of 16 in qs[8s..8s+7].
void nvfp4(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 36) {
    for (int s = 0; s < 4; ++s, dst += 16) {
      const float d = nvfp4Scale(src[s]);
      const uint8_t* qs = src + 4 + 8 * s;
      for (int j = 0; j < 8; ++j) {
        dst[j] = static_cast<float>(kMxfp4Twice[qs[j] & 0x0f]) * d;
        dst[j + 8] = static_cast<float>(kMxfp4Twice[qs[j] >> 4]) * d;
      }
    }
  }
}

// [d:f16][m:f16][qs:16]
void q4_1(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 20, dst += kBlock) {
    const float d = loadHalf(src);
    const float m = loadHalf(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
      dst[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

// [d:f16][qh:u32][qs:16]
void q5_0(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 22, dst += kBlock) {
    const float d = loadHalf(src);
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
    const uint8_t* qs = src + 6;
    for (int j = 0; j < 16; ++j) {
      const int high0 = ((qh >> j) << 4) & 0x10;
      const int high1 = (qh >> (j + 12)) & 0x10;
      dst[j] = static_cast<float>(((qs[j] & 0x0f) | high0) - 16) * d;
      dst[j + 16] = static_cast<float>(((qs[j] >> 4) | high1) - 16) * d;
    }
  }
}

// [d:f16][m:f16][qh:u32][qs:16]
void q5_1(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 24, dst += kBlock) {
    const float d = loadHalf(src);
    const float m = loadHalf(src + 2);
    uint32_t qh;
    std::memcpy(&qh, src + 4, 4);
    const uint8_t* qs = src + 8;
    for (int j = 0; j < 16; ++j) {
      const int high0 = ((qh >> j) << 4) & 0x10;
      const int high1 = (qh >> (j + 12)) & 0x10;
      dst[j] = static_cast<float>((qs[j] & 0x0f) | high0) * d + m;
      dst[j + 16] = static_cast<float>((qs[j] >> 4) | high1) * d + m;
    }
  }
}

// [d:f16][qs:i8 x 32]
void q8_0(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 34, dst += kBlock) {
    const float d = loadHalf(src);
    const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < kBlock; ++j) dst[j] = static_cast<float>(qs[j]) * d;
  }
}

void quantizeQ8_0(const float* src, uint8_t* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += kBlock, dst += 34) {
    float peak = 0;
    for (int j = 0; j < kBlock; ++j) peak = std::max(peak, std::fabs(src[j]));
    const uint16_t half = floatToHalf(peak / 127.0f);
    std::memcpy(dst, &half, 2);
    const float d = halfToFloat(half);
    auto* qs = reinterpret_cast<int8_t*>(dst + 2);
    for (int j = 0; j < kBlock; ++j) {
      const float code = d > 0 ? std::nearbyint(src[j] / d) : 0.0f;
      qs[j] = static_cast<int8_t>(std::clamp(code, -127.0f, 127.0f));
    }
  }
}

}  // namespace cleave::model::dequant
