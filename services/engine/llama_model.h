// One forward step of a Llama-family model on the CPU over a batch of sequence chunks:
// each chunk is a sequence's new tokens (a whole prompt, a prefill chunk, or the one token
// of a decode step) with the sequence's block table in the paged KV cache. All chunks'
// tokens go through every matrix product together, so the weights are read once per step.
//
// In a tensor-parallel group every rank runs its own LlamaModel over its shard of the
// weights (tensor_parallel.h) and its share of the KV cache, on the same batch; the
// Communicator sums the row-parallel products and gathers the logits, so every rank
// returns the same logits.
//
// Threading: one thread drives a model (the rank thread); kernels spread over `pool`.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/thread_pool.h"
#include "services/engine/communicator.h"
#include "services/engine/gated_delta_net.h"
#include "services/engine/kv_storage.h"
#include "services/engine/llama_weights.h"
#include "services/engine/lora_adapter.h"
#include "services/engine/mla_attention.h"

namespace cleave::engine {

struct SequenceChunk {
  std::span<const uint32_t> tokens;  // New tokens, in order.
  int64_t start = 0;                 // Position of tokens[0]: tokens already in the cache.
  std::span<const int32_t> blocks;   // The sequence's blocks, covering start + tokens.size().
  // Rows of logits the chunk returns: after each of its last `logits` tokens (1 <= logits <=
  // tokens.size()). More than one verifies drafted tokens (speculative decoding).
  int64_t logits = 1;
  // The LoRA adapter the chunk runs with: an index of the model's adapters (addAdapter), or
  // -1 for the base model alone.
  int32_t adapter = -1;
  // A model with linear-attention layers: the sequence's slot of the cache's state area
  // (KvStorage::state), which a chunk at start 0 resets. -1 otherwise.
  int32_t state = -1;
  // Prefix caching of such a model (a state checkpoint: the state after a cached prefix,
  // kept in a slot of its own). state_from >= 0: before any layer runs, slot `state_from` is
  // copied into slot `state`, and the chunk (start > 0, the prefix's end) continues from it.
  // state_to >= 0: after every layer has run, slot `state` is copied into slot `state_to`.
  // Neither may be any chunk's `state`, nor a state_to another chunk's state_from or
  // state_to. -1: none.
  int32_t state_from = -1;
  int32_t state_to = -1;
  // Drafts verified on such a model (speculative decoding): row_states[i] >= 0 receives the
  // state after row i as well (i < tokens.size() - 1; -1: not kept), so that a sequence whose
  // drafts are rejected from row i + 1 on continues from the state after the last row it
  // keeps. Slots no other chunk of the batch names, nor this chunk elsewhere. Backends that
  // keep them say so (StepBackend::rowStates).
  std::span<const int32_t> row_states;
};

// Rows of logits a batch returns: its chunks' `logits`, summed.
int64_t logitRows(std::span<const SequenceChunk> batch);

// The state checkpoint copies of a validated batch in `cache` (SequenceChunk::state_from,
// state_to): those before its layers (`before`), or those after them.
void copyStateCheckpoints(std::span<const SequenceChunk> batch, KvStorage& cache, bool before);

// OK when every chunk has tokens inside the vocabulary, 1 <= logits <= its tokens, a block
// table covering its positions with ids in [0, total_blocks), and (when state_slots > 0) a
// state slot in [0, state_slots) no other chunk of the batch names, with state_from,
// state_to and row_states as SequenceChunk says (without state slots, none of them);
// InvalidArgument naming the sequence otherwise.
// Every backend's forward() checks its batch with it before touching anything.
absl::Status validateBatch(std::span<const SequenceChunk> batch, uint32_t vocab_size,
                           int64_t block_size, int64_t total_blocks, int64_t state_slots = 0);

class LlamaModel {
 public:
  // `comm` (null for a group of one) connects the ranks of a tensor-parallel group; it
  // must outlive the model.
  LlamaModel(const LlamaWeights& weights, cpu::ThreadPool& pool, Communicator* comm = nullptr);

  // Writes every chunk's keys and values into `cache` and returns the logits after each
  // chunk's last `logits` tokens, chunk after chunk: [logitRows(batch), vocab], valid until
  // the next call. Errors (nothing
  // written): an empty batch or chunk, a token outside the vocabulary, a block table that
  // does not cover the chunk, a block id outside the cache, an adapter index not added; and
  // a collective failing.
  absl::StatusOr<std::span<const float>> forward(std::span<const SequenceChunk> batch,
                                                 KvStorage& cache);
  // The last forward's hidden states behind its logits, after the final norm: [logit rows,
  // hidden size], row for row; valid until the next call. (The model's last hidden state at
  // a prompt's last token is what an embedding of a decoder model pools.)
  std::span<const float> lastHidden() const { return last_hidden_; }

  // Adds a LoRA adapter loaded for this rank's shard (loadLoraAdapter with weights()); chunks
  // name it by the index returned (0, 1, ...).
  int32_t addAdapter(std::shared_ptr<const LoraAdapter> adapter);

  const LlamaWeights& weights() const { return w_; }

