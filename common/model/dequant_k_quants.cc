// The 256-element "K" super-block formats. Q4_K and Q5_K hold eight 32-element sub-blocks
// with 6-bit scales and mins packed into 12 bytes; Q6_K has sixteen 16-element sub-blocks
// with int8 scales; Q8_K is an f32 scale, 256 int8 values and per-16 sums (unused here).
#include <cstring>

#include "common/model/dequant_kernels.h"

namespace cleave::model::dequant {
namespace {

constexpr int kSuper = 256;

float loadHalf(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return halfToFloat(bits);
}

// Scale and min of sub-block j (0..7) from the 12-byte packed field.
void scaleMin(int j, const uint8_t* packed, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// Scale and offset of sub-blocks `is` and `is + 1` as floats: d * scale, dmin * min.
struct SubBlockPair {
  float d1, m1, d2, m2;
};
SubBlockPair subBlockPair(int is, const uint8_t* packed, float d, float dmin) {
  uint8_t sc, m;
  SubBlockPair p;
  scaleMin(is, packed, &sc, &m);
  p.d1 = d * static_cast<float>(sc);
  p.m1 = dmin * static_cast<float>(m);
  scaleMin(is + 1, packed, &sc, &m);
  p.d2 = d * static_cast<float>(sc);
  p.m2 = dmin * static_cast<float>(m);
  return p;
}

}  // namespace

// Each 32-element sub-block of a Q4_K super-block is a Q4_1 block: the same 4-bit codes,
// scale d * sc and offset -(dmin * m), rounded to half.
bool q4_KAsQ4_1(const uint8_t* src, uint8_t* dst, size_t blocks) {
  bool finite = true;
  for (size_t b = 0; b < blocks; ++b, src += 144) {
    const float d = loadHalf(src);
    const float dmin = loadHalf(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* q = src + 16;
    for (int is = 0; is < 8; is += 2, q += 32) {
      const auto [d1, m1, d2, m2] = subBlockPair(is, scales, d, dmin);
      // Sub-block `is` holds the low nibbles of q[0..32), `is + 1` the high ones; a Q4_1 byte
      // holds elements l (low) and l + 16 (high).
      for (int half = 0; half < 2; ++half, dst += 20) {
        const uint16_t scale = floatToHalf(half == 0 ? d1 : d2);
        const uint16_t offset = floatToHalf(-(half == 0 ? m1 : m2));
        finite = finite && (scale & 0x7c00) != 0x7c00 && (offset & 0x7c00) != 0x7c00;
        std::memcpy(dst, &scale, 2);
        std::memcpy(dst + 2, &offset, 2);
        const int shift = 4 * half;
        for (int l = 0; l < 16; ++l) {
          dst[4 + l] =
              static_cast<uint8_t>(((q[l] >> shift) & 0x0f) | (((q[l + 16] >> shift) & 0x0f) << 4));
        }
      }
    }
  }
  return finite;
}

// [d:f16][dmin:f16][scales:12][qs:128]
void q4_K(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 144) {
    const float d = loadHalf(src);
    const float dmin = loadHalf(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* q = src + 16;
    for (int j = 0, is = 0; j < kSuper; j += 64, is += 2, q += 32, dst += 64) {
      const auto [d1, m1, d2, m2] = subBlockPair(is, scales, d, dmin);
      for (int l = 0; l < 32; ++l) dst[l] = d1 * static_cast<float>(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) dst[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// [d:f16][dmin:f16][scales:12][qh:32][qs:128]
void q5_K(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 176) {
    const float d = loadHalf(src);
    const float dmin = loadHalf(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* ql = src + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kSuper; j += 64, is += 2, ql += 32, dst += 64) {
      const auto [d1, m1, d2, m2] = subBlockPair(is, scales, d, dmin);
      for (int l = 0; l < 32; ++l) {
        dst[l] = d1 * static_cast<float>((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        dst[l + 32] = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      }
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

// [ql:128][qh:64][scales:i8 x 16][d:f16]
void q6_K(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 210) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = loadHalf(src + 208);
    for (int n = 0; n < kSuper; n += 128, ql += 64, qh += 32, sc += 8, dst += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int8_t>((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int8_t>((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        dst[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        dst[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        dst[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

// [d:f32][qs:i8 x 256][bsums:i16 x 16]
void q8_K(const uint8_t* src, float* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 292, dst += kSuper) {
    float d;
    std::memcpy(&d, src, 4);
    const int8_t* qs = reinterpret_cast<const int8_t*>(src + 4);
    for (int j = 0; j < kSuper; ++j) dst[j] = d * static_cast<float>(qs[j]);
  }
}

}  // namespace cleave::model::dequant
