// The body of the SIMD prefill attention kernels (attention_kernels.h), written once over a
// vector type: each ISA's file includes it, compiled for that ISA (attention_avx2.cc,
// attention_avx512.cc). Internal to cleave_kernels_cpu.
//
// A tile is kLanes query rows of one run (attention_kernels.h) that read one KV head. The
// rows are the vector's lanes, so every stored key and value element is loaded once for the
// whole tile (a broadcast) rather than once per query row, and nothing is summed across
// lanes. With Qt the tile's queries transposed ([head_dim][kLanes], times the score scale)
// and positions taken kKeys at a time from j0:
//   s[k]  = sum_e Qt[e] * K[j0 + k][e]           (kKeys vectors of the rows' scores)
//   online softmax: running max m and sum l per lane, all vertical
//   Ot[e] = Ot[e] * exp(m_old - m) + sum_k p[k] * V[j0 + k][e]
// so a tile reads its sequence's keys and values once, not once per token. A row's scores
// past its token's position are masked; positions past the tile's last are never used (their
// keys are masked, their values not read), so stale or unwritten cache rows there are harmless.
// A sliding window (AttentionArgs::window) starts the keys at the chunk holding the tile's
// first window start and masks each row's scores before its own; sinks start each row's
// online softmax from its head's sink logit.
//
// attention_keys.h computes a token alone with the same operations per row, so the two agree
// to the bit.
//
// Keys and values stored as floats in one block are read in place; other chunks (bf16,
// e4m3, blocks shorter than kKeys) are widened into scratch rows first: bf16 by a shift; e4m3
// by placing its bits in a half float (exponent bias 15 instead of 7, so the half is the
// value times 2^-8, subnormals exact) and converting that, the 2^8 and the layer's scales
// folded into the query and output scales. (An e4m3 NaN code reads as 480; the cache never
// holds one from a finite model.)
//
// No standard-library template that compiles to code is instantiated here under an ISA's
// flags (a weak copy built for AVX-512 could be the one the whole program links); the
// caller's buffers stand in for containers.
//
// The caller passes `scratch`, rowsScratchFloats(head_dim) floats (attention_kernels.h).
//
// `Simd` provides: types V (float lanes) and I (int32 lanes); kLanes; kAccumulators (vectors
// of accumulators that fit in registers); kDims (value accumulators per pass); zero(),
// set1(f), loadf(const float*), loadi(const int32_t*), store(float*, v), fma(a, b, c),
// mul/add/sub/div/max(a, b), exp(v), neg_inf(), above(s, limits, j) (s with -inf in the lanes
// whose limit is < j), load<KvType>(const uint8_t*) (kLanes stored elements widened, e4m3 as
// value x 2^-8); and for attention_keys.h keep(s, n) (-inf in the lanes from n on),
// dropBelow(s, n) (-inf in the lanes before n),
// hmax(v), hsumTree(v) (the lanes summed in treeSum's order), exp1(x) and
// transpose(rows, col, out).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/elementwise.h"

