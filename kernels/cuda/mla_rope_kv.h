// The cache write of multi-head latent attention (engine/mla_attention.h), fused with the
// rotation of the queries' rope part:
//
//   latent    [tokens][kv_lora + rope] bf16 (kv_a_proj_with_mqa's product), row stride
//             latent_stride: c, then k_pe
//   cache     one layer's latent rows, [block][block_size][kv_lora + rope], bf16 or e4m3
//             (value / scale, saturated): rmsnorm(c) * norm_weight, then k_pe rotated
//   q         [tokens][heads][nope + rope] bf16, row stride q_stride
//   q_abs     [tokens][heads][kv_lora + rope] bf16, row stride q_abs_stride: each head's
//             rotated q_pe goes to its last `rope` elements (the first kv_lora are the
//             absorbed no-rope query, written by a product)
// Token t is at positions[t] and goes to slot slots[t] = block * block_size + offset. The
// rotated pairs follow `layout`, in place, as the CPU engine stores them, so the two
// backends' caches hold the same rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/attention_variants.h"
#include "kernels/cuda/rope_kv.h"

namespace cleave::cuda {

struct MlaRopeKvArgs {
  const __nv_bfloat16* latent = nullptr;
  int64_t latent_stride = 0;
  const __nv_bfloat16* norm_weight = nullptr;  // [kv_lora]
  float eps = 1e-6f;
  const __nv_bfloat16* q = nullptr;
  int64_t q_stride = 0;
  const int32_t* positions = nullptr;  // [tokens]
  const int32_t* slots = nullptr;      // [tokens]
  const float* inv_freq = nullptr;     // [rope / 2], device memory
  float attention_factor = 1.0f;       // on cos and sin (rope_kv.h)
  int64_t tokens = 0;
  int heads = 0;
  int nope = 0;
  int kv_lora = 0;
  int rope = 0;  // even
  int block_size = 16;
  RopeLayout layout = RopeLayout::kAdjacent;
  __nv_bfloat16* q_abs = nullptr;
  int64_t q_abs_stride = 0;
  void* cache = nullptr;
  KvDtype kv_dtype = KvDtype::kBf16;
  float kv_scale = 1.0f;
};

absl::Status mlaRopeKvWrite(const MlaRopeKvArgs& args, cudaStream_t stream);

}  // namespace cleave::cuda
