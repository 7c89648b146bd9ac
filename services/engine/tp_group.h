// One model replica spread over the rank threads of a tensor-parallel group (ARCHITECTURE
// §1): rank r holds shard r of the weights (tensor_parallel.h), its own thread pool and its
// share of every KV block, and runs the same forward step as the others; they meet in
// collectives (through shared memory, or Gloo). A group of one runs on the caller's thread
// with no transport at all.
//
// The KvBlockPool that hands out block ids lives with the scheduler: a block id means the
// same positions on every rank.
//
// Threading: one thread (the scheduler's) calls every method; forward() blocks until every
// rank has finished the step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/progress.h"
#include "kernels/cpu/kv_format.h"
#include "services/engine/llama_model.h"
#include "services/engine/step_backend.h"

namespace cleave::engine {

// How the ranks of a group exchange partial sums.
enum class TpTransport {
  kSharedMemory,  // Rank threads read each other's buffers (shared_memory_communicator.h).
  kGloo,          // Gloo over loopback TCP (gloo_communicator.h).
};

// How far loading has come, summed over the ranks.
struct LoadProgress {
  int64_t layers_done = 0;
  int64_t layers_total = 0;  // Layers x ranks.
  int64_t bytes_done = 0;    // Weights kept so far.
};

// An on_progress that redraws `line` (when it is enabled: on a terminal) with the layers
// and bytes loaded and the rate. `line` must outlive the load.
std::function<void(const LoadProgress&)> showLoadProgress(ProgressLine& line);

struct TpGroupOptions {
  int tp = 1;
  TpTransport transport = TpTransport::kSharedMemory;
  // How MoE layers split (tensor_parallel.h): whole experts per rank, or every expert's
  // columns.
  MoeSplit moe_split = MoeSplit::kExperts;
  // CPU threads for the whole group, split evenly between the ranks (at least one each).
  int threads = 1;
  // The KV cache's element type (CPU model; a backend stores its own).
  cpu::KvType kv_type = cpu::KvType::kF32;
  // Called as layers load (from one rank thread at a time), e.g. for a progress line.
  std::function<void(const LoadProgress&)> on_progress;
  // Set: steps run on these backends (one per rank, made by allocateKv), which hold the KV
  // cache themselves — kv() has no rows then, unless host_kv. Empty: the CPU model.
  StepBackendFactory backend;
  // With a backend: what each rank's would hold, for backendMemory(). Optional.
  BackendMemoryEstimator backend_memory;
  // With a backend: host rows too (kv(), in kv_type, which must be the backend's element
  // type), filled and read by copyKv — what a KV transport moves. Their number of blocks is
  // allocateKv's host_blocks: a staging area, not a mirror of the pool.
  bool host_kv = false;
  // The longest sequence (prompt + output) the group runs, below the model's own context
  // length (vLLM's --max-model-len): config().max_position_embeddings is then this, which
  // also sizes a backend's workspace. 0: the model's.
  int64_t max_context = 0;
};

class TpGroup {
 public:
  // Loads every rank's shard of the model at `path` (in parallel, one per rank thread) and
  // connects the ranks. Errors name the file, the tensor, or the dimension that cannot be
  // split options.tp ways.
  static absl::StatusOr<std::unique_ptr<TpGroup>> load(const std::string& path,
                                                       const TpGroupOptions& options);
  ~TpGroup();

  // Gives every rank `num_blocks` KV blocks of `block_size` positions (replacing any
  // before); with a backend, makes the backend with that pool, then frees the CPU model and
  // its weights (the backend made its own copy), so a group with a backend allocates once,
  // and (host_kv) gives every rank `host_blocks` blocks of host rows (0: as many as the
  // pool). The CPU model with host_blocks > 0 keeps that many rows apart from its cache
  // too: transfers then stage through them as a backend's do, and a peer writes only
  // there. Errors: a bad size, a backend that cannot start (naming why; the weights stay
  // then), a second allocation with a backend (FailedPrecondition).
  // A model with linear-attention layers also gets `state_slots` slots of their state
  // (KvStorage::state; SequenceChunk::state names one), at least one.
  absl::Status allocateKv(int64_t num_blocks, int64_t block_size, int64_t host_blocks = 0,
                          int64_t state_slots = 0);

  // What each rank's backend would hold with blocks of `block_size` positions
  // (TpGroupOptions::backend_memory), before allocateKv makes them. FailedPrecondition
  // without an estimator or once the backends are made.
  absl::StatusOr<std::vector<BackendMemory>> backendMemory(int64_t block_size) const;

  // One forward step of every rank over `batch` (LlamaModel::forward); the logits are rank
  // 0's (every rank has the same), valid until the next call.
  absl::StatusOr<std::span<const float>> forward(std::span<const SequenceChunk> batch);
  // The same step, returning what rows[i] asks of batch row i (StepBackend::forwardAndDraw):
  // a backend may draw tokens itself; the CPU model returns every row's logits and no
  // tokens. Rank 0's results, valid until the next call.
  absl::StatusOr<StepOutput> forwardAndDraw(std::span<const SequenceChunk> batch,
                                            std::span<const RowOutput> rows);
  // The last step's hidden states behind its logits rows (LlamaModel::lastHidden), rank 0's
  // (every rank has the same): the CPU model's, or a backend's that has them (hiddenStates()).
  std::span<const float> lastHidden() const;
  // Whether lastHidden() has the rows: the CPU model's, and a backend's with multiRowLogits.
  bool hiddenStates() const { return multiRowLogits(); }

