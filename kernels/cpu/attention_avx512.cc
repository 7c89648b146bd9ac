// The attention kernel (attention_group.h) on 16 AVX-512 lanes.
#include <immintrin.h>

#include "kernels/cpu/attention_group.h"
#include "kernels/cpu/attention_kernels.h"

namespace cleave::cpu::kernels {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int64_t kLanes = 16;
  static constexpr int64_t kAccumulators = 16;  // Of 32 registers.
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float f) { return _mm512_set1_ps(f); }
  static V loadf(const float* p) { return _mm512_loadu_ps(p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  // The lanes of each of v[0..3] summed: 128-bit quarters first (two vectors at a time), then
  // the four lanes of each quarter.
  static void sum4(const V* v, float* out) {
    const V ab = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const V cd = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(3, 2, 3, 2)));
    // Quarter i holds four partial sums of v[i].
    V quarters = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    quarters = _mm512_add_ps(quarters, _mm512_permute_ps(quarters, _MM_SHUFFLE(2, 3, 0, 1)));
    quarters = _mm512_add_ps(quarters, _mm512_permute_ps(quarters, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 firsts = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), quarters);
    _mm_storeu_ps(out, _mm512_castps512_ps128(firsts));
  }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
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

void attentionGroupAvx512(const AttentionArgs& a, int64_t t, int64_t kvh, float* scores) {
  attentionGroupFor<Avx512>(a, t, kvh, scores);
}

}  // namespace cleave::cpu::kernels
