#include "services/worker/worker_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

namespace cleave::worker {
namespace {

using ::testing::HasSubstr;

WorkerOptions validOptions() {
  std::string model = testing::TempDir() + "/worker_options_test.gguf";
  std::ofstream(model) << "GGUF";
  WorkerOptions options;
  options.model = model;
  options.role = "decode";
  return options;
}

TEST(WorkerOptionsTest, FlagsBindToOptions) {
  WorkerOptions options;
  FlagSet flags("cleave-worker", "", "");
  options.addFlags(flags);
  std::vector<std::string> args = {"--role=prefill",
                                   "--tp=2",
                                   "--memory-budget=6GiB",
                                   "--target-concurrency",
                                   "32",
                                   "--speculative-tokens=3",
                                   "--prompt-lookup-max=6",
                                   "--lora-modules=sql=/a,chat=/b",
                                   "--max-batch-tokens=2048",
                                   "--block-size=64",
                                   "--state-checkpoints=5"};
  ASSERT_TRUE(flags.parse(args).ok());
  EXPECT_EQ(options.role, "prefill");
  EXPECT_EQ(options.tp, 2);
  EXPECT_EQ(options.memory_budget, 6ull << 30);
  EXPECT_EQ(options.target_concurrency, 32);
  EXPECT_EQ(options.speculative.tokens, 3);
  EXPECT_EQ(options.speculative.ngram.max, 6);
  EXPECT_EQ(options.lora_modules, "sql=/a,chat=/b");
  EXPECT_EQ(options.max_batch_tokens, 2048);
  EXPECT_EQ(options.block_size, 64);
  EXPECT_EQ(options.state_checkpoints, 5);
}

// Checkpoints for a linear-attention model's prefix cache: the target concurrency unless
// set (none on a decode worker), and none where nothing is cached.
TEST(WorkerOptionsTest, StateCheckpointsFollowTheRoleAndPrefixCaching) {
  WorkerOptions options = validOptions();
  options.target_concurrency = 12;
  EXPECT_EQ(stateCheckpoints(options, Role::kBoth), 12);
  EXPECT_EQ(stateCheckpoints(options, Role::kPrefill), 12);
  EXPECT_EQ(stateCheckpoints(options, Role::kDecode), 0);
  options.state_checkpoints = 3;
  EXPECT_EQ(stateCheckpoints(options, Role::kBoth), 3);
  EXPECT_EQ(stateCheckpoints(options, Role::kDecode), 3);  // For --local-prefill-tokens.
  options.prefix_caching = false;
  EXPECT_EQ(stateCheckpoints(options, Role::kPrefill), 0);
}

// Slots for a linear-attention model's drafts: one per draft of each sequence decoded at
// once, where drafts are verified (not on a prefill worker).
TEST(WorkerOptionsTest, DraftStatesCountEveryDraftOfTheTarget) {
  WorkerOptions options = validOptions();
  options.target_concurrency = 12;
  EXPECT_EQ(draftStates(options, Role::kBoth), 0);  // No drafts asked for.
  options.speculative.tokens = 3;
  EXPECT_EQ(draftStates(options, Role::kBoth), 36);
  EXPECT_EQ(draftStates(options, Role::kDecode), 36);
  EXPECT_EQ(draftStates(options, Role::kPrefill), 0);
}

TEST(WorkerOptionsTest, ValidatesEachValue) {
  EXPECT_TRUE(validate(validOptions()).ok());
  struct Case {
    const char* expected;
    void (*mutate)(WorkerOptions&);
  };
  const Case cases[] = {
      {"--role must be", [](WorkerOptions& o) { o.role = "router"; }},
      {"--model is required", [](WorkerOptions& o) { o.model.clear(); }},
      {"No such file", [](WorkerOptions& o) { o.model = "/nonexistent/model.gguf"; }},
      {"--tp must be", [](WorkerOptions& o) { o.tp = 0; }},
      {"--moe-split is experts or columns", [](WorkerOptions& o) { o.moe_split = "rows"; }},
      {"--target-concurrency must be", [](WorkerOptions& o) { o.target_concurrency = 0; }},
      {"--planned-seq-len must be", [](WorkerOptions& o) { o.planned_seq_len = -5; }},
      {"--max-batch-tokens must be in 0..1048576",
       [](WorkerOptions& o) { o.max_batch_tokens = -1; }},
      {"--max-batch-tokens 64 does not exceed --target-concurrency 64",
       [](WorkerOptions& o) {
         o.target_concurrency = 64;
         o.max_batch_tokens = 64;
       }},
      {"--metrics-port must be", [](WorkerOptions& o) { o.server.metrics_port = 65536; }},
      {"--threads must be", [](WorkerOptions& o) { o.threads = -1; }},
      {"--max-model-len must be in", [](WorkerOptions& o) { o.max_model_len = -1; }},
      {"--kv-transfer-timeout-ms, --kv-quarantine-ms and --lease-timeout-ms must be >= 1",
       [](WorkerOptions& o) { o.kv_transfer_timeout_ms = 0; }},
      {"--kv-transfer-timeout-ms, --kv-quarantine-ms and --lease-timeout-ms must be >= 1",
       [](WorkerOptions& o) { o.kv_quarantine_ms = 0; }},
      {"--gpu-memory-fraction must be in [0, 1]",
       [](WorkerOptions& o) { o.gpu_memory_fraction = 1.5; }},
      {"--kv-staging-tokens must be", [](WorkerOptions& o) { o.kv_staging_tokens = -1; }},
      {"--backend must be cpu or cuda", [](WorkerOptions& o) { o.backend = "tpu"; }},
      {"--kv-dtype: ", [](WorkerOptions& o) { o.kv_dtype = "int4"; }},
      {"--block-size must be a power of two in 8..256, got 24",
       [](WorkerOptions& o) { o.block_size = 24; }},
      {"--block-size must be a power of two in 8..256, got 4",
       [](WorkerOptions& o) { o.block_size = 4; }},
      {"--block-size must be a power of two in 8..256, got 512",
       [](WorkerOptions& o) { o.block_size = 512; }},
      {"--speculative-tokens must be", [](WorkerOptions& o) { o.speculative.tokens = 17; }},
      {"--prompt-lookup-min", [](WorkerOptions& o) { o.speculative.ngram.min = 0; }},
      {"--state-checkpoints must be in 0..65536, or -1",
       [](WorkerOptions& o) { o.state_checkpoints = -2; }},
      {"--lora-modules: 'sql' is not NAME=PATH", [](WorkerOptions& o) { o.lora_modules = "sql"; }},
      {"LoRA adapters run on the CPU backend only",
       [](WorkerOptions& o) {
         o.backend = "cuda";
         o.kv_dtype = "bf16";
         o.lora_modules = "sql=/a";
       }},
      {"the GPU stores its KV cache as bf16 or fp8",
       [](WorkerOptions& o) {
         o.backend = "cuda";
         o.kv_dtype = "f32";
       }},
  };
  for (const Case& c : cases) {
    WorkerOptions options = validOptions();
    c.mutate(options);
    absl::Status status = validate(options);
    EXPECT_FALSE(status.ok()) << c.expected;
    EXPECT_THAT(status.message(), HasSubstr(c.expected));
  }
}

// Automatic: 512 tokens a step, more where the decode batch would leave prefill too little;
// a prefill worker's target does not count. An explicit value stands.
TEST(WorkerOptionsTest, BatchTokensHoldTheDecodeBatchAndAPrefillChunk) {
  WorkerOptions options = validOptions();
  options.target_concurrency = 16;
  EXPECT_EQ(batchTokens(options), 512);
  options.target_concurrency = 1000;
  EXPECT_EQ(batchTokens(options), 1128);
  options.role = "prefill";
  EXPECT_EQ(batchTokens(options), 512);
  options.role = "decode";
  options.max_batch_tokens = 4096;
  EXPECT_TRUE(validate(options).ok());
  EXPECT_EQ(batchTokens(options), 4096);
  options.role = "prefill";  // No decode batch to hold.
  options.max_batch_tokens = 64;
  EXPECT_TRUE(validate(options).ok());
  EXPECT_EQ(batchTokens(options), 64);
}

TEST(WorkerOptionsTest, AutoKvTypeIsBf16OnEveryBackend) {
  WorkerOptions options = validOptions();
  EXPECT_EQ(kvType(options), cpu::KvType::kBf16);
  options.backend = "cuda";
  EXPECT_EQ(kvType(options), cpu::KvType::kBf16);
  options.kv_dtype = "f32";
  EXPECT_EQ(kvType(options), cpu::KvType::kF32);
  options.kv_dtype = "fp8";
  EXPECT_EQ(kvType(options), cpu::KvType::kFp8E4M3);
}

}  // namespace
}  // namespace cleave::worker
