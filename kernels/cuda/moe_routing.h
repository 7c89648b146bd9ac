// Mixture-of-experts routing on the GPU, fused: from a token's router logits to its k
// experts (best first) and their weights, one warp per token — the CUDA twin of
// routeSoftmaxTopK and routeSigmoidGroupedTopK (services/engine/moe_block.h), with the same
// order, ties to the lower expert id, and the same weights.
//
//   softmax   Mixtral, Qwen3-MoE, DeepSeek-V2, gpt-oss: softmax over the logits, top k,
//             renormalized when asked (gpt-oss's softmax over its top k logits is this,
//             renormalized), times `scaling`.
//   sigmoid   DeepSeek-V3: s = sigmoid(logit), choice c = s + bias; each of n_group groups
//             of consecutive experts scores the sum of its two best c; the topk_group best
//             groups stay; the top k c among their experts win, weighted by s (renormalized
//             when asked) times `scaling`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace cleave::cuda {

enum class MoeScoring { kSoftmax, kSigmoidGrouped };

struct MoeRoutingArgs {
  const float* logits = nullptr;      // [tokens][experts], row stride `stride`
  const float* logit_bias = nullptr;  // [experts] added to every row's logits (gpt-oss), or null
  int64_t stride = 0;
  int64_t tokens = 0;
  int experts = 0;  // <= 512
  int k = 0;        // <= 32
  MoeScoring scoring = MoeScoring::kSoftmax;
  const float* bias = nullptr;  // [experts] or null (sigmoid only)
  int n_group = 1;              // <= 32, divides experts (sigmoid only)
  int topk_group = 1;
  bool normalize = false;
  float scaling = 1.0f;
  int32_t* expert_ids = nullptr;  // [tokens][k]
  float* weights = nullptr;       // [tokens][k]
};

// InvalidArgument naming the field for sizes outside the bounds above.
absl::Status routeExperts(const MoeRoutingArgs& args, cudaStream_t stream);

}  // namespace cleave::cuda
