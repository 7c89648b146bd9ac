#include "services/engine/moe_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "common/log.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vector_ops.h"
#include "services/engine/checked_matmul.h"

namespace cleave::engine {

namespace {

void addBias(float* x, const std::vector<float>& bias, int64_t rows) {
  cpu::addRowBias(x, bias.data(), rows, static_cast<int64_t>(bias.size()));
}

// gpt-oss's expert activation (MoeConfig::swiglu_limit), into `gate`.
void clampedSwiglu(float* gate, const float* up, int64_t n, float limit, float alpha) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    gate[i] = (u + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
  }
}

}  // namespace

Routing routeSoftmaxTopK(const float* logits, int64_t experts, int64_t k, bool normalize,
                         float scaling) {
  std::vector<float> probs(logits, logits + experts);
  cpu::softmax(probs.data(), experts, 1, experts);
  std::vector<int32_t> order(experts);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  });
  Routing routing;
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) {
    routing.experts.push_back(order[i]);
    routing.weights.push_back(probs[order[i]]);
    sum += probs[order[i]];
  }
  for (float& w : routing.weights) w = (normalize ? w / sum : w) * scaling;
  return routing;
}

Routing routeSigmoidGroupedTopK(const float* logits, const float* bias,
                                const GroupedRoutingParams& p) {
  std::vector<float> score(p.experts), choice(p.experts);
  for (int64_t e = 0; e < p.experts; ++e) {
    score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[e] = score[e] + (bias ? bias[e] : 0.0f);
  }
  const int64_t per_group = p.experts / p.n_group;
  std::vector<float> group_score(p.n_group);
  for (int64_t g = 0; g < p.n_group; ++g) {
    std::vector<float> members(choice.begin() + g * per_group,
                               choice.begin() + (g + 1) * per_group);
    std::partial_sort(members.begin(), members.begin() + std::min<int64_t>(2, per_group),
                      members.end(), std::greater<float>());
    group_score[g] = members[0] + (per_group > 1 ? members[1] : 0.0f);
  }
  std::vector<int64_t> groups(p.n_group);
  std::iota(groups.begin(), groups.end(), 0);
  std::partial_sort(
      groups.begin(), groups.begin() + p.topk_group, groups.end(), [&](int64_t a, int64_t b) {
        return group_score[a] > group_score[b] || (group_score[a] == group_score[b] && a < b);
      });
  std::vector<int32_t> candidates;
  for (int64_t i = 0; i < p.topk_group; ++i) {
    for (int64_t e = groups[i] * per_group; e < (groups[i] + 1) * per_group; ++e)
      candidates.push_back(static_cast<int32_t>(e));
  }
  std::partial_sort(candidates.begin(), candidates.begin() + p.k, candidates.end(),
                    [&](int32_t a, int32_t b) {
                      return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
                    });
  Routing routing;
  float sum = 0.0f;
  for (int64_t i = 0; i < p.k; ++i) {
    routing.experts.push_back(candidates[i]);
    routing.weights.push_back(score[candidates[i]]);
    sum += score[candidates[i]];
  }
  for (float& w : routing.weights) w = (p.normalize ? w / (sum + 1e-20f) : w) * p.scaling;
  return routing;
}

MoeRunner::MoeRunner(const model::MoeConfig& config, int64_t hidden, cpu::ThreadPool& pool)
    : config_(config), hidden_(hidden), pool_(pool) {}

