#include "services/roofline/roofline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cleave::roofline {
namespace {

model::ModelConfig tinyDense() {
  model::ModelConfig c;
  c.hidden_size = 64;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.vocab_size = 100;
  return c;
}

const Hardware kUnit{.name = "unit",
                     .bandwidth = 1e9,
                     .peak_flops = 1e9,
                     .attention_flops = 1e9,
                     .link_bandwidth = 1e9,
                     .link_latency = 1e-6};

TEST(RooflineTest, ExpectedExpertsFollowTheFormula) {
  // PERF.md: B = 16, k = 8, E = 256 touches ~102 experts.
  EXPECT_NEAR(expectedDistinctExperts(256, 8, 16), 101.96, 0.01);
  EXPECT_NEAR(expectedDistinctExperts(256, 8, 1), 8.0, 1e-9);
  EXPECT_NEAR(expectedDistinctExperts(8, 2, 1000), 8.0, 1e-9);
}

// Computed by hand: per layer attention 64 x (2 x 64 + 2 x 32) = 12288 parameters, MLP
// 3 x 64 x 128 = 24576; two layers and a 100 x 64 lm-head read 80128 parameters.
TEST(RooflineTest, ADenseDecodeStepByHand) {
  auto t = stepFloor(tinyDense(), kUnit, decodeStep(1, 10));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(t->weight_bytes, 80128 * 2);
  EXPECT_DOUBLE_EQ(t->kv_bytes, 10 * 2 * 64 * 2);         // positions x layers x 2kvh.hd x bytes
  EXPECT_DOUBLE_EQ(t->activation_bytes, 64 * 2 * 2 * 2);  // hidden x 16 bits x 2 x layers
  EXPECT_DOUBLE_EQ(t->linear_flops, 2 * 73728 + 2 * 6400);
  EXPECT_DOUBLE_EQ(t->attention_flops, 2 * 10 * 4 * 32 * 2);
  EXPECT_DOUBLE_EQ(t->memory_seconds, (160256 + 2560 + 512) / 1e9);
  EXPECT_DOUBLE_EQ(t->compute_seconds, (160256 + 5120) / 1e9);
  EXPECT_DOUBLE_EQ(t->collective_seconds, 0);
  EXPECT_DOUBLE_EQ(t->floor_seconds, t->compute_seconds);

  Workload two = decodeStep(1, 10);
  two.tp = 2;
  auto split = stepFloor(tinyDense(), kUnit, two);
  ASSERT_TRUE(split.ok());
  EXPECT_DOUBLE_EQ(split->weight_bytes, 80128);
  EXPECT_DOUBLE_EQ(split->kv_bytes, 1280);
  // Two all-reduces per layer of 64 x 2 bytes: 1 us + 2 x (1/2) x 128 B / 1 GB/s each.
  EXPECT_NEAR(split->collective_seconds, 4 * (1e-6 + 128e-9), 1e-15);
}

// tinyDense with its first layer linear attention (2 key heads of 4, 4 value heads of 8, 4
// taps) and gated attention on the second, by hand: the linear layer's projections are
// 64 x (2 x 8 + 2 x 32 + 2 x 4) + 32 x 64 = 7680 parameters, the gated layer's attention
// 64 x (3 x 64 + 2 x 32) = 16384; one layer keeps KV. Each sequence's state is 4 x 4 x 8 = 128
// floats of S and 3 x (16 + 32) = 144 of convolution inputs, read and written once a step.
TEST(RooflineTest, ALinearAttentionLayerReadsAndWritesItsStates) {
  model::ModelConfig c = tinyDense();
  c.attention_output_gate = true;
  c.linear_attention = model::LinearAttentionConfig{.key_heads = 2,
                                                    .value_heads = 4,
                                                    .key_head_dim = 4,
                                                    .value_head_dim = 8,
                                                    .conv_kernel = 4,
                                                    .layers = {true, false}};
  auto t = stepFloor(c, kUnit, decodeStep(3, 10));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(t->weight_bytes, (7680 + 16384 + 2 * 24576 + 6400) * 2);
  EXPECT_DOUBLE_EQ(t->kv_bytes, 3 * 10 * 64 * 2 + 2.0 * 3 * (128 + 144) * 4);
  // Scores and values of the one attention layer, and ~7 FLOPs per state element a token.
  EXPECT_DOUBLE_EQ(t->attention_flops, 3 * (2 * 10 * 4 * 32) + 3 * 7 * 128);
}

TEST(RooflineTest, MoeLayersReadTheExpectedExperts) {
  model::ModelConfig c = tinyDense();
  c.moe =
      model::MoeConfig{.num_experts = 16, .experts_per_token = 2, .expert_intermediate_size = 32};
  c.moe->first_k_dense = 1;  // Layer 0 dense, layer 1 MoE.
  auto one = stepFloor(c, kUnit, decodeStep(1, 0));
  auto many = stepFloor(c, kUnit, decodeStep(64, 0));
  ASSERT_TRUE(one.ok() && many.ok());
  const double expert = 3 * 64 * 32, router = 64 * 16;
  const double base = 2 * 12288 + 24576 + 6400 + router;
  EXPECT_DOUBLE_EQ(one->weight_bytes, (base + 2 * expert) * 2);
  EXPECT_NEAR(many->weight_bytes, (base + expectedDistinctExperts(16, 2, 64) * expert) * 2, 1e-6);
  EXPECT_GT(many->expected_experts, 15.9);
}

// A loaded MoE model's weight bytes: a step reads its routed experts only in the share its
// tokens are expected to choose (k of E for one token, nearly all for many).
TEST(RooflineTest, LoadedMoeWeightsCountTheExpertsAStepReads) {
  model::ModelConfig c = tinyDense();
  c.moe =
      model::MoeConfig{.num_experts = 32, .experts_per_token = 4, .expert_intermediate_size = 32};
  Workload one = decodeStep(1, 10);
  one.weight_bytes = 1000;
  one.routed_expert_bytes = 800;
  auto t = stepFloor(c, kUnit, one);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->weight_bytes, 200 + 800 * 4.0 / 32);
  Workload many = decodeStep(256, 10);
  many.weight_bytes = 1000;
  many.routed_expert_bytes = 800;
  t = stepFloor(c, kUnit, many);
  ASSERT_TRUE(t.ok());
  EXPECT_NEAR(t->weight_bytes, 1000, 1e-6);
}

