#include "services/engine/cuda_llama_model.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gated_delta_net.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mla_attention.h"
#include "kernels/cuda/mla_rope_kv.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/rope_kv.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/sigmoid_gate.h"
#include "services/engine/cuda_arena.h"
#include "services/engine/cuda_moe_layer.h"
#include "services/engine/cuda_weights.h"
#include "services/engine/nccl_communicator.h"
#include "services/engine/tensor_parallel.h"

namespace cleave::engine {
namespace {

using bf16 = __nv_bfloat16;

// What a model's layers hold besides their matrices and norms (the same on every layer).
struct LayerTraits {
  bool qkv_bias = false;  // Qwen2, gpt-oss
  bool qk_norm = false;   // Qwen3
  bool o_bias = false;    // gpt-oss, on the rank holding the first heads
  bool sinks = false;     // gpt-oss's attention sinks
  bool tied = false;      // the output projection is the embedding table
};

// A layer's matrices (cuda_weights.h): bf16 for cuBLASLt, or NVFP4 / FP8 128x128 as the
// checkpoint stores them, for the skinny GEMM.
// Norm weights are f32 (cuda::RmsNormArgs), but for kv_a_norm, which the latent cache's
// fused norm reads as bf16.
struct DeviceLayer {
  float* attn_norm = nullptr;
  cuda::ExpertWeights wqkv;  // [q_dim + 2 kv_dim][hidden]: wq, wk, wv rows
  bf16* bqkv = nullptr;      // [q_dim + 2 kv_dim], when the model has biases
  float* q_norm = nullptr;
  float* k_norm = nullptr;
  float* sinks = nullptr;                // [heads], when the model has attention sinks
  cuda::ExpertWeights wo;                // [hidden][q_dim]
  bf16* bo = nullptr;                    // [hidden], when this rank adds the O bias
  float k_scale = 1.0f, v_scale = 1.0f;  // An e4m3 cache's (LlamaLayer).
  float* ffn_norm = nullptr;
  // Gemma 3: norms of the attention's and the MLP's outputs, before the residual adds.
  float* post_attn_norm = nullptr;
  float* post_ffn_norm = nullptr;
  cuda::ExpertWeights wgu;    // [2 ffn][hidden]: gate rows, then up rows
  cuda::ExpertWeights wdown;  // [hidden][ffn]
  // Multi-head latent attention (mla_attention.h), bf16, instead of wqkv; wo is then
  // [hidden][heads * v_head_dim].
  cuda::ExpertWeights q_a;       // [q_lora][hidden], when Q is low-rank
  float* q_a_norm = nullptr;     // [q_lora]
  cuda::ExpertWeights q_b;       // [heads * (nope + rope)][q_lora or hidden]
  cuda::ExpertWeights kv_a;      // [kv_lora + rope][hidden]
  bf16* kv_a_norm = nullptr;     // [kv_lora]
  cuda::ExpertWeights k_absorb;  // [heads][kv_lora][nope]: each head's W_UKᵀ
  cuda::ExpertWeights v_up;      // [heads][v][kv_lora]: each head's W_UV
  // Linear-attention layers (Gated DeltaNet, kernels/cuda/gated_delta_net.h) instead of
  // attention: the input projection, bf16, [q, k, v, z, b, a rows of this rank's heads, each
  // key head's value heads together][hidden]; wo is then [hidden][value heads · d_v].
  cuda::ExpertWeights lin_proj;
  float* conv = nullptr;      // [channels][conv_kernel]
  float* a_rate = nullptr;    // [value heads]
  float* dt_bias = nullptr;   // [value heads]
  float* lin_norm = nullptr;  // [d_v]
};

// The formats of a layer's matrices (bf16 for random weights).
struct LayerFormats {
  cuda::ExpertWeightFormat qkv = cuda::ExpertWeightFormat::kBf16;
  cuda::ExpertWeightFormat o = cuda::ExpertWeightFormat::kBf16;
  cuda::ExpertWeightFormat gate_up = cuda::ExpertWeightFormat::kBf16;
  cuda::ExpertWeightFormat down = cuda::ExpertWeightFormat::kBf16;
};

bf16* bf16Data(const cuda::ExpertWeights& w) {
  return static_cast<bf16*>(const_cast<void*>(w.data));
}

int64_t nextPowerOfTwo(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

}  // namespace

struct CudaLlamaModel::State {
  model::ModelConfig config;
  CudaModelOptions options;
  cuda::RopeLayout rope_layout = cuda::RopeLayout::kHalves;
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, q_dim = 0, kv_dim = 0, qkv_dim = 0,
          ffn = 0, vocab = 0, layers = 0;
  // The leading values of each query and key head that rotate; 0: all (model::ModelConfig).
  int64_t rotary_dim = 0;
  // The KV cache: parts (keys and values, or MLA's one latent) of kv_heads rows of
  // cache_head_dim per position (model::kvCacheShape).
  int64_t cache_parts = 2, cache_head_dim = 0;
  // Multi-head latent attention: its widths (a latent row is kv_lora + rope), the softmax
  // scale, and its workspace, [max_step_tokens][width] each.
  bool mla = false;
  int64_t q_low = 0, kv_lora = 0, rope = 0, nope = 0, v_dim = 0, latent_row = 0;
  float mla_scale = 1.0f;
  bf16 *mla_q_low = nullptr, *mla_q = nullptr, *mla_latent = nullptr, *mla_q_abs = nullptr,
       *mla_attended = nullptr;
  // Q and K normed across heads (ModelConfig::qk_norm_across_heads): each token's sums of
  // squares, Q's then K's, [2][max_step_tokens], summed over the ranks.
  float* qk_squares = nullptr;
  // Gated attention (Qwen3.5, Qwen3-Next): a qkv row ends with each head's gate values
  // ([q_dim] at gate_offset), and the attention's output is times their sigmoid.
  bool gated = false;
  int64_t gate_offset = 0;
  // Layers with a KV cache (all but linear-attention ones): each layer's place among them
  // (-1 for a linear layer) and among the linear layers (-1 for the others).
  int64_t kv_layers = 0;
  std::vector<int> kv_index, linear_index;
  // Linear attention (Gated DeltaNet) on this rank: its heads and sizes, the input
  // projection's width (q, k, v, z, b, a), the channels of the convolution (q, k, v), and a
  // layer's state floats; each sequence's state is one of state_slots slots of slot_floats
  // (every linear layer's), slot state_slots the padding rows'.
  struct Linear {
    int key_heads = 0, value_heads = 0, dk = 0, dv = 0, taps = 0;
    int64_t kd = 0, vd = 0, channels = 0, proj_dim = 0, layer_floats = 0;
  };
  std::optional<Linear> lin;
  int64_t state_slots = 0, slot_floats = 0;
  float* states = nullptr;  // [state_slots + 1][slot_floats]
  // Prefill steps split each value head's columns over this many blocks (their raw outputs,
  // [max_step_tokens][vd] f32, normed apart); decode steps keep one block a head.
  int lin_column_groups = 1;
  float* lin_raw = nullptr;
  int multiprocessors = 0;        // the device's
  bf16* lin_projected = nullptr;  // [max_step_tokens][proj_dim]
  float* lin_mixed = nullptr;     // [max_step_tokens][channels]
  bf16* lin_out = nullptr;        // [max_step_tokens][vd]
  // Tensor parallelism: this rank's rows of the vocabulary (embedding, lm-head) and every
  // rank's row count (the logits' all-gather); null comm for a group of one.
  NcclCommunicator* comm = nullptr;
  int64_t vocab_begin = 0, vocab_rows = 0;
  int shard_rank = 0;  // rank 0 returns a step's results
  std::vector<int64_t> rank_vocab_rows;
  int64_t max_blocks_per_seq = 0;
  int64_t kv_blocks = 0;  // usable; block kv_blocks is the padding rows' scratch block
  LayerTraits traits;
  CudaMemoryPlan plan;
  int64_t weight_bytes = 0;         // weightBytes()
  int64_t routed_expert_bytes = 0;  // routedExpertBytes()
  uint8_t* base = nullptr;

  std::vector<DeviceLayer> layer;
  std::vector<LayerFormats> formats;  // per layer
  // Mixture-of-experts layers: which they are, their shape, weights and shared workspace.
  std::vector<bool> is_moe;
  bool has_dense = true;
  std::optional<CudaMoeShape> moe;
  std::vector<CudaMoeWeights> moe_layer;
  CudaMoeWorkspace moe_ws;
  bf16* embed = nullptr;  // [vocab_rows][hidden]
  float* output_norm = nullptr;
  bf16* output = nullptr;  // [vocab_rows][hidden]; embed when tied
  float* inv_freq = nullptr;
  float rope_factor = 1.0f;  // YaRN's attention factor on cos and sin
  // Gemma 3 (model::ModelConfig): the sliding layers' rotation (null: as the others), the
  // embeddings' scale, the logits' soft cap (0: none), the MLP's GELU.
  float* sliding_inv_freq = nullptr;
  float embedding_scale = 1.0f;
  float final_softcap = 0.0f;
  // Granite: each block's output times residual_scale before the residual add, the logits
  // times logits_scale (1 / logits_scaling).
  float residual_scale = 1.0f;
  float logits_scale = 1.0f;
  bool gelu = false;
  // Workspace, [max_step_tokens][width] unless noted.
  bf16 *x = nullptr, *h = nullptr, *qkv = nullptr, *q = nullptr, *attn = nullptr, *o = nullptr,
       *gu = nullptr, *act = nullptr;
  // [L()] rows each: the final hidden states behind the rows of logits, and the logits.
  bf16* last = nullptr;       // [L()][hidden]
  float* logits = nullptr;    // [L()][vocab_rows]
  float* gathered = nullptr;  // TP: every rank's logits, rank-major [rank][logit rows][rows]
  float* ordered = nullptr;   // TP, rank 0: the gathered logits in vocabulary order
  // The draws' settings and results, one block laid out alike on the GPU and in pinned host
  // memory, so each direction is one copy: per row what goes up (how it is drawn, its
  // penalties, how many top log-probabilities it asks: -1 none), then what comes back (the
  // drawn token, its log-probability, [kMaxLogprobs] best tokens'), then the penalized rows'
  // seen tokens (rank 0 only: the others draw nothing).
  struct Draws {
    uint8_t* base = nullptr;
    cuda::SamplingRow* rows = nullptr;
    cuda::PenaltyRow* penalties = nullptr;
    int32_t* logprob_counts = nullptr;
    int32_t* drawn = nullptr;
    float* chosen = nullptr;
    cuda::TokenLogprob* top = nullptr;
    cuda::SeenToken* seen = nullptr;
    int64_t up_bytes = 0, back_bytes = 0, bytes = 0;
    int64_t row_count = 0, seen_count = 0;

    // The pieces at `at` (null: sizes only) for `rows` rows and `seen` seen tokens.
    static Draws place(uint8_t* at, int64_t rows, int64_t seen) {
      Draws d;
      d.base = at;
      d.row_count = rows;
      d.seen_count = seen;
      int64_t offset = 0;
      auto take = [&]<typename T>(T*& p, int64_t count) {
        p = at ? reinterpret_cast<T*>(at + offset) : nullptr;
        offset += count * static_cast<int64_t>(sizeof(T));
      };
      take(d.rows, rows);  // 8-byte fields first: every offset after stays aligned.
      take(d.penalties, rows);
      take(d.logprob_counts, rows);
      d.up_bytes = offset;
      take(d.drawn, rows);
      take(d.chosen, rows);
      take(d.top, rows * kMaxLogprobs);
      d.back_bytes = offset - d.up_bytes;
      take(d.seen, seen);
      d.bytes = offset;
      return d;
    }
  };
  Draws draws;  // on the GPU
  // Seen tokens of one step: a row's are distinct and fewer than its positions.
  int64_t seen_capacity = 0;
  void* attention_workspace = nullptr;
  void* quantized = nullptr;  // the activations of a quantized dense product, quantized
  int64_t quantized_bytes = 0;
  int32_t* meta = nullptr;  // ids, positions, slots, q_starts, contexts, last rows, tables,
                            // state slots
  uint8_t* kv = nullptr;    // [layer][K, V][block][kv head][slot][head_dim], kv_dtype

  int32_t* host_meta = nullptr;         // pinned
  float* host_logits = nullptr;         // pinned, [L()][vocab]
  int64_t step_logit_rows = 0;          // of the last step
  std::vector<int64_t> chunk_last_row;  // of the last step: each sequence's last logits row
  bool multi_row_logits = false;        // options.max_logit_rows was given
  // lastHidden(): the last step's rows, copied on first use after it.
  mutable std::vector<float> hidden_out;
  mutable std::vector<bf16> hidden_staged;
  mutable bool hidden_copied = false;
  Draws host_draws;                   // pinned
  std::vector<TokenLogprob> top_out;  // host_draws.top as the engine's type
  void* pinned_rows = nullptr;        // host KV rows copyKv registered (page-locked), if any
  void* pin_tried = nullptr;          // the host rows copyKv last tried to lock
  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::Gemm> gemm;
  // Attention plans, one pair per distinct window of the layers (gpt-oss: its sliding
  // window and none), and each layer's.
  struct AttentionPlans {
    cuda::DecodeAttentionPlan decode;
    cuda::PrefillAttentionPlan prefill;
  };
  std::vector<AttentionPlans> attention_plans;
  std::vector<int> layer_plan;
  cuda::MlaAttentionPlan mla_plan;            // Latent attention's instead of the two above.
  std::map<int64_t, cudaGraphExec_t> graphs;  // decode batch bucket -> graph
  std::set<int64_t> warmed;                   // buckets run once eagerly
  std::set<int64_t> eager;                    // buckets whose capture failed: never graphed

  ~State() {
    cudaSetDevice(options.device);  // A group's models are destroyed from one thread.
    for (auto& [bucket, graph] : graphs) cudaGraphExecDestroy(graph);
    gemm.reset();
    if (stream) cudaStreamDestroy(stream);
    if (host_meta) cudaFreeHost(host_meta);
    if (host_logits) cudaFreeHost(host_logits);
    if (host_draws.base) cudaFreeHost(host_draws.base);
    if (pinned_rows) cudaHostUnregister(pinned_rows);
    if (base) cudaFree(base);
  }

