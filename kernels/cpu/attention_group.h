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
// `Simd` provides: type V, kLanes, zero(), set1(f), loadf(const float*), fma(a, b, c),
// mul(a, b), sum(v), store(float*, v), and load<KvType>(const uint8_t*) widening kLanes
// stored elements (e4m3 as value x 2^-8).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"

namespace cleave::cpu::kernels {

template <typename Simd, KvType kType>
void attentionGroupOf(const AttentionArgs& a, int64_t t, int64_t kvh, float* scores) {
  using V = typename Simd::V;
  constexpr int64_t kLanes = Simd::kLanes;
  constexpr int64_t kMaxVectors = 256 / kLanes;  // head_dim <= 256.
  constexpr int64_t kAccumulators = Simd::kAccumulators;
  constexpr int64_t kElement = kvElementBytes(kType);
  constexpr float kWiden = kType == KvType::kFp8E4M3 ? 256.0f : 1.0f;  // Undoes load's 2^-8.
  const float k_factor = kType == KvType::kFp8E4M3 ? a.k_scale * kWiden : 1.0f;
  const float v_factor = kType == KvType::kFp8E4M3 ? a.v_scale * kWiden : 1.0f;
  const int64_t group = a.heads / a.kv_heads;
  const int64_t d = a.head_dim, nv = d / kLanes, bs = a.block_size;
  const int64_t context = a.positions[t] + 1;
  const int32_t* table = a.block_tables[t];
  const int64_t head_block = bs * d * kElement;  // Bytes of one head's part of a block.
  const auto* k_pool = static_cast<const uint8_t*>(a.k_pool);
  const auto* v_pool = static_cast<const uint8_t*>(a.v_pool);
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
      for (int64_t g = 0; g < group; ++g) {
        V acc = Simd::zero();
        for (int64_t v = 0; v < nv; ++v) {
          acc = Simd::fma(Simd::loadf(q + g * d + v * kLanes), key[v], acc);
        }
        scores[g * context + j0 + j] = Simd::sum(acc) * score_scale;
      }
    }
  }
  softmax(scores, context, group, context);

  // Heads in chunks whose accumulators fit in registers.
  const int64_t chunk = std::max<int64_t>(1, kAccumulators / nv);
  const V out_scale = Simd::set1(v_factor);
  for (int64_t g0 = 0; g0 < group; g0 += chunk) {
    const int64_t heads = std::min(chunk, group - g0);
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
    for (int64_t h = 0; h < heads; ++h) {
      float* out = a.out + t * a.ldo + (kvh * group + g0 + h) * d;
      for (int64_t v = 0; v < nv; ++v) {
        Simd::store(out + v * kLanes, Simd::mul(acc[h * nv + v], out_scale));
      }
    }
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
