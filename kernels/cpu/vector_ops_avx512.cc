#include <immintrin.h>

#include "kernels/cpu/simd_exp.h"
#include "kernels/cpu/vector_ops.h"

namespace cleave::cpu::vec {
namespace {

using simd::exp16;

inline __mmask16 tailMask(int64_t left) { return static_cast<__mmask16>((1u << left) - 1); }

}  // namespace

float expShiftSumAvx512(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xffff : tailMask(n - i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), s));
    _mm512_mask_storeu_ps(x + i, mask, e);
    sum = _mm512_mask_add_ps(sum, mask, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

void siluMulRowAvx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xffff : tailMask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(mask, gate + i);
    const __m512 silu =
        _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(out + i, mask, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(mask, up + i)));
  }
}

float dotAvx512(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + i), _mm512_maskz_loadu_ps(mask, b + i),
                          acc);
  }
  return _mm512_reduce_add_ps(acc);
}

void axpyAvx512(float alpha, const float* x, float* y, int64_t n) {
  const __m512 a = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(a, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(
        y + i, mask,
        _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(mask, x + i), _mm512_maskz_loadu_ps(mask, y + i)));
  }
}

}  // namespace cleave::cpu::vec