// A model quantized in part: each product at its weights' peak (float ones at
// float_peak_flops, the router always), by hand from the MoE model above: per token 2 x 12288
// attention, 24576 dense MLP, 2 x 6144 routed-expert and 1024 router parameters, 6400 head.
TEST(RooflineTest, FloatProductsRunAtTheFloatPeak) {
  model::ModelConfig c = tinyDense();
  c.moe =
      model::MoeConfig{.num_experts = 16, .experts_per_token = 2, .expert_intermediate_size = 32};
  c.moe->first_k_dense = 1;
  Hardware hw = kUnit;
  hw.float_peak_flops = 0.25e9;
  Workload w = decodeStep(3, 0);
  const double attention = 2 * 12288, mlp = 24576, experts = 2 * 6144, router = 1024, head = 6400;
  auto t = stepFloor(c, hw, w);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->linear_flops, 2 * 3 * (attention + mlp + experts + router + head));
  EXPECT_NEAR(t->compute_seconds, 2 * 3 * (attention + mlp + experts + router / 0.25 + head) / 1e9,
              1e-15);
  // gpt-oss's: bf16 but the experts; and a third of the MLP (its down projection).
  w.float_products = {.attention = 1, .mlp = 1.0 / 3, .lm_head = 1};
  t = stepFloor(c, hw, w);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->linear_flops, 2 * 3 * (attention + mlp + experts + router + head));
  EXPECT_NEAR(t->compute_seconds,
              2 * 3 * ((attention + router + head + mlp / 3) / 0.25 + mlp * 2 / 3 + experts) / 1e9,
              1e-15);
  // Without a float peak, every product runs at peak_flops.
  t = stepFloor(c, kUnit, w);
  ASSERT_TRUE(t.ok());
  EXPECT_NEAR(t->compute_seconds, t->linear_flops / 1e9, 1e-15);
}

