// Small device helpers the per-token kernels share.
#pragma once

namespace cleave::cuda {

// The sum of v over the 32 lanes of a warp, in every lane (all lanes must call it).
__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// σ(x) = 1 / (1 + e^−x), with the fast exponential.
__device__ __forceinline__ float sigmoidOf(float x) { return 1.0f / (1.0f + __expf(-x)); }

}  // namespace cleave::cuda
