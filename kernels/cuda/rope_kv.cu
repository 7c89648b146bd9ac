#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rope_kv.h"

namespace cleave::cuda {
namespace {

using bf16 = __nv_bfloat16;

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

// One block per token; threads walk the (head, pair) grid of query, key and value heads.
__global__ void ropeKvKernel(const RopeKvArgs a) {
  const int64_t token = blockIdx.x;
  const int half = a.head_dim / 2;
  const float position = static_cast<float>(a.positions[token]);
  const bf16* row = a.qkv + token * a.qkv_stride;
  const int64_t slot = a.slots[token];
  const int64_t block = slot / a.block_size;
  const int64_t offset = slot % a.block_size;
  auto cacheRow = [&](bf16* cache, int kv_head) {
    return cache + ((block * a.kv_heads + kv_head) * a.block_size + offset) * a.head_dim;
  };
  const int rotated_heads = a.heads + a.kv_heads;
  for (int i = threadIdx.x; i < (rotated_heads + a.kv_heads) * half; i += blockDim.x) {
    const int head = i / half;
    const int pair = i % half;
    if (head >= rotated_heads) {  // A value head: copied as it is.
      const int kv_head = head - rotated_heads;
      const bf16* src = row + static_cast<int64_t>(head) * a.head_dim;
      bf16* dst = cacheRow(a.v_cache, kv_head);
      dst[2 * pair] = src[2 * pair];
      dst[2 * pair + 1] = src[2 * pair + 1];
      continue;
    }
    const int first = a.layout == RopeLayout::kHalves ? pair : 2 * pair;
    const int second = a.layout == RopeLayout::kHalves ? pair + half : 2 * pair + 1;
    const bf16* src = row + static_cast<int64_t>(head) * a.head_dim;
    float sin_angle, cos_angle;
    sinCos(position * a.inv_freq[pair], &sin_angle, &cos_angle);
    const float x0 = __bfloat162float(src[first]);
    const float x1 = __bfloat162float(src[second]);
    bf16* dst = head < a.heads
                    ? a.q_out + token * a.q_stride + static_cast<int64_t>(head) * a.head_dim
                    : cacheRow(a.k_cache, head - a.heads);
    dst[first] = __float2bfloat16(x0 * cos_angle - x1 * sin_angle);
    dst[second] = __float2bfloat16(x1 * cos_angle + x0 * sin_angle);
  }
}

}  // namespace

absl::Status ropeKvWrite(const RopeKvArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return absl::OkStatus();
  if (args.head_dim % 2 != 0) return absl::InvalidArgumentError("rope_kv: head_dim must be even");
  ropeKvKernel<<<static_cast<unsigned>(args.tokens), 256, 0, stream>>>(args);
  return launchStatus("rope_kv");
}

}  // namespace cleave::cuda
