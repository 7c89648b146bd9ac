#include "services/engine/memory_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cleave::engine {
namespace {

using ::testing::HasSubstr;

model::ModelConfig smolLm2() {
  model::ModelConfig c;
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_layers = 30;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.vocab_size = 49152;
  return c;
}

TEST(MemoryPlanTest, KvBytesFollowTheModelAndTp) {
  // 2 (K, V) x 30 layers x 3 heads x 64 dims x 4 bytes.
  EXPECT_EQ(kvBytesPerToken(smolLm2(), 4, 1), 2 * 30 * 3 * 64 * 4);
  model::ModelConfig c = smolLm2();
  c.num_kv_heads = 8;
  EXPECT_EQ(kvBytesPerToken(c, 2, 4), 2 * 30 * 2 * 64 * 2);
  // MLA (DeepSeek-V3): one latent row of 512 + 64 per layer, the same on every rank.
  c.num_layers = 61;
  c.num_heads = c.num_kv_heads = 128;
  c.mla = model::MlaConfig{.q_lora_rank = 1536,
                           .kv_lora_rank = 512,
                           .qk_nope_head_dim = 128,
                           .qk_rope_head_dim = 64,
                           .v_head_dim = 128};
  EXPECT_EQ(kvBytesPerToken(c, 2, 1), 61 * 576 * 2);
  EXPECT_EQ(kvBytesPerToken(c, 2, 8), 61 * 576 * 2);
}

TEST(MemoryPlanTest, AFittingPlanAccountsForEveryByte) {
  auto plan = planMemory(smolLm2(), {.budget_bytes = int64_t{2} << 30,
                                     .weight_bytes = 100 << 20,
                                     .target_concurrency = 16,
                                     .planned_seq_len = 2048});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GE(plan->sequences_at_planned_len, 16);
  EXPECT_LE(plan->weights + plan->workspace + plan->kv_pool, plan->budget);
  EXPECT_GT(plan->kv_pool + plan->kv_block_bytes, plan->budget - plan->weights - plan->workspace);
  EXPECT_THAT(plan->table(), HasSubstr("KV pool"));
}

// Verified drafts return a row of logits each: the workspace holds them, at most a step's
// tokens of them.
TEST(MemoryPlanTest, DraftsLogitsAreInTheWorkspace) {
  auto workspace = [](int64_t drafts) {
    auto plan = planMemory(smolLm2(), {.budget_bytes = int64_t{2} << 30,
                                       .weight_bytes = 100 << 20,
                                       .target_concurrency = 16,
                                       .max_batch_tokens = 512,
                                       .speculative_tokens = drafts});
    return plan.ok() ? plan->workspace : -1;
  };
  const int64_t row = 2 * 49152 * 4;  // Logits of a row, twice (the estimate's margin).
  EXPECT_EQ(workspace(4) - workspace(0), 16 * 4 * row);
  EXPECT_EQ(workspace(16) - workspace(0), 16 * 16 * row);
  EXPECT_EQ(workspace(64) - workspace(0), (512 - 16 - kPromptLogprobRows) * row);
  EXPECT_EQ(workspace(100), workspace(64));
}

TEST(MemoryPlanTest, TooSmallABudgetRefusesWithTheNumbers) {
  auto plan = planMemory(smolLm2(), {.budget_bytes = 300 << 20,
                                     .weight_bytes = 100 << 20,
                                     .target_concurrency = 16,
                                     .planned_seq_len = 2048});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(),
              HasSubstr("16 sequences of 2048 tokens need 1440.0 MiB of KV"));
  EXPECT_THAT(plan.status().message(), HasSubstr("weights (100.0 MiB)"));
  EXPECT_THAT(plan.status().message(), HasSubstr("Raise --memory-budget to at least"));
}

