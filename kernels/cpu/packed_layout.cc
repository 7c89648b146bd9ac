#include "kernels/cpu/packed_layout.h"

#include <cstring>

namespace cleave::cpu::packed {

void pack(model::TensorType type, int64_t rows, int64_t cols, const uint8_t* src, uint8_t* dst) {
  using model::TensorType;
  const int64_t blocks = cols / 32;
  const int64_t block_bytes = *model::tensorBytes(type, 32);
  const int64_t row_bytes = blocks * block_bytes;
  const int64_t quant_offset = type == TensorType::kQ4_1 ? 4 : 2;
  const int64_t group_block = groupBlockBytes(type);
  std::memset(dst, 0, groups(rows) * blocks * group_block);
  for (int64_t g = 0; g < groups(rows); ++g) {
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* out = dst + (g * blocks + b) * group_block;
      uint8_t* quants = out + scaleBytes(type);
      for (int64_t r = 0; r < kGroupRows; ++r) {
        const int64_t row = g * kGroupRows + r;
        if (row >= rows) break;  // Padding rows stay zero: zero scales, zero contribution.
        const uint8_t* block = src + row * row_bytes + b * block_bytes;
        std::memcpy(out + 2 * r, block, 2);                                          // d
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
