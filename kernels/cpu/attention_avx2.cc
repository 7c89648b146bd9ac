// The attention kernels (attention_rows.h, attention_keys.h) on 8 AVX2 lanes.
#include <immintrin.h>

#include <limits>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/attention_keys.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/simd_exp.h"
#include "kernels/cpu/simd_reduce.h"

namespace cleave::cpu::kernels {
namespace {

struct Avx2 {
  using V = __m256;
  using I = __m256i;
  static constexpr int64_t kLanes = kRowLanesAvx2;
  static constexpr int64_t kAccumulators = 8;  // Of 16 registers.
  static constexpr int64_t kDims = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float f) { return _mm256_set1_ps(f); }
  static V loadf(const float* p) { return _mm256_loadu_ps(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V exp(V x) { return simd::exp8(x); }
  static V neg_inf() { return _mm256_set1_ps(-std::numeric_limits<float>::infinity()); }
  static I loadi(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const I*>(p)); }
  static V above(V s, I limits, int64_t j) {
    const __m256i past = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(j)), limits);
    return _mm256_blendv_ps(s, neg_inf(), _mm256_castsi256_ps(past));
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // s with -inf in the lanes from n on.
  static V keep(V s, int64_t n) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i past = _mm256_cmpgt_epi32(lanes, _mm256_set1_epi32(static_cast<int32_t>(n - 1)));
    return _mm256_blendv_ps(s, neg_inf(), _mm256_castsi256_ps(past));
  }
  // s with -inf in the lanes before n.
  static V dropBelow(V s, int64_t n) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i before = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n)), lanes);
    return _mm256_blendv_ps(s, neg_inf(), _mm256_castsi256_ps(before));
  }
  static float hmax(V x) { return simd::max8(x); }
  // The lanes summed as treeSum (attention_rows.h) sums 8 vectors.
  static float hsumTree(V x) { return simd::sum8(x); }
  static float exp1(float x) { return _mm256_cvtss_f32(exp(_mm256_set1_ps(x))); }
  // out[i], lane k = rows[k][col + i] for i, k < 8: two rounds of in-lane interleaves, then
  // the 128-bit halves gathered.
  static void transpose(const float* const* rows, int64_t col, V* out) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      const __m256 a = _mm256_loadu_ps(rows[2 * i] + col);
      const __m256 b = _mm256_loadu_ps(rows[2 * i + 1] + col);
      t[2 * i] = _mm256_unpacklo_ps(a, b);
      t[2 * i + 1] = _mm256_unpackhi_ps(a, b);
    }
    for (int i = 0; i < 2; ++i) {
      const __m256d lo = _mm256_castps_pd(t[4 * i]), hi = _mm256_castps_pd(t[4 * i + 1]);
      const __m256d lo2 = _mm256_castps_pd(t[4 * i + 2]), hi2 = _mm256_castps_pd(t[4 * i + 3]);
      // u[4i + c]: rows 4i..4i+3 of column c of each half.
      u[4 * i] = _mm256_castpd_ps(_mm256_unpacklo_pd(lo, lo2));
      u[4 * i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(lo, lo2));
      u[4 * i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(hi, hi2));
      u[4 * i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(hi, hi2));
    }
    for (int c = 0; c < 4; ++c) {
      out[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      out[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
  // The even and odd bf16 elements of 32-bit pairs, widened.
  static V bf16Even(V pairs) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(pairs), 16));
  }
  static V bf16Odd(V pairs) {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(pairs),
                                                _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  template <KvType kType>
  static V load(const uint8_t* p) {
    if constexpr (kType == KvType::kF32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    } else if constexpr (kType == KvType::kBf16) {
      const __m256i wide =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    } else {
      const __m128i codes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
      const __m128i magnitude = _mm_slli_epi16(_mm_and_si128(codes, _mm_set1_epi16(0x7F)), 7);
      const __m128i sign = _mm_slli_epi16(_mm_and_si128(codes, _mm_set1_epi16(0x80)), 8);
      return _mm256_cvtph_ps(_mm_or_si128(magnitude, sign));
    }
  }
};

}  // namespace

void attentionKeysAvx2(const AttentionArgs& a, int64_t t, int64_t kvh, float* scratch) {
  attentionKeysFor<Avx2>(a, t, kvh, scratch);
}

void attentionRowsAvx2(const AttentionArgs& a, const RowTile& tile, int64_t kvh, float* scratch) {
  attentionRowsFor<Avx2>(a, tile, kvh, scratch);
}

}  // namespace cleave::cpu::kernels
