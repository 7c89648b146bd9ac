#include "kernels/cpu/attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vector_ops.h"

namespace cleave::cpu {

namespace {

// The SIMD kernels' work: tiles of the runs with at least `lanes` rows (prefill chunks), and
// the other tokens one at a time (rows == 0), the tasks with the most positions first.
std::vector<kernels::RowTile> planTiles(const AttentionArgs& a, int64_t lanes) {
  const int64_t group = a.heads / a.kv_heads;
  std::vector<kernels::RowTile> tiles;
  for (int64_t t = 0; t < a.tokens;) {
    int64_t n = 1;
    while (t + n < a.tokens && a.block_tables[t + n] == a.block_tables[t] &&
           a.positions[t + n] == a.positions[t] + n)
      ++n;
    if (n * group >= lanes) {
      for (int64_t r0 = 0; r0 < n * group; r0 += lanes) tiles.push_back({t, n * group, r0});
    } else {
      for (int64_t i = 0; i < n; ++i) tiles.push_back({t + i, 0, 0});
    }
    t += n;
  }
  auto lastPosition = [&](const kernels::RowTile& tile) {
    if (tile.rows == 0) return a.positions[tile.t0];
    const int64_t r = std::min(tile.r0 + lanes, tile.rows) - 1;
    return a.positions[tile.t0 + r / group];
  };
  std::stable_sort(tiles.begin(), tiles.end(),
                   [&](const auto& x, const auto& y) { return lastPosition(x) > lastPosition(y); });
  return tiles;
}

}  // namespace

void attention(const AttentionArgs& a, ThreadPool& pool) {
  const Isa isa = bestIsa();
  const bool avx512 = isa == Isa::kAvx512 && a.head_dim % 16 == 0 && a.head_dim <= 256;
  if (avx512 || (isa >= Isa::kAvx2 && a.head_dim % 8 == 0 && a.head_dim <= 256)) {
    const std::vector<kernels::RowTile> tiles =
        planTiles(a, avx512 ? kernels::kRowLanesAvx512 : kernels::kRowLanesAvx2);
    pool.run(static_cast<int64_t>(tiles.size()) * a.kv_heads, [&](int64_t task) {
      const kernels::RowTile& tile = tiles[task / a.kv_heads];
      const int64_t kvh = task % a.kv_heads;
      thread_local std::vector<float> scratch;
      if (tile.rows > 0) {
        scratch.resize(kernels::rowsScratchFloats(a.head_dim));
        (avx512 ? kernels::attentionRowsAvx512 : kernels::attentionRowsAvx2)(a, tile, kvh,
                                                                             scratch.data());
      } else {
        scratch.resize(kernels::keysScratchFloats(a.heads / a.kv_heads, a.head_dim));
        (avx512 ? kernels::attentionKeysAvx512 : kernels::attentionKeysAvx2)(a, tile.t0, kvh,
                                                                             scratch.data());
      }
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
    const int64_t from = a.window > 0 ? std::max<int64_t>(0, context - a.window) : 0;
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
    // The scores of positions [from, context), then the sink's logit (no value).
    const int64_t n = context - from;
    thread_local std::vector<float> scores;
    scores.resize(n + 1);
    for (int64_t j = from; j < context; ++j) {
      scores[j - from] = dot(q, rowOf(a.k_pool, a.k_scale, j), a.head_dim) * a.scale;
    }
    if (a.softcap > 0) softCap(scores.data(), n, a.softcap);
    scores[n] = a.sinks != nullptr ? a.sinks[h] : -std::numeric_limits<float>::infinity();
    softmax(scores.data(), n + 1, 1, n + 1);
    float* out = a.out + t * a.ldo + h * a.head_dim;
    for (int64_t d = 0; d < a.head_dim; ++d) out[d] = 0.0f;
    for (int64_t j = from; j < context; ++j) {
      axpy(scores[j - from], rowOf(a.v_pool, a.v_scale, j), out, a.head_dim);
    }
  });
}

}  // namespace cleave::cpu