  // Offsets into meta, in int32 units.
  int64_t T() const { return options.max_step_tokens; }
  int64_t S() const { return options.max_sequences; }
  int64_t L() const { return options.max_logit_rows; }  // rows of logits, >= S()
  int32_t* ids(int32_t* m) const { return m; }
  int32_t* positions(int32_t* m) const { return m + T(); }
  int32_t* slots(int32_t* m) const { return m + 2 * T(); }
  int32_t* qStarts(int32_t* m) const { return m + 3 * T(); }
  int32_t* contexts(int32_t* m) const { return m + 3 * T() + S() + 1; }
  int32_t* lastRows(int32_t* m) const { return m + 3 * T() + 2 * S() + 1; }  // [L()]
  int32_t* tables(int32_t* m) const { return m + 3 * T() + 2 * S() + 1 + L(); }
  int32_t* stateSlots(int32_t* m) const { return tables(m) + S() * max_blocks_per_seq; }
  int32_t* rowStates(int32_t* m) const { return stateSlots(m) + S(); }  // [T()]
  int64_t metaCount() const {
    return 3 * T() + 2 * S() + 1 + L() + S() * max_blocks_per_seq + S() + T();
  }
  int64_t layerKvElements() const {
    return (kv_blocks + 1) * kv_heads * options.block_size * cache_head_dim;
  }
  int64_t kvElementBytes() const { return options.kv_dtype == cuda::KvDtype::kFp8E4M3 ? 1 : 2; }
  // The cache of KV layer `k` (kv_index of a model layer).
  void* keys(int64_t k) const {
    return kv + cache_parts * k * layerKvElements() * kvElementBytes();
  }
  void* values(int64_t k) const {
    return static_cast<uint8_t*>(keys(k)) +
           (cache_parts - 1) * layerKvElements() * kvElementBytes();
  }

  // Places every piece; with a null base only sizes them (and fills in the plan).
  void layout(uint8_t* at) {
    Arena arena(at);
    layer.assign(layers, {});
    moe_layer.assign(layers, {});
    for (int64_t l = 0; l < layers; ++l) {
      DeviceLayer& d = layer[l];
      if (config.pre_norms) d.attn_norm = arena.take<float>(hidden);
      const LayerFormats& f = formats[l];
      if (linear_index[l] >= 0) {
        d.lin_proj = placeWeights(arena, cuda::ExpertWeightFormat::kBf16, 1, lin->proj_dim, hidden);
        d.conv = arena.take<float>(lin->channels * lin->taps);
        d.a_rate = arena.take<float>(lin->value_heads);
        d.dt_bias = arena.take<float>(lin->value_heads);
        d.lin_norm = arena.take<float>(lin->dv);
        d.wo = placeWeights(arena, f.o, 1, hidden, lin->vd);
      } else if (mla) {
        const auto bf16_format = cuda::ExpertWeightFormat::kBf16;
        if (q_low > 0) {
          d.q_a = placeWeights(arena, bf16_format, 1, q_low, hidden);
          d.q_a_norm = arena.take<float>(q_low);
        }
        d.q_b = placeWeights(arena, bf16_format, 1, q_dim, q_low > 0 ? q_low : hidden);
        d.kv_a = placeWeights(arena, bf16_format, 1, latent_row, hidden);
        d.kv_a_norm = arena.take<bf16>(kv_lora);
        d.k_absorb = placeWeights(arena, bf16_format, 1, heads * kv_lora, nope);
        d.v_up = placeWeights(arena, bf16_format, 1, heads * v_dim, kv_lora);
        d.wo = placeWeights(arena, f.o, 1, hidden, heads * v_dim);
      } else {
        d.wqkv = placeWeights(arena, f.qkv, 1, qkv_dim, hidden);
        if (traits.qkv_bias) d.bqkv = arena.take<bf16>(qkv_dim);
        if (traits.qk_norm) {  // Per head, or the rank's part of a norm across heads.
          d.q_norm = arena.take<float>(config.qk_norm_across_heads ? q_dim : head_dim);
          d.k_norm = arena.take<float>(config.qk_norm_across_heads ? kv_dim : head_dim);
        }
        if (traits.sinks) d.sinks = arena.take<float>(heads);
        d.wo = placeWeights(arena, f.o, 1, hidden, q_dim);
        if (traits.o_bias) d.bo = arena.take<bf16>(hidden);
      }
      if (config.pre_norms) d.ffn_norm = arena.take<float>(hidden);
      if (config.post_norms) {
        d.post_attn_norm = arena.take<float>(hidden);
        d.post_ffn_norm = arena.take<float>(hidden);
      }
      if (is_moe[l]) {
        moe_layer[l] = placeMoeWeights(arena, *moe);
        continue;
      }
      d.wgu = placeWeights(arena, f.gate_up, 1, 2 * ffn, hidden);
      d.wdown = placeWeights(arena, f.down, 1, hidden, ffn);
    }
    embed = arena.take<bf16>(vocab_rows * hidden);
    output_norm = arena.take<float>(hidden);
    output = traits.tied ? embed : arena.take<bf16>(vocab_rows * hidden);
    inv_freq = arena.take<float>(cpu::rotaryDim(config) / 2);
    if (config.sliding_rope_theta > 0)
      sliding_inv_freq = arena.take<float>(cpu::rotaryDim(config) / 2);
    plan.weights = arena.used();
    const int64_t t = options.max_step_tokens;
    x = arena.take<bf16>(t * hidden);
    h = arena.take<bf16>(t * hidden);
    if (mla) {
      if (q_low > 0) mla_q_low = arena.take<bf16>(t * q_low);
      mla_q = arena.take<bf16>(t * q_dim);
      mla_latent = arena.take<bf16>(t * latent_row);
      mla_q_abs = arena.take<bf16>(t * heads * latent_row);
      mla_attended = arena.take<bf16>(t * heads * kv_lora);
      attn = arena.take<bf16>(t * heads * v_dim);
    } else {
      qkv = arena.take<bf16>(t * qkv_dim);
      if (config.qk_norm_across_heads) qk_squares = arena.take<float>(2 * t);
      q = arena.take<bf16>(t * q_dim);
      attn = arena.take<bf16>(t * q_dim);
    }
    if (lin) {
      lin_projected = arena.take<bf16>(t * lin->proj_dim);
      lin_mixed = arena.take<float>(t * lin->channels);
      lin_out = arena.take<bf16>(t * lin->vd);
      if (lin_column_groups > 1) lin_raw = arena.take<float>(t * lin->vd);
      states = arena.take<float>((state_slots + 1) * slot_floats);
    }
    o = arena.take<bf16>(t * hidden);
    if (has_dense) {
      // The unactivated gate/up rows only for cuBLASLt's product, or a GELU MLP's; the skinny
      // GEMM fuses SiLU.
      bool bf16_gate_up = gelu;
      for (int64_t l = 0; l < layers; ++l)
        bf16_gate_up =
            bf16_gate_up || (!is_moe[l] && formats[l].gate_up == cuda::ExpertWeightFormat::kBf16);
      if (bf16_gate_up) gu = arena.take<bf16>(t * 2 * ffn);
      act = arena.take<bf16>(t * ffn);
    }
    if (moe) moe_ws = placeMoeWorkspace(arena, *moe);
    // Native operands of quantized dense products (moe_gemm.h): the largest input.
    quantized_bytes = 0;
    for (int64_t l = 0; l < layers; ++l) {
      const LayerFormats& f = formats[l];
      const int64_t o_in = linear_index[l] >= 0 ? lin->vd : mla ? heads * v_dim : q_dim;
      int64_t need = std::max(cuda::nativeScratchBytes(f.qkv, t, hidden),
                              cuda::nativeScratchBytes(f.o, t, o_in));
      if (!is_moe[l])
        need = std::max({need, cuda::nativeScratchBytes(f.gate_up, t, hidden),
                         cuda::nativeScratchBytes(f.down, t, ffn)});
      quantized_bytes = std::max(quantized_bytes, need);
    }
    quantized = quantized_bytes > 0 ? arena.take<uint8_t>(quantized_bytes) : nullptr;
    last = arena.take<bf16>(L() * hidden);
    logits = arena.take<float>(L() * vocab_rows);
    if (rank_vocab_rows.size() > 1) {
      gathered = arena.take<float>(L() * vocab);
      if (shard_rank == 0) ordered = arena.take<float>(L() * vocab);
    }
    seen_capacity = options.max_sequences * std::min<int64_t>(options.max_context, vocab);
    const int64_t seen_rows = shard_rank == 0 ? seen_capacity : 0;  // Only rank 0 draws.
    const int64_t draw_bytes = Draws::place(nullptr, options.max_sequences, seen_rows).bytes;
    draws = Draws::place(arena.take<uint8_t>(draw_bytes), options.max_sequences, seen_rows);
    size_t attention_bytes = mla_plan.workspace_bytes;
    for (const AttentionPlans& p : attention_plans)
      attention_bytes = std::max(attention_bytes, p.decode.workspace_bytes);
    attention_workspace = arena.take<uint8_t>(static_cast<int64_t>(attention_bytes));
    meta = arena.take<int32_t>(metaCount());
    plan.workspace = arena.used() - plan.weights;
    kv = arena.take<uint8_t>(cache_parts * kv_layers * layerKvElements() * kvElementBytes());
    plan.kv_cache = arena.used() - plan.weights - plan.workspace;
  }

