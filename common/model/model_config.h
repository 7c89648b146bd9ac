// The architecture of a model, read from a Hugging Face config.json or GGUF metadata into
// one ModelConfig that the engine, the router and the roofline tool share.
//
// Supported families: Llama (Llama 2/3, SmolLM2), Qwen2 (QKV bias), Qwen3 (q/k RMSNorm),
// and MoE: Mixtral, Qwen3-MoE, DeepSeek-V3 (sigmoid scoring with group-limited top-k,
// shared experts) with multi-head latent attention (MlaConfig), gpt-oss (attention sinks,
// sliding-window layers, biased experts with a clamped SwiGLU), GLM-4.5 (DeepSeek-V3's
// routing and shared experts on grouped-query attention with rotary embedding on half of
// each head), Gemma 3 (sandwich norms, GELU MLP, local and global layers with their own
// rotary bases), MiniMax-M2 (sigmoid routing with a correction bias; Q and K each normed
// across all their heads), OLMo 2 and 3 (norms after attention and the MLP only, Q and K
// normed across heads; OLMo 3's sliding layers with their own rotation), Granite 3 (Llama's
// graph with scaled embeddings, residual adds and logits, and its own softmax scale), Gemma 2
// (Gemma 3's graph with soft-capped attention scores), EXAONE 4.0 (OLMo's norms, unrotated
// global layers), GLM-4 (sandwich norms, adjacent-pair partial rotary), Qwen3.5 (Gated
// DeltaNet linear attention on most layers, gated attention on the others).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cleave::model {

class GgufFile;

enum class Architecture {
  kLlama,
  kQwen2,
  kQwen3,
  kMixtral,
  kQwen3Moe,
  kDeepseekV3,
  kGptOss,
  kPhi3,
  kGlm4Moe,
  kGemma3,
  kGemma2,
  kMiniMaxM2,
  kOlmo2,
  kGranite,
  kExaone4,
  kGlm4,
  kQwen35
};

const char* architectureName(Architecture arch);

struct RopeScaling {
  // "none", "linear", "dynamic", "llama3", "yarn" or "longrope".
  std::string type = "none";
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and yarn
  uint32_t original_max_position_embeddings = 0;
  // yarn. mscale and mscale_all_dim are 0 when the file does not give them.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  std::optional<double> attention_factor;
  bool truncate = true;  // Correction range rounded out to whole dimensions.
  // longrope (Phi-3's 128k variants, Phi-3.5-mini, Phi-4-mini): rotary pair i's frequency
  // divided by long_factor[i] when the served context (max_position_embeddings as the worker
  // runs it) is longer than original_max_position_embeddings, else by short_factor[i] — one
  // choice for every position, as vLLM and llama.cpp make it; attention_factor is always set
  // (from `factor`, or the model's context over the original, when the file gives none).
  std::vector<double> short_factor;
  std::vector<double> long_factor;
};

enum class MoeScoring { kSoftmax, kSigmoid };

// The gated MLP's activation of its gate rows: SiLU, or GELU's tanh approximation (Gemma's
// gelu_pytorch_tanh).
enum class MlpActivation { kSilu, kGeluTanh };

struct MoeConfig {
  uint32_t num_experts = 0;
  uint32_t experts_per_token = 0;
  uint32_t expert_intermediate_size = 0;
  // Renormalize the top-k weights to sum to one.
  bool norm_topk_prob = false;
  MoeScoring scoring = MoeScoring::kSoftmax;
  uint32_t shared_experts = 0;
  uint32_t shared_expert_intermediate_size = 0;  // Per shared expert.
  // Qwen3.5-MoE: the shared expert's output times sigmoid(x · shared_expert_gate), a learned
  // gate of each token's input.
  bool shared_expert_gate = false;
  // Group-limited routing (DeepSeek-V3): pick topk_group of n_group groups first.
  uint32_t n_group = 1;
  uint32_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  // Scores get a learned per-expert bias before top-k (DeepSeek-V3 "noaux_tc").
  bool score_correction_bias = false;
  // Layers [0, first_k_dense) use a dense MLP.
  uint32_t first_k_dense = 0;
  // Every `sparse_step`-th layer is MoE (Qwen3-MoE decoder_sparse_step); others dense.
  uint32_t sparse_step = 1;
  std::vector<uint32_t> dense_layers;  // Qwen3-MoE mlp_only_layers.
  // gpt-oss: the router and every expert projection have biases, and an expert's
  // activation is a clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
  // out = (u + 1) * g * sigmoid(alpha * g). swiglu_limit 0: SiLU(gate) * up.
  bool router_bias = false;
  bool expert_bias = false;
  double swiglu_limit = 0.0;
  double swiglu_alpha = 1.702;
};

