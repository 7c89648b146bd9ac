// AVX-512 (F/BW/VL + VNNI) row kernels. Quantized weights: two 32-element blocks per
// iteration, the 4-bit or 8-bit weights widened to 64 unsigned bytes in x's element order
// and multiplied with VPDPBUSD (u8 x s8 -> s32); each block's integer sum is scaled by
// d_w * d_x in float. Tokens are processed in tiles of up to 4 so each weight block is
// loaded and widened once per tile.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matmul_kernels.h"

namespace cleave::cpu::kernels {
namespace {

using model::TensorType;

constexpr int kTile = 4;

inline float half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// 64 unsigned weight bytes of blocks b0 and b1, in the element order of x.
template <TensorType kType>
inline __m512i widen(const uint8_t* b0, const uint8_t* b1) {
  if constexpr (kType == TensorType::kQ8_0) {
    __m512i z = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + 2)), 1);
    return _mm512_xor_si512(z, _mm512_set1_epi8(static_cast<char>(0x80)));  // s8 -> s8 + 128.
  } else {
    constexpr int kOffset = kType == TensorType::kQ4_0 ? 2 : 4;
    __m256i packed = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + kOffset))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + kOffset)), 1);
    const __m256i mask = _mm256_set1_epi8(0x0f);
    __m256i low = _mm256_and_si256(packed, mask);                         // [b0 0..15 | b1 0..15]
    __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);  // [b0 16..31 | b1 16..31]
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
    return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));  // [b0 lo, b0 hi, b1 lo, b1 hi]
  }
}

// The part of a block's contribution not covered by d_w * d_x * dot(u8 weights, x).
template <TensorType kType>
inline float correction(const uint8_t* block, float dw, float dx, int32_t xsum) {
  if constexpr (kType == TensorType::kQ4_0) return -8.0f * dw * dx * static_cast<float>(xsum);
  if constexpr (kType == TensorType::kQ8_0) return -128.0f * dw * dx * static_cast<float>(xsum);
  return half(block + 2) * dx * static_cast<float>(xsum);  // Q4_1: + m_w * sum(x).
}

// One weight row against tokens [t0, t0 + kCount).
template <TensorType kType, int kCount>
inline void rowTile(const uint8_t* row, int64_t blocks, int64_t block_bytes,
                    const QuantizedActivations& x, int64_t t0, float* y, int64_t ldy) {
  __m512 acc[kCount];
  float corr[kCount];
  for (int i = 0; i < kCount; ++i) {
    acc[i] = _mm512_setzero_ps();
    corr[i] = 0.0f;
  }
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const uint8_t* b0 = row + b * block_bytes;
    const uint8_t* b1 = b0 + block_bytes;
    const __m512i wv = widen<kType>(b0, b1);
    const float dw0 = half(b0);
    const float dw1 = half(b1);
    for (int i = 0; i < kCount; ++i) {
      const int64_t t = t0 + i;
      const __m512i xv = _mm512_loadu_si512(x.rowQ(t) + 32 * b);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv);
      const float dx0 = x.rowD(t)[b];
      const float dx1 = x.rowD(t)[b + 1];
      const __m512 scale =
          _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(dw0 * dx0), _mm512_set1_ps(dw1 * dx1));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[i]);
      corr[i] += correction<kType>(b0, dw0, dx0, x.rowSum(t)[b]) +
                 correction<kType>(b1, dw1, dx1, x.rowSum(t)[b + 1]);
    }
  }
  if (b < blocks) {  // An odd last block: widen it with itself and keep the low half.
    const uint8_t* b0 = row + b * block_bytes;
    const __m512i wv = widen<kType>(b0, b0);
    const float dw0 = half(b0);
    for (int i = 0; i < kCount; ++i) {
      const int64_t t = t0 + i;
      const __m512i xv = _mm512_castsi256_si512(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.rowQ(t) + 32 * b)));
      const __m512i dot = _mm512_maskz_dpbusd_epi32(0x00ff, _mm512_setzero_si512(), wv, xv);
      const float dx0 = x.rowD(t)[b];
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(dw0 * dx0), acc[i]);
      corr[i] += correction<kType>(b0, dw0, dx0, x.rowSum(t)[b]);
    }
  }
  for (int i = 0; i < kCount; ++i) y[(t0 + i) * ldy] = _mm512_reduce_add_ps(acc[i]) + corr[i];
}

template <TensorType kType>
void quantRows(const QuantRows& a) {
  const WeightMatrix& w = *a.weight;
  const int64_t blocks = w.cols / 32;
  const int64_t row_bytes = w.rowBytes();
  const int64_t block_bytes = row_bytes / blocks;
  const int64_t tokens = a.x->rows;
  for (int64_t n = a.row_begin; n < a.row_end; ++n) {
    const uint8_t* row = w.data + n * row_bytes;
    float* y = a.y + n;
    int64_t t = 0;
    for (; t + kTile <= tokens; t += kTile) rowTile<kType, kTile>(row, blocks, block_bytes, *a.x, t, y, a.ldy);
    switch (tokens - t) {
      case 3: rowTile<kType, 3>(row, blocks, block_bytes, *a.x, t, y, a.ldy); break;
      case 2: rowTile<kType, 2>(row, blocks, block_bytes, *a.x, t, y, a.ldy); break;
      case 1: rowTile<kType, 1>(row, blocks, block_bytes, *a.x, t, y, a.ldy); break;
      default: break;
    }
  }
}

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

void quantRowsAvx512(const QuantRows& a) {
  switch (a.weight->type) {
    case TensorType::kQ4_0: return quantRows<TensorType::kQ4_0>(a);
    case TensorType::kQ4_1: return quantRows<TensorType::kQ4_1>(a);
    case TensorType::kQ8_0: return quantRows<TensorType::kQ8_0>(a);
    default: return;
  }
}

void floatRowsAvx512(const FloatRows& a) {
  switch (a.weight->type) {
    case TensorType::kF32: return floatRows<TensorType::kF32>(a);
    case TensorType::kF16: return floatRows<TensorType::kF16>(a);
    case TensorType::kBF16: return floatRows<TensorType::kBF16>(a);
    default: return;
  }
}

}  // namespace cleave::cpu::kernels