  // `logit_rows` rows of logits (their token rows in lastRows); a decode step's are its
  // sequences.
  absl::Status enqueue(int64_t n, int64_t sequences, int64_t logit_rows, bool decode);
  absl::Status run(int64_t n, int64_t sequences, int64_t logit_rows, bool decode);
  absl::StatusOr<cudaGraphExec_t> capture(int64_t n, int64_t sequences);
  // Enqueues the batch's state checkpoint copies (SequenceChunk::state_from, state_to), those
  // before the layers (`before`) or those after them, device to device on the stream.
  absl::Status copyCheckpoints(std::span<const SequenceChunk> batch, bool before);
  // The part of forwardAndDraw() after the batch checks (which fail alike on every rank).
  absl::StatusOr<StepOutput> step(std::span<const SequenceChunk> batch,
                                  std::span<const RowOutput> outputs, int64_t sequences, int64_t n,
                                  bool decode);
  // After a step of `rows` sequences (the first `sequences` real) and `logit_rows` rows of
  // logits: draws the rows that ask for it and copies the logits where any row wants them
  // (every row's when some chunk has several: logit_rows > rows), both to pinned host memory.
  absl::StatusOr<StepOutput> results(std::span<const RowOutput> outputs, int64_t sequences,
                                     int64_t rows, int64_t logit_rows);
};

namespace {

// Shapes, plans and the one allocation, before any weight is written; with !allocate, the
// plan alone (sized, nothing allocated, no communicator needed). Either way the device's
// memory goes to `memory` when it is not null. `moe_blocks`: the weights' MoE layers (their
// expert format), none for random ones.
absl::StatusOr<std::unique_ptr<CudaLlamaModel::State>> prepare(
    const model::ModelConfig& c, const ShardDims& dims, const CudaModelOptions& options,
    const LayerTraits& traits, std::span<const MoeBlock* const> moe_blocks,
    std::vector<LayerFormats> formats, bool allocate = true, BackendMemory* memory = nullptr) {
  // What the kernels do not run, refused before any device is touched.
  if (!c.mla && c.head_dim != 16 && c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128 &&
      c.head_dim != 256) {
    return absl::UnimplementedError(absl::StrCat(
        c.source, ": head_dim ", c.head_dim, " (", model::architectureName(c.architecture),
        ") is not run by the CUDA attention kernels (head sizes ", cuda::kHeadDims,
        "); use --backend cpu"));
  }
  if (c.linear_attention) {
    const model::LinearAttentionConfig& la = *c.linear_attention;
    if (absl::Status ok = cuda::gatedDeltaNetSupported(
            static_cast<int>(la.key_head_dim), static_cast<int>(la.value_head_dim),
            static_cast<int>(la.conv_kernel), static_cast<int>(la.key_heads),
            static_cast<int>(la.value_heads));
        !ok.ok())
      return absl::UnimplementedError(
          absl::StrCat(c.source, ": ", ok.message(), "; use --backend cpu"));
  }
  if (c.attention_output_gate && (traits.qkv_bias || c.mla))
    return absl::UnimplementedError(absl::StrCat(
        c.source,
        ": gated attention with Q/K/V biases or latent attention is not run by the CUDA "
        "kernels; use --backend cpu"));
  if (c.mlp_activation != model::MlpActivation::kSilu && c.moe) {
    return absl::UnimplementedError(
        absl::StrCat(c.source,
                     ": experts gated by GELU are not run by the CUDA expert GEMMs; "
                     "use --backend cpu"));
  }
  if (options.operands == cuda::GemmOperands::kNative)
    return absl::InvalidArgumentError(
        "the CUDA model takes auto or widened GEMM operands (auto uses the native ones wherever a "
        "matrix fits them)");
  if (options.max_step_tokens < 1 || options.max_sequences < 1 || options.max_context < 1 ||
      options.max_sequences > options.max_step_tokens)
    return absl::InvalidArgumentError(
        "CUDA model options: max_step_tokens, max_sequences and max_context must be >= 1, and "
        "max_sequences <= max_step_tokens");
  if (allocate && ((options.comm != nullptr ? options.comm->size() : 1) != dims.shard.size ||
                   (options.comm != nullptr && options.comm->rank() != dims.shard.rank)))
    return absl::InvalidArgumentError(
        "a CUDA model of a tensor-parallel shard needs its rank's communicator");
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
      cudaSetDevice(options.device), absl::StrCat("selecting GPU ", options.device,
                                                  " (a GPU and a driver for CUDA 13 are needed)")));
  cudaDeviceProp prop{};
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaGetDeviceProperties(&prop, options.device),
                                          "reading the GPU's properties"));
  auto state = std::make_unique<CudaLlamaModel::State>();
  CudaLlamaModel::State& s = *state;
  s.config = c;
  s.options = options;
  // Decode graphs round the batch up to a power of two: size every step for that.
  s.options.max_sequences = nextPowerOfTwo(options.max_sequences);
  s.options.max_step_tokens = std::max(options.max_step_tokens, s.options.max_sequences);
  s.multi_row_logits = options.max_logit_rows > 0;
  s.options.max_logit_rows =
      std::clamp(options.max_logit_rows, s.options.max_sequences, s.options.max_step_tokens);
  s.hidden = c.hidden_size;
  s.heads = dims.heads.size;
  s.kv_heads = dims.kv_heads.size;
  s.head_dim = c.head_dim;
  s.rotary_dim = c.rotary_dim;
  s.gelu = c.mlp_activation == model::MlpActivation::kGeluTanh;
  s.embedding_scale = static_cast<float>(c.embedding_scale);
  s.final_softcap = static_cast<float>(c.final_logit_softcap);
  s.residual_scale = static_cast<float>(c.residual_scale);
  s.logits_scale = static_cast<float>(1.0 / c.logits_scaling);
  s.q_dim = s.heads * s.head_dim;
  s.kv_dim = s.kv_heads * s.head_dim;
  s.qkv_dim = s.q_dim + 2 * s.kv_dim;
  if (c.attention_output_gate) {
    s.gated = true;
    s.gate_offset = s.qkv_dim;
    s.qkv_dim += s.q_dim;
  }
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const bool linear = c.isLinearLayer(l);
    s.kv_index.push_back(linear ? -1 : static_cast<int>(c.kvLayer(l)));
    s.linear_index.push_back(linear ? static_cast<int>(c.linearLayer(l)) : -1);
  }
  s.kv_layers = c.kvLayers();
  if (c.linear_attention) {
    const model::LinearAttentionConfig& la = *c.linear_attention;
    s.lin = CudaLlamaModel::State::Linear{};
    CudaLlamaModel::State::Linear& lin = *s.lin;
    lin.key_heads = static_cast<int>(dims.linear_key_heads.size);
    lin.value_heads = static_cast<int>(dims.linear_value_heads.size);
    lin.dk = static_cast<int>(la.key_head_dim);
    lin.dv = static_cast<int>(la.value_head_dim);
    lin.taps = static_cast<int>(la.conv_kernel);
    lin.kd = int64_t{lin.key_heads} * lin.dk;
    lin.vd = int64_t{lin.value_heads} * lin.dv;
    lin.channels = 2 * lin.kd + lin.vd;
    lin.proj_dim = lin.channels + lin.vd + 2 * lin.value_heads;
    lin.layer_floats =
        lin.key_heads * cuda::gatedDeltaNetGroupFloats(
                            lin.dk, lin.dv, lin.taps, lin.value_heads / std::max(lin.key_heads, 1));
    s.slot_floats = c.linearLayers() * lin.layer_floats;
    s.lin_column_groups = cuda::gatedDeltaNetColumnGroups(lin.dk, lin.dv);
    s.multiprocessors = prop.multiProcessorCount;
    // One slot per sequence a step can hold unless the caller sizes them (TpGroup: the
    // scheduler's slots).
    s.state_slots = options.state_slots > 0 ? options.state_slots : s.options.max_sequences;
  }
  const model::KvCacheShape cache_shape = model::kvCacheShape(c);
  s.cache_parts = cache_shape.parts;
  s.cache_head_dim = cache_shape.head_dim;
  if (c.mla) {
    s.mla = true;
    s.q_low = c.mla->q_lora_rank;
    s.kv_lora = c.mla->kv_lora_rank;
    s.rope = c.mla->qk_rope_head_dim;
    s.nope = c.mla->qk_nope_head_dim;
    s.v_dim = c.mla->v_head_dim;
    s.latent_row = s.kv_lora + s.rope;
    s.mla_scale = mlaSoftmaxScale(c);
  }
  s.ffn = dims.ffn.size;
  s.vocab = c.vocab_size;
  s.comm = dims.shard.size > 1 ? options.comm : nullptr;
  s.vocab_begin = dims.vocab.begin;
  s.shard_rank = dims.shard.rank;
  s.vocab_rows = dims.vocab.size;
  for (int r = 0; r < dims.shard.size; ++r) {
    CLEAVE_ASSIGN_OR_RETURN(ShardDims other, planShard(c, {.rank = r, .size = dims.shard.size}));
    s.rank_vocab_rows.push_back(other.vocab.size);
  }
  s.layers = c.num_layers;
  s.traits = traits;
  s.formats = std::move(formats);
  s.formats.resize(s.layers);
  s.is_moe.assign(s.layers, false);
  s.has_dense = !c.moe;
  if (c.moe) {
    for (int64_t l = 0; l < s.layers; ++l) {
      s.is_moe[l] = c.isMoeLayer(static_cast<uint32_t>(l));
      s.has_dense = s.has_dense || !s.is_moe[l];
    }
    CLEAVE_ASSIGN_OR_RETURN(s.moe,
                            cudaMoeShape(c, dims, moe_blocks, options.random_expert_format,
                                         s.options.max_step_tokens, s.options.max_sequences));
    s.moe->operands = options.operands;
  }
  // Quantized dense matrices and MoE experts run on the expert-GEMM kernels.
  CLEAVE_RETURN_IF_ERROR(cuda::prepareMoeGemm());
  s.max_blocks_per_seq = (options.max_context + options.block_size - 1) / options.block_size;
  s.kv_blocks =
      options.kv_blocks > 0 ? options.kv_blocks : options.max_sequences * s.max_blocks_per_seq;
  const float softcap = static_cast<float>(c.attention_softcap);  // Gemma 2's
  const float scale = c.attention_scale > 0 ? static_cast<float>(c.attention_scale)
                                            : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  if (s.mla) {
    CLEAVE_ASSIGN_OR_RETURN(
        s.mla_plan,
        cuda::planMlaAttention({.heads = static_cast<int>(s.heads),
                                .kv_lora = static_cast<int>(s.kv_lora),
                                .rope = static_cast<int>(s.rope),
                                .block_size = static_cast<int>(options.block_size),
                                .max_tokens = static_cast<int>(s.options.max_step_tokens),
                                .max_context = static_cast<int>(options.max_context),
                                .kv_dtype = options.kv_dtype},
                               prop.multiProcessorCount));
  } else {
    std::vector<int> windows;  // of attention_plans, in order
    for (uint32_t l = 0; l < c.num_layers; ++l) {
      const int window = static_cast<int>(c.attentionWindow(l));
      auto known = std::find(windows.begin(), windows.end(), window);
      s.layer_plan.push_back(static_cast<int>(known - windows.begin()));
      if (known != windows.end()) continue;
      windows.push_back(window);
      CudaLlamaModel::State::AttentionPlans& p = s.attention_plans.emplace_back();
      CLEAVE_ASSIGN_OR_RETURN(p.decode, cuda::planDecodeAttention(
                                            {.heads = static_cast<int>(s.heads),
                                             .kv_heads = static_cast<int>(s.kv_heads),
                                             .head_dim = static_cast<int>(s.head_dim),
                                             .block_size = static_cast<int>(options.block_size),
                                             .max_batch = static_cast<int>(s.options.max_sequences),
                                             .max_context = static_cast<int>(options.max_context),
                                             .scale = scale,
                                             .kv_dtype = options.kv_dtype,
                                             .window = window,
                                             .softcap = softcap},
                                            prop.multiProcessorCount));
      CLEAVE_ASSIGN_OR_RETURN(
          p.prefill,
          cuda::planPrefillAttention({.heads = static_cast<int>(s.heads),
                                      .kv_heads = static_cast<int>(s.kv_heads),
                                      .head_dim = static_cast<int>(s.head_dim),
                                      .block_size = static_cast<int>(options.block_size),
                                      .max_sequences = static_cast<int>(s.options.max_sequences),
                                      .max_new_tokens = static_cast<int>(s.options.max_step_tokens),
                                      .scale = scale,
                                      .kv_dtype = options.kv_dtype,
                                      .window = window,
                                      .softcap = softcap}));
    }
  }
  s.layout(nullptr);
  if (s.seen_capacity > INT32_MAX)  // The penalties index their seen tokens with int32.
    return absl::InvalidArgumentError(
        "CUDA model options: max_sequences x max_context must stay below 2^31");
  const int64_t total = s.plan.weights + s.plan.workspace + s.plan.kv_cache;
  size_t free_bytes = 0, total_bytes = 0;
  CLEAVE_RETURN_IF_ERROR(
      cuda::cudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "reading free GPU memory"));
  // NCCL allocates its buffers at the first collective, after the model: leave it room.
  const size_t headroom = dims.shard.size > 1 ? size_t{1} << 30 : 0;
  free_bytes = free_bytes > headroom ? free_bytes - headroom : 0;
  if (memory != nullptr) {
    memory->free_bytes = static_cast<int64_t>(free_bytes);
    memory->total_bytes = static_cast<int64_t>(total_bytes);
  }
  if (!allocate) return state;
  if (static_cast<size_t>(total) > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "GPU ", options.device, " has ", free_bytes >> 20, " MiB free; the model needs ",
        total >> 20, " MiB: weights ", s.plan.weights >> 20, ", workspace ", s.plan.workspace >> 20,
        ", KV cache ", s.plan.kv_cache >> 20, " (lower max_sequences, max_context or kv_blocks)"));
  }
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaMalloc(reinterpret_cast<void**>(&s.base), total),
                                          "allocating the model"));
  s.layout(s.base);
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaMemset(s.kv, 0, static_cast<size_t>(s.plan.kv_cache)),
                                          "clearing the KV cache"));
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
      cudaMallocHost(reinterpret_cast<void**>(&s.host_meta), s.metaCount() * sizeof(int32_t)),
      "pinned step metadata"));
  std::memset(s.host_meta, 0, s.metaCount() * sizeof(int32_t));
  if (s.shard_rank == 0)  // Rank 0 returns the group's results.
    CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
        cudaMallocHost(reinterpret_cast<void**>(&s.host_logits), s.L() * s.vocab * sizeof(float)),
        "pinned logits"));
  uint8_t* pinned = nullptr;
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
      cudaMallocHost(reinterpret_cast<void**>(&pinned), static_cast<size_t>(s.draws.bytes)),
      "pinned draws"));
  s.host_draws = CudaLlamaModel::State::Draws::place(pinned, s.draws.row_count, s.draws.seen_count);
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
      cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "creating a stream"));
  CLEAVE_ASSIGN_OR_RETURN(s.gemm, cuda::Gemm::create());
  // What a decode step reads (as the CPU model counts it): every weight but the untied
  // embedding table, of which it gathers rows; the routed experts apart, since a batch reads
  // only those its tokens pick.
  s.weight_bytes = s.plan.weights - (s.traits.tied ? 0 : s.vocab_rows * s.hidden * 2);
  if (s.moe) {
    const int64_t moe_layers = std::count(s.is_moe.begin(), s.is_moe.end(), true);
    s.routed_expert_bytes = moe_layers * s.moe->experts() * moeExpertBytes(*s.moe);
  }
  return state;
}

// A matrix's rows as floats, checked to be [rows][cols]; errors name `what`.
absl::StatusOr<std::vector<float>> hostRows(const cpu::CpuMatrix& m, int64_t rows, int64_t cols,
                                            const char* what) {
  if (m.rows() != rows || m.cols() != cols)
    return absl::InvalidArgumentError(absl::StrCat(what, " is [", m.rows(), ", ", m.cols(),
                                                   "], expected [", rows, ", ", cols, "]"));
  std::vector<float> values(static_cast<size_t>(rows * cols));
  CLEAVE_RETURN_IF_ERROR(cpu::dequantizeRows(m.source(), 0, rows, values.data()));
  return values;
}

// Gated attention's stacked projection: each head's query rows (wq holds them before its
// gate rows), K, V, then each head's gate rows at gate_offset.
absl::Status uploadGatedQkv(const LlamaLayer& src, const CudaLlamaModel::State& s,
                            DeviceLayer& dst) {
  const int64_t hidden = s.hidden, hd = s.head_dim;
  CLEAVE_ASSIGN_OR_RETURN(std::vector<float> q, hostRows(src.wq, 2 * s.q_dim, hidden, "wq"));
  CLEAVE_ASSIGN_OR_RETURN(std::vector<float> k, hostRows(src.wk, s.kv_dim, hidden, "wk"));
  CLEAVE_ASSIGN_OR_RETURN(std::vector<float> v, hostRows(src.wv, s.kv_dim, hidden, "wv"));
  std::vector<float> qkv(static_cast<size_t>(s.qkv_dim * hidden));
  for (int64_t h = 0; h < s.heads; ++h) {
    std::copy_n(q.data() + 2 * h * hd * hidden, hd * hidden, qkv.data() + h * hd * hidden);
    std::copy_n(q.data() + (2 * h + 1) * hd * hidden, hd * hidden,
                qkv.data() + (s.gate_offset + h * hd) * hidden);
  }
  std::copy(k.begin(), k.end(), qkv.begin() + s.q_dim * hidden);
  std::copy(v.begin(), v.end(), qkv.begin() + (s.q_dim + s.kv_dim) * hidden);
  return uploadBf16(qkv, bf16Data(dst.wqkv), "gated attention's q, k, v and gates");
}

