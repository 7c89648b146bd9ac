// The mixture-of-experts MLP of Mixtral, Qwen3-MoE, DeepSeek-V3 and gpt-oss: a router picks k
// of E experts per token (softmax top-k, optionally renormalized; or DeepSeek's sigmoid scores
// with a correction bias and group-limited top-k), each expert is a SwiGLU MLP (gpt-oss: with
// biases and a clamped SwiGLU, MoeConfig::swiglu_limit), and a
// token's output is the weighted sum of its experts' outputs plus, for DeepSeek, the
// shared experts' output. Tokens are grouped by expert so each expert's weights are read once per
// step for all the tokens routed to it.
//
// Threading: forward() is called by the rank thread; matrix products spread over the pool.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/model/model_config.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace cleave::engine {

struct MoeExpert {
  cpu::CpuMatrix gate;  // [expert_intermediate, hidden]
  cpu::CpuMatrix up;    // [expert_intermediate, hidden]
  cpu::CpuMatrix down;  // [hidden, expert_intermediate]
  // gpt-oss's biases ([expert_intermediate], [expert_intermediate], [hidden]); empty when
  // the model has none. A rank holding some of an expert's columns adds down_bias only if
  // it holds the first (the others' sums are partial).
  std::vector<float> gate_bias, up_bias, down_bias;
};

struct MoeBlock {
  cpu::CpuMatrix router;  // [experts, hidden]: every expert's row, on every rank.
  // Experts [expert_begin, expert_begin + experts.size()): all of them, or one
  // tensor-parallel rank's share, whose forward() then yields a partial sum.
  int64_t expert_begin = 0;
  std::vector<MoeExpert> experts;
  std::vector<float> score_bias;    // [experts]; DeepSeek-V3's correction bias (else empty).
  std::vector<float> router_bias;   // [experts]; added to the router's logits (gpt-oss).
  std::optional<MoeExpert> shared;  // DeepSeek's always-on shared experts, as one MLP.
  // [hidden]; Qwen3.5-MoE: the shared output times sigmoid(x · shared_gate) (else empty).
  std::vector<float> shared_gate;
};

// Routing of one token: expert ids best first and their weights.
struct Routing {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

// Softmax over `logits` (one token's router output), top `k`, renormalized when `normalize`,
// times `scaling` (DeepSeek-V2's routed_scaling_factor; 1 for Mixtral and Qwen3-MoE).
Routing routeSoftmaxTopK(const float* logits, int64_t experts, int64_t k, bool normalize,
                         float scaling = 1.0f);

// DeepSeek-V3 routing: s = sigmoid(logits); choice score c = s + bias (a learned
// per-expert correction); each of n_group groups of consecutive experts scores the sum of
// its two best c; the topk_group best groups stay; the top `k` c among their experts are
// chosen, weighted by s (renormalized when `normalize`) times `scaling`.
struct GroupedRoutingParams {
  int64_t experts = 0;
  int64_t k = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool normalize = true;
  float scaling = 1.0f;
};
Routing routeSigmoidGroupedTopK(const float* logits, const float* bias,
                                const GroupedRoutingParams& params);

class MoeRunner {
 public:
  MoeRunner(const model::MoeConfig& config, int64_t hidden, cpu::ThreadPool& pool);

  // out[t] = sum over token t's experts of weight * expert(x[t]); x and out are
  // [tokens, hidden] (out may not alias x).
  void forward(const MoeBlock& block, const float* x, int64_t tokens, float* out);

 private:
  model::MoeConfig config_;
  int64_t hidden_;
  cpu::ThreadPool& pool_;
  void runExpert(const MoeExpert& expert, int64_t rows);  // gathered_ -> expert_out_

  std::vector<float> router_logits_, gathered_, gate_, up_, expert_out_;
};

}  // namespace cleave::engine
