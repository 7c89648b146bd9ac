#include "common/model/mxfp4_as_nvfp4.h"

#include <algorithm>
#include <cmath>

namespace cleave::model {
namespace {

constexpr int kBlock = 32;       // values per MXFP4 block
constexpr int kBlockBytes = 17;  // its exponent, then 16 bytes of codes
constexpr int kTop = 8;          // the exponent of the largest block's group scale, 2^8
constexpr int kBottom = -9;      // the smallest e4m3 power of two, 2^-9 (subnormal)

// The e4m3 byte of 2^d, kBottom <= d <= kTop.
uint8_t e4m3PowerOfTwo(int d) {
  if (d >= -6) return static_cast<uint8_t>((d + 7) << 3);  // normal: biased exponent d + 7
  return static_cast<uint8_t>(1 << (d - kBottom));         // subnormal: mantissa x 2^-9
}

// The E2M1 magnitudes of codes 0..7.
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// The E2M1 code (sign bit 3) nearest to `code`'s value times 2^shift (shift < 0), ties to
// the even code.
uint8_t roundedCode(uint8_t code, int shift) {
  const float x = std::ldexp(kE2m1[code & 7], shift);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const float gap = std::fabs(kE2m1[c] - x), best_gap = std::fabs(kE2m1[best] - x);
    if (gap < best_gap || (gap == best_gap && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (code & 8));
}

}  // namespace

Nvfp4Rows mxfp4AsNvfp4(const uint8_t* blocks, int64_t rows, int64_t cols) {
  const int64_t per_row = cols / kBlock;
  Nvfp4Rows out;
  out.codes.resize(rows * cols / 2);
  out.scales.resize(rows * cols / 16);
  out.row_scales.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = blocks + r * per_row * kBlockBytes;
    int top = 0;
    for (int64_t b = 0; b < per_row; ++b) top = std::max<int>(top, row[b * kBlockBytes]);
    out.row_scales[r] = std::ldexp(1.0f, top - 127 - kTop);
    for (int64_t b = 0; b < per_row; ++b) {
      const uint8_t* block = row + b * kBlockBytes;
      const int d = block[0] - top + kTop;
      const bool rounded = d < kBottom;
      out.rounded_blocks += rounded;
      const uint8_t scale = e4m3PowerOfTwo(std::max(d, kBottom));
      uint8_t* scales = out.scales.data() + (r * per_row + b) * 2;
      scales[0] = scales[1] = scale;
      // Element j (< 16) in the low nibble of block byte 1 + j, element 16 + j in its high one.
      auto code = [&](int e) -> uint8_t {
        const uint8_t c = e < 16 ? block[1 + e] & 0x0f : block[1 + e - 16] >> 4;
        return rounded ? roundedCode(c, d - kBottom) : c;
      };
      uint8_t* codes = out.codes.data() + (r * per_row + b) * (kBlock / 2);
      for (int k = 0; k < kBlock / 2; ++k)
        codes[k] = static_cast<uint8_t>(code(2 * k) | code(2 * k + 1) << 4);
    }
  }
  return out;
}

}  // namespace cleave::model