// A linear-attention layer's weights in the kernels' order (gated_delta_net.h): the rank's
// q, k, v, z, b and a rows stacked, each key head's value heads together, whatever order the
// checkpoint keeps them in (Qwen3-Next's grouped projections, llama.cpp's tiled value heads).
absl::Status uploadLinear(const GatedDeltaNetWeights& w, const CudaLlamaModel::State& s,
                          DeviceLayer& dst) {
  const CudaLlamaModel::State::Linear& lin = *s.lin;
  const int64_t hidden = s.hidden, dk = lin.dk, dv = lin.dv;
  const int64_t keys = lin.key_heads, values = lin.value_heads, ratio = values / keys;
  // Where the kernels keep a stored value head.
  const bool tiled = s.config.linear_attention->tiled_value_heads;
  auto placeOf = [&](int64_t h) { return tiled ? (h % keys) * ratio + h / keys : h; };
  const int64_t q0 = 0, k0 = lin.kd, v0 = 2 * lin.kd, z0 = lin.channels;
  const int64_t b0 = lin.channels + lin.vd, a0 = b0 + values;
  std::vector<float> proj(static_cast<size_t>(lin.proj_dim * hidden));
  auto put = [&](const std::vector<float>& from, int64_t from_row, int64_t to_row, int64_t rows) {
    std::copy_n(from.data() + from_row * hidden, rows * hidden, proj.data() + to_row * hidden);
  };
  if (w.qkvz.rows() > 0) {  // Per key head: q, k, its value heads' v, then their z.
    const int64_t group = 2 * dk + 2 * ratio * dv;
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> m,
                            hostRows(w.qkvz, keys * group, hidden, "in_proj_qkvz"));
    for (int64_t g = 0; g < keys; ++g) {
      put(m, g * group, q0 + g * dk, dk);
      put(m, g * group + dk, k0 + g * dk, dk);
      put(m, g * group + 2 * dk, v0 + g * ratio * dv, ratio * dv);
      put(m, g * group + 2 * dk + ratio * dv, z0 + g * ratio * dv, ratio * dv);
    }
  } else {
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> q, hostRows(w.q, lin.kd, hidden, "linear q"));
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> k, hostRows(w.k, lin.kd, hidden, "linear k"));
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> v, hostRows(w.v, lin.vd, hidden, "linear v"));
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> z, hostRows(w.z, lin.vd, hidden, "linear z"));
    put(q, 0, q0, lin.kd);
    put(k, 0, k0, lin.kd);
    for (int64_t h = 0; h < values; ++h) {
      put(v, h * dv, v0 + placeOf(h) * dv, dv);
      put(z, h * dv, z0 + placeOf(h) * dv, dv);
    }
  }
  if (w.ba.rows() > 0) {  // Per key head: its value heads' b, then their a.
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> m, hostRows(w.ba, 2 * values, hidden, "in_proj_ba"));
    for (int64_t g = 0; g < keys; ++g) {
      put(m, g * 2 * ratio, b0 + g * ratio, ratio);
      put(m, g * 2 * ratio + ratio, a0 + g * ratio, ratio);
    }
  } else {
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> b, hostRows(w.b, values, hidden, "linear b"));
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> a, hostRows(w.a, values, hidden, "linear a"));
    for (int64_t h = 0; h < values; ++h) {
      put(b, h, b0 + placeOf(h), 1);
      put(a, h, a0 + placeOf(h), 1);
    }
  }
  CLEAVE_RETURN_IF_ERROR(uploadBf16(proj, bf16Data(dst.lin_proj), "linear attention projections"));
  const int64_t taps = lin.taps;
  if (static_cast<int64_t>(w.conv.size()) != lin.channels * taps ||
      static_cast<int64_t>(w.a_rate.size()) != values ||
      static_cast<int64_t>(w.dt_bias.size()) != values)
    return absl::InvalidArgumentError(
        absl::StrCat("linear attention: ", w.conv.size(), " convolution weights, ", w.a_rate.size(),
                     " decay rates and ", w.dt_bias.size(), " dt biases for ", lin.channels,
                     " channels of ", taps, " taps and ", values, " value heads"));
  std::vector<float> conv(w.conv.begin(), w.conv.begin() + 2 * lin.kd * taps);
  conv.resize(w.conv.size());
  std::vector<float> a_rate(values), dt_bias(values);
  for (int64_t h = 0; h < values; ++h) {
    std::copy_n(w.conv.data() + (2 * lin.kd + h * dv) * taps, dv * taps,
                conv.data() + (2 * lin.kd + placeOf(h) * dv) * taps);
    a_rate[placeOf(h)] = w.a_rate[h];
    dt_bias[placeOf(h)] = w.dt_bias[h];
  }
  CLEAVE_RETURN_IF_ERROR(uploadF32(conv, dst.conv, lin.channels * taps, "linear conv1d"));
  CLEAVE_RETURN_IF_ERROR(uploadF32(a_rate, dst.a_rate, values, "linear A_log"));
  CLEAVE_RETURN_IF_ERROR(uploadF32(dt_bias, dst.dt_bias, values, "linear dt_bias"));
  CLEAVE_RETURN_IF_ERROR(uploadF32(w.norm, dst.lin_norm, dv, "linear norm"));
  // The output projection's columns follow the value heads.
  CLEAVE_ASSIGN_OR_RETURN(std::vector<float> out, hostRows(w.out, hidden, lin.vd, "out_proj"));
  std::vector<float> placed(out.size());
  for (int64_t row = 0; row < hidden; ++row)
    for (int64_t h = 0; h < values; ++h)
      std::copy_n(out.data() + row * lin.vd + h * dv, dv,
                  placed.data() + row * lin.vd + placeOf(h) * dv);
  return uploadBf16(placed, bf16Data(dst.wo), "linear out_proj");
}

// A layer's latent attention projections, as bf16 (its per-head matrices stacked).
absl::Status uploadMla(const MlaWeights& src, const CudaLlamaModel::State& s, DeviceLayer& dst) {
  if (s.q_low > 0) {
    CLEAVE_RETURN_IF_ERROR(uploadRows(src.q_a, dst.q_a, 0, 0, "q_a_proj"));
    CLEAVE_RETURN_IF_ERROR(uploadF32(src.q_a_norm, dst.q_a_norm, s.q_low, "q_a_layernorm"));
  }
  CLEAVE_RETURN_IF_ERROR(uploadRows(src.q_b, dst.q_b, 0, 0, "q_b_proj"));
  CLEAVE_RETURN_IF_ERROR(uploadRows(src.kv_a, dst.kv_a, 0, 0, "kv_a_proj_with_mqa"));
  CLEAVE_RETURN_IF_ERROR(uploadBf16(src.kv_a_norm, dst.kv_a_norm, "kv_a_layernorm"));
  if (static_cast<int64_t>(src.k_absorb.size()) != s.heads ||
      static_cast<int64_t>(src.v_up.size()) != s.heads)
    return absl::InvalidArgumentError("kv_b_proj's per-head parts do not match the heads");
  for (int64_t h = 0; h < s.heads; ++h) {
    CLEAVE_RETURN_IF_ERROR(
        uploadRows(src.k_absorb[h], dst.k_absorb, 0, h * s.kv_lora, "kv_b_proj"));
    CLEAVE_RETURN_IF_ERROR(uploadRows(src.v_up[h], dst.v_up, 0, h * s.v_dim, "kv_b_proj"));
  }
  return absl::OkStatus();
}

// The rotation of `c` as cpu::Rope computes it: its inverse frequencies into `dst`, its
// attention factor into `factor`.
absl::Status uploadRope(const model::ModelConfig& c, cpu::RopePairing pairing, float* dst,
                        float& factor) {
  const cpu::Rope rope(c, pairing);
  factor = static_cast<float>(rope.attentionFactor());
  const std::vector<float>& f = rope.inverseFrequencies();
  return uploadBytes(dst, f.data(), f.size() * sizeof(float), "rope frequencies");
}

// The sliding layers' inverse frequencies into `dst` when they have their own rotation
// (cpu::slidingRope; no attention factor: no scaling).
absl::Status uploadSlidingRope(const model::ModelConfig& c, cpu::RopePairing pairing, float* dst) {
  const std::optional<cpu::Rope> rope = cpu::slidingRope(c, pairing);
  if (!rope) return absl::OkStatus();
  const std::vector<float>& f = rope->inverseFrequencies();
  return uploadBytes(dst, f.data(), f.size() * sizeof(float), "sliding rope frequencies");
}

}  // namespace

CudaLlamaModel::CudaLlamaModel(std::unique_ptr<State> state) : state_(std::move(state)) {}
CudaLlamaModel::~CudaLlamaModel() = default;

namespace {

// prepare() for `w`: its formats, biases, norms and tying read off the weights.
absl::StatusOr<std::unique_ptr<CudaLlamaModel::State>> prepareFor(const LlamaWeights& w,
                                                                  const CudaModelOptions& options,
                                                                  bool allocate,
                                                                  BackendMemory* memory = nullptr) {
  CLEAVE_RETURN_IF_ERROR(cpu::ropeSupported(w.config.rope_scaling));
  // The attention layers' traits, read off the first (Qwen3.5's first layers are linear).
  const LlamaLayer* first = nullptr;
  for (const LlamaLayer& l : w.layers) {
    if (!l.linear) {
      first = &l;
      break;
    }
  }
  const LayerTraits traits{
      .qkv_bias = first && !first->bq.empty(),
      .qk_norm = first && !first->q_norm.empty(),
      .o_bias = first && !first->bo.empty(),
      .sinks = first && !first->sinks.empty(),
      .tied = w.output.source().data == w.token_embd.data && w.token_embd.type == w.output.type()};
  std::vector<const MoeBlock*> moe_blocks;
  for (const LlamaLayer& l : w.layers) {
    if (l.moe) moe_blocks.push_back(&*l.moe);
  }
  // Native FP8/FP4 products round the activations: only for checkpoints made to run so.
  // Weight-only ones (NVFP4A16, gpt-oss's MXFP4, GGUF files) keep bf16 activations, as vLLM
  // runs them (Marlin's W4A16).
  CudaModelOptions chosen = options;
  if (chosen.operands == cuda::GemmOperands::kAuto && !w.activations_quantized)
    chosen.operands = cuda::GemmOperands::kWidened;
  std::vector<LayerFormats> formats;
  for (const LlamaLayer& l : w.layers) {
    // Latent, gated and linear attention's projections are bf16 (rows rearranged at upload).
    const bool bf16_attention = l.mla || l.linear || w.config.attention_output_gate;
    LayerFormats f{.qkv = bf16_attention ? cuda::ExpertWeightFormat::kBf16
                                         : stackFormat({&l.wq, &l.wk, &l.wv}),
                   .o = l.linear ? cuda::ExpertWeightFormat::kBf16 : stackFormat({&l.wo})};
    if (!l.moe) {
      f.gate_up = stackFormat({&l.w_gate, &l.w_up});
      f.down = stackFormat({&l.w_down});
    }
    formats.push_back(f);
  }
  return prepare(w.config, w.dims, chosen, traits, moe_blocks, std::move(formats), allocate,
                 memory);
}

}  // namespace

absl::StatusOr<BackendMemory> CudaLlamaModel::estimate(const LlamaWeights& w,
                                                       const CudaModelOptions& options) {
  CudaModelOptions one = options;
  one.kv_blocks = 1;
  BackendMemory e;
  CLEAVE_ASSIGN_OR_RETURN(std::unique_ptr<State> state, prepareFor(w, one, /*allocate=*/false, &e));
  const State& s = *state;
  e.kv_block_bytes = s.cache_parts * s.kv_layers * s.kv_heads * s.options.block_size *
                     s.cache_head_dim * s.kvElementBytes();
  e.weights = s.plan.weights;
  // The cache of one block holds the padding rows' scratch block too: fixed, like the rest.
  // The linear-attention state slots are not: the memory plan sets them aside itself
  // (MemoryPlan::state_bytes) and create() gets their number; the padding rows' slot stays.
  e.workspace = s.plan.workspace + s.plan.kv_cache - e.kv_block_bytes -
                s.state_slots * s.slot_floats * static_cast<int64_t>(sizeof(float));
  return e;
}

