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

}  // namespace

void pack(model::TensorType type, int64_t rows, int64_t cols, const uint8_t* src, uint8_t* dst) {
  using model::TensorType;
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
