#include "kernels/cpu/attention.h"

#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vector_ops.h"

namespace cleave::cpu {

void attention(const AttentionArgs& a, ThreadPool& pool) {
  const Isa isa = bestIsa();
  const bool avx512 = isa == Isa::kAvx512 && a.head_dim % 16 == 0 && a.head_dim <= 256;
  if (avx512 || (isa >= Isa::kAvx2 && a.head_dim % 8 == 0 && a.head_dim <= 256)) {
    pool.run(a.tokens * a.kv_heads, [&](int64_t task) {
      const int64_t t = task / a.kv_heads;
      thread_local std::vector<float> scores;
      scores.resize((a.heads / a.kv_heads) * (a.positions[t] + 1));
      (avx512 ? kernels::attentionGroupAvx512 : kernels::attentionGroupAvx2)(
          a, t, task % a.kv_heads, scores.data());
    });
    return;
  }
  const int64_t group = a.heads / a.kv_heads;
  const int64_t head_block = a.block_size * a.head_dim;  // One head's part of a block.
  const int64_t element = kvElementBytes(a.kv_type);
  pool.run(a.tokens * a.heads, [&](int64_t task) {
    const int64_t t = task / a.heads;
    const int64_t h = task % a.heads;
    const int64_t kvh = h / group;
    const int64_t context = a.positions[t] + 1;
    const int32_t* table = a.block_tables[t];
    thread_local std::vector<float> row;  // A decoded key or value.
    row.resize(a.head_dim);
    auto rowOf = [&](const void* pool_base, float scale, int64_t position) -> const float* {
      const int64_t at = (table[position / a.block_size] * a.kv_heads + kvh) * head_block +
                         (position % a.block_size) * a.head_dim;
      const void* stored = static_cast<const uint8_t*>(pool_base) + at * element;
      if (a.kv_type == KvType::kF32) return static_cast<const float*>(stored);
      decodeKv(a.kv_type, stored, a.head_dim, scale, row.data());
      return row.data();
    };
    const float* q = a.q + t * a.ldq + h * a.head_dim;
    thread_local std::vector<float> scores;
    scores.resize(context);
    for (int64_t j = 0; j < context; ++j) {
      scores[j] = dot(q, rowOf(a.k_pool, a.k_scale, j), a.head_dim) * a.scale;
    }
    softmax(scores.data(), context, 1, context);
    float* out = a.out + t * a.ldo + h * a.head_dim;
    for (int64_t d = 0; d < a.head_dim; ++d) out[d] = 0.0f;
    for (int64_t j = 0; j < context; ++j) {
      axpy(scores[j], rowOf(a.v_pool, a.v_scale, j), out, a.head_dim);
    }
  });
}

}  // namespace cleave::cpu
