// AVX2 forms of the float vector ops that call exp: 8 lanes at a time, the last partial vector
// through masked loads and stores, so every element takes the same arithmetic.
#include <immintrin.h>

#include "kernels/cpu/simd_exp.h"
#include "kernels/cpu/simd_reduce.h"
#include "kernels/cpu/vector_ops.h"

namespace cleave::cpu::vec {
namespace {

using simd::exp8;

// Lanes [0, left) of a mask for _mm256_maskload_ps / _mm256_maskstore_ps.
inline __m256i tailMask(int64_t left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(left)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace

float expShiftSumAvx2(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i mask = tailMask(n - i);
    // Lanes past n load 0 and are masked out of the sum.
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(mask),
                                   exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), s)));
    _mm256_maskstore_ps(x + i, mask, e);
    sum = _mm256_add_ps(sum, e);
  }
  return simd::sum8(sum);
}

void siluMulRowAvx2(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i mask = tailMask(n - i);
    const __m256 g = _mm256_maskload_ps(gate + i, mask);
    const __m256 silu =
        _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_maskstore_ps(out + i, mask, _mm256_mul_ps(silu, _mm256_maskload_ps(up + i, mask)));
  }
}

}  // namespace cleave::cpu::vec
