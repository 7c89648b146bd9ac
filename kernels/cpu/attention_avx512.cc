// The attention kernels (attention_rows.h, attention_keys.h) on 16 AVX-512 lanes.
#include <immintrin.h>

#include <limits>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/attention_keys.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/simd_exp.h"

namespace cleave::cpu::kernels {
namespace {

struct Avx512 {
  using V = __m512;
  using I = __m512i;
  static constexpr int64_t kLanes = kRowLanesAvx512;
  static constexpr int64_t kAccumulators = 16;  // Of 32 registers.
  static constexpr int64_t kDims = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float f) { return _mm512_set1_ps(f); }
  static V loadf(const float* p) { return _mm512_loadu_ps(p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V exp(V x) { return simd::exp16(x); }
  static V neg_inf() { return _mm512_set1_ps(-std::numeric_limits<float>::infinity()); }
  static I loadi(const int32_t* p) { return _mm512_loadu_si512(p); }
  static V above(V s, I limits, int64_t j) {
    const __mmask16 past =
        _mm512_cmplt_epi32_mask(limits, _mm512_set1_epi32(static_cast<int32_t>(j)));
    return _mm512_mask_mov_ps(s, past, neg_inf());
  }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // s with -inf in the lanes from n on.
  static V keep(V s, int64_t n) {
    return _mm512_mask_mov_ps(neg_inf(), static_cast<__mmask16>((1u << n) - 1), s);
  }
  // s with -inf in the lanes before n.
  static V dropBelow(V s, int64_t n) {
    return _mm512_mask_mov_ps(s, static_cast<__mmask16>((1u << n) - 1), neg_inf());
  }
  static float hmax(V x) { return _mm512_reduce_max_ps(x); }
  // The lanes summed as treeSum (attention_rows.h) sums 16 vectors: x[i] + x[i + 8] first,
  // then + 4, + 2, + 1.
  static float hsumTree(V x) {
    x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(3, 2, 3, 2)));
    x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 1, 1, 1)));
    x = _mm512_add_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = _mm512_add_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_cvtss_f32(x);
  }
  static float exp1(float x) { return _mm512_cvtss_f32(exp(_mm512_set1_ps(x))); }
  // out[i], lane k = rows[k][col + i] for i, k < 16: two rounds of in-lane interleaves,
  // then the 128-bit quarters gathered.
  static void transpose(const float* const* rows, int64_t col, V* out) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      const __m512 a = _mm512_loadu_ps(rows[2 * i] + col);
      const __m512 b = _mm512_loadu_ps(rows[2 * i + 1] + col);
      t[2 * i] = _mm512_unpacklo_ps(a, b);
      t[2 * i + 1] = _mm512_unpackhi_ps(a, b);
    }
    for (int i = 0; i < 4; ++i) {
      const __m512d lo = _mm512_castps_pd(t[4 * i]), hi = _mm512_castps_pd(t[4 * i + 1]);
      const __m512d lo2 = _mm512_castps_pd(t[4 * i + 2]), hi2 = _mm512_castps_pd(t[4 * i + 3]);
      // u[4i + c]: rows 4i..4i+3 of column c of each quarter.
      u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo, lo2));
      u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo, lo2));
      u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi, hi2));
      u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi, hi2));
    }
    for (int c = 0; c < 4; ++c) {
      const __m512 x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], _MM_SHUFFLE(1, 0, 1, 0));
      const __m512 x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], _MM_SHUFFLE(3, 2, 3, 2));
      const __m512 y0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(1, 0, 1, 0));
      const __m512 y1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(3, 2, 3, 2));
      out[c] = _mm512_shuffle_f32x4(x0, y0, _MM_SHUFFLE(2, 0, 2, 0));
      out[4 + c] = _mm512_shuffle_f32x4(x0, y0, _MM_SHUFFLE(3, 1, 3, 1));
      out[8 + c] = _mm512_shuffle_f32x4(x1, y1, _MM_SHUFFLE(2, 0, 2, 0));
      out[12 + c] = _mm512_shuffle_f32x4(x1, y1, _MM_SHUFFLE(3, 1, 3, 1));
    }
  }
  // The even and odd bf16 elements of 32-bit pairs, widened.
  static V bf16Even(V pairs) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(pairs), 16));
  }
  static V bf16Odd(V pairs) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(pairs),
                                                _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  template <KvType kType>
  static V load(const uint8_t* p) {
    if constexpr (kType == KvType::kF32) {
      return _mm512_loadu_ps(p);
    } else if constexpr (kType == KvType::kBf16) {
      const __m512i wide =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    } else {
      const __m256i codes =
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      const __m256i magnitude =
          _mm256_slli_epi16(_mm256_and_si256(codes, _mm256_set1_epi16(0x7F)), 7);
      const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(codes, _mm256_set1_epi16(0x80)), 8);
      return _mm512_cvtph_ps(_mm256_or_si256(magnitude, sign));
    }
  }
};

}  // namespace

void attentionKeysAvx512(const AttentionArgs& a, int64_t t, int64_t kvh, float* scratch) {
  attentionKeysFor<Avx512>(a, t, kvh, scratch);
}

void attentionRowsAvx512(const AttentionArgs& a, const RowTile& tile, int64_t kvh, float* scratch) {
  attentionRowsFor<Avx512>(a, tile, kvh, scratch);
}

}  // namespace cleave::cpu::kernels