// A GPU worker plans with what its backends count (the largest rank's terms) and, with no
// budget given, fills the tightest device: a share of its memory, at most its free memory
// less the reserve for what lives outside the model's allocation.
TEST(MemoryPlanTest, BackendsCountTheirOwnBytesAndFillTheTightestDevice) {
  const int64_t gib = int64_t{1} << 30;
  const std::vector<BackendMemory> ranks = {{.weights = 3 * gib,
                                             .workspace = gib / 2,
                                             .kv_block_bytes = 1 << 20,
                                             .free_bytes = 70 * gib,
                                             .total_bytes = 80 * gib},
                                            {.weights = 2 * gib,
                                             .workspace = gib,
                                             .kv_block_bytes = 1 << 19,
                                             .free_bytes = 79 * gib,
                                             .total_bytes = 80 * gib}};
  MemoryPlanInput in{.weight_bytes = 9 * gib, .target_concurrency = 16, .planned_seq_len = 2048};
  useBackendMemory(ranks, 0.9, in);
  EXPECT_EQ(in.weight_bytes, 3 * gib);  // the backends' count, not the CPU's
  EXPECT_EQ(in.workspace_bytes, gib);
  EXPECT_EQ(in.kv_block_bytes, 1 << 20);
  EXPECT_EQ(in.budget_bytes, 70 * gib - kDeviceReserve);  // rank 0's free, under 72 GiB
  auto plan = planMemory(smolLm2(), in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->workspace, gib);
  EXPECT_EQ(plan->kv_block_bytes, 1 << 20);
  EXPECT_EQ(plan->kv_blocks, (70 * gib - kDeviceReserve - 4 * gib) >> 20);
  // A share below the free memory decides; a given budget stays.
  MemoryPlanInput shared{};
  useBackendMemory(ranks, 0.45, shared);
  EXPECT_EQ(shared.budget_bytes, static_cast<int64_t>(0.45 * 80 * gib));
  MemoryPlanInput given{.budget_bytes = 5 * gib};
  useBackendMemory(ranks, 0.9, given);
  EXPECT_EQ(given.budget_bytes, 5 * gib);
}

// A model with linear-attention layers: two state slots per target sequence and the
// prefix cache's checkpoints and the drafts' row states, each a sequence's state of every
// linear layer, come out of the budget before the KV pool.
TEST(MemoryPlanTest, StateSlotsAndCheckpointsComeBeforeTheKvPool) {
  model::ModelConfig c = smolLm2();
  c.linear_attention = model::LinearAttentionConfig{
      .key_heads = 3, .value_heads = 6, .key_head_dim = 32, .value_head_dim = 48};
  c.linear_attention->layers.assign(c.num_layers, true);
  for (uint32_t l = 3; l < c.num_layers; l += 4) c.linear_attention->layers[l] = false;
  // Per linear layer and key head: 3 conv rows of 2·32 + 2·48 channels, 2 states of 32 x 48.
  const int64_t slot_bytes =
      int64_t{4} * c.linearLayers() * 3 * (3 * (2 * 32 + 2 * 48) + 2 * 32 * 48);
  auto plan = [&](int64_t checkpoints, int64_t drafts) {
    auto p = planMemory(c, {.budget_bytes = int64_t{1} << 30,
                            .weight_bytes = 100 << 20,
                            .target_concurrency = 8,
                            .planned_seq_len = 1024,
                            .state_checkpoints = checkpoints,
                            .state_drafts = drafts});
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  };
  const MemoryPlan without = plan(0, 0), with = plan(5, 3);
  EXPECT_EQ(without.state_slots, 16);
  EXPECT_EQ(with.state_slots, 24);
  EXPECT_EQ(with.state_checkpoints, 5);
  EXPECT_EQ(with.state_drafts, 3);
  EXPECT_EQ(without.state_bytes, 16 * slot_bytes);
  EXPECT_EQ(with.state_bytes, 24 * slot_bytes);
  EXPECT_LT(with.kv_blocks, without.kv_blocks);
  EXPECT_LE(with.weights + with.workspace + with.state_bytes + with.kv_pool, with.budget);
  EXPECT_GT(with.weights + with.workspace + with.state_bytes + with.kv_pool + with.kv_block_bytes,
            with.budget);
  EXPECT_THAT(with.table(), HasSubstr("24 slots: 5 checkpoints, 3 for drafts"));
}

TEST(MemoryPlanTest, APoolHasAtMostTheBlocksItsIdsCanName) {
  auto plan = planMemory(smolLm2(), {.budget_bytes = int64_t{1} << 50,
                                     .weight_bytes = 100 << 20,
                                     .target_concurrency = 16,
                                     .planned_seq_len = 2048});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kv_blocks, kMaxKvBlocks);
}

}  // namespace
}  // namespace cleave::engine
