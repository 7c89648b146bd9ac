#include "services/engine/memory_plan.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/engine/gated_delta_net.h"

namespace cleave::engine {
namespace {

std::string mib(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// Activations of one step: the residual stream and its norm, Q/K/V and attention output,
// the MLP's gate and up rows, logits per sequence (and per draft), and int8 copies for the
// quantized products. Generous by design: an estimate low by 2x would overrun the budget.
int64_t workspaceBytes(const model::ModelConfig& c, const MemoryPlanInput& in) {
  const int64_t tokens = in.max_batch_tokens;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t ffn =
      std::max<int64_t>(c.intermediate_size, c.moe ? c.moe->expert_intermediate_size : 0);
  // MLA adds the absorbed queries and attended latents, a latent row per head each.
  const int64_t latent_heads =
      c.mla ? 2 * int64_t{c.num_heads} * (c.mla->kv_lora_rank + c.mla->qk_rope_head_dim) : 0;
  // Linear attention's projections (queries, keys, values, their gate, the grouped copies)
  // and output, and gated attention's queries with their gates.
  int64_t linear = 0;
  if (c.linear_attention) {
    const model::LinearAttentionConfig& la = *c.linear_attention;
    const int64_t kd = int64_t{la.key_heads} * la.key_head_dim;
    const int64_t vd = int64_t{la.value_heads} * la.value_head_dim;
    linear = 2 * (2 * kd + 2 * vd) + vd + c.hidden_size;
  }
  const int64_t gates = c.attention_output_gate ? 2 * q_dim : 0;
  const int64_t floats_per_token =
      2 * c.hidden_size + 2 * q_dim + 2 * kv_dim + 2 * ffn + latent_heads + linear + gates;
  const int64_t activations = tokens * floats_per_token * 4;
  const int64_t quantized = tokens * std::max<int64_t>(c.hidden_size, ffn) * 2;
  const int64_t rows =
      std::min(in.target_concurrency * (1 + in.speculative_tokens) + kPromptLogprobRows,
               std::max(in.max_batch_tokens, in.target_concurrency));
  const int64_t logits = rows * int64_t{c.vocab_size} * 4;
  return 2 * (activations + quantized + logits);
}

}  // namespace

void useBackendMemory(std::span<const BackendMemory> ranks, double fraction,
                      MemoryPlanInput& input) {
  int64_t budget = std::numeric_limits<int64_t>::max();
  input.weight_bytes = input.workspace_bytes = input.kv_block_bytes = 0;
  for (const BackendMemory& m : ranks) {
    input.weight_bytes = std::max(input.weight_bytes, m.weights);
    input.workspace_bytes = std::max(input.workspace_bytes, m.workspace);
    input.kv_block_bytes = std::max(input.kv_block_bytes, m.kv_block_bytes);
    budget = std::min({budget, static_cast<int64_t>(fraction * static_cast<double>(m.total_bytes)),
                       m.free_bytes - kDeviceReserve});
  }
  if (input.budget_bytes == 0 && !ranks.empty()) input.budget_bytes = std::max<int64_t>(budget, 0);
}

int64_t kvBytesPerToken(const model::ModelConfig& c, int64_t kv_element_bytes, int64_t tp) {
  // The rank with the most KV heads (rank 0 when they do not split evenly) sizes the pool.
  const model::KvCacheShape shape = model::kvCacheShape(c);
  const int64_t kv_heads =
      shape.replicated ? shape.heads : std::max<int64_t>(1, (shape.heads + tp - 1) / tp);
  return shape.parts * int64_t{c.kvLayers()} * kv_heads * shape.head_dim * kv_element_bytes;
}

std::string MemoryPlan::table() const {
  std::string t = "memory plan:\n";
  absl::StrAppend(&t, absl::StrFormat("  %-22s %14s\n", "budget", mib(budget)));
  absl::StrAppend(&t, absl::StrFormat("  %-22s %14s\n", "weights", mib(weights)));
  absl::StrAppend(&t, absl::StrFormat("  %-22s %14s\n", "activation workspace", mib(workspace)));
  absl::StrAppend(&t,
                  absl::StrFormat("  %-22s %14s  (%lld blocks of %s)\n", "KV pool", mib(kv_pool),
                                  static_cast<long long>(kv_blocks), mib(kv_block_bytes)));
  if (state_slots > 0) {
    absl::StrAppend(
        &t, absl::StrFormat(
                "  %-22s %14s  (%lld slots: %lld checkpoints, %lld for drafts)\n",
                "linear-attention state", mib(state_bytes), static_cast<long long>(state_slots),
                static_cast<long long>(state_checkpoints), static_cast<long long>(state_drafts)));
  }
  absl::StrAppend(&t, absl::StrFormat("  %-22s %14lld\n", "sequences at plan",
                                      static_cast<long long>(sequences_at_planned_len)));
  return t;
}

absl::StatusOr<MemoryPlan> planMemory(const model::ModelConfig& c, const MemoryPlanInput& in) {
  if (in.target_concurrency < 1 || in.planned_seq_len < 1 || in.block_size < 1 || in.tp < 1) {
    return absl::InvalidArgumentError(
        "target concurrency, planned length, block size and TP must be >= 1");
  }
  MemoryPlan plan;
  plan.budget = in.budget_bytes;
  plan.weights = in.weight_bytes;
  plan.workspace = in.workspace_bytes > 0 ? in.workspace_bytes : workspaceBytes(c, in);
  plan.kv_block_bytes = in.kv_block_bytes > 0
                            ? in.kv_block_bytes
                            : in.block_size * kvBytesPerToken(c, in.kv_element_bytes, in.tp);
  if (c.linear_attention) {
    // Rank 0 holds the most heads (uneven splits give it the larger share).
    absl::StatusOr<ShardDims> dims = planShard(c, {.rank = 0, .size = static_cast<int>(in.tp)});
    if (!dims.ok()) return dims.status();
    // The router admits up to twice a worker's target (a batch prefilled ahead), each
    // reservation holding its slot from Reserve to Release.
    plan.state_checkpoints = std::max<int64_t>(in.state_checkpoints, 0);
    plan.state_drafts = std::max<int64_t>(in.state_drafts, 0);
    plan.state_slots = 2 * in.target_concurrency + plan.state_checkpoints + plan.state_drafts;
    plan.state_bytes = plan.state_slots * linearStateFloats(c, *dims) * 4;
  }
  const int64_t blocks_per_sequence = (in.planned_seq_len + in.block_size - 1) / in.block_size;
  const int64_t needed_kv = in.target_concurrency * blocks_per_sequence * plan.kv_block_bytes;
  const int64_t left = in.budget_bytes - plan.weights - plan.workspace - plan.state_bytes;
  plan.kv_blocks = std::clamp<int64_t>(left / plan.kv_block_bytes, 0, kMaxKvBlocks);
  plan.kv_pool = plan.kv_blocks * plan.kv_block_bytes;
  plan.sequences_at_planned_len = plan.kv_blocks / blocks_per_sequence;
  if (plan.sequences_at_planned_len < in.target_concurrency) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the KV pool cannot hold the target concurrency: ", in.target_concurrency, " sequences of ",
        in.planned_seq_len, " tokens need ", mib(needed_kv), " of KV, but the budget of ",
        mib(in.budget_bytes), " leaves ", mib(std::max<int64_t>(0, left)), " after weights (",
        mib(plan.weights), "), workspace (", mib(plan.workspace), ") and linear-attention state (",
        mib(plan.state_bytes), "), room for ", plan.sequences_at_planned_len,
        " sequences. Raise --memory-budget to at least ",
        mib(plan.weights + plan.workspace + plan.state_bytes + needed_kv),
        ", or lower --target-concurrency or --planned-seq-len"));
  }
  return plan;
}

}  // namespace cleave::engine