void MoeRunner::runExpert(const MoeExpert& expert, int64_t m) {
  const int64_t ffn = expert.gate.rows();
  gate_.resize(m * ffn);
  up_.resize(m * ffn);
  expert_out_.resize(m * hidden_);
  checkedMatmulsOfOneInput(gathered_.data(), hidden_, m,
                           {{&expert.gate, gate_.data(), ffn}, {&expert.up, up_.data(), ffn}},
                           pool_);
  if (!expert.gate_bias.empty()) {
    addBias(gate_.data(), expert.gate_bias, m);
    addBias(up_.data(), expert.up_bias, m);
  }
  if (config_.swiglu_limit > 0) {
    clampedSwiglu(gate_.data(), up_.data(), m * ffn, static_cast<float>(config_.swiglu_limit),
                  static_cast<float>(config_.swiglu_alpha));
  } else {
    cpu::siluMul(gate_.data(), up_.data(), ffn, m, ffn, gate_.data(), ffn);
  }
  CLEAVE_CHECK_OK(cpu::matmul({.weight = &expert.down,
                               .x = gate_.data(),
                               .ldx = ffn,
                               .tokens = m,
                               .y = expert_out_.data(),
                               .ldy = hidden_},
                              pool_));
  if (!expert.down_bias.empty()) addBias(expert_out_.data(), expert.down_bias, m);
}

void MoeRunner::forward(const MoeBlock& block, const float* x, int64_t tokens, float* out) {
  const int64_t experts = block.router.rows();
  router_logits_.resize(tokens * experts);
  CLEAVE_CHECK_OK(cpu::matmul({.weight = &block.router,
                               .x = x,
                               .ldx = hidden_,
                               .tokens = tokens,
                               .y = router_logits_.data(),
                               .ldy = experts},
                              pool_));
  if (!block.router_bias.empty()) addBias(router_logits_.data(), block.router_bias, tokens);
  // Per expert, the tokens routed to it and their weights.
  std::vector<std::vector<std::pair<int64_t, float>>> assigned(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* logits = router_logits_.data() + t * experts;
    Routing r =
        config_.scoring == model::MoeScoring::kSigmoid
            ? routeSigmoidGroupedTopK(
                  logits, block.score_bias.empty() ? nullptr : block.score_bias.data(),
                  {.experts = experts,
                   .k = config_.experts_per_token,
                   .n_group = config_.n_group,
                   .topk_group = config_.topk_group,
                   .normalize = config_.norm_topk_prob,
                   .scaling = static_cast<float>(config_.routed_scaling_factor)})
            : routeSoftmaxTopK(logits, experts, config_.experts_per_token, config_.norm_topk_prob,
                               static_cast<float>(config_.routed_scaling_factor));
    for (size_t i = 0; i < r.experts.size(); ++i)
      assigned[r.experts[i]].emplace_back(t, r.weights[i]);
  }
  if (block.shared) {
    // The shared experts see every token with weight 1.
    gathered_.assign(x, x + tokens * hidden_);
    runExpert(*block.shared, tokens);
    std::memcpy(out, expert_out_.data(), tokens * hidden_ * sizeof(float));
    // A scalar per token: linear, so a rank's partial sum takes it as the whole would.
    for (int64_t t = 0; !block.shared_gate.empty() && t < tokens; ++t) {
      const float g = cpu::dot(x + t * hidden_, block.shared_gate.data(), hidden_);
      const float scale = 1.0f / (1.0f + std::exp(-g));
      for (int64_t i = 0; i < hidden_; ++i) out[t * hidden_ + i] *= scale;
    }
  } else {
    std::memset(out, 0, tokens * hidden_ * sizeof(float));
  }
  for (int64_t e = 0; e < static_cast<int64_t>(block.experts.size()); ++e) {
    const auto& rows = assigned[block.expert_begin + e];
    if (rows.empty()) continue;  // Experts no token chose are not read at all.
    const int64_t m = static_cast<int64_t>(rows.size());
    gathered_.resize(m * hidden_);
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(gathered_.data() + i * hidden_, x + rows[i].first * hidden_,
                  hidden_ * sizeof(float));
    }
    runExpert(block.experts[e], m);
    for (int64_t i = 0; i < m; ++i) {
      float* dst = out + rows[i].first * hidden_;
      const float* src = expert_out_.data() + i * hidden_;
      const float w = rows[i].second;
      for (int64_t j = 0; j < hidden_; ++j) dst[j] += w * src[j];
    }
  }
}

}  // namespace cleave::engine
