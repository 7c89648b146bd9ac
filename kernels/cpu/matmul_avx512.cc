// AVX-512 row kernels for float weights (F32, F16, BF16 widened to float in registers):
// 16 columns per step, tokens in tiles of up to 4 so each weight vector is loaded once per
// tile. Quantized weights use the packed kernel (matmul_packed_avx512.cc).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matmul_kernels.h"

namespace cleave::cpu::kernels {
namespace {

using model::TensorType;

constexpr int kTile = 4;

// 16 weights starting at element k of a float-format row, as floats.
template <TensorType kType>
inline __m512 loadWeights(const uint8_t* row, int64_t k, __mmask16 mask) {
  if constexpr (kType == TensorType::kF32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + k);
  } else if constexpr (kType == TensorType::kF16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, row + 2 * k));
  } else {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, row + 2 * k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
}

template <TensorType kType, int kCount>
inline void floatTile(const uint8_t* row, int64_t cols, const float* x, int64_t ldx, float* y,
                      int64_t ldy) {
  __m512 acc[kCount];
  for (int i = 0; i < kCount; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < cols; k += 16) {
    const __mmask16 mask = cols - k >= 16 ? 0xffff : static_cast<__mmask16>((1u << (cols - k)) - 1);
    const __m512 wv = loadWeights<kType>(row, k, mask);
    for (int i = 0; i < kCount; ++i) {
      acc[i] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mask, x + i * ldx + k), acc[i]);
    }
  }
  for (int i = 0; i < kCount; ++i) y[i * ldy] = _mm512_reduce_add_ps(acc[i]);
}

template <TensorType kType>
void floatRows(const FloatRows& a) {
  const WeightMatrix& w = *a.weight;
  const int64_t row_bytes = w.rowBytes();
  for (int64_t n = a.row_begin; n < a.row_end; ++n) {
    const uint8_t* row = w.data + n * row_bytes;
    int64_t t = 0;
    for (; t + kTile <= a.tokens; t += kTile) {
      floatTile<kType, kTile>(row, w.cols, a.x + t * a.ldx, a.ldx, a.y + t * a.ldy + n, a.ldy);
    }
    for (; t < a.tokens; ++t) {
      floatTile<kType, 1>(row, w.cols, a.x + t * a.ldx, a.ldx, a.y + t * a.ldy + n, a.ldy);
    }
  }
}

}  // namespace

void floatRowsAvx512(const FloatRows& a) {
  switch (a.weight->type) {
    case TensorType::kF32: return floatRows<TensorType::kF32>(a);
    case TensorType::kF16: return floatRows<TensorType::kF16>(a);
    case TensorType::kBF16: return floatRows<TensorType::kBF16>(a);
    default: return;
  }
}

}  // namespace cleave::cpu::kernels
