// Command-line options of cleave-worker and their validation.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/flags.h"
#include "common/server_flags.h"
#include "kernels/cpu/kv_format.h"
#include "services/engine/speculative.h"

namespace cleave::worker {

enum class Role { kPrefill, kDecode, kBoth };

struct WorkerOptions {
  std::string role = "both";
  std::string model;
  int64_t tp = 1;
  std::string moe_split = "experts";
  std::string backend = "cpu";    // cpu, or cuda (rank r on GPU r)
  std::string kv_dtype = "auto";  // The KV cache's element type (cpu::parseKvType), or auto
  std::string router;
  std::string advertise;  // host:port the router reaches this worker at (empty: --listen's).
  ServerFlags server{.listen = "127.0.0.1:0"};
  uint64_t memory_budget = 0;
  // GPU workers with --memory-budget 0: the share of each device's memory the plan fills.
  double gpu_memory_fraction = 0.9;
  int64_t target_concurrency = 16;
  int64_t planned_seq_len = 2048;
  // The longest sequence served, below the model's context length; 0: the model's.
  int64_t max_model_len = 0;
  // Tokens one engine step computes: every decoding sequence's next token, then prefill
  // chunks in what is left (0: batchTokens() decides).
  int64_t max_batch_tokens = 0;
  int64_t kv_staging_tokens = 0;  // Host staging rows per side of transfers (kv_staging.h)
  int64_t block_size = 16;        // Positions per KV-cache block: a power of two in [8, 256]
  int64_t threads = 0;
  bool prefix_caching = true;
  // A model with linear-attention layers: state checkpoints kept for prefix caching
  // (engine::SchedulerOptions::state_checkpoints); -1: the target concurrency (0 on a decode
  // worker, stateCheckpoints()).
  int64_t state_checkpoints = -1;
  engine::SpeculativeOptions speculative;
  // LoRA adapters served next to the base model: NAME=PATH[,NAME=PATH...]
  // (engine::parseLoraModules).
  std::string lora_modules;
  int64_t lease_timeout_ms = 10000;
  // How long one KV transfer may take before it is abandoned.
  int64_t kv_transfer_timeout_ms = 30000;
  // How long a fenced reservation's blocks stay out of use (a writer may still write).
  int64_t kv_quarantine_ms = 300000;
  // On SIGTERM/SIGINT: how long the worker keeps running what it holds after telling the
  // router it is draining, before it deregisters (the router moves what is left).
  int64_t drain_timeout_ms = 30000;
  // TLS to the router: its CA, and this worker's client certificate and key.
  std::string router_ca;
  std::string tls_cert;
  std::string tls_key;

  // Binds every option to a flag on `flags`.
  void addFlags(FlagSet& flags);
};

absl::StatusOr<Role> parseRole(absl::string_view text);

// The KV cache's element type: --kv-dtype, auto being cpu::kDefaultKvType (bf16)
// on every backend.
// Call after validate().
cpu::KvType kvType(const WorkerOptions& options);

// Tokens per engine step: --max-batch-tokens, or for 0 kDefaultBatchTokens, raised for a
// decode worker to its target concurrency plus kDefaultBatchTokens / 4 (a prefill chunk
// beside a full decode batch). Call after validate().
inline constexpr int64_t kDefaultBatchTokens = 512;
int64_t batchTokens(const WorkerOptions& options);

// State checkpoints a worker of `role` keeps: --state-checkpoints, -1 being its target
// concurrency, or 0 on a decode worker (which computes prompts only with the router's
// --local-prefill-tokens); 0 without prefix caching.
int64_t stateCheckpoints(const WorkerOptions& options, Role role);

// State slots a worker of `role` keeps for the rows of a linear-attention model's drafts
// (engine::SchedulerOptions::draft_states): one per draft of each sequence it decodes at once,
// --speculative-tokens x --target-concurrency; 0 on a prefill worker, which drafts nothing.
int64_t draftStates(const WorkerOptions& options, Role role);

// Checks values that parse but cannot work: an unknown role, a missing model file, a TP
// degree or concurrency out of range. The message names the flag and what to change.
absl::Status validate(const WorkerOptions& options);

}  // namespace cleave::worker
