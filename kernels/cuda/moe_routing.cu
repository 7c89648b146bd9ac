#include <cfloat>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/warp_math.cuh"

namespace cleave::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxExperts = 512;

// The larger (value, index) of two, ties to the lower index.
__device__ __forceinline__ void better(float& value, int& index, float other, int other_index) {
  if (other > value || (other == value && other_index < index)) {
    value = other;
    index = other_index;
  }
}

// A NaN score (an overflowed activation) ranks below every number, so the argmax rounds
// below always pick a real expert and NaN outputs stay NaN instead of faulting.
__device__ __forceinline__ float rankable(float v) { return isnan(v) ? -FLT_MAX : v; }

__device__ __forceinline__ void warpArgmax(float& value, int& index) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    better(value, index, __shfl_xor_sync(0xffffffffu, value, offset),
           __shfl_xor_sync(0xffffffffu, index, offset));
}

__global__ void __launch_bounds__(kWarps * 32) routeKernel(const MoeRoutingArgs a) {
  __shared__ float score_all[kWarps][kMaxExperts];
  __shared__ float choice_all[kWarps][kMaxExperts];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (token >= a.tokens) return;
  float* score = score_all[warp];
  float* choice = choice_all[warp];
  const float* logits = a.logits + token * a.stride;
  const int e_count = a.experts;
  auto logit = [&](int e) { return logits[e] + (a.logit_bias ? a.logit_bias[e] : 0.0f); };

  if (a.scoring == MoeScoring::kSoftmax) {
    float top = -FLT_MAX;
    for (int e = lane; e < e_count; e += 32) top = fmaxf(top, logit(e));
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
    float sum = 0.0f;
    for (int e = lane; e < e_count; e += 32) {
      score[e] = expf(logit(e) - top);
      sum += score[e];
    }
    sum = warpSum(sum);
    for (int e = lane; e < e_count; e += 32) {
      score[e] /= sum;
      choice[e] = rankable(score[e]);
    }
  } else {
    for (int e = lane; e < e_count; e += 32) {
      score[e] = 1.0f / (1.0f + expf(-logit(e)));
      choice[e] = rankable(score[e] + (a.bias ? a.bias[e] : 0.0f));
    }
  }
  __syncwarp();

  // Group-limited: lane g scores group g by its two best choices, the best groups stay.
  uint32_t kept_groups = 0xffffffffu;
  const int per_group = e_count / a.n_group;
  if (a.scoring == MoeScoring::kSigmoidGrouped && a.n_group > 1) {
    float group_score = -FLT_MAX;
    if (lane < a.n_group) {
      float first = -FLT_MAX, second = -FLT_MAX;
      for (int e = lane * per_group; e < (lane + 1) * per_group; ++e) {
        if (choice[e] > first) {
          second = first;
          first = choice[e];
        } else if (choice[e] > second) {
          second = choice[e];
        }
      }
      // Floored at -FLT_MAX (two NaN choices sum to -inf): a real group, even one of NaN
      // scores, then beats the placeholder lanes (ties go to the lower index).
      group_score = fmaxf(first + (per_group > 1 ? second : 0.0f), -FLT_MAX);
    }
    kept_groups = 0;
    for (int round = 0; round < a.topk_group; ++round) {
      float value = (kept_groups >> lane) & 1u ? -FLT_MAX : group_score;
      int index = lane < a.n_group ? lane : 1 << 30;
      if ((kept_groups >> lane) & 1u) index = 1 << 30;
      warpArgmax(value, index);
      if (index < a.n_group) kept_groups |= 1u << index;
    }
  }

  // k rounds of a warp argmax over the allowed, not yet chosen experts.
  int32_t* ids = a.expert_ids + token * a.k;
  float* weights = a.weights + token * a.k;
  float my_weight = 0.0f;  // lane i < k keeps the weight of the i-th choice
  int my_id = 0;
  for (int round = 0; round < a.k; ++round) {
    float value = -FLT_MAX;
    int index = 1 << 30;
    for (int e = lane; e < e_count; e += 32) {
      if (!((kept_groups >> (e / per_group)) & 1u)) continue;
      better(value, index, choice[e], e);
    }
    warpArgmax(value, index);
    if (index >= e_count) index = 0;  // Unreachable with rankable scores; never index past.
    if (lane == round) {
      my_id = index;
      my_weight = score[index];
    }
    __syncwarp();
    if (lane == 0) choice[index] = -INFINITY;  // Chosen: below every candidate from now on.
    __syncwarp();
  }
  const float sum = warpSum(lane < a.k ? my_weight : 0.0f);
  if (lane < a.k) {
    float w = my_weight;
    if (a.scoring == MoeScoring::kSoftmax) {
      w = (a.normalize ? w / sum : w) * a.scaling;
    } else {
      w = (a.normalize ? w / (sum + 1e-20f) : w) * a.scaling;
    }
    ids[lane] = my_id;
    weights[lane] = w;
  }
}

}  // namespace

absl::Status routeExperts(const MoeRoutingArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return absl::OkStatus();
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("moe routing: " + what);
  };
  if (a.experts < 1 || a.experts > kMaxExperts) return bad("experts must be in [1, 512]");
  if (a.k < 1 || a.k > 32 || a.k > a.experts) return bad("k must be in [1, min(32, experts)]");
  if (a.n_group < 1 || a.n_group > 32 || a.experts % a.n_group != 0)
    return bad("n_group must be in [1, 32] and divide experts");
  if (a.topk_group < 1 || a.topk_group > a.n_group)
    return bad("topk_group must be in [1, n_group]");
  if (a.scoring == MoeScoring::kSigmoidGrouped && a.k > a.topk_group * (a.experts / a.n_group))
    return bad("k exceeds the experts of the kept groups");
  const auto blocks = static_cast<unsigned>((a.tokens + kWarps - 1) / kWarps);
  routeKernel<<<blocks, kWarps * 32, 0, stream>>>(a);
  return launchStatus("moe routing");
}

}  // namespace cleave::cuda
