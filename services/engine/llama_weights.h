// Weights of a Llama-family model (Llama 2/3, SmolLM2, Qwen2, Qwen3; the MoE families,
// DeepSeek-V3 with its latent attention) in the CPU backend's layout, loaded
// from a GGUF file or a Hugging Face folder (config.json + safetensors). Matrices become
// CpuMatrix (quantized ones repacked once); norms become float vectors. The source file
// stays mapped: the embedding table is read from it in place.
//
// Loaded for one rank of a tensor-parallel group, the weights are that rank's shard
// (tensor_parallel.h): the shapes in the comments below are then the rank's slices.
//
// Threading: immutable after load.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/gguf_file.h"
#include "common/model/model_config.h"
#include "common/model/safetensors_file.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope.h"
#include "services/engine/gated_delta_net.h"
#include "services/engine/mla_attention.h"
#include "services/engine/moe_block.h"
#include "services/engine/tensor_parallel.h"
#include "services/roofline/roofline.h"

namespace cleave::engine {

// What a layer's matrix computes (LlamaLayer::forEachMatrix).
enum class MatrixKind {
  kAttention,     // Q, K, V, O, and MLA's projections.
  kMlp,           // A dense MLP, or the always-on shared experts.
  kRoutedExpert,  // One of the experts a MoE router chooses among.
  kRouter,
};

struct LlamaLayer {
  std::vector<float> attn_norm;  // [hidden]
  cpu::CpuMatrix wq;  // [heads * head_dim, hidden]; gated attention: each head's gate rows after
                      // its query rows ([heads * 2 * head_dim, hidden])
  cpu::CpuMatrix wk;  // [kv_heads * head_dim, hidden]
  cpu::CpuMatrix wv;  // [kv_heads * head_dim, hidden]
  cpu::CpuMatrix wo;  // [hidden, heads * head_dim] (MLA: heads * v_head_dim)
  // Multi-head latent attention models: these instead of wq, wk and wv.
  std::optional<MlaWeights> mla;
  // Linear-attention layers: these instead of attention (wq, wk, wv and wo empty).
  std::optional<GatedDeltaNetWeights> linear;
  // Qwen2: biases of the Q/K/V projections (empty when the model has none).
  std::vector<float> bq, bk, bv;
  // gpt-oss: the O projection's bias ([hidden]; held by the rank with the first heads, whose
  // partial sum it joins, and empty elsewhere) and each query head's attention sink logit
  // ([heads]).
  std::vector<float> bo, sinks;
  // Qwen3: RMSNorm weights applied to each Q and K head before RoPE ([head_dim]; empty when
  // the model has none).
  std::vector<float> q_norm, k_norm;
  // An e4m3 KV cache holds keys / k_scale and values / v_scale (the checkpoint's calibrated
  // scales, self_attn.k_scale and v_scale; 1 without them). Other cache types ignore them.
  float k_scale = 1.0f, v_scale = 1.0f;
  std::vector<float> ffn_norm;  // [hidden]
  // Gemma 3: norms of the attention's and the MLP's outputs before their residual adds
  // ([hidden]; empty in models without them).
  std::vector<float> post_attn_norm, post_ffn_norm;
  cpu::CpuMatrix w_gate;  // [intermediate, hidden]
  cpu::CpuMatrix w_up;    // [intermediate, hidden]
  cpu::CpuMatrix w_down;  // [hidden, intermediate]
  // Set on mixture-of-experts layers instead of the dense MLP above.
  std::optional<MoeBlock> moe;
  int64_t bytes() const;  // Of the weights as kept.
  // Calls fn on every matrix the layer holds (those a dense or MLA layer leaves empty too).
  void forEachMatrix(const std::function<void(MatrixKind, const cpu::CpuMatrix&)>& fn) const;
};

// Rows [row_begin, row_begin + rows) of the embedding table in their stored format.
struct EmbeddingTable {
  model::TensorType type = model::TensorType::kF32;
  const uint8_t* data = nullptr;  // Row row_begin.
  int64_t row_begin = 0;
  int64_t rows = 0;  // vocab
  int64_t cols = 0;  // hidden
  int64_t rowBytes() const { return *model::tensorBytes(type, cols); }
};

struct LlamaWeights {
  model::ModelConfig config;  // The whole model's.
  ShardDims dims;             // This rank's slices.
  cpu::RopePairing rope_pairing = cpu::RopePairing::kAdjacent;
  // The mapped source; one of the two is set. Keeps the embedding table readable.
  std::unique_ptr<model::GgufFile> gguf;
  std::unique_ptr<model::SafetensorsCheckpoint> safetensors;
  EmbeddingTable token_embd;  // [vocab, hidden]
  std::vector<LlamaLayer> layers;
  std::vector<float> output_norm;  // [hidden]
  cpu::CpuMatrix output;           // [vocab, hidden]; the embedding table when tied.
  // The checkpoint's activations are meant to be quantized too
  // (model::QuantizationInfo::activations_quantized); GGUF files: no.
  bool activations_quantized = false;
  // Bytes a decode step streams for the weights (all matrices + norms + one embedding row).
  int64_t weightBytes() const;
  // Of those, the routed experts' (every expert of every MoE layer this rank holds): a step
  // reads only the experts its tokens chose.
  int64_t routedExpertBytes() const;
  // Of each kind of product, the share of parameters multiplied as floats rather than int8
  // (0 for a kind the model lacks), for their compute floor.
  roofline::Workload::FloatProducts floatProducts() const;
  // Whether any product runs on the int8 kernels.
  bool multipliesInt8() const;
  // Whether any product runs on the bf16 dot kernel (BF16 weights; CpuMatrix::multipliesBf16):
  // then the roofline prices every float product at the bf16 peak, a lower bound for all.
  bool multipliesBf16() const;
};

// Loads rank `shard` of a Llama-family model from `path`: a GGUF file, or a folder with
// config.json and safetensors. Errors name the file and the tensor that is missing or
// misshapen, or the dimension that cannot be split shard.size ways.
// Called after each layer is loaded with the bytes of that layer's weights (as kept).
using LayerLoaded = std::function<void(int64_t bytes)>;
absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlama(const std::string& path, TpShard shard = {},
                                                        const LayerLoaded& on_layer = {});
absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlamaGguf(const std::string& path,
                                                            TpShard shard = {},
                                                            const LayerLoaded& on_layer = {});
absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlamaSafetensors(
    const std::string& folder, TpShard shard = {}, const LayerLoaded& on_layer = {});

// The MoE block of `layer` of a Hugging Face checkpoint (Mixtral, Qwen3-MoE or DeepSeek-V3
// naming), for running one block on its own.
absl::StatusOr<MoeBlock> loadMoeBlock(const model::SafetensorsCheckpoint& checkpoint,
                                      const model::ModelConfig& config, uint32_t layer);

}  // namespace cleave::engine