// Multi-head latent attention (DeepSeek-V2/V3): every position caches one latent row,
// kv_lora_rank normalized values and qk_rope_head_dim rotated key values, shared by all
// heads; the heads' keys and values are that latent times kv_b_proj.
struct MlaConfig {
  uint32_t q_lora_rank = 0;  // 0: no low-rank Q.
  uint32_t kv_lora_rank = 0;
  uint32_t qk_nope_head_dim = 0;
  uint32_t qk_rope_head_dim = 0;
  uint32_t v_head_dim = 0;
  // The rotary dimensions pair as (x[2i], x[2i+1]) (rope_interleave, DeepSeek's default)
  // rather than as halves.
  bool rope_interleave = true;
};

// Gated DeltaNet linear attention (Qwen3.5): a layer keeps, per sequence, a fixed-size
// state instead of KV rows. Its input projection gives each token queries and keys
// (key_heads of key_head_dim), values (value_heads of value_head_dim), an output gate z
// (as wide as the values), and per value head a write strength b and a decay input a. The
// queries, keys and values pass a causal depthwise convolution of conv_kernel taps (each
// sequence keeps its last conv_kernel - 1 inputs) and SiLU; queries and keys are L2-normed
// and each value head's state S [key_head_dim, value_head_dim] (value head h reads key head
// h / (value_heads / key_heads)) is updated per token as
//   S = exp(g)·S;  S += k ⊗ β(v − Sᵀk);  out = Sᵀq / √key_head_dim
// with β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias); each head's out is RMS-normed
// (its own weights), times SiLU(z), and projected back to the hidden size.
struct LinearAttentionConfig {
  uint32_t key_heads = 0;
  uint32_t value_heads = 0;  // A multiple of key_heads.
  uint32_t key_head_dim = 0;
  uint32_t value_head_dim = 0;
  uint32_t conv_kernel = 4;
  // Qwen3-Next's projections: in_proj_qkvz holds each key head's query, key, values and z
  // together (grouped_qkvz), in_proj_ba each key head's value heads' b, then a (grouped_ba),
  // rather than Qwen3.5's one matrix per kind. llama.cpp's qwen3next files split the first
  // into Qwen3.5's matrices but keep the second.
  bool grouped_qkvz = false;
  bool grouped_ba = false;
  // llama.cpp's Qwen3.5 files order the value heads tiled ([value head 0 of every key head,
  // then value head 1 of every key head, ...]) rather than grouped by key head: value head h
  // reads key head h % key_heads, not h / (value_heads / key_heads).
  bool tiled_value_heads = false;
  // layers[l]: layer l is a linear-attention layer (config.json layer_types
  // "linear_attention"); the others attend over the KV cache.
  std::vector<bool> layers;
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string model_type;  // As the file names it ("llama", "qwen3_moe", GGUF "qwen3moe").
  uint32_t hidden_size = 0;
  uint32_t intermediate_size = 0;  // Dense MLP.
  uint32_t num_layers = 0;
  uint32_t num_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t vocab_size = 0;
  uint32_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // The leading dimensions of each query and key head that rotate (partial_rotary_factor ·
  // head_dim: GLM-4.5's half); 0: all of head_dim. The rest pass through unrotated.
  uint32_t rotary_dim = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // Q/K/V projections have biases (Qwen2).
  bool qk_norm = false;         // RMSNorm on Q and K per head (Qwen3).
  // With qk_norm: one RMSNorm over all of a token's query heads (num_heads · head_dim weights)
  // and one over all its key heads, as OLMo 2 and MiniMax-M2 norm them, rather than per head.
  bool qk_norm_across_heads = false;
  bool o_bias = false;  // The output projection has a bias too (gpt-oss).
  // Gemma 3: the embeddings times embedding_scale (√hidden_size); a norm after attention and
  // after the MLP (post_norms) as well as before them (pre_norms; OLMo 2 has the post norms
  // only, and its residual stream enters attention and the MLP as it is); the MLP's gate through
  // mlp_activation; a softmax scale of attention_scale (query_pre_attn_scalar^-½; 0 keeps
  // 1/√head_dim); sliding layers rotating with base sliding_rope_theta and no scaling (0: as
  // the other layers); the logits soft-capped to ±final_logit_softcap (cap · tanh(x / cap);
  // 0: none).
  double embedding_scale = 1.0;
  bool pre_norms = true;
  bool post_norms = false;
  MlpActivation mlp_activation = MlpActivation::kSilu;
  double attention_scale = 0.0;
  double sliding_rope_theta = 0.0;
  double final_logit_softcap = 0.0;
  // Gemma 2: each attention score soft-capped to ±attention_softcap before the softmax; 0: none.
  double attention_softcap = 0.0;
  // Granite: each attention and MLP output times residual_scale before the residual stream
  // adds it (residual_multiplier), and the logits divided by logits_scaling.
  double residual_scale = 1.0;
  double logits_scaling = 1.0;
  // Ministral 3 (Llama 4's attention temperature): each query, after its rotation, times
  // 1 + query_scale_beta · ln(1 + ⌊position / query_scale_period⌋) — 1 within the original
  // context, growing past it. 0: none.
  double query_scale_beta = 0.0;
  uint32_t query_scale_period = 0;
  // The query's factor at `position`.
  double queryScale(int64_t position) const;
  // Layers whose queries and keys are not rotated (SmolLM3's every fourth: "NoPE"); empty:
  // every layer rotates.
  std::vector<bool> nope_layers;
  bool rotates(uint32_t layer) const { return layer >= nope_layers.size() || !nope_layers[layer]; }
  // A learned logit per query head joins each softmax's denominator (gpt-oss "sinks").
  bool attention_sinks = false;
  // Layers with sliding_layers[l] set attend to their last sliding_window positions only
  // (gpt-oss: every other layer); empty: every layer attends to the whole context.
  uint32_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  std::optional<uint32_t> bos_token_id;
  // Where generation stops: config.json's eos_token_id and generation_config.json's (end of
  // turn); in a GGUF file the EOS, EOT and EOM ids.
  std::vector<uint32_t> eos_token_ids;
  std::optional<MoeConfig> moe;
  std::optional<MlaConfig> mla;
  std::optional<LinearAttentionConfig> linear_attention;
  // Qwen3.5's gated attention: the query projection gives each head its queries and then as
  // many gate values; the attention output times sigmoid(gate) before the O projection.
  bool attention_output_gate = false;
  // The file it came from.
  std::string source;

