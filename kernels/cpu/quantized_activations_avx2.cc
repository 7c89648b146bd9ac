// AVX2 activation quantization, the same arithmetic as the portable and AVX-512 paths: per
// 32-element block, max |x|, scale, round to nearest even (the default MXCSR mode) and narrow
// to int8 (the values are within +-127 already).
#include <immintrin.h>

#include "kernels/cpu/quantized_activations.h"
#include "kernels/cpu/simd_reduce.h"

namespace cleave::cpu {

void quantizeActivationsAvx2(const float* x, int64_t row_begin, int64_t row_end, int64_t cols,
                             int64_t ld, QuantizedActivations& out) {
  const int64_t blocks = cols / 32;
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  // packs_epi32 then packs_epi16 leave the four 8-value quarters' 4-byte groups in the order
  // 0 2 4 6 1 3 5 7 of the 32 values' groups; this puts them back.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* row = x + r * ld;
    for (int64_t b = 0; b < blocks; ++b) {
      __m256 v[4];
      for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(row + 32 * b + 8 * k);
      const __m256 peak = _mm256_max_ps(
          _mm256_max_ps(_mm256_and_ps(v[0], magnitude), _mm256_and_ps(v[1], magnitude)),
          _mm256_max_ps(_mm256_and_ps(v[2], magnitude), _mm256_and_ps(v[3], magnitude)));
      const float amax = simd::max8(peak);
      const float d = amax / 127.0f;
      const __m256 inverse = _mm256_set1_ps(d != 0.0f ? 127.0f / amax : 0.0f);
      __m256i q[4];
      for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inverse));
      const __m256i bytes =
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + r * cols + 32 * b),
                          _mm256_permutevar8x32_epi32(bytes, order));
      out.d[r * blocks + b] = d;
      const int32_t half = simd::sum8(_mm256_add_epi32(q[0], q[1]));
      out.sum[r * blocks + b] = half + simd::sum8(_mm256_add_epi32(q[2], q[3]));
      out.half_sum[r * blocks + b] = half;
    }
  }
}

}  // namespace cleave::cpu