absl::StatusOr<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::create(
    const LlamaWeights& w, const CudaModelOptions& options) {
  CLEAVE_ASSIGN_OR_RETURN(std::unique_ptr<State> state, prepareFor(w, options, /*allocate=*/true));
  State& s = *state;
  s.rope_layout = w.rope_pairing == cpu::RopePairing::kHalves ? cuda::RopeLayout::kHalves
                                                              : cuda::RopeLayout::kAdjacent;
  for (int64_t l = 0; l < s.layers; ++l) {
    const LlamaLayer& src = w.layers[l];
    DeviceLayer& dst = s.layer[l];
    dst.k_scale = src.k_scale;
    dst.v_scale = src.v_scale;
    if (src.moe.has_value() != s.is_moe[l])
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, "'s MLP does not match the config (dense or MoE)"));
    if (src.attn_norm.empty() != (dst.attn_norm == nullptr) ||
        src.ffn_norm.empty() != (dst.ffn_norm == nullptr))
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", l, "'s norms before attention and the MLP do not match the config"));
    if (dst.attn_norm != nullptr)
      CLEAVE_RETURN_IF_ERROR(uploadF32(src.attn_norm, dst.attn_norm, s.hidden, "attn_norm"));
    if (src.linear.has_value() != (s.linear_index[l] >= 0))
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", l, "'s attention does not match the config (linear attention or not)"));
    if (src.linear) {
      CLEAVE_RETURN_IF_ERROR(uploadLinear(*src.linear, s, dst));
    } else {
      if (src.mla.has_value() != s.mla)
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", l, "'s attention does not match the config (MLA or not)"));
      if (s.mla) {
        CLEAVE_RETURN_IF_ERROR(uploadMla(*src.mla, s, dst));
      } else if (s.gated) {
        CLEAVE_RETURN_IF_ERROR(uploadGatedQkv(src, s, dst));
      } else {
        CLEAVE_RETURN_IF_ERROR(uploadRows(src.wq, dst.wqkv, 0, 0, "wq"));
        CLEAVE_RETURN_IF_ERROR(uploadRows(src.wk, dst.wqkv, 0, s.q_dim, "wk"));
        CLEAVE_RETURN_IF_ERROR(uploadRows(src.wv, dst.wqkv, 0, s.q_dim + s.kv_dim, "wv"));
      }
      if (s.traits.qkv_bias) {
        std::vector<float> bias = src.bq;
        bias.insert(bias.end(), src.bk.begin(), src.bk.end());
        bias.insert(bias.end(), src.bv.begin(), src.bv.end());
        CLEAVE_RETURN_IF_ERROR(uploadBf16(bias, dst.bqkv, "qkv bias"));
      }
      if (s.traits.qk_norm) {
        const bool across = s.config.qk_norm_across_heads;
        CLEAVE_RETURN_IF_ERROR(
            uploadF32(src.q_norm, dst.q_norm, across ? s.q_dim : s.head_dim, "q_norm"));
        CLEAVE_RETURN_IF_ERROR(
            uploadF32(src.k_norm, dst.k_norm, across ? s.kv_dim : s.head_dim, "k_norm"));
      }
      CLEAVE_RETURN_IF_ERROR(uploadRows(src.wo, dst.wo, 0, 0, "wo"));
      if (static_cast<int64_t>(src.bo.size()) != (s.traits.o_bias ? s.hidden : 0) ||
          static_cast<int64_t>(src.sinks.size()) != (s.traits.sinks ? s.heads : 0))
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", l, "'s O bias or attention sinks differ from the first layer's (",
            src.bo.size(), " and ", src.sinks.size(), " values)"));
      if (s.traits.o_bias) CLEAVE_RETURN_IF_ERROR(uploadBf16(src.bo, dst.bo, "o_proj bias"));
      if (s.traits.sinks)
        CLEAVE_RETURN_IF_ERROR(
            uploadBytes(dst.sinks, src.sinks.data(), src.sinks.size() * 4, "attention sinks"));
    }
    if (dst.ffn_norm != nullptr)
      CLEAVE_RETURN_IF_ERROR(uploadF32(src.ffn_norm, dst.ffn_norm, s.hidden, "ffn_norm"));
    if (dst.post_attn_norm != nullptr) {
      CLEAVE_RETURN_IF_ERROR(
          uploadF32(src.post_attn_norm, dst.post_attn_norm, s.hidden, "post_attn_norm"));
      CLEAVE_RETURN_IF_ERROR(
          uploadF32(src.post_ffn_norm, dst.post_ffn_norm, s.hidden, "post_ffn_norm"));
    }
    if (src.moe) {
      CLEAVE_RETURN_IF_ERROR(uploadMoe(*src.moe, *s.moe, s.moe_layer[l]));
      continue;
    }
    CLEAVE_RETURN_IF_ERROR(uploadRows(src.w_gate, dst.wgu, 0, 0, "w_gate"));
    CLEAVE_RETURN_IF_ERROR(uploadRows(src.w_up, dst.wgu, 0, s.ffn, "w_up"));
    CLEAVE_RETURN_IF_ERROR(uploadRows(src.w_down, dst.wdown, 0, 0, "w_down"));
  }
  {
    const EmbeddingTable& e = w.token_embd;
    std::vector<float> table(static_cast<size_t>(e.rows * e.cols));
    CLEAVE_RETURN_IF_ERROR(model::dequantize(e.type, e.data, e.rows * e.cols, table.data()));
    CLEAVE_RETURN_IF_ERROR(uploadBf16(table, s.embed, "token embeddings"));
  }
  CLEAVE_RETURN_IF_ERROR(uploadF32(w.output_norm, s.output_norm, s.hidden, "output_norm"));
  if (!s.traits.tied) CLEAVE_RETURN_IF_ERROR(uploadDequantized(w.output, s.output, "output"));
  CLEAVE_RETURN_IF_ERROR(uploadRope(w.config, w.rope_pairing, s.inv_freq, s.rope_factor));
  CLEAVE_RETURN_IF_ERROR(uploadSlidingRope(w.config, w.rope_pairing, s.sliding_inv_freq));
  // The uploads ran on the default stream, which the model's non-blocking stream does not
  // wait for: they finish before the first step can read them.
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaDeviceSynchronize(), "uploading the weights"));
  return std::unique_ptr<CudaLlamaModel>(new CudaLlamaModel(std::move(state)));
}

absl::StatusOr<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::createRandom(
    const model::ModelConfig& config, const CudaModelOptions& options, uint64_t seed) {
  CLEAVE_ASSIGN_OR_RETURN(const ShardDims whole, planShard(config, {}));
  const LayerTraits traits{.qkv_bias = config.attention_bias,
                           .qk_norm = config.qk_norm,
                           .o_bias = config.o_bias,
                           .sinks = config.attention_sinks,
                           .tied = config.tie_word_embeddings};
  CLEAVE_ASSIGN_OR_RETURN(std::unique_ptr<State> state,
                          prepare(config, whole, options, traits, {}, {}));
  State& s = *state;
  uint64_t stream_id = seed;
  auto fill = [&](auto* p, int64_t count, float low, float high) {
    return cuda::fillUniform(p, count, low, high, stream_id++ * 0x100000001b3ull, s.stream);
  };
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(s.hidden));
  const float ffn_scale = 1.0f / std::sqrt(static_cast<float>(s.ffn));
  // Uniform in +-1/sqrt(fan-in).
  auto fillMatrix = [&](const cuda::ExpertWeights& w, int64_t rows, int64_t cols) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
    return fill(bf16Data(w), rows * cols, -scale, scale);
  };
  for (int64_t l = 0; l < s.layers; ++l) {
    const DeviceLayer& d = s.layer[l];
    if (d.attn_norm != nullptr) CLEAVE_RETURN_IF_ERROR(fill(d.attn_norm, s.hidden, 0.8f, 1.2f));
    if (s.linear_index[l] >= 0) {
      const State::Linear& lin = *s.lin;
      CLEAVE_RETURN_IF_ERROR(fillMatrix(d.lin_proj, lin.proj_dim, s.hidden));
      CLEAVE_RETURN_IF_ERROR(fill(d.conv, lin.channels * lin.taps, -0.5f, 0.5f));
      CLEAVE_RETURN_IF_ERROR(fill(d.a_rate, lin.value_heads, -1.0f, -0.05f));
      CLEAVE_RETURN_IF_ERROR(fill(d.dt_bias, lin.value_heads, -1.0f, 1.0f));
      CLEAVE_RETURN_IF_ERROR(fill(d.lin_norm, lin.dv, 0.8f, 1.2f));
      CLEAVE_RETURN_IF_ERROR(fillMatrix(d.wo, s.hidden, lin.vd));
    } else if (s.mla) {
      if (s.q_low > 0) {
        CLEAVE_RETURN_IF_ERROR(fillMatrix(d.q_a, s.q_low, s.hidden));
        CLEAVE_RETURN_IF_ERROR(fill(d.q_a_norm, s.q_low, 0.8f, 1.2f));
      }
      CLEAVE_RETURN_IF_ERROR(
          fillMatrix(d.q_b, s.heads * (s.nope + s.rope), s.q_low > 0 ? s.q_low : s.hidden));
      CLEAVE_RETURN_IF_ERROR(fillMatrix(d.kv_a, s.kv_lora + s.rope, s.hidden));
      CLEAVE_RETURN_IF_ERROR(fill(d.kv_a_norm, s.kv_lora, 0.8f, 1.2f));
      CLEAVE_RETURN_IF_ERROR(fillMatrix(d.k_absorb, s.heads * s.kv_lora, s.nope));
      CLEAVE_RETURN_IF_ERROR(fillMatrix(d.v_up, s.heads * s.v_dim, s.kv_lora));
      CLEAVE_RETURN_IF_ERROR(fillMatrix(d.wo, s.hidden, s.heads * s.v_dim));
    } else {
      CLEAVE_RETURN_IF_ERROR(fill(bf16Data(d.wqkv), s.qkv_dim * s.hidden, -in_scale, in_scale));
      CLEAVE_RETURN_IF_ERROR(fill(bf16Data(d.wo), s.hidden * s.q_dim, -in_scale, in_scale));
      if (d.bqkv != nullptr) CLEAVE_RETURN_IF_ERROR(fill(d.bqkv, s.qkv_dim, -0.1f, 0.1f));
      if (d.q_norm != nullptr) {
        const bool across = s.config.qk_norm_across_heads;
        CLEAVE_RETURN_IF_ERROR(fill(d.q_norm, across ? s.q_dim : s.head_dim, 0.8f, 1.2f));
        CLEAVE_RETURN_IF_ERROR(fill(d.k_norm, across ? s.kv_dim : s.head_dim, 0.8f, 1.2f));
      }
      if (d.bo != nullptr) CLEAVE_RETURN_IF_ERROR(fill(d.bo, s.hidden, -0.1f, 0.1f));
      if (d.sinks != nullptr) {
        const std::vector<float> sinks(s.heads, 0.5f);
        CLEAVE_RETURN_IF_ERROR(
            uploadBytes(d.sinks, sinks.data(), sinks.size() * 4, "random attention sinks"));
      }
    }
    if (d.ffn_norm != nullptr) CLEAVE_RETURN_IF_ERROR(fill(d.ffn_norm, s.hidden, 0.8f, 1.2f));
    if (d.post_attn_norm != nullptr) {
      CLEAVE_RETURN_IF_ERROR(fill(d.post_attn_norm, s.hidden, 0.8f, 1.2f));
      CLEAVE_RETURN_IF_ERROR(fill(d.post_ffn_norm, s.hidden, 0.8f, 1.2f));
    }
    if (s.is_moe[l]) {
      CLEAVE_RETURN_IF_ERROR(fillRandomMoe(*s.moe, s.moe_layer[l], stream_id++, s.stream));
      continue;
    }
    CLEAVE_RETURN_IF_ERROR(fill(bf16Data(d.wgu), 2 * s.ffn * s.hidden, -in_scale, in_scale));
    CLEAVE_RETURN_IF_ERROR(fill(bf16Data(d.wdown), s.hidden * s.ffn, -ffn_scale, ffn_scale));
  }
  CLEAVE_RETURN_IF_ERROR(fill(s.embed, s.vocab_rows * s.hidden, -1.0f, 1.0f));
  CLEAVE_RETURN_IF_ERROR(fill(s.output_norm, s.hidden, 0.8f, 1.2f));
  if (!s.traits.tied)
    CLEAVE_RETURN_IF_ERROR(fill(s.output, s.vocab_rows * s.hidden, -in_scale, in_scale));
  CLEAVE_RETURN_IF_ERROR(uploadRope(config, cpu::RopePairing::kHalves, s.inv_freq, s.rope_factor));
  CLEAVE_RETURN_IF_ERROR(uploadSlidingRope(config, cpu::RopePairing::kHalves, s.sliding_inv_freq));
  // The default stream's uploads (inverse frequencies) included.
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaDeviceSynchronize(), "filling random weights"));
  return std::unique_ptr<CudaLlamaModel>(new CudaLlamaModel(std::move(state)));
}

absl::Status CudaLlamaModel::copyKv(KvCopy direction, std::span<const int32_t> blocks,
                                    std::span<const int32_t> rows, KvStorage& host) {
  State& s = *state_;
  const KvStorageOptions& o = host.options();
  const int64_t element = cpu::kvElementBytes(o.type);
  if (o.num_layers != s.kv_layers || o.kv_heads != s.kv_heads || o.head_dim != s.cache_head_dim ||
      o.parts != s.cache_parts || o.block_size != s.options.block_size ||
      element != s.kvElementBytes() ||
      (o.type == cpu::KvType::kFp8E4M3) != (s.options.kv_dtype == cuda::KvDtype::kFp8E4M3))
    return absl::InvalidArgumentError(
        absl::StrCat("host KV rows [", o.num_layers, " layers, ", o.kv_heads, " heads, head_dim ",
                     o.head_dim, ", blocks of ", o.block_size, ", ", cpu::kvTypeName(o.type),
                     "] do not match the GPU cache's [", s.kv_layers, ", ", s.kv_heads, ", ",
                     s.cache_head_dim, ", ", s.options.block_size, ", ",
                     s.options.kv_dtype == cuda::KvDtype::kFp8E4M3 ? "fp8_e4m3" : "bf16", "]"));
  if (blocks.size() != rows.size())
    return absl::InvalidArgumentError(
        absl::StrCat("copyKv of ", blocks.size(), " blocks to ", rows.size(), " host rows"));
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] < 0 || blocks[i] >= s.kv_blocks)
      return absl::InvalidArgumentError(absl::StrCat(
          "KV block ", blocks[i], " is outside the GPU cache (", s.kv_blocks, " blocks)"));
    if (rows[i] < 0 || rows[i] >= o.num_blocks)
      return absl::InvalidArgumentError(absl::StrCat(
          "host KV row block ", rows[i], " is outside the host rows (", o.num_blocks, " blocks)"));
  }
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaSetDevice(s.options.device), "selecting the GPU"));
  if (s.pin_tried != host.data()) {
    s.pin_tried = host.data();
    // Page-locked host rows copy at the link's speed; unlocked ones still copy, staged by
    // the driver, if locking them fails. (The rows outlive the model: TpGroup destroys
    // its backends first.)
    if (s.pinned_rows != nullptr) cudaHostUnregister(s.pinned_rows);
    s.pinned_rows = nullptr;
    if (cudaHostRegister(host.data(), static_cast<size_t>(host.bytes()), cudaHostRegisterDefault) ==
        cudaSuccess) {
      s.pinned_rows = host.data();
    } else {
      (void)cudaGetLastError();
    }
  }
  // A block of one layer's keys (or values) is [kv head][slot][head_dim] in both layouts, so
  // a run of consecutive block ids on both sides is one contiguous copy.
  const int64_t block_bytes = s.kv_heads * s.options.block_size * s.cache_head_dim * element;
  const bool to_host = direction == KvCopy::kToHost;
  for (size_t i = 0; i < blocks.size();) {
    size_t end = i + 1;
    while (end < blocks.size() && blocks[end] == blocks[end - 1] + 1 &&
           rows[end] == rows[end - 1] + 1)
      ++end;
    const int64_t bytes = static_cast<int64_t>(end - i) * block_bytes;
    for (int64_t l = 0; l < s.kv_layers; ++l) {
      for (int kv = 0; kv < s.cache_parts; ++kv) {
        uint8_t* device =
            static_cast<uint8_t*>(kv == 0 ? s.keys(l) : s.values(l)) + blocks[i] * block_bytes;
        uint8_t* host_rows = host.data() + host.offset(l, kv, rows[i], 0);
        const absl::Status queued = cuda::cudaStatus(
            cudaMemcpyAsync(to_host ? host_rows : device, to_host ? device : host_rows,
                            static_cast<size_t>(bytes),
                            to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s.stream),
            to_host ? "copying KV rows to the host" : "copying KV rows to the GPU");
        if (!queued.ok()) {
          // The copies queued before still read or write the rows: they end before the
          // caller may hand the rows to another transfer.
          (void)cudaStreamSynchronize(s.stream);
          return queued;
        }
      }
    }
    i = end;
  }
  return cuda::cudaStatus(cudaStreamSynchronize(s.stream), "KV row copies");
}

