// How a worker splits its memory budget: weights + activation workspace for its batch +
// KV pool = budget. A decode worker must be able to hold its target concurrency of
// sequences at the planned length; when it cannot, planning fails and says which term
// took the memory and what budget would do — never a silent cap below the target.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"

namespace cleave::engine {

// What one rank's backend would hold, counted before it is made: what the memory plan of a
// worker whose KV pool lives with the backend (a GPU's) works from.
struct BackendMemory {
  int64_t weights = 0;         // As the backend stores them.
  int64_t workspace = 0;       // All else of its allocation but the KV pool.
  int64_t kv_block_bytes = 0;  // One block of its cache.
  int64_t free_bytes = 0;      // Its device's free memory now.
  int64_t total_bytes = 0;     // Its device's memory.
};

// Device memory a worker leaves beyond its backends' allocations when it fills the
// devices: CUDA graphs, cuBLASLt's workspace, NCCL's buffers past their headroom.
inline constexpr int64_t kDeviceReserve = int64_t{512} << 20;

// The most blocks a pool has (16.7M tokens of blocks of 16, 8.4M of 8): the block ids and
// their bookkeeping stay small however large the budget.
inline constexpr int64_t kMaxKvBlocks = int64_t{1} << 20;

// Rows of logits a step computes for prompt log-probabilities, at most (the prompts scored
// token by token go in chunks of this many in all).
inline constexpr int64_t kPromptLogprobRows = 64;

struct MemoryPlanInput {
  int64_t budget_bytes = 0;
  int64_t weight_bytes = 0;        // As loaded (packed) for this rank.
  int64_t target_concurrency = 1;  // Sequences that must fit at once.
  int64_t planned_seq_len = 2048;  // Prompt + output tokens of a typical sequence.
  int64_t max_batch_tokens = 512;  // Tokens of one step (sizes the workspace).
  // Drafts a decoding sequence may verify per step (SpeculativeOptions::tokens): each
  // returns a row of logits.
  int64_t speculative_tokens = 0;
  int64_t block_size = 16;
  int64_t kv_element_bytes = 4;  // f32 keys and values.
  int64_t tp = 1;                // KV heads are split across ranks.
  // A model with linear-attention layers: state slots kept for prefix caching's checkpoints
  // (SchedulerOptions::state_checkpoints), beyond the sequences'.
  int64_t state_checkpoints = 0;
  // And slots keeping the state after each verified draft (SchedulerOptions::draft_states).
  int64_t state_drafts = 0;
  // As a backend counted them (BackendMemory), for a pool that lives with it; 0: the CPU
  // model's, estimated from the shapes (workspace) and computed (block bytes).
  int64_t workspace_bytes = 0;
  int64_t kv_block_bytes = 0;
};

struct MemoryPlan {
  int64_t budget = 0;
  int64_t weights = 0;
  int64_t workspace = 0;
  int64_t kv_pool = 0;
  int64_t kv_block_bytes = 0;  // One block of one rank, all layers, keys + values.
  // Linear-attention models: two state slots per target sequence (the router admits twice
  // the target; TpGroup::allocateKv's state_slots), the input's state_checkpoints and
  // state_drafts, set aside before the KV pool; 0 for other models.
  int64_t state_slots = 0;
  int64_t state_checkpoints = 0;  // Of state_slots.
  int64_t state_drafts = 0;       // Of state_slots.
  int64_t state_bytes = 0;
  int64_t kv_blocks = 0;
  int64_t sequences_at_planned_len = 0;  // How many planned-length sequences the pool holds.
  // The plan as a table for the log.
  std::string table() const;
};

// Plans with the backends' own counts in place of the CPU model's (weights, workspace and
// block bytes of their largest rank, which every rank must match in blocks), and with
// budget_bytes 0 fills the devices: on the tightest rank, `fraction` of
// its device's memory, at most its free memory less kDeviceReserve.
void useBackendMemory(std::span<const BackendMemory> ranks, double fraction,
                      MemoryPlanInput& input);

// KV bytes per token for one rank.
int64_t kvBytesPerToken(const model::ModelConfig& config, int64_t kv_element_bytes, int64_t tp);

// Fails with FailedPrecondition when the KV pool cannot hold target_concurrency sequences
// of planned_seq_len tokens; the message gives each term and the budget that would fit.
// The pool has at most kMaxKvBlocks blocks.
absl::StatusOr<MemoryPlan> planMemory(const model::ModelConfig& config,
                                      const MemoryPlanInput& input);

}  // namespace cleave::engine
