// Portable row kernels: the reference the SIMD paths are tested against.
#include <algorithm>
#include <cstring>

#include "common/model/dequant_kernels.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/packed_layout.h"

namespace cleave::cpu::kernels {
namespace {

using model::TensorType;

float half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return model::dequant::halfToFloat(bits);
}

// Integer dot of one weight block (values in x's element order) with one x block, and the
// block's contribution to y given the x block's scale and sum.
float blockDot(TensorType type, const uint8_t* block, const int8_t* xq, float dx, int32_t xsum) {
  int32_t dot = 0;
  switch (type) {
    case TensorType::kQ4_0:
    case TensorType::kQ4_1: {
      const uint8_t* qs = block + (type == TensorType::kQ4_0 ? 2 : 4);
      for (int j = 0; j < 16; ++j) {
        dot += (qs[j] & 0x0f) * xq[j] + (qs[j] >> 4) * xq[j + 16];
      }
      if (type == TensorType::kQ4_0) return half(block) * dx * static_cast<float>(dot - 8 * xsum);
      return half(block) * dx * static_cast<float>(dot) +
             half(block + 2) * dx * static_cast<float>(xsum);
    }
    case TensorType::kQ8_0: {
      const int8_t* qs = reinterpret_cast<const int8_t*>(block + 2);
      for (int j = 0; j < 32; ++j) dot += qs[j] * xq[j];
      return half(block) * dx * static_cast<float>(dot);
    }
    case TensorType::kMXFP4: {
      const uint8_t* qs = block + 1;
      for (int j = 0; j < 16; ++j) {
        dot += model::dequant::kMxfp4Twice[qs[j] & 0x0f] * xq[j] +
               model::dequant::kMxfp4Twice[qs[j] >> 4] * xq[j + 16];
      }
      return model::dequant::mxfp4Scale(block[0]) * dx * static_cast<float>(dot);
    }
    default: return 0.0f;
  }
}

float loadFloat(TensorType type, const uint8_t* row, int64_t k) {
  switch (type) {
    case TensorType::kF32: {
      float v;
      std::memcpy(&v, row + 4 * k, 4);
      return v;
    }
    case TensorType::kF16: return half(row + 2 * k);
    default: {
      uint16_t bits;
      std::memcpy(&bits, row + 2 * k, 2);
      return model::dequant::bf16ToFloat(bits);
    }
  }
}

}  // namespace

void packedNvfp4Portable(const PackedRows& a) {
  constexpr int64_t kGroupBlock = packed::groupBlockBytes(TensorType::kNVFP4);
  const CpuMatrix& w = *a.weight;
  const int64_t blocks = w.cols() / 32;
  const int64_t group_bytes = packed::groupBytes(TensorType::kNVFP4, blocks);
  for (int64_t g = a.group_begin; g < a.group_end; ++g) {
    const int64_t rows = std::min<int64_t>(packed::kGroupRows, w.rows() - g * packed::kGroupRows);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = 0; t < a.x->rows; ++t) {
        float sum = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          const uint8_t* block = w.packedData() + g * group_bytes + b * kGroupBlock;
          const uint8_t* quants = block + packed::scaleBytes(TensorType::kNVFP4);
          const int8_t* xq = a.x->rowQ(t) + 32 * b;
          int32_t first = 0, second = 0;
          for (int c = 0; c < 4; ++c) {
            for (int i = 0; i < 4; ++i) {
              const uint8_t q = quants[64 * c + 4 * r + i];
              first += model::dequant::kMxfp4Twice[q & 0x0f] * xq[4 * c + i];
              second += model::dequant::kMxfp4Twice[q >> 4] * xq[16 + 4 * c + i];
            }
          }
          float d_first, d_second;
          std::memcpy(&d_first, block + 4 * r, 4);
          std::memcpy(&d_second, block + 64 + 4 * r, 4);
          const float dx = a.x->rowD(t)[b];
          sum += static_cast<float>(first) * (d_first * dx) +
                 static_cast<float>(second) * (d_second * dx);
        }
        a.y[t * a.ldy + g * packed::kGroupRows + r] = sum;
      }
    }
  }
}

void quantRowsPortable(const QuantRows& a) {
  const WeightMatrix& w = *a.weight;
  const int64_t blocks = w.cols / 32;
  const int64_t block_bytes = w.rowBytes() / blocks;
  for (int64_t n = a.row_begin; n < a.row_end; ++n) {
    const uint8_t* row = w.data + n * w.rowBytes();
    for (int64_t t = 0; t < a.x->rows; ++t) {
      float sum = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        sum += blockDot(w.type, row + b * block_bytes, a.x->rowQ(t) + 32 * b, a.x->rowD(t)[b],
                        a.x->rowSum(t)[b]);
      }
      a.y[t * a.ldy + n] = sum;
    }
  }
}

void floatRowsPortable(const FloatRows& a) {
  const WeightMatrix& w = *a.weight;
  for (int64_t n = a.row_begin; n < a.row_end; ++n) {
    const uint8_t* row = w.data + n * w.rowBytes();
    for (int64_t t = 0; t < a.tokens; ++t) {
      const float* x = a.x + t * a.ldx;
      float sum = 0.0f;
      for (int64_t k = 0; k < w.cols; ++k) sum += loadFloat(w.type, row, k) * x[k];
      a.y[t * a.ldy + n] = sum;
    }
  }
}

}  // namespace cleave::cpu::kernels
