// The body of the SIMD attention kernels (attention_kernels.h), written once over a vector
// type: each ISA's file includes it, compiled for that ISA, with its lanes (attention_avx2.cc,
// attention_avx512.cc). Internal to cleave_kernels_cpu.
//
// One (token, KV head): the query heads sharing the KV head are processed together, so each
// key and value row is loaded once for the whole group instead of once per query head.
// Head-major blocks keep a head's positions contiguous.
//
// Stored keys and values are widened to floats a vector at a time as they are loaded: bf16
// by a shift; e4m3 by placing its bits in a half float (exponent bias 15 instead of 7, so the
// half is the value times 2^-8; subnormals land on half subnormals exactly) and converting
// that. The 2^8 and the layer's scales are folded into the score scale and the output.
// (An e4m3 NaN code reads as 480 here; the cache never holds one from a finite model.)
//
// The caller passes `scores`, room for (heads / kv_heads) x (positions[t] + 1) floats: no
// standard-library template is instantiated under an ISA's flags (a weak copy compiled for
// AVX-512 could be the one the whole program links).
//
// `Simd` provides: type V, kLanes, kAccumulators (vectors of accumulators that fit in
// registers), zero(), set1(f), loadf(const float*), fma(a, b, c), mul(a, b), sum4(const V[4],
// float[4]) (each vector's lanes summed), store(float*, v), and load<KvType>(const uint8_t*)
// widening kLanes stored elements (e4m3 as value x 2^-8).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"

namespace cleave::cpu::kernels {

// Calls f.template operator()<H>() with H == heads, for heads in [1, kMax].
template <int kMax, typename F>
inline void withHeads(int64_t heads, F&& f) {
  if constexpr (kMax > 1) {
    if (heads < kMax) return withHeads<kMax - 1>(heads, f);
  }
  f.template operator()<kMax>();
}

// The output of heads [g0, g0 + heads) of the group: the value rows weighted by their
// probabilities, H x nv accumulators. kNv > 0 and kHeads > 0 fix the vectors per row and
// the heads at compile time, so the accumulators live in registers; 0 reads them from
// `nv` and `heads`.
template <typename Simd, KvType kType, int64_t kNv, int64_t kHeads>
inline void valueChunk(const AttentionArgs& a, int64_t t, int64_t kvh, const float* scores,
                       int64_t g0, int64_t nv_runtime, int64_t heads_runtime, float v_factor) {
  using V = typename Simd::V;
  constexpr int64_t kLanes = Simd::kLanes;
  constexpr int64_t kMaxVectors = 256 / kLanes;  // head_dim <= 256.
  constexpr int64_t kAccumulators = Simd::kAccumulators;
  constexpr int64_t kElement = kvElementBytes(kType);
  const int64_t nv = kNv > 0 ? kNv : nv_runtime;
  const int64_t heads = kHeads > 0 ? kHeads : heads_runtime;
  const int64_t group = a.heads / a.kv_heads;
  const int64_t d = a.head_dim, bs = a.block_size;
  const int64_t context = a.positions[t] + 1;
  const int32_t* table = a.block_tables[t];
  const int64_t head_block = bs * d * kElement;
  const auto* v_pool = static_cast<const uint8_t*>(a.v_pool);
  V acc[kMaxVectors > kAccumulators ? kMaxVectors : kAccumulators];
  for (int64_t i = 0; i < heads * nv; ++i) acc[i] = Simd::zero();
  for (int64_t j0 = 0; j0 < context; j0 += bs) {
    const uint8_t* vb = v_pool + (table[j0 / bs] * a.kv_heads + kvh) * head_block;
    const int64_t n = std::min(bs, context - j0);
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* row = vb + j * d * kElement;
      for (int64_t v = 0; v < nv; ++v) {
        const V value = Simd::template load<kType>(row + v * kLanes * kElement);
        for (int64_t h = 0; h < heads; ++h) {
          const V p = Simd::set1(scores[(g0 + h) * context + j0 + j]);
          acc[h * nv + v] = Simd::fma(p, value, acc[h * nv + v]);
        }
      }
    }
  }
  const V out_scale = Simd::set1(v_factor);
  for (int64_t h = 0; h < heads; ++h) {
    float* out = a.out + t * a.ldo + (kvh * group + g0 + h) * d;
    for (int64_t v = 0; v < nv; ++v) {
      Simd::store(out + v * kLanes, Simd::mul(acc[h * nv + v], out_scale));
    }
  }
}