absl::Status CudaLlamaModel::copyState(KvCopy direction, int32_t slot, KvStorage& host) {
  State& s = *state_;
  if (!s.lin) return absl::FailedPreconditionError("the model has no linear-attention state");
  if (host.options().state_floats != s.slot_floats || slot < 0 || slot >= s.state_slots ||
      slot >= host.stateSlots())
    return absl::InvalidArgumentError(absl::StrCat(
        "state slot ", slot, " of ", s.state_slots, " GPU slots of ", s.slot_floats, " floats and ",
        host.stateSlots(), " host slots of ", host.options().state_floats));
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaSetDevice(s.options.device), "selecting the GPU"));
  const bool to_host = direction == KvCopy::kToHost;
  float* device = s.states + slot * s.slot_floats;
  float* rows = host.state(slot);
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
      cudaMemcpyAsync(to_host ? rows : device, to_host ? device : rows,
                      static_cast<size_t>(s.slot_floats) * sizeof(float),
                      to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s.stream),
      to_host ? "copying a state slot to the host" : "copying a state slot to the GPU"));
  return cuda::cudaStatus(cudaStreamSynchronize(s.stream), "state slot copy");
}

int64_t CudaLlamaModel::kvBlocks() const { return state_->kv_blocks; }
const CudaMemoryPlan& CudaLlamaModel::memoryPlan() const { return state_->plan; }
int64_t CudaLlamaModel::weightBytes() const { return state_->weight_bytes; }

int64_t CudaLlamaModel::routedExpertBytes() const { return state_->routed_expert_bytes; }

// Every kernel of one step over the metadata already in `meta`: `n` token rows of
// `sequences` sequences.
absl::Status CudaLlamaModel::State::enqueue(int64_t n, int64_t sequences, int64_t logit_rows,
                                            bool decode) {
  const float eps = static_cast<float>(config.rms_norm_eps);
  cudaStream_t st = stream;
  auto product = [&](const bf16* in, int64_t in_dim, const bf16* w, const bf16* bias,
                     int64_t out_dim, void* out, bool as_float = false, int64_t rows = -1) {
    return gemm->run({.x = in,
                      .x_stride = in_dim,
                      .w = w,
                      .bias = bias,
                      .tokens = rows < 0 ? n : rows,
                      .out = out_dim,
                      .in = in_dim,
                      .y = out,
                      .y_stride = out_dim,
                      .y_float = as_float},
                     st);
  };
  // A layer's product: cuBLASLt for bf16 weights, the skinny GEMM for quantized ones (which
  // can fuse the SiLU-and-mul of a gate/up product: `act_out` then gets the activation).
  auto linear = [&](const bf16* in, int64_t in_dim, const cuda::ExpertWeights& w, const bf16* bias,
                    bf16* out) -> absl::Status {
    if (w.format == cuda::ExpertWeightFormat::kBf16)
      return product(in, in_dim, bf16Data(w), bias, w.rows, out);
    return cuda::runSkinnyGemm({.x = in,
                                .x_stride = in_dim,
                                .rows = n,
                                .weights = w,
                                .y = out,
                                .y_stride = w.rows,
                                .bias = bias,
                                .operands = options.operands,
                                .scratch = quantized,
                                .scratch_bytes = quantized_bytes},
                               st);
  };
  // Tensor parallel: each rank's partial sums (embedding rows, O and down products, its
  // experts) are all-reduced in place before the residual stream takes them.
  auto reduce = [&](bf16* data, int64_t rows) -> absl::Status {
    if (comm == nullptr) return absl::OkStatus();
    return comm->enqueueAllReduceBf16(data, rows * hidden, st);
  };
  // Gemma 3's norm of a block's output (o, summed over the ranks) before the residual add;
  // nothing without one.
  auto postNorm = [&](const float* weight) -> absl::Status {
    if (weight == nullptr) return absl::OkStatus();
    return cuda::rmsNorm({.x = o,
                          .x_stride = hidden,
                          .weight = weight,
                          .rows = n,
                          .cols = hidden,
                          .eps = eps,
                          .out = o,
                          .out_stride = hidden},
                         st);
  };
  // Q and K each normed across all their heads (OLMo 2, MiniMax-M2). A rank holds some heads
  // of each row: its sums of squares, summed over the group, then the norm with those.
  auto normQkAcrossHeads = [&](const DeviceLayer& d) -> absl::Status {
    struct Part {
      bf16* x;
      const float* weight;
      int64_t cols, whole;
      float* squares;
    };
    const Part parts[] = {
        {qkv, d.q_norm, q_dim, int64_t{config.num_heads} * head_dim, qk_squares},
        {qkv + q_dim, d.k_norm, kv_dim, int64_t{config.num_kv_heads} * head_dim, qk_squares + n}};
    if (comm != nullptr) {
      for (const Part& p : parts) {
        CLEAVE_RETURN_IF_ERROR(cuda::rmsNorm(
            {.x = p.x, .x_stride = qkv_dim, .rows = n, .cols = p.cols, .squares_out = p.squares},
            st));
      }
      CLEAVE_RETURN_IF_ERROR(comm->enqueueAllReduceF32(qk_squares, 2 * n, st));
    }
    for (const Part& p : parts) {
      CLEAVE_RETURN_IF_ERROR(cuda::rmsNorm({.x = p.x,
                                            .x_stride = qkv_dim,
                                            .weight = p.weight,
                                            .rows = n,
                                            .cols = p.cols,
                                            .eps = eps,
                                            .out = p.x,
                                            .out_stride = qkv_dim,
                                            .squares = comm != nullptr ? p.squares : nullptr,
                                            .norm_cols = p.whole},
                                           st));
    }
    return absl::OkStatus();
  };
  // The MLP's activated gate rows of gu times its up rows, into act.
  auto activate = [&]() {
    return (gelu ? cuda::geluTanhMul : cuda::siluMul)(gu, gu + ffn, 2 * ffn, n, ffn, act, ffn, st);
  };
  if (comm == nullptr) {
    CLEAVE_RETURN_IF_ERROR(cuda::embed(ids(meta), n, embed, vocab, hidden, x, hidden, st));
  } else {
    CLEAVE_RETURN_IF_ERROR(
        cuda::embedShard(ids(meta), n, embed, vocab_begin, vocab_rows, hidden, x, hidden, st));
    CLEAVE_RETURN_IF_ERROR(reduce(x, n));
  }
  if (embedding_scale != 1.0f)  // Gemma: √hidden.
    CLEAVE_RETURN_IF_ERROR(cuda::scale(x, n * hidden, embedding_scale, st));
  CLEAVE_RETURN_IF_ERROR(cuda::rmsNorm({.x = x,
                                        .x_stride = hidden,
                                        .weight = layer[0].attn_norm,
                                        .rows = n,
                                        .cols = hidden,
                                        .eps = eps,
                                        .out = h,
                                        .out_stride = hidden},
                                       st));
  for (int64_t l = 0; l < layers; ++l) {
    const DeviceLayer& d = layer[l];
    // Gemma 3's sliding layers rotate with their own base.
    const bool local_rope =
        sliding_inv_freq != nullptr && config.attentionWindow(static_cast<uint32_t>(l)) > 0;
    if (linear_index[l] >= 0) {
      // Gated DeltaNet: one input projection, the convolution and the delta rule over each
      // sequence's state, then O.
      CLEAVE_RETURN_IF_ERROR(linear(h, hidden, d.lin_proj, nullptr, lin_projected));
      CLEAVE_RETURN_IF_ERROR(cuda::gatedDeltaNet(
          {.proj = lin_projected,
           .proj_stride = lin->proj_dim,
           .mixed = lin_mixed,
           .q_starts = qStarts(meta),
           .positions = positions(meta),
           .state_slots = stateSlots(meta),
           .row_slots = rowStates(meta),
           .states = states,
           .slot_floats = slot_floats,
           .layer_offset = linear_index[l] * lin->layer_floats,
           .conv = d.conv,
           .a_rate = d.a_rate,
           .dt_bias = d.dt_bias,
           .norm = d.lin_norm,
           .sequences = static_cast<int>(sequences),
           .key_heads = lin->key_heads,
           .value_heads = lin->value_heads,
           .key_head_dim = lin->dk,
           .value_head_dim = lin->dv,
           .conv_kernel = lin->taps,
           .eps = eps,
           .out = lin_out,
           .out_stride = lin->vd,
           // Split only a step of too few blocks to fill the GPU.
           .column_groups = decode || sequences * lin->value_heads >= 2 * multiprocessors
                                ? 1
                                : lin_column_groups,
           .raw = lin_raw,
           .tokens = static_cast<int>(n)},
          st));
      CLEAVE_RETURN_IF_ERROR(linear(lin_out, lin->vd, d.wo, nullptr, o));
    } else if (mla) {
      // Latent attention: Q (through its low rank), the latent row, the absorbed queries
      // (each head's no-rope part times its W_UKᵀ; the rope part rotated by the cache
      // write), attention over the latent, each head's result times its W_UV, then O.
      const int64_t q_in = q_low > 0 ? q_low : hidden;
      if (q_low > 0) {
        CLEAVE_RETURN_IF_ERROR(linear(h, hidden, d.q_a, nullptr, mla_q_low));
        CLEAVE_RETURN_IF_ERROR(cuda::rmsNorm({.x = mla_q_low,
                                              .x_stride = q_low,
                                              .weight = d.q_a_norm,
                                              .rows = n,
                                              .cols = q_low,
                                              .eps = eps,
                                              .out = mla_q_low,
                                              .out_stride = q_low},
                                             st));
      }
      CLEAVE_RETURN_IF_ERROR(linear(q_low > 0 ? mla_q_low : h, q_in, d.q_b, nullptr, mla_q));
      CLEAVE_RETURN_IF_ERROR(linear(h, hidden, d.kv_a, nullptr, mla_latent));
      // One batched product over the heads: head h's no-rope query times its W_UKᵀ.
      CLEAVE_RETURN_IF_ERROR(gemm->run({.x = mla_q,
                                        .x_stride = q_dim,
                                        .w = bf16Data(d.k_absorb),
                                        .tokens = n,
                                        .out = kv_lora,
                                        .in = nope,
                                        .y = mla_q_abs,
                                        .y_stride = heads * latent_row,
                                        .batch = static_cast<int>(heads),
                                        .x_batch = head_dim,
                                        .w_batch = kv_lora * nope,
                                        .y_batch = latent_row},
                                       st));
      CLEAVE_RETURN_IF_ERROR(
          cuda::mlaRopeKvWrite({.latent = mla_latent,
                                .latent_stride = latent_row,
                                .norm_weight = d.kv_a_norm,
                                .eps = eps,
                                .q = mla_q,
                                .q_stride = q_dim,
                                .positions = positions(meta),
                                .slots = slots(meta),
                                .inv_freq = inv_freq,
                                .attention_factor = rope_factor,
                                .tokens = n,
                                .heads = static_cast<int>(heads),
                                .nope = static_cast<int>(nope),
                                .kv_lora = static_cast<int>(kv_lora),
                                .rope = static_cast<int>(rope),
                                .block_size = static_cast<int>(options.block_size),
                                .layout = rope_layout,
                                .q_abs = mla_q_abs,
                                .q_abs_stride = heads * latent_row,
                                .cache = keys(kv_index[l]),
                                .kv_dtype = options.kv_dtype,
                                .kv_scale = d.k_scale},
                               st));
      CLEAVE_RETURN_IF_ERROR(
          cuda::mlaAttention(mla_plan,
                             {.q = mla_q_abs,
                              .q_stride = heads * latent_row,
                              .cache = keys(kv_index[l]),
                              .kv_dtype = options.kv_dtype,
                              .kv_scale = d.k_scale,
                              .positions = positions(meta),
                              .q_starts = qStarts(meta),
                              .block_tables = tables(meta),
                              .max_blocks_per_seq = static_cast<int>(max_blocks_per_seq),
                              .sequences = static_cast<int>(sequences),
                              .tokens = n,
                              .heads = static_cast<int>(heads),
                              .kv_lora = static_cast<int>(kv_lora),
                              .rope = static_cast<int>(rope),
                              .block_size = static_cast<int>(options.block_size),
                              .scale = mla_scale,
                              .out = mla_attended,
                              .out_stride = heads * kv_lora,
                              .workspace = attention_workspace},
                             st));
      CLEAVE_RETURN_IF_ERROR(gemm->run({.x = mla_attended,
                                        .x_stride = heads * kv_lora,
                                        .w = bf16Data(d.v_up),
                                        .tokens = n,
                                        .out = v_dim,
                                        .in = kv_lora,
                                        .y = attn,
                                        .y_stride = heads * v_dim,
                                        .batch = static_cast<int>(heads),
                                        .x_batch = kv_lora,
                                        .w_batch = v_dim * kv_lora,
                                        .y_batch = v_dim},
                                       st));
      CLEAVE_RETURN_IF_ERROR(linear(attn, heads * v_dim, d.wo, nullptr, o));
    } else {
      CLEAVE_RETURN_IF_ERROR(linear(h, hidden, d.wqkv, d.bqkv, qkv));
      if (traits.qk_norm && config.qk_norm_across_heads) {
        CLEAVE_RETURN_IF_ERROR(normQkAcrossHeads(d));
      } else if (traits.qk_norm) {
        CLEAVE_RETURN_IF_ERROR(cuda::rmsNorm({.x = qkv,
                                              .x_stride = qkv_dim,
                                              .weight = d.q_norm,
                                              .rows = n * heads,
                                              .cols = head_dim,
                                              .eps = eps,
                                              .out = qkv,
                                              .out_stride = qkv_dim,
                                              .group = heads},
                                             st));
        CLEAVE_RETURN_IF_ERROR(cuda::rmsNorm({.x = qkv + q_dim,
                                              .x_stride = qkv_dim,
                                              .weight = d.k_norm,
                                              .rows = n * kv_heads,
                                              .cols = head_dim,
                                              .eps = eps,
                                              .out = qkv + q_dim,
                                              .out_stride = qkv_dim,
                                              .group = kv_heads},
                                             st));
      }
      CLEAVE_RETURN_IF_ERROR(
          cuda::ropeKvWrite({.qkv = qkv,
                             .qkv_stride = qkv_dim,
                             .positions = positions(meta),
                             .slots = slots(meta),
                             .inv_freq = local_rope ? sliding_inv_freq : inv_freq,
                             .attention_factor = local_rope ? 1.0f : rope_factor,
                             .query_scale_beta = static_cast<float>(config.query_scale_beta),
                             .query_scale_period = static_cast<int>(config.query_scale_period),
                             .tokens = n,
                             .heads = static_cast<int>(heads),
                             .kv_heads = static_cast<int>(kv_heads),
                             .head_dim = static_cast<int>(head_dim),
                             .rotary_dim = static_cast<int>(rotary_dim),
                             .rotate = config.rotates(static_cast<uint32_t>(l)),
                             .block_size = static_cast<int>(options.block_size),
                             .layout = rope_layout,
                             .q_out = q,
                             .q_stride = q_dim,
                             .k_cache = keys(kv_index[l]),
                             .v_cache = values(kv_index[l]),
                             .kv_dtype = options.kv_dtype,
                             .k_scale = d.k_scale,
                             .v_scale = d.v_scale},
                            st));
      const AttentionPlans& plans = attention_plans[layer_plan[l]];
      if (decode) {
        CLEAVE_RETURN_IF_ERROR(
            cuda::runDecodeAttention(plans.decode,
                                     {.q = q,
                                      .q_stride = q_dim,
                                      .k_cache = keys(kv_index[l]),
                                      .v_cache = values(kv_index[l]),
                                      .k_scale = d.k_scale,
                                      .v_scale = d.v_scale,
                                      .block_tables = tables(meta),
                                      .max_blocks_per_seq = static_cast<int>(max_blocks_per_seq),
                                      .seq_lens = contexts(meta),
                                      .batch = static_cast<int>(sequences),
                                      .sinks = d.sinks,
                                      .out = attn,
                                      .out_stride = q_dim,
                                      .workspace = attention_workspace},
                                     st));
      } else {
        CLEAVE_RETURN_IF_ERROR(
            cuda::runPrefillAttention(plans.prefill,
                                      {.q = q,
                                       .q_stride = q_dim,
                                       .k_cache = keys(kv_index[l]),
                                       .v_cache = values(kv_index[l]),
                                       .k_scale = d.k_scale,
                                       .v_scale = d.v_scale,
                                       .block_tables = tables(meta),
                                       .max_blocks_per_seq = static_cast<int>(max_blocks_per_seq),
                                       .q_starts = qStarts(meta),
                                       .context_lens = contexts(meta),
                                       .sequences = static_cast<int>(sequences),
                                       .sinks = d.sinks,
                                       .out = attn,
                                       .out_stride = q_dim},
                                      st));
      }
      if (gated)  // Gated attention: each output value times σ of its gate.
        CLEAVE_RETURN_IF_ERROR(
            cuda::sigmoidGate(attn, q_dim, qkv + gate_offset, qkv_dim, n, q_dim, st));
      CLEAVE_RETURN_IF_ERROR(linear(attn, q_dim, d.wo, d.bo, o));
    }
    CLEAVE_RETURN_IF_ERROR(reduce(o, n));
    CLEAVE_RETURN_IF_ERROR(postNorm(d.post_attn_norm));
    // x += o; h = norm(x).
    CLEAVE_RETURN_IF_ERROR(cuda::rmsNorm({.x = o,
                                          .x_stride = hidden,
                                          .residual = x,
                                          .residual_stride = hidden,
                                          .x_scale = residual_scale,
                                          .weight = d.ffn_norm,
                                          .rows = n,
                                          .cols = hidden,
                                          .eps = eps,
                                          .out = h,
                                          .out_stride = hidden},
                                         st));
    if (is_moe[l]) {
      CLEAVE_RETURN_IF_ERROR(enqueueMoe(*moe, moe_layer[l], moe_ws, h, n, decode, o, *gemm, st));
    } else {
      if (d.wgu.format == cuda::ExpertWeightFormat::kBf16) {
        CLEAVE_RETURN_IF_ERROR(product(h, hidden, bf16Data(d.wgu), nullptr, 2 * ffn, gu));
        CLEAVE_RETURN_IF_ERROR(activate());
      } else if (gelu) {  // The skinny GEMM fuses SiLU only: its rows, then GELU.
        CLEAVE_RETURN_IF_ERROR(linear(h, hidden, d.wgu, nullptr, gu));
        CLEAVE_RETURN_IF_ERROR(activate());
      } else {
        CLEAVE_RETURN_IF_ERROR(cuda::runSkinnyGemm({.x = h,
                                                    .x_stride = hidden,
                                                    .rows = n,
                                                    .weights = d.wgu,
                                                    .silu_mul = true,
                                                    .y = act,
                                                    .y_stride = ffn,
                                                    .operands = options.operands,
                                                    .scratch = quantized,
                                                    .scratch_bytes = quantized_bytes},
                                                   st));
      }
      CLEAVE_RETURN_IF_ERROR(linear(act, ffn, d.wdown, nullptr, o));
    }
    CLEAVE_RETURN_IF_ERROR(reduce(o, n));
    CLEAVE_RETURN_IF_ERROR(postNorm(d.post_ffn_norm));
    const float* next_norm = l + 1 < layers ? layer[l + 1].attn_norm : output_norm;
    CLEAVE_RETURN_IF_ERROR(cuda::rmsNorm({.x = o,
                                          .x_stride = hidden,
                                          .residual = x,
                                          .residual_stride = hidden,
                                          .x_scale = residual_scale,
                                          .weight = next_norm,
                                          .rows = n,
                                          .cols = hidden,
                                          .eps = eps,
                                          .out = h,
                                          .out_stride = hidden},
                                         st));
  }
  // The rows of logits: each sequence's last row, or its last few (the norm is per row, so
  // normalizing all rows above and gathering now is the same as gathering first).
  CLEAVE_RETURN_IF_ERROR(cuda::embed(lastRows(meta), logit_rows, h, n, hidden, last, hidden, st));
  CLEAVE_RETURN_IF_ERROR(
      product(last, hidden, output, nullptr, vocab_rows, logits, true, logit_rows));
  if (logits_scale != 1.0f)  // Granite; elementwise too.
    CLEAVE_RETURN_IF_ERROR(cuda::scale(logits, logit_rows * vocab_rows, logits_scale, st));
  if (final_softcap > 0)  // Elementwise: on each rank's rows before the gather.
    CLEAVE_RETURN_IF_ERROR(cuda::softCap(logits, logit_rows * vocab_rows, final_softcap, st));
  if (comm == nullptr) return absl::OkStatus();
  std::vector<int64_t> counts;
  for (int64_t rows : rank_vocab_rows) counts.push_back(rows * logit_rows);
  return comm->enqueueAllGather(logits, counts, gathered, st);
}

