// One forward step of a Llama-family model on a GPU: the CUDA backend's twin of
// LlamaModel (llama_model.h), same batch contract, same logits within bf16 tolerance.
//
// Weights are uploaded once as bf16 (any stored format is dequantized at load; the QKV and
// gate/up projections fused into one matrix each), and the weights, the step's workspace
// and the paged KV cache live in one device allocation sized at create(). The residual
// stream and activations are bf16, the KV cache bf16 or e4m3; norms, softmax and accumulation f32;
// logits f32. Layer by layer: fused residual-add + RMSNorm, one QKV product (+ bias), per-head q/k
// norm, RoPE fused with the KV-cache write (YaRN's attention factor on cos and sin), paged
// attention (the decode kernel when every chunk is one token, the prefill kernel otherwise; a
// plan per distinct sliding window of the layers, gpt-oss's attention sinks), O product (+ bias),
// the same for the MLP.
//
// Decode steps (every chunk one token) replay a CUDA graph captured per batch-size bucket
// (powers of two up to max_sequences); padding rows write a scratch block no sequence
// owns.
//
// Qwen3.5's and Qwen3-Next's layers: gated attention (wqkv's rows end with each head's gate
// rows, and the attention's output is times their sigmoid before O) and linear attention
// (Gated DeltaNet: one input projection, kernels/cuda/gated_delta_net.h, then O). A linear
// layer has no KV cache; each sequence's state over those layers is a slot of its own
// (options.state_slots, f32, laid out as the CPU's KvStorage::state, gated_delta_net.h),
// which a chunk at position 0 starts afresh.
//
// DeepSeek's multi-head latent attention replaces the QKV product, RoPE and attention with
// the latent path of mla_attention.h (low-rank Q, the latent row cached, absorbed queries,
// the latent attention kernel, W_UV per head); the cache then has one part of one head.
//
// Mixture-of-experts layers (Qwen3-MoE, Mixtral, DeepSeek-style shared experts, gpt-oss's
// biased router and experts) run through cuda_moe_layer.h, their experts in NVFP4 or
// 128x128-block FP8 when the checkpoint stores them so, else bf16 (gpt-oss's MXFP4 too).
//
// Tensor parallelism: a model made from one rank's shard of the weights (tensor_parallel.h)
// with its rank's NcclCommunicator all-reduces the partial sums of the vocabulary-parallel
// embedding, the row-parallel O and down products and its share of the experts (bf16, in
// place, on the model's stream, inside the decode graphs too), and all-gathers the
// vocabulary-parallel logits; rank 0 returns the step's results.
//
// Threading: one thread drives a model; it owns its stream and its device memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/kv_format.h"
#include "kernels/cuda/attention_variants.h"
#include "kernels/cuda/moe_gemm.h"
#include "services/engine/llama_model.h"
#include "services/engine/llama_weights.h"
#include "services/engine/step_backend.h"

namespace cleave::engine {

class NcclCommunicator;

struct CudaModelOptions {
  int device = 0;
  int64_t max_step_tokens = 2048;  // tokens of one forward step
  int64_t max_sequences = 64;      // sequences of one forward step
  // Rows of logits one step may return (SequenceChunk::logits summed: drafts to verify,
  // prompt log-probabilities), at most max_step_tokens; 0: one per sequence, and
  // multiRowLogits() false. The logits buffers are sized for this many rows.
  int64_t max_logit_rows = 0;
  int64_t max_context = 4096;  // positions of one sequence
  int64_t block_size = 16;
  int64_t kv_blocks = 0;  // 0: max_sequences sequences of max_context positions
  // A model with linear-attention layers: slots of their state (SequenceChunk::state names
  // one), 0: max_sequences. Ignored by other models.
  int64_t state_slots = 0;
  bool cuda_graphs = true;
  // The KV cache's element type; e4m3 halves its bytes (scaled per layer by the
  // checkpoint's k_scale and v_scale, 1 without them).
  cuda::KvDtype kv_dtype = cuda::KvDtype::kBf16;
  // How NVFP4 and FP8 matrices (dense and experts) meet the activations (moe_gemm.h):
  // kWidened (weights widened to bf16), or kAuto: the activations quantized per row for the
  // native MMA wherever the device has it and the matrix's shape fits (NVFP4: K % 64), each
  // matrix on its own. kNative is refused: a model's matrices need not all fit.
  cuda::GemmOperands operands = cuda::GemmOperands::kAuto;
  // createRandom's MoE experts: bf16, NVFP4 or 128x128-block FP8.
  cuda::ExpertWeightFormat random_expert_format = cuda::ExpertWeightFormat::kBf16;
  // A tensor-parallel shard's group (its rank's communicator, on `device`); null for a
  // model on one GPU. Outlives the model.
  NcclCommunicator* comm = nullptr;
};

// Bytes of the one device allocation, by what they hold.
struct CudaMemoryPlan {
  int64_t weights = 0;
  int64_t workspace = 0;
  int64_t kv_cache = 0;
};

class CudaLlamaModel : public StepBackend {
 public:
  // What create(weights, options) would allocate, counted without allocating, for any
  // kv_blocks: weights + workspace + kv_blocks * kv_block_bytes (the workspace holding all
  // but the pool: activations, attention partials, step metadata, the padding rows'
  // scratch block and state slot), and the device's memory now (free less NCCL's headroom
  // under tensor parallelism); a linear-attention model's create() also takes
  // options.state_slots slots of linearStateFloats floats, which the caller's memory plan
  // counts (MemoryPlan::state_bytes). Needs the device, not a communicator. Errors as
  // create()'s, but memory.
  static absl::StatusOr<BackendMemory> estimate(const LlamaWeights& weights,
                                                const CudaModelOptions& options);
  // Uploads `weights` (read only during the call) to GPU `options.device`. Errors: no such
  // device, an architecture or head size the backend does not run, too little memory
  // (naming the plan), a CUDA call failing (naming it).
  static absl::StatusOr<std::unique_ptr<CudaLlamaModel>> create(const LlamaWeights& weights,
                                                                const CudaModelOptions& options);
  // A model of `config`'s shape with random weights (uniform, scaled like an initializer),
  // for benchmarks: nothing is read from disk.
  static absl::StatusOr<std::unique_ptr<CudaLlamaModel>> createRandom(
      const model::ModelConfig& config, const CudaModelOptions& options, uint64_t seed);
  ~CudaLlamaModel() override;

