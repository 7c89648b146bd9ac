// The attention kernel (attention_group.h) on 8 AVX2 lanes.
#include <immintrin.h>

#include "kernels/cpu/attention_group.h"
#include "kernels/cpu/attention_kernels.h"

namespace cleave::cpu::kernels {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int64_t kLanes = 8;
  static constexpr int64_t kAccumulators = 8;  // Of 16 registers.
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float f) { return _mm256_set1_ps(f); }
  static V loadf(const float* p) { return _mm256_loadu_ps(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  // The lanes of each of v[0..3] summed: pairs, then quads, then the two halves.
  static void sum4(const V* v, float* out) {
    const V quads = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1)));
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
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

void attentionGroupAvx2(const AttentionArgs& a, int64_t t, int64_t kvh, float* scores) {
  attentionGroupFor<Avx2>(a, t, kvh, scores);
}

}  // namespace cleave::cpu::kernels