  // True when layer `layer` uses the MoE block.
  bool isMoeLayer(uint32_t layer) const;
  // The positions layer `layer` attends to, itself included; 0: all.
  uint32_t attentionWindow(uint32_t layer) const;
  // True when layer `layer` is a linear-attention layer (no KV rows).
  bool isLinearLayer(uint32_t layer) const {
    return linear_attention && layer < linear_attention->layers.size() &&
           linear_attention->layers[layer];
  }
  // Layers that keep KV rows (all but the linear-attention ones), and layer `layer`'s index
  // among them (for a layer that keeps them).
  uint32_t kvLayers() const;
  uint32_t kvLayer(uint32_t layer) const;
  // Linear-attention layers, and layer `layer`'s index among them.
  uint32_t linearLayers() const { return num_layers - kvLayers(); }
  uint32_t linearLayer(uint32_t layer) const { return layer - kvLayer(layer); }
};

// What one position leaves in one layer's KV cache: `parts` tensors of `heads` rows of
// `head_dim` elements. Multi-head attention keeps keys and values (2 parts of
// num_kv_heads rows of head_dim); MLA keeps one latent row of kv_lora_rank +
// qk_rope_head_dim that serves as keys and, in its first kv_lora_rank elements, as values
// (1 part), and every tensor-parallel rank holds all of it (`replicated`).
struct KvCacheShape {
  int parts = 2;
  uint32_t heads = 0;
  uint32_t head_dim = 0;
  bool replicated = false;
};
KvCacheShape kvCacheShape(const ModelConfig& config);

// Parses config.json text; `name` names the file in errors.
absl::StatusOr<ModelConfig> parseConfigJson(absl::string_view json, const std::string& name);
absl::StatusOr<ModelConfig> configFromGguf(const GgufFile& file);
// `path`: a .gguf file, a config.json, or a folder holding config.json.
absl::StatusOr<ModelConfig> loadModelConfig(const std::string& path);

}  // namespace cleave::model