  // As LlamaModel::forward, with block ids into this model's own KV cache
  // ([0, kvBlocks())). Also InvalidArgument past the options' step, sequence or context
  // bounds. Under tensor parallelism every rank steps together; rank 0 returns the logits,
  // the others an empty span. A rank whose step fails aborts its group (so no peer waits
  // in a collective forever); the group is not used again.
  absl::StatusOr<std::span<const float>> forward(std::span<const SequenceChunk> batch) override;
  // The same step, drawing on the GPU the rows that ask for it (their penalties, the draw,
  // the log-probabilities asked for: sampling.h) and copying the logits [batch][vocab] (the
  // model's, unpenalized) to the host only when some row wants them; under tensor
  // parallelism rank 0 returns the results, the others none. A step with a chunk of several
  // rows of logits returns every row's logits [logitRows(batch)][vocab], and draws each
  // chunk's last row as any step does. Also InvalidArgument when the rows' seen tokens
  // together pass max_sequences x max_context, or the rows of logits pass max_logit_rows.
  absl::StatusOr<StepOutput> forwardAndDraw(std::span<const SequenceChunk> batch,
                                            std::span<const RowOutput> outputs) override;
  // Whether options.max_logit_rows was given (StepBackend::multiRowLogits).
  bool multiRowLogits() const override;
  // Keeps SequenceChunk::row_states: the Gated DeltaNet kernels write a row's state there.
  bool rowStates() const override { return true; }
  // The last step's final hidden states behind its rows of logits, copied from the GPU on
  // the first call after a step (StepBackend::lastHidden); empty on ranks other than 0.
  std::span<const float> lastHidden() const override;
  // Device <-> host copies of whole blocks (runs consecutive on both sides in one copy each).
  // `host` is page-locked on first use (TpGroup makes that at allocateKv, with no blocks) and
  // stays so while the model lives: it must outlive the model (or be replaced by another
  // host pool first).
  absl::Status copyKv(KvCopy direction, std::span<const int32_t> blocks,
                      std::span<const int32_t> rows, KvStorage& host) override;
  // One linear-attention state slot to or from the host's (StepBackend::copyState); `host`
  // must hold slots of this model's slot floats.
  absl::Status copyState(KvCopy direction, int32_t slot, KvStorage& host) override;

  int64_t kvBlocks() const;
  const CudaMemoryPlan& memoryPlan() const;
  // Bytes a decode step at batch B reads for the weights (what its roofline counts).
  int64_t weightBytes() const override;
  int64_t routedExpertBytes() const override;

  struct State;

 private:
  explicit CudaLlamaModel(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// TpGroup backends (TpGroupOptions::backend): rank r's CudaLlamaModel on GPU
// base.device + r with `base`'s options, an NCCL group (with the P2P all-reduce where the
// GPUs allow) for tp > 1, its KV pool the group's blocks (and max_context what they can
// hold, up to the model's context length, or base.max_context where the checkpoint has none).
StepBackendFactory cudaStepBackend(const CudaModelOptions& base);
// What those backends would hold (CudaLlamaModel::estimate), sized for contexts up to the
// model's context length (or base.max_context).
BackendMemoryEstimator cudaBackendMemory(const CudaModelOptions& base);

// The GPU cache type holding the same bytes as a host KV type (bf16 or e4m3; the GPU has no
// f32 cache, so f32 maps to bf16 and callers refuse it first).
inline cuda::KvDtype gpuKvDtype(cpu::KvType type) {
  return type == cpu::KvType::kFp8E4M3 ? cuda::KvDtype::kFp8E4M3 : cuda::KvDtype::kBf16;
}

}  // namespace cleave::engine
