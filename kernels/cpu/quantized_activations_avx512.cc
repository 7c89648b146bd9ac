// AVX-512 activation quantization: per 32-element block, max |x| by reduction, scale,
// round to nearest even (the default MXCSR mode) and narrow to int8 with saturation.
#include <immintrin.h>

#include "kernels/cpu/quantized_activations.h"

namespace cleave::cpu {

void quantizeActivationsAvx512(const float* x, int64_t row_begin, int64_t row_end, int64_t cols,
                               int64_t ld, QuantizedActivations& out) {
  const int64_t blocks = cols / 32;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* row = x + r * ld;
    for (int64_t b = 0; b < blocks; ++b) {
      const __m512 v0 = _mm512_loadu_ps(row + 32 * b);
      const __m512 v1 = _mm512_loadu_ps(row + 32 * b + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float d = amax / 127.0f;
      const __m512 inverse = _mm512_set1_ps(d != 0.0f ? 127.0f / amax : 0.0f);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inverse));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inverse));
      int8_t* q = out.q.data() + r * cols + 32 * b;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(q1));
      out.d[r * blocks + b] = d;
      const int32_t half = _mm512_reduce_add_epi32(q0);
      out.sum[r * blocks + b] = half + _mm512_reduce_add_epi32(q1);
      out.half_sum[r * blocks + b] = half;
    }
  }
}

}  // namespace cleave::cpu
