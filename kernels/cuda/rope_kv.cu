#include <cuda_fp8.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rope_device.cuh"
#include "kernels/cuda/rope_kv.h"

namespace cleave::cuda {
namespace {

using bf16 = __nv_bfloat16;

// One block per token; threads walk the (head, pair) grid of query, key and value heads.
template <bool kFp8>
__global__ void ropeKvKernel(const RopeKvArgs a) {
  const int64_t token = blockIdx.x;
  const int half = a.head_dim / 2;
  // Pairs [0, rotated) rotate within the leading rotary_dim values; the others copy two
  // values each past them.
  const int rotated = a.rotate ? (a.rotary_dim > 0 ? a.rotary_dim : a.head_dim) / 2 : 0;
  const float position = static_cast<float>(a.positions[token]);
  const bf16* row = a.qkv + token * a.qkv_stride;
  const int64_t slot = a.slots[token];
  const int64_t block = slot / a.block_size;
  const int64_t offset = slot % a.block_size;
  // Element offset of kv head `kv_head`'s row for this token in a cache.
  auto cacheRow = [&](int kv_head) {
    return ((block * a.kv_heads + kv_head) * a.block_size + offset) * a.head_dim;
  };
  const int rotated_heads = a.heads + a.kv_heads;
  for (int i = threadIdx.x; i < (rotated_heads + a.kv_heads) * half; i += blockDim.x) {
    const int head = i / half;
    const int pair = i % half;
    const bf16* src = row + static_cast<int64_t>(head) * a.head_dim;
    if (head >= rotated_heads) {  // A value head: stored as it is.
      const int64_t at = cacheRow(head - rotated_heads);
      storeKv<kFp8>(a.v_cache, at + 2 * pair, __bfloat162float(src[2 * pair]), a.v_scale);
      storeKv<kFp8>(a.v_cache, at + 2 * pair + 1, __bfloat162float(src[2 * pair + 1]), a.v_scale);
      continue;
    }
    RotatedPair r;
    if (pair < rotated) {
      r = rotatePair(src, pair, rotated, a.layout, position * a.inv_freq[pair], a.attention_factor);
    } else {
      r.first = 2 * pair;  // == 2 * rotated + 2 * (pair - rotated)
      r.second = r.first + 1;
      r.y0 = __bfloat162float(src[r.first]);
      r.y1 = __bfloat162float(src[r.second]);
    }
    if (head < a.heads) {
      if (a.query_scale_beta != 0.0f && a.query_scale_period > 0) {
        const float scale =
            1.0f + a.query_scale_beta *
                       log1pf(static_cast<float>(a.positions[token] / a.query_scale_period));
        r.y0 *= scale;
        r.y1 *= scale;
      }
      bf16* dst = a.q_out + token * a.q_stride + static_cast<int64_t>(head) * a.head_dim;
      dst[r.first] = __float2bfloat16(r.y0);
      dst[r.second] = __float2bfloat16(r.y1);
    } else {
      const int64_t at = cacheRow(head - a.heads);
      storeKv<kFp8>(a.k_cache, at + r.first, r.y0, a.k_scale);
      storeKv<kFp8>(a.k_cache, at + r.second, r.y1, a.k_scale);
    }
  }
}

}  // namespace

absl::Status ropeKvWrite(const RopeKvArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return absl::OkStatus();
  if (args.head_dim % 2 != 0) return absl::InvalidArgumentError("rope_kv: head_dim must be even");
  if (args.rotary_dim % 2 != 0 || args.rotary_dim < 0 || args.rotary_dim > args.head_dim) {
    return absl::InvalidArgumentError("rope_kv: rotary_dim must be even and at most head_dim");
  }
  if (args.kv_dtype == KvDtype::kFp8E4M3)
    ropeKvKernel<true><<<static_cast<unsigned>(args.tokens), 256, 0, stream>>>(args);
  else
    ropeKvKernel<false><<<static_cast<unsigned>(args.tokens), 256, 0, stream>>>(args);
  return launchStatus("rope_kv");
}

}  // namespace cleave::cuda
