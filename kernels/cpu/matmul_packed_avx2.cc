// AVX2 kernel over the row-interleaved layout (packed_layout.h). A 16-row group is taken as
// two halves of 8 rows, each 32-bit lane of a 256-bit vector one row: chunk c's bytes
// [64c + 32h, 64c + 32h + 32) are half h's. Per block, each 4-weight chunk is multiplied with
// the matching 4 bytes of x broadcast to every lane (VPMADDUBSW, u8 x s8 into s16 pairs), so
// a lane ends the block holding its row's integer dot product; scales and offsets are applied
// per lane, with no horizontal sums.
//   Q4_0 / Q4_1: codes 0..15 times |x| <= 127 give pairs of at most 3810, so a block's eight
//     products add in int16 (at most 30480) and widen once (VPMADDWD).
//   Q8_0: the codes are stored + 128; made signed again, they multiply as |w| x (x * sign w)
//     (pairs of at most 2 * 128 * 127) and widen every chunk.
// Tokens go in tiles so each block is unpacked once per tile; a token's sums run in the same
// order whatever its tile, so its output does not depend on the batch.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/packed_layout.h"

namespace cleave::cpu::kernels {
namespace {

using model::TensorType;

constexpr int kHalfRows = 8;

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Rows [8 * half, 8 * half + 8) of a group, tokens [t0, t0 + kCount); `valid` rows of the
// half exist (1..8), the rest are padding and are not stored.
template <TensorType kType, int kCount>
inline void halfTile(const uint8_t* group, int64_t blocks, int half, const QuantizedActivations& x,
                     int64_t t0, float* y, int64_t ldy, int valid) {
  constexpr int64_t kGroupBlock = packed::groupBlockBytes(kType);
  constexpr int64_t kScales = packed::scaleBytes(kType);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low_mask = _mm256_set1_epi8(0x0f);
  __m256 acc[kCount];
  for (int i = 0; i < kCount; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = group + b * kGroupBlock;
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * half)));
    [[maybe_unused]] const __m256 m =
        kType == TensorType::kQ4_1 ? _mm256_cvtph_ps(_mm_loadu_si128(
                                         reinterpret_cast<const __m128i*>(block + 32 + 16 * half)))
                                   : _mm256_setzero_ps();
    const uint8_t* quants = block + kScales + 32 * half;
    __m256i dot[kCount];
    if constexpr (kType == TensorType::kQ8_0) {
      for (int i = 0; i < kCount; ++i) dot[i] = _mm256_setzero_si256();
      const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
      for (int c = 0; c < 8; ++c) {
        const __m256i w = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * c)), bias);
        const __m256i magnitude = _mm256_abs_epi8(w);
#pragma unroll
        for (int i = 0; i < kCount; ++i) {
          const int8_t* xq = x.rowQ(t0 + i) + 32 * b;
          const __m256i pairs =
              _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(broadcast4(xq + 4 * c), w));
          dot[i] = _mm256_add_epi32(dot[i], _mm256_madd_epi16(pairs, ones));
        }
      }
    } else {
      __m256i pairs[kCount];
      for (int i = 0; i < kCount; ++i) pairs[i] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * c));
        const __m256i low = _mm256_and_si256(v, low_mask);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_mask);
#pragma unroll
        for (int i = 0; i < kCount; ++i) {
          const int8_t* xq = x.rowQ(t0 + i) + 32 * b;
          pairs[i] = _mm256_add_epi16(
              pairs[i], _mm256_add_epi16(_mm256_maddubs_epi16(low, broadcast4(xq + 4 * c)),
                                         _mm256_maddubs_epi16(high, broadcast4(xq + 16 + 4 * c))));
        }
      }
      for (int i = 0; i < kCount; ++i) dot[i] = _mm256_madd_epi16(pairs[i], ones);
    }
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      const int64_t t = t0 + i;
      const float dx = x.rowD(t)[b];
      acc[i] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[i]);
      const float xs = dx * static_cast<float>(x.rowSum(t)[b]);
      if constexpr (kType == TensorType::kQ4_0)
        acc[i] = _mm256_fmadd_ps(d, _mm256_set1_ps(-8.0f * xs), acc[i]);
      if constexpr (kType == TensorType::kQ4_1)
        acc[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs), acc[i]);
    }
  }
  if (valid == kHalfRows) {
    for (int i = 0; i < kCount; ++i) _mm256_storeu_ps(y + (t0 + i) * ldy, acc[i]);
  } else {
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int i = 0; i < kCount; ++i) _mm256_maskstore_ps(y + (t0 + i) * ldy, mask, acc[i]);
  }
}

template <TensorType kType>
void groups(const PackedRows& a) {
  const CpuMatrix& w = *a.weight;
  const int64_t blocks = w.cols() / 32;
  const int64_t group_bytes = packed::groupBytes(kType, blocks);
  const int64_t tokens = a.x->rows;
  for (int64_t g = a.group_begin; g < a.group_end; ++g) {
    const uint8_t* group = w.packedData() + g * group_bytes;
    const int64_t rows = std::min<int64_t>(packed::kGroupRows, w.rows() - g * packed::kGroupRows);
    for (int half = 0; half * kHalfRows < rows; ++half) {
      const int valid = static_cast<int>(std::min<int64_t>(kHalfRows, rows - half * kHalfRows));
      float* y = a.y + g * packed::kGroupRows + half * kHalfRows;
      forEachTokenTile(tokens, [&]<int kCount>(int64_t t) {
        halfTile<kType, kCount>(group, blocks, half, *a.x, t, y, a.ldy, valid);
      });
    }
  }
}

}  // namespace

void packedGroupsAvx2(const PackedRows& a) {
  switch (a.weight->kernelType()) {
    case TensorType::kQ4_0: return groups<TensorType::kQ4_0>(a);
    case TensorType::kQ4_1: return groups<TensorType::kQ4_1>(a);
    case TensorType::kQ8_0: return groups<TensorType::kQ8_0>(a);
    default: return;
  }
}

}  // namespace cleave::cpu::kernels
