// Causal prefill attention on the tensor cores (flash-attention: online softmax over
// tiles of 64 key positions, never materializing the score matrix), over the paged KV
// cache, so a chunk of new tokens attends to the sequence's cached prefix too.
//
// The new tokens' keys and values must already be in the cache (rope_kv writes them).
// Sequences are packed: sequence s's new tokens are rows [q_starts[s], q_starts[s + 1])
// of q and out; after this step it holds context_lens[s] positions, so its new token i
// sits at position context_lens[s] - (q_starts[s + 1] - q_starts[s]) + i and attends to
// positions [0, that position], or to the last `window` of them (sliding-window layers); with
// `sinks`, head h's softmax has one more logit, sinks[h], that joins the denominator and
// carries no value (gpt-oss). The kernel cannot check what lives on the device: the
// caller keeps every sequence's new tokens <= the plan's max_new_tokens (rows past it are
// left unwritten) and <= its context_lens (a row at a negative position reads as NaN).
//
//   q    [tokens][heads][head_dim] bf16, row stride q_stride
//   out  [tokens][heads][head_dim] bf16, row stride out_stride
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cuda/attention_variants.h"

namespace cleave::cuda {

struct PrefillAttentionShape {
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;     // 16, 32, 64, 128 or 256 (two blocks a head, each with half the values)
  int block_size = 16;  // a power of two
  int max_sequences = 0;
  int max_new_tokens = 0;  // the most new tokens of one sequence in a step
  float scale = 0.0f;
  KvDtype kv_dtype = KvDtype::kBf16;
  int window = 0;  // positions a token attends to, itself included; 0: all
  // Scores capped to ±softcap (cap · tanh(s / cap)) before the softmax (Gemma 2); 0: none.
  float softcap = 0.0f;
};

struct PrefillAttentionPlan {
  PrefillAttentionShape shape;
  int query_tiles = 0;  // 64-row tiles for max_new_tokens
};

absl::StatusOr<PrefillAttentionPlan> planPrefillAttention(const PrefillAttentionShape& shape);

struct PrefillAttentionArgs {
  const __nv_bfloat16* q = nullptr;
  int64_t q_stride = 0;
  const void* k_cache = nullptr;  // [block][kv_heads][block_size][head_dim], kv_dtype
  const void* v_cache = nullptr;
  float k_scale = 1.0f;  // e4m3 caches: stored value x scale
  float v_scale = 1.0f;
  const int32_t* block_tables = nullptr;  // [sequences][max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int32_t* q_starts = nullptr;      // [sequences + 1]
  const int32_t* context_lens = nullptr;  // [sequences]
  int sequences = 0;
  const float* sinks = nullptr;  // [heads] f32 logits on the device, or null: none
  __nv_bfloat16* out = nullptr;
  int64_t out_stride = 0;
};

absl::Status runPrefillAttention(const PrefillAttentionPlan& plan, const PrefillAttentionArgs& args,
                                 cudaStream_t stream);

}  // namespace cleave::cuda
