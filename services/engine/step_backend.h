// A forward step run somewhere other than the CPU model: the seam through which a TpGroup
// hands its steps to another backend (the CUDA model, cuda_llama_model.h) while the
// scheduler above it stays the same. A tensor-parallel group has one backend per rank,
// made together (they may share a communicator group) and stepped together, each on its
// rank's thread.
//
// Threading: each backend is stepped by its rank's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "services/engine/kv_storage.h"
#include "services/engine/llama_model.h"
#include "services/engine/llama_weights.h"
#include "services/engine/memory_plan.h"
#include "services/engine/sampler.h"

namespace cleave::engine {

enum class KvCopy { kToHost, kFromHost };

// What the caller takes from one batch row of a step.
struct RowOutput {
  bool logits = false;             // its logits, sampled on the host
  std::optional<DeviceDraw> draw;  // its next token, drawn by the backend
};

// A drawn token's, or a top token's, log-probability.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// A step's results: logits [logitRows(batch)][vocab] (empty when no row asked for them; a
// step with a chunk of several rows returns them all) and tokens [batch] (the drawn rows'
// tokens, drawn from each chunk's last row; the others unspecified; empty when the backend
// draws nothing: the caller then samples every row from the logits, which it always gets
// then).
// For drawn rows that asked for log-probabilities (DeviceDraw::logprobs = n >= 0):
// logprobs[row] their token's, top[row * kMaxLogprobs + i] for i < n the best tokens', best
// first (both empty when no drawn row asked).
struct StepOutput {
  std::span<const float> logits;
  std::span<const int32_t> tokens;
  std::span<const float> logprobs;
  std::span<const TokenLogprob> top;
};

class StepBackend {
 public:
  virtual ~StepBackend() = default;
  // As LlamaModel::forward, over the backend's own KV cache of the blocks it was made with.
  virtual absl::StatusOr<std::span<const float>> forward(std::span<const SequenceChunk> batch) = 0;
  // The same step, returning what rows[i] asks of batch row i (rows.size() == batch.size());
  // valid until the next step. This default draws nothing: forward's logits, no tokens.
  virtual absl::StatusOr<StepOutput> forwardAndDraw(std::span<const SequenceChunk> batch,
                                                    std::span<const RowOutput> rows) {
    (void)rows;
    auto logits = forward(batch);
    if (!logits.ok()) return logits.status();
    return StepOutput{.logits = *logits};
  }
  // Copies every layer's key and value rows of backend block blocks[i] to or from host
  // block rows[i] (this rank's heads, the same block size, head size and element type;
  // `host` may have fewer blocks than the backend: a staging area), and returns once they
  // are there: what a KV transport, which reads and writes host memory, needs around a
  // transfer. No blocks: nothing is copied, and the backend may prepare `host` for later
  // copies. InvalidArgument names a shape or block id that does not match, or spans of
  // different lengths.
  virtual absl::Status copyKv(KvCopy direction, std::span<const int32_t> blocks,
                              std::span<const int32_t> rows, KvStorage& host) = 0;
  // A model with linear-attention layers: copies state slot `slot` (every linear layer's
  // state of this rank's heads) to or from the same slot of `host`'s state area
  // (KvStorage::state, the same layout), and returns once it is there. This default:
  // Unimplemented (a backend running no such model).
  virtual absl::Status copyState(KvCopy direction, int32_t slot, KvStorage& host) {
    (void)direction, (void)slot, (void)host;
    return absl::UnimplementedError("this backend keeps no linear-attention state");
  }
  // Weight bytes a step reads, as the backend stores them (0: as the CPU model's), of which
  // routedExpertBytes() are routed experts (a step reads those its tokens pick).
  virtual int64_t weightBytes() const { return 0; }
  virtual int64_t routedExpertBytes() const { return 0; }
  // Whether a chunk may ask for more than one row of logits (SequenceChunk::logits: drafts to
  // verify, prompt log-probabilities), up to the rows the scheduler's steps can ask for, and
  // lastHidden() has the hidden states behind them.
  virtual bool multiRowLogits() const { return false; }
  // Whether a step keeps the states after a chunk's rows that SequenceChunk::row_states
  // names (drafts verified on a model with linear-attention layers).
  virtual bool rowStates() const { return false; }
  // The last step's final hidden states (after the output norm) behind its rows of logits,
  // [logitRows(batch)][hidden] as floats, as LlamaModel::lastHidden; valid until the next
  // step. Empty where multiRowLogits() is false, and on a tensor-parallel rank other than 0.
  virtual std::span<const float> lastHidden() const { return {}; }
};

// Counts BackendMemory for rank r's backend from ranks[r] (read only during the call), with
// blocks of `block_size` positions.
using BackendMemoryEstimator = std::function<absl::StatusOr<std::vector<BackendMemory>>(
    std::span<const LlamaWeights* const> ranks, int64_t block_size)>;

// Makes one backend per rank of a group, rank r's for ranks[r] (its shard of the weights,
// read only during the call), each with a KV pool of `num_blocks` blocks of `block_size`
// positions and, for a model with linear-attention layers, `state_slots` slots of their
// state (SequenceChunk::state).
using StepBackendFactory = std::function<absl::StatusOr<std::vector<std::unique_ptr<StepBackend>>>(
    std::span<const LlamaWeights* const> ranks, int64_t num_blocks, int64_t block_size,
    int64_t state_slots)>;

}  // namespace cleave::engine
