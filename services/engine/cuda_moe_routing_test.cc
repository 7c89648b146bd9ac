// GPU routing against the CPU backend's (services/engine/moe_block.h) on random logits:
// Mixtral (8 experts, top 2), Qwen3-MoE (128, top 8, renormalized), gpt-oss (32, top 4,
// renormalized, a bias on the router's logits) and DeepSeek-V3 (256, top 8 of 4 of 8 groups,
// correction bias, scaling 2.5): the same experts in the same order, weights within 1e-5.
#include "kernels/cuda/moe_routing.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_test_util.h"
#include "services/engine/moe_block.h"

namespace cleave::cuda {
namespace {

using testing::DeviceBuffer;

struct Case {
  const char* name;
  int experts, k;
  MoeScoring scoring;
  int n_group = 1, topk_group = 1;
  bool normalize = false;
  float scaling = 1.0f;
  bool logit_bias = false;
};

TEST(MoeRoutingTest, MatchesCpuRouting) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (const Case& c :
       {Case{"mixtral", 8, 2, MoeScoring::kSoftmax},
        Case{"qwen3-moe", 128, 8, MoeScoring::kSoftmax, 1, 1, true},
        Case{"gpt-oss", 32, 4, MoeScoring::kSoftmax, 1, 1, true, 1.0f, true},
        Case{"deepseek-v2-lite", 64, 6, MoeScoring::kSoftmax, 1, 1, false, 16.0f},
        Case{"deepseek-v3", 256, 8, MoeScoring::kSigmoidGrouped, 8, 4, true, 2.5f},
        Case{"sigmoid, one group", 64, 6, MoeScoring::kSigmoidGrouped, 1, 1, false, 1.0f}}) {
    SCOPED_TRACE(c.name);
    const int64_t tokens = 37, stride = c.experts + 3;
    std::vector<float> logits(tokens * stride), bias(c.experts), logit_bias(c.experts);
    for (float& x : logits) x = dist(rng);
    for (float& b : bias) b = 0.1f * dist(rng);
    for (float& b : logit_bias) b = dist(rng);
    const bool sigmoid = c.scoring == MoeScoring::kSigmoidGrouped;
    DeviceBuffer<float> dlogits(logits), dbias(bias), dlogit_bias(logit_bias),
        dweights(tokens * c.k);
    DeviceBuffer<int32_t> dids(tokens * c.k);
    ASSERT_TRUE(routeExperts({.logits = dlogits.get(),
                              .logit_bias = c.logit_bias ? dlogit_bias.get() : nullptr,
                              .stride = stride,
                              .tokens = tokens,
                              .experts = c.experts,
                              .k = c.k,
                              .scoring = c.scoring,
                              .bias = sigmoid ? dbias.get() : nullptr,
                              .n_group = c.n_group,
                              .topk_group = c.topk_group,
                              .normalize = c.normalize,
                              .scaling = c.scaling,
                              .expert_ids = dids.get(),
                              .weights = dweights.get()},
                             nullptr)
                    .ok());
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    const std::vector<int32_t> ids = dids.copyToHost();
    const std::vector<float> weights = dweights.copyToHost();
    for (int64_t t = 0; t < tokens; ++t) {
      // The CPU adds the router's bias to its logits before routing (MoeRunner::forward).
      std::vector<float> row_copy(logits.begin() + t * stride,
                                  logits.begin() + t * stride + c.experts);
      if (c.logit_bias)
        for (int e = 0; e < c.experts; ++e) row_copy[e] += logit_bias[e];
      const float* row = row_copy.data();
      const engine::Routing want =
          sigmoid ? engine::routeSigmoidGroupedTopK(row, bias.data(),
                                                    {.experts = c.experts,
                                                     .k = c.k,
                                                     .n_group = c.n_group,
                                                     .topk_group = c.topk_group,
                                                     .normalize = c.normalize,
                                                     .scaling = c.scaling})
                  : engine::routeSoftmaxTopK(row, c.experts, c.k, c.normalize, c.scaling);
      for (int i = 0; i < c.k; ++i) {
        ASSERT_EQ(ids[t * c.k + i], want.experts[i]) << "token " << t << " choice " << i;
        EXPECT_NEAR(weights[t * c.k + i], want.weights[i], 1e-5 * std::max(1.0f, want.weights[i]))
            << "token " << t << " choice " << i;
      }
    }
  }
}

TEST(MoeRoutingTest, RefusesShapesItCannotRoute) {
  MoeRoutingArgs args{.tokens = 1, .experts = 1024, .k = 2};
  EXPECT_EQ(routeExperts(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args = {.tokens = 1, .experts = 64, .k = 2, .n_group = 7};
  EXPECT_EQ(routeExperts(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args = {.tokens = 1,
          .experts = 64,
          .k = 20,
          .scoring = MoeScoring::kSigmoidGrouped,
          .n_group = 8,
          .topk_group = 2};
  EXPECT_EQ(routeExperts(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave::cuda
