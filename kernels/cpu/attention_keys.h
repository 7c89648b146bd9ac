// The body of the SIMD attention kernel for a token on its own (decode; attention_kernels.h),
// written once over a vector type: each ISA's file includes it, compiled for that ISA.
// Internal to cleave_kernels_cpu.
//
// The query heads of one token that read one KV head, with the positions as the vector's
// lanes: each chunk of kLanes keys is transposed (in registers, kLanes dimensions at a time) so
// that a head's scores for the whole chunk are one vector, an FMA per head dimension. Every head
// row goes through exactly the operations attention_rows.h gives a lane (the same FMA chains, the
// same online-softmax steps per chunk, the same sums in the same order), so a token's output has
// the same bits whether it is decoded alone or computed in a prefill chunk.
//
// The caller passes `scratch`, keysScratchFloats(group, head_dim) floats. As in
// attention_rows.h, no standard-library template that compiles to code is used here.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/attention_rows.h"

namespace cleave::cpu::kernels {

// Calls f.template operator()<R>() with R == rows, for rows in [1, kMax].
template <int64_t kMax, typename F>
inline void withRows(int64_t rows, F&& f) {
  if constexpr (kMax > 1) {
    if (rows < kMax) return withRows<kMax - 1>(rows, f);
  }
  f.template operator()<kMax>();
}

// Scores of kRows head rows (`qs`, [rows][d]) for a chunk of key rows (`keys`, kLanes
// pointers) into `scores` ([rows][kLanes]): the chunk is transposed kLanes dimensions at a
// time in registers, and each lane runs the FMA chain attention_rows.h's scoresOf runs.
template <typename Simd, int64_t kD, int64_t kRows>
inline void keyScores(const float* qs, const float* const* keys, int64_t d_runtime, float* scores) {
  using V = typename Simd::V;
  constexpr int64_t kLanes = Simd::kLanes;
  const int64_t d = kD > 0 ? kD : d_runtime;
  V s[kRows];
  unrolled<kRows>([&]<int64_t g>() { s[g] = Simd::zero(); });
  for (int64_t e0 = 0; e0 < d; e0 += kLanes) {
    V kt[kLanes];  // kt[i]: dimension e0 + i of the chunk's keys.
    Simd::transpose(keys, e0, kt);
    unrolled<kLanes>([&]<int64_t i>() {
      unrolled<kRows>(
          [&]<int64_t g>() { s[g] = Simd::fma(Simd::set1(qs[g * d + e0 + i]), kt[i], s[g]); });
    });
  }
  unrolled<kRows>([&]<int64_t g>() { Simd::store(scores + g * kLanes, s[g]); });
}

// A bf16 cache is read as pairs of adjacent elements, one pair a 32-bit lane, and widened
// after the transposes (a pair's even element shifted up, its odd one masked): half the
// shuffles of transposing widened floats, and no widened copy of the keys. Head sizes that are
// whole multiples of 2 kLanes; the vectors of a row then hold, in turn, the even and the odd
// elements of each run of 2 kLanes (pairDim).
template <typename Simd, KvType kType, int64_t kD>
inline constexpr bool kBf16Pairs = (kType == KvType::kBf16) && (kD > 0) &&
                                   (kD % (2 * Simd::kLanes) == 0);

// The head dimension lane i of vector v holds in that order.
template <typename Simd>
constexpr int64_t pairDim(int64_t v, int64_t i) {
  return v / 2 * 2 * Simd::kLanes + 2 * i + v % 2;
}

// keyScores over bf16 rows read as pairs (`keys`: kLanes rows of kD bf16 elements): the same
// FMA chains, dimension by dimension.
template <typename Simd, int64_t kD, int64_t kRows>
inline void keyScoresPairs(const float* qs, const float* const* keys, float* scores) {
  using V = typename Simd::V;
  constexpr int64_t kLanes = Simd::kLanes;
  V s[kRows];
  unrolled<kRows>([&]<int64_t g>() { s[g] = Simd::zero(); });
  for (int64_t e0 = 0; e0 < kD; e0 += 2 * kLanes) {
    V kt[kLanes];  // kt[i]: elements e0 + 2i, e0 + 2i + 1 of the chunk's keys.
    Simd::transpose(keys, e0 / 2, kt);
    unrolled<kLanes>([&]<int64_t i>() {
      const V even = Simd::bf16Even(kt[i]), odd = Simd::bf16Odd(kt[i]);
      unrolled<kRows>([&]<int64_t g>() {
        s[g] = Simd::fma(Simd::set1(qs[g * kD + e0 + 2 * i]), even, s[g]);
        s[g] = Simd::fma(Simd::set1(qs[g * kD + e0 + 2 * i + 1]), odd, s[g]);
      });
    });
  }
  unrolled<kRows>([&]<int64_t g>() { Simd::store(scores + g * kLanes, s[g]); });
}

// ot[g] = ot[g] * alpha[g] + sum_k p[g][k] V[k] for kRows head rows, with kNv vectors per row.
// With kPairs, ot's vectors are in pairDim order.
template <typename Simd, KvType kType, int64_t kNv, int64_t kRows, bool kPairs>
inline void keyValues(const uint8_t* const* values, int64_t keys, const float* ps,
                      const float* alpha, int64_t d, float* ot) {
  using V = typename Simd::V;
  constexpr int64_t kLanes = Simd::kLanes;
  constexpr int64_t kElement = kvElementBytes(kType);
  V acc[kRows * kNv];
  unrolled<kRows>([&]<int64_t g>() {
    unrolled<kNv>([&]<int64_t v>() {
      acc[g * kNv + v] = Simd::mul(Simd::loadf(ot + g * d + v * kLanes), Simd::set1(alpha[g]));
    });
  });
  for (int64_t k = 0; k < keys; ++k) {
    unrolled<kNv>([&]<int64_t v>() {
      V value;
      if constexpr (kPairs) {
        const V pairs = Simd::loadf(reinterpret_cast<const float*>(values[k]) + v / 2 * kLanes);
        value = v % 2 == 0 ? Simd::bf16Even(pairs) : Simd::bf16Odd(pairs);
      } else {
        value = Simd::template load<kType>(values[k] + v * kLanes * kElement);
      }
      unrolled<kRows>([&]<int64_t g>() {
        acc[g * kNv + v] = Simd::fma(Simd::set1(ps[g * kLanes + k]), value, acc[g * kNv + v]);
      });
    });
  }
  unrolled<kRows>([&]<int64_t g>() {
    unrolled<kNv>([&]<int64_t v>() { Simd::store(ot + g * d + v * kLanes, acc[g * kNv + v]); });
  });
}

template <typename Simd, KvType kType, int64_t kD>
void attentionKeysFixed(const AttentionArgs& a, int64_t t, int64_t kvh, float* scratch) {
  constexpr int64_t kLanes = Simd::kLanes;
  constexpr int64_t kElement = kvElementBytes(kType);
  constexpr float kWiden = kType == KvType::kFp8E4M3 ? 256.0f : 1.0f;  // Undoes load's 2^-8.
  // Rows of accumulators a pass keeps in registers: scores one vector a row (next to the
  // kLanes transposed keys), values d/kLanes.
  constexpr int64_t kScoreRows = Simd::kAccumulators / 2;
  constexpr int64_t kNv = kD > 0 ? kD / kLanes : 0;
  constexpr int64_t kValueRows = kNv > 0 ? std::max<int64_t>(1, Simd::kAccumulators / kNv) : 1;
  constexpr bool kPairs = kBf16Pairs<Simd, kType, kD>;
  const float k_factor = kType == KvType::kFp8E4M3 ? a.k_scale * kWiden : 1.0f;
  const float v_factor = kType == KvType::kFp8E4M3 ? a.v_scale * kWiden : 1.0f;
  const int64_t d = kD > 0 ? kD : a.head_dim;
  const int64_t group = a.heads / a.kv_heads;
  const int64_t limit = a.positions[t];
  const int32_t* table = a.block_tables[t];
  float* qs = scratch;             // [group][d], scaled queries
  float* ot = qs + group * d;      // [group][d]
  float* kf = ot + group * d;      // [kLanes][d], widened keys
  float* ps = kf + kLanes * d;     // [group][kLanes], scores then probabilities
  float* m = ps + group * kLanes;  // [group]
  float* l = m + group;            // [group]
  float* alpha = l + group;        // [group]
  float* zero = alpha + group;     // [d]

  const float q_factor = a.scale * k_factor;
  const float* q = a.q + t * a.ldq + kvh * group * d;  // The group's heads are adjacent.
  for (int64_t i = 0; i < group * d; ++i) {
    qs[i] = q[i] * q_factor;
    ot[i] = 0.0f;
  }
  for (int64_t e = 0; e < d; ++e) zero[e] = 0.0f;
  for (int64_t g = 0; g < group; ++g) {  // From the sink, as attention_rows.h starts a lane.
    m[g] = a.sinks != nullptr ? a.sinks[kvh * group + g] : kNoScore;
    l[g] = a.sinks != nullptr ? 1.0f : 0.0f;
  }
  const int64_t start = windowStart(a, limit);
  const auto* k_pool = static_cast<const uint8_t*>(a.k_pool);
  const auto* v_pool = static_cast<const uint8_t*>(a.v_pool);
  auto rowOf = [&](const uint8_t* pool, int64_t j) {
    return kvRow<kElement>(a, table, pool, kvh, j, d);
  };

  for (int64_t j0 = firstChunk(a, limit, kLanes); j0 <= limit; j0 += kLanes) {
    const int64_t keys = std::min(kLanes, limit + 1 - j0);
    // The next chunk's rows are fetched while this one computes (a block's rows are one
    // stream, but each block is somewhere else).
    for (int64_t j = j0 + kLanes; j < std::min(j0 + 2 * kLanes, limit + 1); ++j) {
      for (int64_t at = 0; at < d * kElement; at += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(rowOf(k_pool, j) + at), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(rowOf(v_pool, j) + at), _MM_HINT_T0);
      }
    }
    const float* rows[kLanes];
    const uint8_t* values[kLanes];
    for (int64_t k = 0; k < kLanes; ++k) {
      if (k >= keys) {
        rows[k] = zero;
        continue;
      }
      values[k] = rowOf(v_pool, j0 + k);
      if constexpr (kType == KvType::kF32 || kPairs) {
        rows[k] = reinterpret_cast<const float*>(rowOf(k_pool, j0 + k));  // Pairs: bf16 words.
      } else {
        const uint8_t* stored = rowOf(k_pool, j0 + k);
        for (int64_t v = 0; v < d; v += kLanes)
          Simd::store(kf + k * d + v, Simd::template load<kType>(stored + v * kElement));
        rows[k] = kf + k * d;
      }
    }
    for (int64_t g0 = 0; g0 < group; g0 += kScoreRows) {
      withRows<kScoreRows>(std::min(kScoreRows, group - g0), [&]<int64_t kRows>() {
        if constexpr (kPairs)
          keyScoresPairs<Simd, kD, kRows>(qs + g0 * d, rows, ps + g0 * kLanes);
        else
          keyScores<Simd, kD, kRows>(qs + g0 * d, rows, d, ps + g0 * kLanes);
      });
    }
    if (a.softcap > 0) softCap(ps, group * kLanes, a.softcap);  // Gemma 2: as attention_rows.h
    for (int64_t g = 0; g < group; ++g) {
      float* p = ps + g * kLanes;
      auto scores = Simd::keep(Simd::loadf(p), keys);                // -inf past the position.
      if (j0 < start) scores = Simd::dropBelow(scores, start - j0);  // And before the window.
      const float top = Simd::hmax(scores);
      const float peak = top > m[g] ? top : m[g];
      const auto probabilities = Simd::exp(Simd::sub(scores, Simd::set1(peak)));
      Simd::store(p, probabilities);
      const float sum = Simd::hsumTree(probabilities);
      alpha[g] = Simd::exp1(m[g] - peak);
      l[g] = l[g] * alpha[g];
      l[g] = l[g] + sum;
      m[g] = peak;
    }
    if constexpr (kNv > 0) {
      for (int64_t g0 = 0; g0 < group; g0 += kValueRows) {
        withRows<kValueRows>(std::min(kValueRows, group - g0), [&]<int64_t kRows>() {
          keyValues<Simd, kType, kNv, kRows, kPairs>(values, keys, ps + g0 * kLanes, alpha + g0, d,
                                                     ot + g0 * d);
        });
      }
    } else {
      for (int64_t g = 0; g < group; ++g) {
        for (int64_t k = 0; k < keys; ++k) {
          const auto p = Simd::set1(ps[g * kLanes + k]);
          for (int64_t v = 0; v < d; v += kLanes) {
            auto acc = Simd::loadf(ot + g * d + v);
            if (k == 0) acc = Simd::mul(acc, Simd::set1(alpha[g]));
            Simd::store(ot + g * d + v,
                        Simd::fma(p, Simd::template load<kType>(values[k] + v * kElement), acc));
          }
        }
      }
    }
  }

