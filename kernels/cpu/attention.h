// Causal multi-head attention with grouped KV heads over a contiguous KV cache of one
// sequence.
//
//   q    [tokens, heads * head_dim]        row stride ldq
//   k, v [context, kv_heads * head_dim]    row stride ldkv; rows [0, positions[t]] are
//                                          valid for query t
//   out  [tokens, heads * head_dim]        row stride ldo
// Query head h reads KV head h / (heads / kv_heads). Scores are scaled by `scale`
// (usually 1/sqrt(head_dim)) and softmaxed in float.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace cleave::cpu {

struct AttentionArgs {
  const float* q = nullptr;
  int64_t ldq = 0;
  int64_t tokens = 0;
  const int32_t* positions = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t ldkv = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  float* out = nullptr;
  int64_t ldo = 0;
};

void attention(const AttentionArgs& args, ThreadPool& pool);

}  // namespace cleave::cpu
