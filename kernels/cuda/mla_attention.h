// Causal attention of multi-head latent attention in its absorbed form
// (engine/mla_attention.h): every query head attends over one shared cached head of
// kv_lora + rope elements, and its values are the first kv_lora elements of the same rows.
//
//   q        [tokens][heads][kv_lora + rope] bf16 (absorbed queries), row stride q_stride
//   cache    one layer's latent rows [block][block_size][kv_lora + rope], bf16 or e4m3
//            (value = stored x kv_scale)
//   out      [tokens][heads][kv_lora] bf16, row stride out_stride: the attended latents
// Token t belongs to the sequence s with q_starts[s] <= t < q_starts[s + 1] and attends to
// its positions [0, positions[t]] through block_tables[s]. One pass serves prefill chunks
// and decode steps; the softmax is online, in f32.
//
// A CUDA-core kernel: correct for any latent size, not yet tuned (the GQA-packed
// tensor-core decode kernel is the model for a faster one).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/attention_variants.h"

namespace cleave::cuda {

struct MlaAttentionArgs {
  const __nv_bfloat16* q = nullptr;
  int64_t q_stride = 0;
  const void* cache = nullptr;
  KvDtype kv_dtype = KvDtype::kBf16;
  float kv_scale = 1.0f;
  const int32_t* positions = nullptr;     // [tokens]
  const int32_t* q_starts = nullptr;      // [sequences + 1]
  const int32_t* block_tables = nullptr;  // [sequences][max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  int sequences = 0;
  int64_t tokens = 0;
  int heads = 0;
  int kv_lora = 0;
  int rope = 0;
  int block_size = 16;
  float scale = 1.0f;  // of the scores
  __nv_bfloat16* out = nullptr;
  int64_t out_stride = 0;
};

absl::Status mlaAttention(const MlaAttentionArgs& args, cudaStream_t stream);

}  // namespace cleave::cuda