  for (int64_t g = 0; g < group; ++g) {
    const float inverse = v_factor / l[g];
    float* out = a.out + t * a.ldo + (kvh * group + g) * d;
    if constexpr (kPairs) {
      for (int64_t e = 0; e < d; ++e)
        out[pairDim<Simd>(e / kLanes, e % kLanes)] = ot[g * d + e] * inverse;
    } else {
      for (int64_t e = 0; e < d; ++e) out[e] = ot[g * d + e] * inverse;
    }
  }
}

// Head sizes of 64 and 128 get their loops fixed at compile time.
template <typename Simd, KvType kType>
void attentionKeysOf(const AttentionArgs& a, int64_t t, int64_t kvh, float* scratch) {
  switch (a.head_dim) {
    case 64: return attentionKeysFixed<Simd, kType, 64>(a, t, kvh, scratch);
    case 128: return attentionKeysFixed<Simd, kType, 128>(a, t, kvh, scratch);
    default: return attentionKeysFixed<Simd, kType, 0>(a, t, kvh, scratch);
  }
}

// The kernel for the args' cache type.
template <typename Simd>
void attentionKeysFor(const AttentionArgs& a, int64_t t, int64_t kvh, float* scratch) {
  switch (a.kv_type) {
    case KvType::kF32: return attentionKeysOf<Simd, KvType::kF32>(a, t, kvh, scratch);
    case KvType::kBf16: return attentionKeysOf<Simd, KvType::kBf16>(a, t, kvh, scratch);
    case KvType::kFp8E4M3: return attentionKeysOf<Simd, KvType::kFp8E4M3>(a, t, kvh, scratch);
  }
}

}  // namespace cleave::cpu::kernels