namespace cleave::cpu::kernels {

// The stored row of position `j` of KV head `kvh` in `pool`, its sequence's blocks `table`:
// blocks are [kv_heads][block_size][d] elements of kElement bytes.
template <int64_t kElement>
inline const uint8_t* kvRow(const AttentionArgs& a, const int32_t* table, const uint8_t* pool,
                            int64_t kvh, int64_t j, int64_t d) {
  const int64_t bs = a.block_size;
  return pool + ((table[j / bs] * a.kv_heads + kvh) * bs + j % bs) * d * kElement;
}

// Widens the stored rows of positions [j0, j0 + kKeys) (zero rows past `last`) into `rows`.
template <typename Simd, KvType kType, int64_t kKeys>
inline void widenRows(const AttentionArgs& a, const int32_t* table, const uint8_t* pool,
                      int64_t kvh, int64_t j0, int64_t last, int64_t d, float* rows) {
  constexpr int64_t kLanes = Simd::kLanes;
  constexpr int64_t kElement = kvElementBytes(kType);
  for (int64_t k = 0; k < kKeys; ++k) {
    float* row = rows + k * d;
    const int64_t j = j0 + k;
    if (j > last) {
      for (int64_t v = 0; v < d; v += kLanes) Simd::store(row + v, Simd::zero());
      continue;
    }
    const uint8_t* stored = kvRow<kElement>(a, table, pool, kvh, j, d);
    for (int64_t v = 0; v < d; v += kLanes)
      Simd::store(row + v, Simd::template load<kType>(stored + v * kElement));
  }
}

// The first position a token at `position` attends to (AttentionArgs::window).
inline int64_t windowStart(const AttentionArgs& a, int64_t position) {
  return a.window > 0 ? std::max<int64_t>(0, position - a.window + 1) : 0;
}

// Where a softmax of keys from position `position`'s window starts: its chunk of `keys`
// positions (chunks are aligned to multiples of it, so a token alone and in a tile go through
// the same chunks; a chunk wholly before a lane's window changes none of its sums).
inline int64_t firstChunk(const AttentionArgs& a, int64_t position, int64_t keys) {
  return windowStart(a, position) / keys * keys;
}

// A softmax's running maximum before any score: the lowest finite float, so that a chunk
// with every score masked (-inf) leaves it, and its sums, as they were (exp(0) = 1) instead of
// turning them into NaN.
inline constexpr float kNoScore = -3.4028234663852886e38f;

// Calls f.template operator()<I>() for I in [0, N), written out (no loop for the compiler to
// keep rolled, so arrays indexed by I stay in registers).
template <int64_t N, typename F>
inline void unrolled(F&& f) {
  [&]<int64_t... I>(std::integer_sequence<int64_t, I...>) { (f.template operator()<I>(), ...); }
  (std::make_integer_sequence<int64_t, N>{});
}

// x[0] + ... + x[N - 1] summed pairwise by halves (x[i] + x[i + N / 2] first, then the same
// on the first half), the order both kernels sum a chunk's probabilities in (Simd::hsumTree
// sums a vector's lanes so); `x` is overwritten.
template <typename Simd, int64_t N>
inline typename Simd::V treeSum(typename Simd::V* x) {
  for (int64_t half = N / 2; half >= 1; half /= 2) {
    for (int64_t i = 0; i < half; ++i) x[i] = Simd::add(x[i], x[i + half]);
  }
  return x[0];
}

// The scores of a tile's rows (`qt`, [d][kLanes]) against kLanes key rows (`keys`,
// [kLanes][d]) into `scores` ([kLanes][kLanes]). Apart so that its accumulators keep every
// register (the softmax's constants would crowd them out).
template <typename Simd, int64_t kD>
[[gnu::noinline]] void scoresOf(const float* qt, const float* keys, int64_t d_runtime,
                                float* scores) {
  using V = typename Simd::V;
  constexpr int64_t kLanes = Simd::kLanes;
  const int64_t d = kD > 0 ? kD : d_runtime;
  V s[kLanes];
  unrolled<kLanes>([&]<int64_t k>() { s[k] = Simd::zero(); });
  for (int64_t e = 0; e < d; ++e) {
    const V q = Simd::loadf(qt + e * kLanes);
    unrolled<kLanes>([&]<int64_t k>() { s[k] = Simd::fma(Simd::set1(keys[k * d + e]), q, s[k]); });
  }
  unrolled<kLanes>([&]<int64_t k>() { Simd::store(scores + k * kLanes, s[k]); });
}

template <typename Simd, KvType kType, int64_t kD>
void attentionRowsFixed(const AttentionArgs& a, const RowTile& tile, int64_t kvh, float* scratch) {
  using V = typename Simd::V;
  constexpr int64_t kLanes = Simd::kLanes;
  constexpr int64_t kKeys = kLanes;
  constexpr int64_t kDims = Simd::kDims;
  constexpr int64_t kElement = kvElementBytes(kType);
  constexpr float kWiden = kType == KvType::kFp8E4M3 ? 256.0f : 1.0f;  // Undoes load's 2^-8.
  const float k_factor = kType == KvType::kFp8E4M3 ? a.k_scale * kWiden : 1.0f;
  const float v_factor = kType == KvType::kFp8E4M3 ? a.v_scale * kWiden : 1.0f;
  const int64_t d = kD > 0 ? kD : a.head_dim;
  const int64_t group = a.heads / a.kv_heads, bs = a.block_size;
  const int64_t lanes = std::min(kLanes, tile.rows - tile.r0);  // Rows of this tile.
  float* qt = scratch;                                          // [d][kLanes]
  float* ot = qt + d * kLanes;                                  // [d][kLanes]
  float* kf = ot + d * kLanes;                                  // [kKeys][d], widened keys
  float* vf = kf + kKeys * d;                                   // [kKeys][d], widened values
  float* pb = vf + kKeys * d;                                   // [kKeys][kLanes], probabilities

  // The queries, transposed and scaled; lanes past the tile copy its last row's position
  // and have zero queries (finite scores, outputs not written). Each lane's softmax starts
  // from its head's sink (m = sink, l = exp(sink - m) = 1), or from nothing.
  int32_t limit[kLanes], below[kLanes];
  float m0[kLanes], l0[kLanes];
  const float q_factor = a.scale * k_factor;
  for (int64_t lane = 0; lane < kLanes; ++lane) {
    const int64_t r = tile.r0 + std::min(lane, lanes - 1);
    const int64_t token = tile.t0 + r / group;
    const int64_t head = kvh * group + r % group;
    limit[lane] = a.positions[token];
    below[lane] = -static_cast<int32_t>(windowStart(a, limit[lane]));
    m0[lane] = a.sinks != nullptr ? a.sinks[head] : kNoScore;
    l0[lane] = a.sinks != nullptr ? 1.0f : 0.0f;
    const float* q = a.q + token * a.ldq + head * d;
    for (int64_t e = 0; e < d; ++e) qt[e * kLanes + lane] = lane < lanes ? q[e] * q_factor : 0.0f;
  }
  for (int64_t i = 0; i < d * kLanes; ++i) ot[i] = 0.0f;
  const int64_t first = limit[0], last = limit[kLanes - 1];  // Rows go by position.
  const typename Simd::I limits = Simd::loadi(limit);
  // Lanes whose window starts after position j: above(s, starts, -j) masks them.
  const typename Simd::I starts = Simd::loadi(below);
  const int64_t latest_start = -below[kLanes - 1];
  const int32_t* table = a.block_tables[tile.t0];
  const auto* k_pool = static_cast<const uint8_t*>(a.k_pool);
  const auto* v_pool = static_cast<const uint8_t*>(a.v_pool);

  V m = Simd::loadf(m0), l = Simd::loadf(l0);
  for (int64_t j0 = firstChunk(a, first, kKeys); j0 <= last; j0 += kKeys) {
    const float* krows = kf;
    const float* vrows = vf;
    if (kType == KvType::kF32 && j0 % bs + kKeys <= bs) {
      krows = reinterpret_cast<const float*>(kvRow<kElement>(a, table, k_pool, kvh, j0, d));
      vrows = reinterpret_cast<const float*>(kvRow<kElement>(a, table, v_pool, kvh, j0, d));
    } else {
      widenRows<Simd, kType, kKeys>(a, table, k_pool, kvh, j0, last, d, kf);
      widenRows<Simd, kType, kKeys>(a, table, v_pool, kvh, j0, last, d, vf);
    }
    scoresOf<Simd, kD>(qt, krows, d, pb);
    if (a.softcap > 0) softCap(pb, kKeys * kLanes, a.softcap);  // Gemma 2: as attention_keys.h
    V s[kKeys];
    for (int64_t k = 0; k < kKeys; ++k) s[k] = Simd::loadf(pb + k * kLanes);
    if (j0 + kKeys - 1 > first) {
      for (int64_t k = 0; k < kKeys; ++k) s[k] = Simd::above(s[k], limits, j0 + k);
    }
    if (j0 < latest_start) {
      for (int64_t k = 0; k < kKeys; ++k) s[k] = Simd::above(s[k], starts, -(j0 + k));
    }
    V peak = m;
    for (int64_t k = 0; k < kKeys; ++k) peak = Simd::max(peak, s[k]);
    const V alpha = Simd::exp(Simd::sub(m, peak));
    for (int64_t k = 0; k < kKeys; ++k) {
      s[k] = Simd::exp(Simd::sub(s[k], peak));
      Simd::store(pb + k * kLanes, s[k]);
    }
    l = Simd::mul(l, alpha);
    l = Simd::add(l, treeSum<Simd, kKeys>(s));
    m = peak;
    const int64_t keys = std::min(kKeys, last + 1 - j0);
    for (int64_t e0 = 0; e0 < d; e0 += kDims) {
      V acc[kDims];
      for (int64_t i = 0; i < kDims; ++i)
        acc[i] = Simd::mul(Simd::loadf(ot + (e0 + i) * kLanes), alpha);
      for (int64_t k = 0; k < keys; ++k) {
        const V p = Simd::loadf(pb + k * kLanes);
        const float* v = vrows + k * d + e0;
        for (int64_t i = 0; i < kDims; ++i) acc[i] = Simd::fma(p, Simd::set1(v[i]), acc[i]);
      }
      for (int64_t i = 0; i < kDims; ++i) Simd::store(ot + (e0 + i) * kLanes, acc[i]);
    }
  }

  float inverse[kLanes];
  Simd::store(inverse, Simd::div(Simd::set1(v_factor), l));
  for (int64_t lane = 0; lane < lanes; ++lane) {
    const int64_t r = tile.r0 + lane;
    float* out = a.out + (tile.t0 + r / group) * a.ldo + (kvh * group + r % group) * d;
    for (int64_t e = 0; e < d; ++e) out[e] = ot[e * kLanes + lane] * inverse[lane];
  }
}

// Head sizes of 64 and 128 get their loops fixed at compile time.
template <typename Simd, KvType kType>
void attentionRowsOf(const AttentionArgs& a, const RowTile& tile, int64_t kvh, float* scratch) {
  switch (a.head_dim) {
    case 64: return attentionRowsFixed<Simd, kType, 64>(a, tile, kvh, scratch);
    case 128: return attentionRowsFixed<Simd, kType, 128>(a, tile, kvh, scratch);
    default: return attentionRowsFixed<Simd, kType, 0>(a, tile, kvh, scratch);
  }
}

// The kernel for the args' cache type.
template <typename Simd>
void attentionRowsFor(const AttentionArgs& a, const RowTile& tile, int64_t kvh, float* scratch) {
  switch (a.kv_type) {
    case KvType::kF32: return attentionRowsOf<Simd, KvType::kF32>(a, tile, kvh, scratch);
    case KvType::kBf16: return attentionRowsOf<Simd, KvType::kBf16>(a, tile, kvh, scratch);
    case KvType::kFp8E4M3: return attentionRowsOf<Simd, KvType::kFp8E4M3>(a, tile, kvh, scratch);
  }
}

}  // namespace cleave::cpu::kernels
