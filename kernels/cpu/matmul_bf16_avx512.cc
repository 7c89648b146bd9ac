// AVX-512 BF16 kernel for BF16 weights: the activations rounded to bf16 once per product
// (toBf16Avx512), then VDPBF16PS, which multiplies 32 bf16 pairs and adds each pair's sum into
// one of 16 float accumulators: twice the products of an FMA per instruction, the weights read
// as stored with nothing to widen. Blocks of 6 rows x 4 tokens, as the float kernel
// (matmul_avx512.cc), each accumulator summing its (row, token) in the same order whatever
// the batch.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/matmul_kernels.h"

namespace cleave::cpu::kernels {
namespace {

// The lanes of 16-bit elements [k, k + 32) that lie before `cols`.
inline __mmask32 laneMask(int64_t cols, int64_t k) {
  const int64_t left = cols - k;
  return left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << left) - 1);
}

inline __m512bh loadBf16(const uint16_t* p, __mmask32 mask) {
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, p));
}

template <int R, int T>
inline void bf16Block(const FloatRows& a, int64_t n, int64_t t) {
  const WeightMatrix& w = *a.weight;
  const int64_t cols = w.cols;
  const uint16_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const uint16_t*>(w.data) + (n + r) * cols;
  const uint16_t* xs[T];
  for (int j = 0; j < T; ++j) xs[j] = a.xb + (t + j) * a.ldxb;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < T; ++j) acc[r][j] = _mm512_setzero_ps();
  auto step = [&](int64_t k, __mmask32 mask) {
    __m512bh x[T];
    for (int j = 0; j < T; ++j) x[j] = loadBf16(xs[j] + k, mask);
    for (int r = 0; r < R; ++r) {
      const __m512bh weights = loadBf16(rows[r] + k, mask);
      for (int j = 0; j < T; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], weights, x[j]);
    }
  };
  int64_t k = 0;
  for (; k + 32 <= cols; k += 32) step(k, ~__mmask32{0});
  if (k < cols) step(k, laneMask(cols, k));
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < T; ++j) a.y[(t + j) * a.ldy + n + r] = _mm512_reduce_add_ps(acc[r][j]);
}

}  // namespace

void bf16RowsAvx512(const FloatRows& a) {
  forEachBlock<6, 4>(a, [&]<int R, int T>(int64_t n, int64_t t) { bf16Block<R, T>(a, n, t); });
}

void toBf16Avx512(const float* x, int64_t tokens, int64_t cols, int64_t ldx, uint16_t* out,
                  int64_t ldo) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = x + t * ldx;
    uint16_t* to = out + t * ldo;
    for (int64_t k = 0; k < cols; k += 32) {
      const __mmask32 mask = laneMask(cols, k);
      const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(mask), row + k);
      const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(mask >> 16), row + k + 16);
      // Rounded to nearest even: the first 16 from lo, the next from hi.
      _mm512_mask_storeu_epi16(to + k, mask,
                               reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
  }
}

}  // namespace cleave::cpu::kernels
