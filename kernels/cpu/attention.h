// Causal multi-head attention with grouped KV heads over a paged KV cache.
//
// Keys and values live in fixed-size blocks of `block_size` positions, head-major inside a
// block: [kv_heads][block_size][head_dim] elements of `kv_type` (kv_format.h; e4m3 keys and
// values are multiplied by k_scale and v_scale), so one head's part of a block is
// contiguous (what a KV transfer between different TP layouts moves). Token t of the
// batch belongs to a sequence whose blocks are listed in block_tables[t] (block j holds the
// sequence's positions [j * block_size, (j + 1) * block_size)); it attends to positions
// [0, positions[t]], or its last `window` positions of those when `window` > 0 (sliding-window
// attention: [positions[t] - window + 1, positions[t]]).
//
//   q    [tokens, heads * head_dim]   row stride ldq
//   out  [tokens, heads * head_dim]   row stride ldo
// Query head h reads KV head h / (heads / kv_heads). Scores are scaled by `scale` and
// softmaxed in float. With `sinks`, head h's softmax has one more logit, sinks[h], that joins
// the denominator and carries no value (gpt-oss's attention sinks): a head may attend to
// nothing.
#pragma once

#include <cstdint>

#include "kernels/cpu/kv_format.h"
#include "kernels/cpu/thread_pool.h"

namespace cleave::cpu {

struct AttentionArgs {
  const float* q = nullptr;
  int64_t ldq = 0;
  int64_t tokens = 0;
  const int32_t* positions = nullptr;            // [tokens]
  const int32_t* const* block_tables = nullptr;  // [tokens] -> the token's sequence's blocks
  const void* k_pool = nullptr;                  // [blocks, kv_heads, block_size, head_dim]
  const void* v_pool = nullptr;
  KvType kv_type = KvType::kF32;
  float k_scale = 1.0f;  // kFp8E4M3 only.
  float v_scale = 1.0f;
  int64_t block_size = 16;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  const float* sinks = nullptr;  // [heads], or null: no sink.
  float softcap = 0.0f;          // Scores capped to ±softcap (cap·tanh(s/cap)); 0: none.
  int64_t window = 0;            // Positions a token attends to, itself included; 0: all.
  float* out = nullptr;
  int64_t ldo = 0;
};

void attention(const AttentionArgs& args, ThreadPool& pool);

}  // namespace cleave::cpu
