#include "kernels/cpu/packed_layout.h"

#include <cstring>

#include "common/model/dequant_kernels.h"

namespace cleave::cpu::packed {
namespace {

float halfAt(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return model::dequant::halfToFloat(bits);
}

// One Q6_K super-block (210 bytes: ql[128], qh[64], sc[16], d) as values + 32 (0..63), in
// element order, and its sixteen scales.
void unpackQ6_K(const uint8_t* block, uint8_t* values, int8_t* scales) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  std::memcpy(scales, block + 192, 16);
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      values[n + l] = static_cast<uint8_t>((ql[l] & 0x0f) | ((qh[l] & 3) << 4));
      values[n + l + 32] = static_cast<uint8_t>((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4));
      values[n + l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      values[n + l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

void packQ6_K(int64_t rows, int64_t cols, const uint8_t* src, uint8_t* dst) {
  const int64_t blocks = cols / 32, supers = cols / 256;
  const int64_t row_bytes = supers * 210;
  const int64_t group_block = groupBlockBytes(model::TensorType::kQ6_K);
  uint8_t values[256];
  int8_t scales[16];
  for (int64_t g = 0; g < groups(rows); ++g) {
    uint8_t* group = dst + g * groupBytes(model::TensorType::kQ6_K, blocks);
    uint8_t* body = group + groupHeaderBytes(model::TensorType::kQ6_K, blocks);
    for (int64_t r = 0; r < kGroupRows; ++r) {
      const int64_t row = g * kGroupRows + r;
      if (row >= rows) break;  // Padding rows stay zero: zero scales, zero contribution.
      for (int64_t s = 0; s < supers; ++s) {
        const uint8_t* super = src + row * row_bytes + s * 210;
        const float d = halfAt(super + 208);
        std::memcpy(group + s * 64 + 4 * r, &d, 4);
        unpackQ6_K(super, values, scales);
        for (int64_t j = 0; j < 8; ++j) {
          uint8_t* out = body + (s * 8 + j) * group_block;
          out[r] = static_cast<uint8_t>(scales[2 * j]);
          out[16 + r] = static_cast<uint8_t>(scales[2 * j + 1]);
          const uint8_t* v = values + 32 * j;
          for (int c = 0; c < 4; ++c) {
            for (int i = 0; i < 4; ++i) {
              out[32 + c * 64 + 4 * r + i] =
                  static_cast<uint8_t>((v[4 * c + i] & 0x0f) | ((v[16 + 4 * c + i] & 0x0f) << 4));
            }
          }
          for (int h = 0; h < 2; ++h) {
            for (int i = 0; i < 4; ++i) {
              uint8_t bits = 0;
              for (int k = 0; k < 4; ++k)
                bits |= static_cast<uint8_t>((v[4 * (4 * h + k) + i] >> 4) << (2 * k));
              out[288 + h * 64 + 4 * r + i] = bits;
            }
          }
        }
      }
    }
  }
}

// NVFP4 from any source: row(r, b, codes, scales) puts row r's block b (32 elements) as its
// 32 E2M1 codes (0..15, in element order) and the scales of its two halves (for the codes'
// own values: halved here for the twice-valued lookup).
template <typename Row>
void packNvfp4(int64_t rows, int64_t cols, uint8_t* dst, Row&& row) {
  constexpr model::TensorType kType = model::TensorType::kNVFP4;
  const int64_t blocks = cols / 32;
  std::memset(dst, 0, groups(rows) * groupBytes(kType, blocks));
  uint8_t codes[32];
  float scales[2];
  for (int64_t g = 0; g < groups(rows); ++g) {
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* out = dst + (g * blocks + b) * groupBlockBytes(kType);
      uint8_t* quants = out + scaleBytes(kType);
      for (int64_t r = 0; r < kGroupRows; ++r) {
        const int64_t n = g * kGroupRows + r;
        if (n >= rows) break;  // Padding rows stay zero: zero scales, zero contribution.
        row(n, b, codes, scales);
        for (int h = 0; h < 2; ++h) {
          const float d = scales[h] * 0.5f;
          std::memcpy(out + 64 * h + 4 * r, &d, 4);
        }
        for (int c = 0; c < 4; ++c) {
          for (int i = 0; i < 4; ++i) {
            quants[c * 64 + 4 * r + i] =
                static_cast<uint8_t>(codes[4 * c + i] | (codes[16 + 4 * c + i] << 4));
          }
        }
      }
    }
  }
}

// 32 E2M1 codes from 16 bytes of them in pairs (element 2k in the low nibble of byte k).
void unpairE2M1(const uint8_t* pairs, uint8_t* codes) {
  for (int j = 0; j < 16; ++j) {
    codes[2 * j] = pairs[j] & 0x0f;
    codes[2 * j + 1] = pairs[j] >> 4;
  }
}

// GGUF NVFP4: block b is the first or second half of 64-element block b / 2, taken as E2M1
// codes and scale bytes (model::nvfp4AsE2M1).
void packNvfp4Blocks(int64_t rows, int64_t cols, const uint8_t* src, uint8_t* dst) {
  const int64_t row_bytes = cols / 64 * 36;
  packNvfp4(rows, cols, dst, [&](int64_t n, int64_t b, uint8_t* codes, float* scales) {
    uint8_t pairs[32], bytes[4];
    model::nvfp4AsE2M1(src + n * row_bytes + b / 2 * 36, 64, pairs, bytes);
    const int64_t half = b % 2;
    unpairE2M1(pairs + 16 * half, codes);
    for (int h = 0; h < 2; ++h) {
      // nvfp4Scale is halved for twice-valued codes: the scale of the codes' own values.
      scales[h] = 2.0f * model::dequant::nvfp4Scale(bytes[2 * half + h]);
    }
  });
}

}  // namespace

void packE2M1(int64_t rows, int64_t cols, const uint8_t* codes,
              absl::FunctionRef<float(int64_t row, int64_t group)> scale, uint8_t* dst) {
  packNvfp4(rows, cols, dst, [&](int64_t n, int64_t b, uint8_t* out, float* scales) {
    unpairE2M1(codes + n * (cols / 2) + 16 * b, out);
    scales[0] = scale(n, 2 * b);
    scales[1] = scale(n, 2 * b + 1);
  });
}

void pack(model::TensorType type, int64_t rows, int64_t cols, const uint8_t* src, uint8_t* dst) {
  using model::TensorType;
  if (type == TensorType::kNVFP4) return packNvfp4Blocks(rows, cols, src, dst);
  std::memset(dst, 0, groups(rows) * groupBytes(type, cols / 32));
  if (type == TensorType::kQ6_K) return packQ6_K(rows, cols, src, dst);
  const int64_t blocks = cols / 32;
  const int64_t block_bytes = *model::tensorBytes(type, 32);
  const int64_t row_bytes = blocks * block_bytes;
  const int64_t quant_offset = type == TensorType::kQ4_1 ? 4 : type == TensorType::kMXFP4 ? 1 : 2;
  const int64_t group_block = groupBlockBytes(type);
  for (int64_t g = 0; g < groups(rows); ++g) {
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* out = dst + (g * blocks + b) * group_block;
      uint8_t* quants = out + scaleBytes(type);
      for (int64_t r = 0; r < kGroupRows; ++r) {
        const int64_t row = g * kGroupRows + r;
        if (row >= rows) break;  // Padding rows stay zero: zero scales, zero contribution.
        const uint8_t* block = src + row * row_bytes + b * block_bytes;
        if (type == TensorType::kMXFP4) {
          const float d = model::dequant::mxfp4Scale(block[0]);
          std::memcpy(out + 4 * r, &d, 4);
        } else {
          std::memcpy(out + 2 * r, block, 2);  // d
        }
        if (type == TensorType::kQ4_1) std::memcpy(out + 32 + 2 * r, block + 2, 2);  // m
        const uint8_t* q = block + quant_offset;
        if (type == TensorType::kQ8_0) {
          for (int c = 0; c < 8; ++c) {
            for (int i = 0; i < 4; ++i)
              quants[c * 64 + 4 * r + i] = static_cast<uint8_t>(q[4 * c + i] ^ 0x80);
          }
        } else {
          // Byte j holds element j (low nibble) and j + 16 (high nibble), which is the
          // chunk layout already: chunk c lane r takes source bytes 4c..4c+3.
          for (int c = 0; c < 4; ++c) std::memcpy(quants + c * 64 + 4 * r, q + 4 * c, 4);
        }
      }
    }
  }
}

}  // namespace cleave::cpu::packed
