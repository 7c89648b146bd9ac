#include <immintrin.h>

#include "kernels/cpu/vector_ops.h"

namespace cleave::cpu::vec {
namespace {

// exp(x) for 16 floats: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact
// reduction), e^r by a degree-6 polynomial, times 2^n by VSCALEFPS. Relative error ~2 ulp;
// below -87.3 the result flushes to 0, above 88.7 it saturates to +inf.
inline __m512 exp16(__m512 x) {
  const __mmask16 representable = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(representable, _mm512_scalef_ps(p, n));
}

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
