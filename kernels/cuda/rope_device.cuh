// Device helpers of the kernels that rotate and cache keys (rope_kv.cu, mla_rope_kv.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/rope_kv.h"

namespace cleave::cuda {

// sin and cos of a float angle as the CPU backend computes them (std::sin of the same
// float), without sincosf's local-memory slow path for large arguments: the angle is
// reduced by multiples of 2π split Cody-Waite style (k · 6.28125 is exact for |k| < 2^15,
// i.e. positions up to ~200k), then the fast intrinsics run on [-π, π].
__device__ __forceinline__ void sinCos(float angle, float* sin_out, float* cos_out) {
  const float k = rintf(angle * 0.15915494309189535f);
  float r = fmaf(-k, 6.28125f, angle);
  r = fmaf(-k, 1.9353071795864769e-3f, r);
  __sincosf(r, sin_out, cos_out);
}

// Pair `pair` of a head of 2 * half values, rotated by `angle` in `layout`'s pairing and
// scaled by `factor` (YaRN's attention factor on cos and sin; 1 otherwise): the two indices
// it occupies and their new values.
struct RotatedPair {
  int first, second;
  float y0, y1;
};
__device__ __forceinline__ RotatedPair rotatePair(const __nv_bfloat16* head, int pair, int half,
                                                  RopeLayout layout, float angle, float factor) {
  RotatedPair r;
  r.first = layout == RopeLayout::kHalves ? pair : 2 * pair;
  r.second = layout == RopeLayout::kHalves ? pair + half : 2 * pair + 1;
  float sin_angle, cos_angle;
  sinCos(angle, &sin_angle, &cos_angle);
  sin_angle *= factor;
  cos_angle *= factor;
  const float x0 = __bfloat162float(head[r.first]);
  const float x1 = __bfloat162float(head[r.second]);
  r.y0 = x0 * cos_angle - x1 * sin_angle;
  r.y1 = x1 * cos_angle + x0 * sin_angle;
  return r;
}

// A cache element: bf16, or e4m3 of value / scale (saturating at the format's finite range).
template <bool kFp8>
__device__ __forceinline__ void storeKv(void* cache, int64_t at, float value, float scale) {
  if constexpr (kFp8) {
    static_cast<__nv_fp8_storage_t*>(cache)[at] =
        __nv_cvt_float_to_fp8(value / scale, __NV_SATFINITE, __NV_E4M3);
  } else {
    static_cast<__nv_bfloat16*>(cache)[at] = __float2bfloat16(value);
  }
}

// The value of a cache element: bf16, or e4m3 times scale.
template <bool kFp8>
__device__ __forceinline__ float loadKv(const void* cache, int64_t at, float scale) {
  if constexpr (kFp8) {
    const __nv_fp8_storage_t v = static_cast<const __nv_fp8_storage_t*>(cache)[at];
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3))) * scale;
  } else {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(cache)[at]);
  }
}

}  // namespace cleave::cuda