// Runs a step, replaying (or capturing) the decode bucket's graph when graphs are on. A
// bucket whose capture fails runs eagerly from then on (slower by its launch overheads, not
// broken), and the log says why once.
absl::Status CudaLlamaModel::State::run(int64_t n, int64_t sequences, int64_t logit_rows,
                                        bool decode) {
  if (!decode || !options.cuda_graphs || eager.contains(sequences))
    return enqueue(n, sequences, logit_rows, decode);
  if (auto it = graphs.find(sequences); it != graphs.end())
    return cuda::cudaStatus(cudaGraphLaunch(it->second, stream), "replaying a decode graph");
  if (warmed.insert(sequences).second) return enqueue(n, sequences, sequences, decode);
  absl::StatusOr<cudaGraphExec_t> exec = capture(n, sequences);
  if (!exec.ok()) {
    cudaGetLastError();  // A failed capture's error is not sticky; a sticky one fails below.
    CLEAVE_LOG(WARNING) << "GPU " << options.device << ": decode steps of " << sequences
                        << " sequences run without a CUDA graph: " << exec.status();
    eager.insert(sequences);
    return enqueue(n, sequences, sequences, decode);
  }
  graphs.emplace(sequences, *exec);
  return cuda::cudaStatus(cudaGraphLaunch(*exec, stream), "launching a decode graph");
}

// Records a decode step of `sequences` rows into a graph (nothing runs).
absl::StatusOr<cudaGraphExec_t> CudaLlamaModel::State::capture(int64_t n, int64_t sequences) {
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capturing a decode step"));
  absl::Status enqueued = enqueue(n, sequences, sequences, true);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made =
      enqueued.ok() && ended == cudaSuccess ? cudaGraphInstantiate(&exec, graph, 0) : cudaSuccess;
  if (graph != nullptr) cudaGraphDestroy(graph);
  CLEAVE_RETURN_IF_ERROR(enqueued);
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(ended, "ending the decode capture"));
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(made, "instantiating a decode graph"));
  return exec;
}

absl::StatusOr<std::span<const float>> CudaLlamaModel::forward(
    std::span<const SequenceChunk> batch) {
  const std::vector<RowOutput> outputs(batch.size(), RowOutput{.logits = true});
  CLEAVE_ASSIGN_OR_RETURN(StepOutput out, forwardAndDraw(batch, outputs));
  return out.logits;
}

absl::StatusOr<StepOutput> CudaLlamaModel::forwardAndDraw(std::span<const SequenceChunk> batch,
                                                          std::span<const RowOutput> outputs) {
  State& s = *state_;
  if (outputs.size() != batch.size())
    return absl::InvalidArgumentError(absl::StrCat("a step of ", batch.size(), " sequences given ",
                                                   outputs.size(), " row outputs"));
  const int64_t bs = s.options.block_size;
  CLEAVE_RETURN_IF_ERROR(validateBatch(batch, static_cast<uint32_t>(s.vocab), bs, s.kv_blocks,
                                       s.lin ? s.state_slots : 0));
  if (logitRows(batch) > s.L())
    return absl::InvalidArgumentError(absl::StrCat("a step asks for ", logitRows(batch),
                                                   " rows of logits, past the model's ", s.L(),
                                                   " (max_logit_rows)"));
  const int64_t sequences = static_cast<int64_t>(batch.size());
  int64_t n = 0;
  bool decode = true;
  for (const SequenceChunk& chunk : batch) {
    n += static_cast<int64_t>(chunk.tokens.size());
    decode = decode && chunk.tokens.size() == 1;
    if (chunk.start + static_cast<int64_t>(chunk.tokens.size()) > s.options.max_context)
      return absl::InvalidArgumentError(
          absl::StrCat("a sequence reaches ", chunk.start + chunk.tokens.size(),
                       " positions, past max_context ", s.options.max_context));
  }
  if (n > s.options.max_step_tokens || sequences > s.options.max_sequences)
    return absl::InvalidArgumentError(absl::StrCat(
        "a step of ", n, " tokens in ", sequences, " sequences exceeds the model's bounds (",
        s.options.max_step_tokens, " tokens, ", s.options.max_sequences, " sequences)"));
  int64_t seen = 0;
  for (const RowOutput& out : outputs) {
    if (!out.draw) continue;
    seen += static_cast<int64_t>(out.draw->seen.size());
    if (out.draw->logprobs >= 0 && !out.draw->seen.empty())
      return absl::InvalidArgumentError(
          "a draw asks for log-probabilities of logits its penalties change");
  }
  if (seen > s.seen_capacity)
    return absl::InvalidArgumentError(
        absl::StrCat("the step's rows have seen ", seen, " tokens, past the model's room for ",
                     s.seen_capacity, " (max_sequences x max_context)"));
  if (s.comm != nullptr) CLEAVE_RETURN_IF_ERROR(s.comm->usable());
  auto out = s.step(batch, outputs, sequences, n, decode);
  // A rank that cannot finish its step would leave its peers in a collective forever.
  if (!out.ok() && s.comm != nullptr) s.comm->abortGroup();
  return out;
}

