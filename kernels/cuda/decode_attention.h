// Paged decode attention on the tensor cores: one new query token per sequence against
// its whole paged KV cache, grouped-query heads packed into the rows of the MMA tile
// (flash-decoding: the context is split into partitions that run in parallel, and a
// second kernel merges their partial results).
//
// Plan once per (shape, largest batch, longest context) — the partition size, grid and
// workspace are fixed there so that a CUDA graph can capture run() and replay it with
// other sequence lengths up to that bound.
//
//   q       [batch][heads][head_dim] bf16, row stride q_stride elements per token
//   caches  one layer's keys and values, [block][kv_heads][block_size][head_dim] in the
//           plan's kv_dtype (bf16, or e4m3 with per-tensor scales k_scale, v_scale)
//   out     [batch][heads][head_dim] bf16, row stride out_stride
// Query head h reads KV head h / (heads / kv_heads); sequence b attends to its positions
// [0, seq_lens[b]) through block_tables[b * max_blocks_per_seq + ...], or to the last
// `window` of them (sliding-window layers). With `sinks`, head h's softmax has one more
// logit, sinks[h], that joins the denominator and carries no value (gpt-oss).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cuda/attention_variants.h"

namespace cleave::cuda {

struct DecodeAttentionShape {
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;     // 16, 32, 64, 128 or 256 (two blocks a head, each with half the values)
  int block_size = 16;  // a power of two
  int max_batch = 0;
  int max_context = 0;
  float scale = 0.0f;  // usually 1 / sqrt(head_dim)
  KvDtype kv_dtype = KvDtype::kBf16;
  int window = 0;  // positions a token attends to, itself included; 0: all
  // Scores capped to ±softcap (cap · tanh(s / cap)) before the softmax (Gemma 2); 0: none.
  float softcap = 0.0f;
};

struct DecodeAttentionPlan {
  DecodeAttentionShape shape;
  int q_tiles = 1;         // 16-row tiles of one KV head's group of query heads
  int partition_size = 0;  // positions per partition at max_context (or the window), a
                           // multiple of 64
  int partitions = 1;      // per sequence (a shorter one splits into as many, each shorter
                           // but at least 256 positions); 1 = no merge kernel
  size_t workspace_bytes = 0;
};

// InvalidArgument naming the field for an unsupported shape. `multiprocessors` is the
// device's SM count (the split aims at a few blocks per SM).
absl::StatusOr<DecodeAttentionPlan> planDecodeAttention(const DecodeAttentionShape& shape,
                                                        int multiprocessors);

struct DecodeAttentionArgs {
  const __nv_bfloat16* q = nullptr;
  int64_t q_stride = 0;
  const void* k_cache = nullptr;  // in the plan's kv_dtype
  const void* v_cache = nullptr;
  float k_scale = 1.0f;  // e4m3 caches: stored value x scale
  float v_scale = 1.0f;
  const int32_t* block_tables = nullptr;  // [batch][max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;  // [batch], each in [1, max_context]
  int batch = 0;                      // <= max_batch
  const float* sinks = nullptr;       // [heads] f32 logits on the device, or null: none
  __nv_bfloat16* out = nullptr;
  int64_t out_stride = 0;
  void* workspace = nullptr;  // plan.workspace_bytes of device memory
};

// Enqueues the kernels on `stream` (capturable). Errors name the launch that failed.
absl::Status runDecodeAttention(const DecodeAttentionPlan& plan, const DecodeAttentionArgs& args,
                                cudaStream_t stream);

}  // namespace cleave::cuda
