// Causal attention of multi-head latent attention in its absorbed form
// (engine/mla_attention.h): every query head attends over one shared cached head of
// kv_lora + rope elements, and its values are the first kv_lora elements of the same rows.
//
//   q        [tokens][heads][kv_lora + rope] bf16 (absorbed queries), row stride q_stride
//   cache    one layer's latent rows [block][block_size][kv_lora + rope], bf16 or e4m3
//            (value = stored x kv_scale)
//   out      [tokens][heads][kv_lora] bf16, row stride out_stride: the attended latents
// Token t belongs to the sequence s with q_starts[s] <= t < q_starts[s + 1] and attends to
// its positions [0, positions[t]] through block_tables[s]. One call serves prefill chunks
// and decode steps; the softmax is online, in f32.
//
// Two kernels behind one plan:
//   * DeepSeek's latent (kv_lora 512, rope 64: V2, V2-Lite, V3, R1, Kimi-K2) runs on the
//     tensor cores (mla_attention_mma.cu): sixteen heads of a token share every latent row a
//     block reads, QKᵀ and PV on mma.sync, the context split across blocks (flash-decoding)
//     when the tokens alone leave the GPU idle, the parts merged after.
//   * Every other latent size runs on a CUDA-core kernel, one block per (token, head).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/attention_variants.h"

namespace cleave::cuda {

struct MlaAttentionShape {
  int heads = 0;
  int kv_lora = 0;
  int rope = 0;
  int block_size = 16;
  int max_tokens = 1;   // Query tokens of one call.
  int max_context = 1;  // Positions a token may attend to.
  KvDtype kv_dtype = KvDtype::kBf16;
};

struct MlaAttentionPlan {
  MlaAttentionShape shape;
  bool tensor_cores = false;
  int multiprocessors = 1;
  // Context parts of the tensor-core kernel for the largest call the workspace holds:
  // `partial_tokens` tokens in up to `max_partitions` parts each.
  int max_partitions = 1;
  int partial_tokens = 0;
  size_t workspace_bytes = 0;
};

// InvalidArgument for a shape neither kernel takes (naming the field).
absl::StatusOr<MlaAttentionPlan> planMlaAttention(const MlaAttentionShape& shape,
                                                  int multiprocessors);

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
  void* workspace = nullptr;  // plan.workspace_bytes
};

// `args` must match the plan's shape (heads, latent, block size, cache type) and hold at most
// max_tokens tokens.
absl::Status mlaAttention(const MlaAttentionPlan& plan, const MlaAttentionArgs& args,
                          cudaStream_t stream);

}  // namespace cleave::cuda