 private:
  void ensureScratch(int64_t tokens, int64_t rows);
  // Multi-head attention of layer `l` (index kvLayer(l) of the cache) over the normed rows in h_:
  // writes the chunk's keys and values into the cache and leaves o_proj's product in h_.
  // Errors: a collective failing (Q and K normed across heads split over the ranks).
  absl::Status attend(const LlamaLayer& layer, int64_t l, int64_t n, KvStorage& cache);
  // OLMo 2's and MiniMax-M2's Q and K norms: each token's query heads normed as one row with
  // layer.q_norm, its key heads with layer.k_norm; the heads of a row are spread over the
  // ranks, so each rank's sums of squares are summed over the group first.
  absl::Status normQkAcrossHeads(const LlamaLayer& layer, int64_t n);
  // The residual stream's n rows: x_ += delta (when given), then (when `norm` is given)
  // h_ = rmsNorm(x_) with it. Rows go over the pool in runs of 32, so a decode step's few
  // stay on this thread.
  void addAndNorm(const float* delta, const float* norm, int64_t n);
  // x_ += delta (when given, scaled in place by scaleDelta), then the input of the next
  // attention or MLP into h_: x_ normed
  // with `norm`, or x_ itself where the layer has no norm before it (OLMo 2).
  void addAndPrepare(float* delta, const std::vector<float>& norm, int64_t n);
  // delta's n rows times the model's residual_scale (Granite), before the stream adds them.
  void scaleDelta(float* delta, int64_t n);
  // RMSNorm of `n` rows of hidden values in place with weights `norm`; nothing when empty
  // (Gemma's norms of the attention and MLP outputs).
  void normRows(float* rows, const std::vector<float>& norm, int64_t n);
  // One product of layer `layer` an adapter may update, and where its rows went.
  struct LoraOutput {
    LoraTarget target;
    float* y;
    int64_t ldy;
  };
  // y[rows] += B (A x[rows]) of each output for the rows of each chunk of the step whose
  // adapter updates that projection (nothing without one). The outputs share the input x (a
  // layer's Q, K and V; its gate and up).
  void addLora(int64_t layer, const float* x, int64_t ldx,
               std::initializer_list<LoraOutput> outputs);
  // Sums a row-parallel product over the group (nothing to do in a group of one).
  absl::Status reduce(float* data, int64_t count);
  // logits_ from each rank's rows of the vocabulary.
  absl::Status gatherLogits(int64_t rows);

  const LlamaWeights& w_;
  cpu::ThreadPool& pool_;
  std::unique_ptr<Communicator> solo_;
  Communicator* comm_;
  cpu::Rope rope_;
  cpu::RopeAngles angles_;
  // Gemma 3's sliding layers rotate with their own base (ModelConfig::sliding_rope_theta).
  std::optional<cpu::Rope> sliding_rope_;
  cpu::RopeAngles sliding_angles_;
  std::optional<MoeRunner> moe_;
  std::optional<MlaAttention> mla_;
  std::optional<GatedDeltaNet> linear_;
  std::vector<LinearStateRun> linear_runs_;  // The step's, for one layer at a time.
  std::vector<float*> linear_after_;         // Their after_rows, run after run.
  std::vector<std::shared_ptr<const LoraAdapter>> adapters_;
  std::span<const SequenceChunk> batch_;  // The step's, while forward() runs.
  bool lora_step_ = false;                // Some chunk of the step has an adapter.
  // Scratch, [tokens, width] each unless noted.
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_, moe_out_;
  std::vector<float> q_gate_;      // [tokens, heads * 2 * head_dim]: gated attention's wq product
  std::vector<float> mixer_;       // [tokens, hidden]: a linear-attention layer's output
  std::vector<float> qk_squares_;  // [2, tokens]: Q's, then K's sums of squares.
  std::vector<float> last_;        // [logit rows, hidden]
  std::span<const float> last_hidden_;  // The rows of last_ the last forward filled.
  std::vector<float> local_logits_;     // [logit rows, this rank's vocab rows]
  std::vector<float> gathered_;         // [ranks][logit rows, rank's vocab rows]
  // The chunks of a step an adapter updates, for each output of one addLora().
  struct LoraRun {
    const LoraProjection* p;
    const LoraOutput* output;
    int64_t row, rows;  // The chunk's rows of the step.
    int64_t column;     // Where its output starts among the call's outputs, end to end.
  };
  // Rows [t0, t1) of `run`, columns [from, to) of its output.
  static void addLoraRun(const LoraRun& run, const float* x, int64_t ldx, int64_t t0, int64_t t1,
                         int64_t from, int64_t to);
  std::vector<LoraRun> lora_runs_;
  std::vector<float> logits_;  // [logit rows, vocab]
  std::vector<int32_t> positions_;
  std::vector<const int32_t*> tables_;
};

// A single sequence with its own cache: prefill a prompt, then decode token by token.
class LlamaRunner {
 public:
  LlamaRunner(const LlamaWeights& weights, cpu::ThreadPool& pool, int64_t max_context);

  // Appends `tokens` and returns the logits [vocab] after the last one. Errors: no tokens,
  // a token outside the vocabulary, or the context overflowing (nothing is appended).
  absl::StatusOr<std::span<const float>> forward(std::span<const uint32_t> tokens);
  int64_t position() const { return position_; }

 private:
  LlamaModel model_;
  KvStorage cache_;
  std::vector<int32_t> blocks_;
  int64_t max_context_;
  int64_t position_ = 0;
};

}  // namespace cleave::engine