  // Brings host rows (kv()) rows[i] and the backends' cache blocks blocks[i] level, every
  // rank: the host rows take the backend's (kToHost: after a prefill, before a transfer
  // reads them) or the reverse (kFromHost: after a transfer wrote them, before decoding).
  // A no-op on the CPU model whose cache is its host rows (rows must equal blocks there).
  // FailedPrecondition without host_kv; InvalidArgument for spans of different lengths.
  absl::Status copyKv(KvCopy direction, std::span<const int32_t> blocks,
                      std::span<const int32_t> rows);
  // The same for state slot `slot` of a model with linear-attention layers (states()): the
  // host slot takes the backends' or the reverse. A no-op on the CPU model, whose states are
  // those host slots, and for a model without linear attention. InvalidArgument for a slot
  // outside [0, stateSlots()).
  absl::Status copyState(KvCopy direction, int32_t slot);

  // Loads the LoRA adapter in `folder` for every rank (loadLoraAdapter) and returns the
  // index chunks name it by (SequenceChunk::adapter). Errors: the loader's, a name already
  // added (AlreadyExists), a group with a backend (FailedPrecondition: adapters run on the
  // CPU model only).
  absl::StatusOr<int32_t> addAdapter(const std::string& name, const std::string& folder);
  // The adapters added, by index (rank 0's: every rank's has the same name, rank and file).
  const std::vector<std::shared_ptr<const LoraAdapter>>& adapters() const { return adapters_; }
  // The index of the adapter called `name`, or -1.
  int32_t adapterIndex(absl::string_view name) const;

  const model::ModelConfig& config() const;
  // Whether a chunk may ask for more than one row of logits (SequenceChunk::logits): the CPU
  // model's rows, and a backend's that says so (StepBackend::multiRowLogits; none before
  // allocateKv makes them).
  bool multiRowLogits() const {
    return backends_.empty() ? !backend_factory_ : backends_[0]->multiRowLogits();
  }
  // Whether a step keeps the states SequenceChunk::row_states names: the CPU model does, a
  // backend that says so (StepBackend::rowStates; none before allocateKv makes them).
  bool rowStates() const {
    return backends_.empty() ? !backend_factory_ : backends_[0]->rowStates();
  }
  int tp() const { return static_cast<int>(ranks_.size()); }
  int64_t numBlocks() const { return num_blocks_; }
  int64_t stateSlots() const { return state_slots_; }
  // Rank `rank`'s linear-attention state slots (stateSlots() of stateFloats(rank) floats each,
  // KvStorage::state): what a KV transport registers beside the pool. Null without them.
  float* states(int rank);
  int64_t stateFloats(int rank) const;
  int64_t blockSize() const { return block_size_; }
  cpu::KvType kvType() const { return kv_type_; }
  // Weight bytes rank `rank` streams per step (as its backend stores them, once made), and
  // its KV bytes per block.
  int64_t weightBytes(int rank) const;
  // Of weightBytes(rank), the routed experts' (LlamaWeights::routedExpertBytes, or the
  // backend's as it stores them).
  int64_t routedExpertBytes(int rank) const;
  // Of each kind of product, the largest float share of any rank on the CPU backend
  // (LlamaWeights::floatProducts; the slowest rank's); none with another backend, which
  // counts one peak.
  roofline::Workload::FloatProducts floatProducts() const;
  // Whether any product runs on the CPU's int8 kernels (so its floor needs the int8 peak);
  // with another backend, whether the linear layers are stored block-quantized.
  bool multipliesInt8() const;
  // Whether any product runs on the CPU's bf16 dot kernel (LlamaWeights::multipliesBf16), so
  // its floor takes the bf16 peak; false with another backend.
  bool multipliesBf16() const;
  int64_t kvBlockBytes(int rank) const;
  // The host rows a KV transport reads and writes for rank `rank` (after allocateKv(): the
  // CPU model's cache or its staging rows, or a backend's host rows with host_kv), and its
  // KV heads.
  KvStorage& kv(int rank);
  Span kvHeads(int rank) const;
  // Rank `rank`'s linear-attention key heads (ShardDims::linear_key_heads; empty without).
  Span linearKeyHeads(int rank) const;
  // The stored format of the linear layers (that of the first layer's Q projection).
  model::TensorType weightType() const { return weight_type_; }

 private:
  struct Rank;
  class Threads;
  TpGroup();
  // Runs `job` on every rank (each on its own thread, or inline for a group of one) and
  // returns the first error.
  absl::Status onEveryRank(const std::function<absl::Status(Rank&)>& job);

  std::vector<std::unique_ptr<Rank>> ranks_;
  model::ModelConfig config_;
  model::TensorType weight_type_ = model::TensorType::kF32;
  std::unique_ptr<Threads> threads_;  // Null for a group of one.
  StepBackendFactory backend_factory_;
  BackendMemoryEstimator backend_memory_;
  std::vector<std::unique_ptr<StepBackend>> backends_;  // one per rank
  int64_t num_blocks_ = 0;
  int64_t block_size_ = 16;
  int64_t state_slots_ = 0;
  cpu::KvType kv_type_ = cpu::KvType::kF32;
  bool host_kv_ = false;  // a backend's group keeps host rows too
  std::span<const float> logits_;
  std::vector<std::shared_ptr<const LoraAdapter>> adapters_;  // rank 0's
};

}  // namespace cleave::engine
