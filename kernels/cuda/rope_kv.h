// Rotary embedding of a step's queries and keys fused with the KV-cache write: reads the
// QKV projection once, writes rotated queries for attention and rotated keys plus values
// into their cache slots.
//
//   qkv       [tokens][(heads + 2 kv_heads) * head_dim] bf16: query heads, key heads, value
//             heads, row stride qkv_stride
//   q_out     [tokens][heads * head_dim] bf16, row stride q_stride
//   caches    one layer's [block][kv_heads][block_size][head_dim], bf16 or e4m3 (value /
//             scale, saturated)
// Token t is at positions[t] and goes to cache slot slots[t] = block * block_size + offset.
// The angle of pair i is positions[t] * inv_freq[i] (inv_freq already holds the model's
// rope scaling, e.g. cpu::Rope::inverseFrequencies()); cos and sin are multiplied by
// attention_factor (YaRN's, cpu::Rope::attentionFactor(); 1 for other scalings). Only the
// leading rotary_dim values of each query and key head rotate (GLM-4.5's half; the pairs
// are taken within them); the rest are copied as they are. With query_scale_beta, each
// query is then multiplied by 1 + beta · ln(1 + ⌊position / query_scale_period⌋)
// (Ministral 3's temperature, model::ModelConfig::queryScale).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/attention_variants.h"

namespace cleave::cuda {

enum class RopeLayout {
  kHalves,    // pairs (x[i], x[i + D/2]): Hugging Face checkpoints
  kAdjacent,  // pairs (x[2i], x[2i + 1]): GGUF llama-family files
};

struct RopeKvArgs {
  const __nv_bfloat16* qkv = nullptr;
  int64_t qkv_stride = 0;
  const int32_t* positions = nullptr;  // [tokens]
  const int32_t* slots = nullptr;      // [tokens]
  const float* inv_freq = nullptr;     // [rotary_dim / 2], device memory
  float attention_factor = 1.0f;
  float query_scale_beta = 0.0f;
  int query_scale_period = 0;
  int64_t tokens = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;    // even
  int rotary_dim = 0;  // even, <= head_dim; 0: head_dim
  bool rotate = true;  // false: queries and keys kept as they are (SmolLM3's NoPE layers)
  int block_size = 16;
  RopeLayout layout = RopeLayout::kHalves;
  __nv_bfloat16* q_out = nullptr;
  int64_t q_stride = 0;
  void* k_cache = nullptr;  // kv_dtype elements
  void* v_cache = nullptr;
  KvDtype kv_dtype = KvDtype::kBf16;
  float k_scale = 1.0f;  // e4m3: stored = value / scale
  float v_scale = 1.0f;
};

absl::Status ropeKvWrite(const RopeKvArgs& args, cudaStream_t stream);

}  // namespace cleave::cuda