absl::StatusOr<StepOutput> CudaLlamaModel::State::step(std::span<const SequenceChunk> batch,
                                                       std::span<const RowOutput> outputs,
                                                       int64_t sequences, int64_t n, bool decode) {
  State& s = *this;
  const int64_t bs = s.options.block_size;
  // Decode graphs run a power-of-two batch; the padding rows decode token 0 at position 0
  // into the scratch block.
  const int64_t rows = decode && s.options.cuda_graphs ? nextPowerOfTwo(sequences) : sequences;
  const int64_t tokens = decode ? rows : n;
  int32_t* m = s.host_meta;
  const int32_t scratch = static_cast<int32_t>(s.kv_blocks);
  int64_t t = 0;
  int64_t logit_rows = 0;  // lastRows filled
  s.chunk_last_row.clear();
  s.qStarts(m)[0] = 0;
  for (int64_t q = 0; q < rows; ++q) {
    int32_t* table = s.tables(m) + q * s.max_blocks_per_seq;
    if (q >= sequences) {
      s.ids(m)[t] = 0;
      s.positions(m)[t] = 0;
      s.slots(m)[t] = static_cast<int32_t>(scratch * bs);
      s.contexts(m)[q] = 1;
      s.lastRows(m)[logit_rows++] = static_cast<int32_t>(t);
      // The padding rows' slot, shared: each is token 0 at position 0, so each resets it and
      // writes the same state there, which no sequence reads.
      s.stateSlots(m)[q] = static_cast<int32_t>(s.state_slots);
      s.rowStates(m)[t] = -1;
      std::fill(table, table + s.max_blocks_per_seq, scratch);
      ++t;
      s.qStarts(m)[q + 1] = static_cast<int32_t>(t);
      continue;
    }
    const SequenceChunk& chunk = batch[q];
    for (size_t i = 0; i < chunk.tokens.size(); ++i, ++t) {
      const int64_t pos = chunk.start + static_cast<int64_t>(i);
      s.ids(m)[t] = static_cast<int32_t>(chunk.tokens[i]);
      s.positions(m)[t] = static_cast<int32_t>(pos);
      s.slots(m)[t] = static_cast<int32_t>(chunk.blocks[pos / bs] * bs + pos % bs);
      s.rowStates(m)[t] = i < chunk.row_states.size() ? chunk.row_states[i] : -1;
    }
    s.qStarts(m)[q + 1] = static_cast<int32_t>(t);
    s.stateSlots(m)[q] = std::max(chunk.state, 0);
    s.contexts(m)[q] = static_cast<int32_t>(chunk.start + chunk.tokens.size());
    for (int64_t j = t - chunk.logits; j < t; ++j)
      s.lastRows(m)[logit_rows++] = static_cast<int32_t>(j);
    s.chunk_last_row.push_back(logit_rows - 1);
    const int64_t used = std::min<int64_t>(chunk.blocks.size(), s.max_blocks_per_seq);
    std::copy(chunk.blocks.begin(), chunk.blocks.begin() + used, table);
    std::fill(table + used, table + s.max_blocks_per_seq, scratch);
  }
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaSetDevice(s.options.device), "selecting the GPU"));
  s.step_logit_rows = logit_rows;
  s.hidden_copied = false;
  absl::Status ran = cuda::cudaStatus(
      cudaMemcpyAsync(s.meta, m, s.metaCount() * sizeof(int32_t), cudaMemcpyHostToDevice, s.stream),
      "copying step metadata");
  // Outside a decode graph's replay: the copies come before and after it on the stream.
  if (ran.ok()) ran = s.copyCheckpoints(batch, /*before=*/true);
  if (ran.ok()) ran = s.run(tokens, rows, logit_rows, decode);
  if (ran.ok()) ran = s.copyCheckpoints(batch, /*before=*/false);
  if (!ran.ok()) {
    // Nothing may still read the pinned metadata the next step writes.
    cudaStreamSynchronize(s.stream);
    return ran;
  }
  if (s.comm != nullptr && s.shard_rank != 0) {  // Rank 0 returns the group's results.
    CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaStreamSynchronize(s.stream), "running a step"));
    return StepOutput{};
  }
  auto results = s.results(outputs, sequences, rows, logit_rows);
  // A failed call leaves nothing in flight to the pinned buffers the next step writes.
  if (!results.ok()) cudaStreamSynchronize(s.stream);
  return results;
}

absl::Status CudaLlamaModel::State::copyCheckpoints(std::span<const SequenceChunk> batch,
                                                    bool before) {
  if (!lin) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(slot_floats) * sizeof(float);
  for (const SequenceChunk& chunk : batch) {
    const int32_t from = before ? chunk.state_from : chunk.state;
    const int32_t to = before ? chunk.state : chunk.state_to;
    if ((before ? chunk.state_from : chunk.state_to) < 0) continue;
    CLEAVE_RETURN_IF_ERROR(
        cuda::cudaStatus(cudaMemcpyAsync(states + to * slot_floats, states + from * slot_floats,
                                         bytes, cudaMemcpyDeviceToDevice, stream),
                         before ? "restoring a state checkpoint" : "saving a state checkpoint"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> CudaLlamaModel::State::results(std::span<const RowOutput> outputs,
                                                          int64_t sequences, int64_t rows,
                                                          int64_t logit_rows) {
  State& s = *this;
  Draws& h = s.host_draws;
  bool want_logits = false, draw = false, logprobs = false;
  int64_t seen = 0;  // Seen tokens of the penalized rows, row after row.
  for (int64_t q = 0; q < sequences; ++q) {
    const RowOutput& out = outputs[q];
    want_logits = want_logits || out.logits;
    draw = draw || out.draw.has_value();
    // A row drawn by no one is drawn greedily: cheap, and its token is not read.
    const DeviceDraw d = out.draw.value_or(DeviceDraw{});
    h.rows[q] = {.temperature = d.temperature,
                 .top_k = d.top_k,
                 .top_p = d.top_p,
                 .min_p = d.min_p,
                 .seed = d.seed,
                 .index = d.index};
    h.logprob_counts[q] = out.draw.has_value() ? d.logprobs : -1;
    logprobs = logprobs || h.logprob_counts[q] >= 0;
    h.penalties[q] = {.repetition = d.repetition_penalty,
                      .presence = d.presence_penalty,
                      .frequency = d.frequency_penalty,
                      .begin = static_cast<int32_t>(seen),
                      .size = static_cast<int32_t>(d.seen.size())};
    for (const SeenToken& t : d.seen)
      h.seen[seen++] = {.token = static_cast<int32_t>(t.token), .count = t.count};
  }
  // Some chunk has several rows of logits (drafts, a scored prompt): the host gets every row.
  const bool several = logit_rows > rows;
  if (!want_logits && !draw && !several) {  // Prompt chunks the host does not read.
    CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaStreamSynchronize(s.stream), "running a step"));
    return StepOutput{};
  }
  // Logits [logit rows][vocab]: under tensor parallelism the gathered ones are every rank's
  // [logit rows][its vocabulary rows] (logit rows = rows unless `several`), rank after rank,
  // put back in vocabulary order first.
  const int64_t host_rows = several ? logit_rows : want_logits ? sequences : 0;
  float* logits = s.logits;
  if (s.comm != nullptr) {
    CLEAVE_RETURN_IF_ERROR(cuda::joinColumnSlices(s.gathered, s.rank_vocab_rows, logit_rows,
                                                  several ? logit_rows : sequences, s.ordered,
                                                  s.stream));
    logits = s.ordered;
  }
  // The model's logits go back before the penalties change the drawn rows' in place.
  if (host_rows > 0) {
    CLEAVE_RETURN_IF_ERROR(
        cuda::cudaStatus(cudaMemcpyAsync(s.host_logits, logits, host_rows * s.vocab * sizeof(float),
                                         cudaMemcpyDeviceToHost, s.stream),
                         "copying logits"));
  }
  // Then each sequence's last row moves to row q (in order, so no row is overwritten before
  // it is read: a sequence's last row is at or past its index) for the draws below, which
  // come out as a step of one row per sequence would draw them.
  if (several && draw) {
    for (int64_t q = 0; q < sequences; ++q) {
      const int64_t from = chunk_last_row[q];
      if (from == q) continue;
      CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
          cudaMemcpyAsync(logits + q * s.vocab, logits + from * s.vocab, s.vocab * sizeof(float),
                          cudaMemcpyDeviceToDevice, s.stream),
          "gathering the drawn rows"));
    }
  }
  if (draw) {
    const Draws& d = s.draws;
    CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
        cudaMemcpyAsync(d.base, h.base, d.up_bytes, cudaMemcpyHostToDevice, s.stream),
        "copying the draws' settings"));
    if (seen > 0) {
      CLEAVE_RETURN_IF_ERROR(
          cuda::cudaStatus(cudaMemcpyAsync(d.seen, h.seen, seen * sizeof(cuda::SeenToken),
                                           cudaMemcpyHostToDevice, s.stream),
                           "copying the seen tokens"));
      CLEAVE_RETURN_IF_ERROR(
          cuda::applyPenalties(logits, s.vocab, sequences, s.vocab, d.penalties, d.seen, s.stream));
    }
    CLEAVE_RETURN_IF_ERROR(
        cuda::sampleTokens(logits, s.vocab, sequences, s.vocab, d.rows, d.drawn, s.stream));
    // Rows asking for log-probabilities have no penalties: their logits are the model's.
    if (logprobs)
      CLEAVE_RETURN_IF_ERROR(cuda::logSoftmaxAt(logits, s.vocab, sequences, s.vocab,
                                                d.logprob_counts, d.drawn, d.chosen, d.top,
                                                kMaxLogprobs, s.stream));
    CLEAVE_RETURN_IF_ERROR(
        cuda::cudaStatus(cudaMemcpyAsync(h.base + h.up_bytes, d.base + d.up_bytes, d.back_bytes,
                                         cudaMemcpyDeviceToHost, s.stream),
                         "copying the drawn tokens"));
  }
  CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(cudaStreamSynchronize(s.stream), "running a step"));
  StepOutput result;
  if (host_rows > 0) result.logits = std::span<const float>(s.host_logits, host_rows * s.vocab);
  if (draw) result.tokens = std::span<const int32_t>(h.drawn, sequences);
  if (logprobs) {
    result.logprobs = std::span<const float>(h.chosen, sequences);
    s.top_out.resize(sequences * kMaxLogprobs);
    for (int64_t i = 0; i < sequences * kMaxLogprobs; ++i)
      s.top_out[i] = {.token = h.top[i].token, .logprob = h.top[i].logprob};
    result.top = s.top_out;
  }
  return result;
}

bool CudaLlamaModel::multiRowLogits() const { return state_->multi_row_logits; }

std::span<const float> CudaLlamaModel::lastHidden() const {
  const State& s = *state_;
  if ((s.comm != nullptr && s.shard_rank != 0) || s.step_logit_rows == 0) return {};
  if (!s.hidden_copied) {
    // The step ended (forwardAndDraw synchronized its stream) before this copy reads `last`.
    const int64_t count = s.step_logit_rows * s.hidden;
    s.hidden_staged.resize(count);
    if (cudaSetDevice(s.options.device) != cudaSuccess ||
        cudaMemcpy(s.hidden_staged.data(), s.last, count * sizeof(bf16), cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
      CLEAVE_LOG(ERROR) << "GPU " << s.options.device << ": copying hidden states failed";
      return {};
    }
    s.hidden_out.resize(count);
    for (int64_t i = 0; i < count; ++i) s.hidden_out[i] = __bfloat162float(s.hidden_staged[i]);
    s.hidden_copied = true;
  }
  return s.hidden_out;
}

namespace {

// One rank's model, holding the group's communicators alive as long as any rank runs.
class CudaRankBackend final : public StepBackend {
 public:
  CudaRankBackend(std::shared_ptr<std::vector<std::unique_ptr<NcclCommunicator>>> group,
                  std::unique_ptr<CudaLlamaModel> model)
      : group_(std::move(group)), model_(std::move(model)) {}
  absl::StatusOr<std::span<const float>> forward(std::span<const SequenceChunk> batch) override {
    return model_->forward(batch);
  }
  absl::StatusOr<StepOutput> forwardAndDraw(std::span<const SequenceChunk> batch,
                                            std::span<const RowOutput> rows) override {
    return model_->forwardAndDraw(batch, rows);
  }
  absl::Status copyKv(KvCopy direction, std::span<const int32_t> blocks,
                      std::span<const int32_t> rows, KvStorage& host) override {
    return model_->copyKv(direction, blocks, rows, host);
  }
  absl::Status copyState(KvCopy direction, int32_t slot, KvStorage& host) override {
    return model_->copyState(direction, slot, host);
  }
  int64_t weightBytes() const override { return model_->weightBytes(); }
  int64_t routedExpertBytes() const override { return model_->routedExpertBytes(); }
  bool multiRowLogits() const override { return model_->multiRowLogits(); }
  bool rowStates() const override { return model_->rowStates(); }
  std::span<const float> lastHidden() const override { return model_->lastHidden(); }

 private:
  std::shared_ptr<std::vector<std::unique_ptr<NcclCommunicator>>> group_;  // Outlives model_.
  std::unique_ptr<CudaLlamaModel> model_;
};

}  // namespace

namespace {

// FailedPrecondition unless GPUs first..first + n - 1 exist.
absl::Status checkGpus(int first, int n) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  if (first + n <= gpus) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("--tp ", n, " on the GPU needs GPUs ", first,
                                                    "..", first + n - 1, "; this machine has ",
                                                    gpus));
}

// The longest sequence a worker's model is sized for: the checkpoint's own limit, else the
// options' (the memory estimate and the model it sizes must agree).
int64_t modelContext(const model::ModelConfig& config, const CudaModelOptions& base) {
  return config.max_position_embeddings > 0 ? config.max_position_embeddings : base.max_context;
}

}  // namespace

StepBackendFactory cudaStepBackend(const CudaModelOptions& base) {
  return [base](std::span<const LlamaWeights* const> ranks, int64_t num_blocks, int64_t block_size,
                int64_t state_slots) -> absl::StatusOr<std::vector<std::unique_ptr<StepBackend>>> {
    const int n = static_cast<int>(ranks.size());
    auto group = std::make_shared<std::vector<std::unique_ptr<NcclCommunicator>>>();
    if (n > 1) {
      CLEAVE_RETURN_IF_ERROR(checkGpus(base.device, n));
      std::vector<int> devices(n);
      for (int r = 0; r < n; ++r) devices[r] = base.device + r;
      CLEAVE_ASSIGN_OR_RETURN(*group, NcclCommunicator::createGroup(devices));
    }
    std::vector<std::unique_ptr<StepBackend>> backends;
    for (int r = 0; r < n; ++r) {
      const LlamaWeights& weights = *ranks[r];
      CudaModelOptions options = base;
      options.device = base.device + r;
      options.comm = n > 1 ? (*group)[r].get() : nullptr;
      options.kv_blocks = num_blocks;
      options.block_size = block_size;
      options.state_slots = state_slots;
      options.max_context =
          std::min<int64_t>(num_blocks * block_size, modelContext(weights.config, base));
      CLEAVE_ASSIGN_OR_RETURN(std::unique_ptr<CudaLlamaModel> model,
                              CudaLlamaModel::create(weights, options));
      backends.push_back(std::make_unique<CudaRankBackend>(group, std::move(model)));
    }
    return backends;
  };
}

BackendMemoryEstimator cudaBackendMemory(const CudaModelOptions& base) {
  return [base](std::span<const LlamaWeights* const> ranks,
                int64_t block_size) -> absl::StatusOr<std::vector<BackendMemory>> {
    CLEAVE_RETURN_IF_ERROR(checkGpus(base.device, static_cast<int>(ranks.size())));
    std::vector<BackendMemory> memory;
    for (size_t r = 0; r < ranks.size(); ++r) {
      CudaModelOptions options = base;
      options.device = base.device + static_cast<int>(r);
      options.block_size = block_size;
      options.max_context = modelContext(ranks[r]->config, base);
      CLEAVE_ASSIGN_OR_RETURN(BackendMemory m, CudaLlamaModel::estimate(*ranks[r], options));
      memory.push_back(m);
    }
    return memory;
  };
}

}  // namespace cleave::engine