// One (token, KV head) with kNv vectors per head row (0: head_dim / kLanes, read at run
// time). Scores go four heads at a time, their four dot products summed across lanes
// together (Simd::sum4) rather than one by one.
template <typename Simd, KvType kType, int64_t kNv>
void attentionGroupFixed(const AttentionArgs& a, int64_t t, int64_t kvh, float* scores) {
  using V = typename Simd::V;
  constexpr int64_t kLanes = Simd::kLanes;
  constexpr int64_t kMaxVectors = 256 / kLanes;  // head_dim <= 256.
  constexpr int64_t kElement = kvElementBytes(kType);
  constexpr float kWiden = kType == KvType::kFp8E4M3 ? 256.0f : 1.0f;  // Undoes load's 2^-8.
  const float k_factor = kType == KvType::kFp8E4M3 ? a.k_scale * kWiden : 1.0f;
  const float v_factor = kType == KvType::kFp8E4M3 ? a.v_scale * kWiden : 1.0f;
  const int64_t group = a.heads / a.kv_heads;
  const int64_t d = a.head_dim, bs = a.block_size;
  const int64_t nv = kNv > 0 ? kNv : d / kLanes;
  const int64_t context = a.positions[t] + 1;
  const int32_t* table = a.block_tables[t];
  const int64_t head_block = bs * d * kElement;  // Bytes of one head's part of a block.
  const auto* k_pool = static_cast<const uint8_t*>(a.k_pool);
  const float* q = a.q + t * a.ldq + kvh * group * d;  // The group's heads are adjacent.
  const float score_scale = a.scale * k_factor;

  for (int64_t j0 = 0; j0 < context; j0 += bs) {
    const uint8_t* kb = k_pool + (table[j0 / bs] * a.kv_heads + kvh) * head_block;
    const int64_t n = std::min(bs, context - j0);
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* k = kb + j * d * kElement;
      V key[kMaxVectors];
      for (int64_t v = 0; v < nv; ++v)
        key[v] = Simd::template load<kType>(k + v * kLanes * kElement);
      for (int64_t g0 = 0; g0 < group; g0 += 4) {
        const int64_t heads = std::min<int64_t>(4, group - g0);
        V acc[4] = {Simd::zero(), Simd::zero(), Simd::zero(), Simd::zero()};
        for (int64_t h = 0; h < 4; ++h) {
          if (h >= heads) break;
          for (int64_t v = 0; v < nv; ++v)
            acc[h] = Simd::fma(Simd::loadf(q + (g0 + h) * d + v * kLanes), key[v], acc[h]);
        }
        float sums[4];
        Simd::sum4(acc, sums);
        for (int64_t h = 0; h < heads; ++h)
          scores[(g0 + h) * context + j0 + j] = sums[h] * score_scale;
      }
    }
  }
  softmax(scores, context, group, context);

  // Heads in chunks whose accumulators fit in registers.
  constexpr int64_t kChunk = kNv > 0 ? std::max<int64_t>(1, Simd::kAccumulators / kNv) : 1;
  const int64_t chunk = std::max<int64_t>(1, Simd::kAccumulators / nv);
  for (int64_t g0 = 0; g0 < group; g0 += chunk) {
    const int64_t heads = std::min(chunk, group - g0);
    if constexpr (kNv > 0) {
      withHeads<kChunk>(heads, [&]<int kHeads>() {
        valueChunk<Simd, kType, kNv, kHeads>(a, t, kvh, scores, g0, nv, heads, v_factor);
      });
    } else {
      valueChunk<Simd, kType, 0, 0>(a, t, kvh, scores, g0, nv, heads, v_factor);
    }
  }
}

// Head sizes of 64 and 128 (nearly every model's) get their loops fixed at compile time.
template <typename Simd, KvType kType>
void attentionGroupOf(const AttentionArgs& a, int64_t t, int64_t kvh, float* scores) {
  constexpr int64_t kLanes = Simd::kLanes;
  switch (a.head_dim) {
    case 64: return attentionGroupFixed<Simd, kType, 64 / kLanes>(a, t, kvh, scores);
    case 128: return attentionGroupFixed<Simd, kType, 128 / kLanes>(a, t, kvh, scores);
    default: return attentionGroupFixed<Simd, kType, 0>(a, t, kvh, scores);
  }
}

// The kernel for the args' cache type.
template <typename Simd>
void attentionGroupFor(const AttentionArgs& a, int64_t t, int64_t kvh, float* scores) {
  switch (a.kv_type) {
    case KvType::kF32: return attentionGroupOf<Simd, KvType::kF32>(a, t, kvh, scores);
    case KvType::kBf16: return attentionGroupOf<Simd, KvType::kBf16>(a, t, kvh, scores);
    case KvType::kFp8E4M3: return attentionGroupOf<Simd, KvType::kFp8E4M3>(a, t, kvh, scores);
  }
}

}  // namespace cleave::cpu::kernels
