// Attention for one (token, KV head) with AVX-512: the query heads sharing the KV head are
// processed together, so each key and value row is loaded once for the whole group instead
// of once per query head. Head-major blocks keep a head's positions contiguous.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/elementwise.h"

namespace cleave::cpu::kernels {

void attentionGroupAvx512(const AttentionArgs& a, int64_t t, int64_t kvh) {
  const int64_t group = a.heads / a.kv_heads;
  const int64_t d = a.head_dim, nv = d / 16, bs = a.block_size;
  const int64_t context = a.positions[t] + 1;
  const int32_t* table = a.block_tables[t];
  const int64_t head_block = bs * d;
  thread_local std::vector<float> scores;
  scores.resize(group * context);
  const float* q = a.q + t * a.ldq + kvh * group * d;  // The group's heads are adjacent.

  for (int64_t j0 = 0; j0 < context; j0 += bs) {
    const float* kb = a.k_pool + (table[j0 / bs] * a.kv_heads + kvh) * head_block;
    const int64_t n = std::min(bs, context - j0);
    for (int64_t j = 0; j < n; ++j) {
      const float* k = kb + j * d;
      for (int64_t g = 0; g < group; ++g) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t v = 0; v < nv; ++v) {
          acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * d + 16 * v), _mm512_loadu_ps(k + 16 * v),
                                acc);
        }
        scores[g * context + j0 + j] = _mm512_reduce_add_ps(acc) * a.scale;
      }
    }
  }
  softmax(scores.data(), context, group, context);

  // Heads in chunks whose accumulators fit in registers.
  const int64_t chunk = std::max<int64_t>(1, 16 / nv);
  for (int64_t g0 = 0; g0 < group; g0 += chunk) {
    const int64_t heads = std::min(chunk, group - g0);
    __m512 acc[16];
    for (int64_t i = 0; i < heads * nv; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t j0 = 0; j0 < context; j0 += bs) {
      const float* vb = a.v_pool + (table[j0 / bs] * a.kv_heads + kvh) * head_block;
      const int64_t n = std::min(bs, context - j0);
      for (int64_t j = 0; j < n; ++j) {
        const float* row = vb + j * d;
        for (int64_t h = 0; h < heads; ++h) {
          const __m512 p = _mm512_set1_ps(scores[(g0 + h) * context + j0 + j]);
          for (int64_t v = 0; v < nv; ++v) {
            acc[h * nv + v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(row + 16 * v), acc[h * nv + v]);
          }
        }
      }
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* out = a.out + t * a.ldo + (kvh * group + g0 + h) * d;
      for (int64_t v = 0; v < nv; ++v) _mm512_storeu_ps(out + 16 * v, acc[h * nv + v]);
    }
  }
}

}  // namespace cleave::cpu::kernels