// The router is held and run whole by every rank: split over two ranks, a MoE step's other
// parameters halve and the router's stay.
TEST(RooflineTest, EveryRankHoldsTheRouter) {
  model::ModelConfig c = tinyDense();
  c.moe =
      model::MoeConfig{.num_experts = 16, .experts_per_token = 2, .expert_intermediate_size = 32};
  c.moe->first_k_dense = 1;
  Workload two = decodeStep(1, 0);
  two.tp = 2;
  auto t = stepFloor(c, kUnit, two);
  ASSERT_TRUE(t.ok());
  const double expert = 3 * 64 * 32, router = 64 * 16, head = 6400;
  const double split = 2 * 12288 + 24576 + 2 * expert;  // Attention, the dense MLP, 2 experts.
  EXPECT_DOUBLE_EQ(t->weight_bytes, ((split + head) / 2 + router) * 2);
  EXPECT_DOUBLE_EQ(t->linear_flops, 2 * (split + head) / 2 + 2 * router);
}

TEST(RooflineTest, PrefillAttendsTheTriangle) {
  const Workload w = prefillChunk(4, 10);
  EXPECT_EQ(w.attended, 11 + 12 + 13 + 14);  // FLOPs: each token over its positions.
  EXPECT_EQ(w.kv_positions, 14);             // Bytes: each position read once.
  EXPECT_EQ(w.new_tokens, 4);
}

// Sliding-window layers (gpt-oss) see a token's last `window` positions: each span counted
// position by position, and a model whose every other layer slides reads and computes the
// full layers' attention plus the windowed ones'.
TEST(RooflineTest, SlidingWindowLayersAttendTheirWindowOnly) {
  for (int64_t window : {0, 1, 3, 5, 12, 40}) {
    for (int64_t start : {0, 2, 9}) {
      for (int64_t tokens : {1, 4, 11}) {
        int64_t attended = 0, lowest = start;
        for (int64_t p = start; p < start + tokens; ++p) {
          const int64_t from = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
          attended += p + 1 - from;
          lowest = std::min(lowest, from);
        }
        const AttentionSpan span = attentionSpan(start, tokens, window);
        EXPECT_EQ(span.attended, attended) << window << " " << start << " " << tokens;
        EXPECT_EQ(span.kv_positions, start + tokens - lowest) << window << " " << start;
      }
    }
  }
  EXPECT_EQ(attentionSpan(5, 0, 3).attended, 0);
  const Workload w = decodeStep(3, 100, 8);
  EXPECT_EQ(w.attended, 300);
  EXPECT_EQ(w.windowed_attended, 24);
  EXPECT_EQ(w.windowed_kv_positions, 24);
  model::ModelConfig c = tinyDense();
  auto plain = stepFloor(c, kUnit, w);
  c.sliding_window = 8;
  c.sliding_layers = {true, false};
  auto windowed = stepFloor(c, kUnit, w);
  ASSERT_TRUE(plain.ok() && windowed.ok());
  EXPECT_DOUBLE_EQ(windowed->kv_bytes, plain->kv_bytes * (100 + 8) / 200);
  EXPECT_DOUBLE_EQ(windowed->attention_flops, plain->attention_flops * (100 + 8) / 200);
}

TEST(RooflineTest, UnknownHardwareListsTheKnownOnes) {
  auto hw = builtinHardware("tpu", "bf16");
  EXPECT_EQ(hw.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(hw.status().message(), ::testing::HasSubstr("rtx-pro-6000"));
  EXPECT_TRUE(builtinHardware("h200", "fp8").ok());
  EXPECT_FALSE(builtinHardware("h200", "int3").ok());
}

}  // namespace
}  // namespace cleave::roofline
