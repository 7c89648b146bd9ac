#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mla_rope_kv.h"
#include "kernels/cuda/rope_device.cuh"

namespace cleave::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;

// One block per token: the latent's norm, its row in the cache, then the rotation of the
// key's and every query head's rope part.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads) mlaRopeKvKernel(const MlaRopeKvArgs a) {
  __shared__ float partial[kThreads / 32];
  const int64_t token = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bf16* c = a.latent + token * a.latent_stride;
  float squares = 0.0f;
  for (int i = threadIdx.x; i < a.kv_lora; i += kThreads) {
    const float v = __bfloat162float(c[i]);
    squares += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
  if (lane == 0) partial[warp] = squares;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  const float inv_rms = rsqrtf(total / static_cast<float>(a.kv_lora) + a.eps);

  const int row = a.kv_lora + a.rope;
  const int64_t base = static_cast<int64_t>(a.slots[token]) * row;  // One head per slot.
  for (int i = threadIdx.x; i < a.kv_lora; i += kThreads) {
    const float v = __bfloat162float(c[i]) * inv_rms * __bfloat162float(a.norm_weight[i]);
    storeKv<kFp8>(a.cache, base + i, v, a.kv_scale);
  }
  const int half = a.rope / 2;
  const float position = static_cast<float>(a.positions[token]);
  // Items [0, heads * half) rotate the query heads, the last `half` the key.
  for (int i = threadIdx.x; i < (a.heads + 1) * half; i += kThreads) {
    const int head = i / half;
    const int pair = i % half;
    const bf16* src = head < a.heads ? a.q + token * a.q_stride +
                                           static_cast<int64_t>(head) * (a.nope + a.rope) + a.nope
                                     : c + a.kv_lora;
    const RotatedPair r =
        rotatePair(src, pair, half, a.layout, position * a.inv_freq[pair], a.attention_factor);
    if (head < a.heads) {
      bf16* dst = a.q_abs + token * a.q_abs_stride + static_cast<int64_t>(head) * row + a.kv_lora;
      dst[r.first] = __float2bfloat16(r.y0);
      dst[r.second] = __float2bfloat16(r.y1);
    } else {
      storeKv<kFp8>(a.cache, base + a.kv_lora + r.first, r.y0, a.kv_scale);
      storeKv<kFp8>(a.cache, base + a.kv_lora + r.second, r.y1, a.kv_scale);
    }
  }
}

}  // namespace

absl::Status mlaRopeKvWrite(const MlaRopeKvArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return absl::OkStatus();
  if (args.rope < 2 || args.rope % 2 != 0 || args.kv_lora < 1 || args.heads < 1)
    return absl::InvalidArgumentError(
        "mla_rope_kv: rope must be even and positive, kv_lora and heads positive");
  if (args.kv_dtype == KvDtype::kFp8E4M3)
    mlaRopeKvKernel<true><<<static_cast<unsigned>(args.tokens), kThreads, 0, stream>>>(args);
  else
    mlaRopeKvKernel<false><<<static_cast<unsigned>(args.tokens), kThreads, 0, stream>>>(args);
  return launchStatus("mla_rope_kv");
}

}  // namespace cleave::cuda
