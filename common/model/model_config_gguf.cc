// GGUF metadata (llama.cpp's keys) into a ModelConfig.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/gguf_file.h"
#include "common/model/model_config.h"
#include "common/model/model_config_internal.h"
#include "common/status_macros.h"

namespace cleave::model {

namespace {

// A 1-D float32 tensor of rope factors (llama.cpp's rope_factors_*), as doubles.
absl::StatusOr<std::vector<double>> ropeFactors(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.findTensor(name);
  if (t == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", name, " is missing"));
  if (t->type != TensorType::kF32 || t->dims.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": ", name, " must be a 1-D float32 tensor"));
  }
  std::vector<double> out(t->num_elements);
  for (size_t i = 0; i < out.size(); ++i) {
    float v;
    std::memcpy(&v, t->data + 4 * i, 4);
    out[i] = v;
  }
  return out;
}

}  // namespace

absl::StatusOr<ModelConfig> configFromGguf(const GgufFile& file) {
  ModelConfig c;
  c.source = file.path();
  CLEAVE_ASSIGN_OR_RETURN(c.model_type, file.getString("general.architecture"));
  const ArchName* arch = nullptr;
  for (const ArchName& a : architectures()) {
    if (arch == nullptr && c.model_type == a.gguf) arch = &a;
  }
  if (arch == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": general.architecture \"", c.model_type,
                     "\" is not supported (supported: llama, qwen2, qwen3, "
                     "qwen3moe, deepseek2, gpt-oss, phi3, glm4moe, gemma3, smollm3, granite, "
                     "minimax-m2, olmo2, glm4, gemma2, qwen35, qwen35moe)"));
  }
  c.architecture = arch->arch;
  const std::string p = c.model_type + ".";
  auto u32 = [&](const std::string& key) -> absl::StatusOr<uint32_t> {
    CLEAVE_ASSIGN_OR_RETURN(uint64_t v, file.getUint(p + key));
    if (v > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": metadata \"", p, key, "\" is too large"));
    }
    return static_cast<uint32_t>(v);
  };
  auto u32Or = [&](const std::string& key, uint32_t fallback) -> absl::StatusOr<uint32_t> {
    if (file.find(p + key) == nullptr) return fallback;
    return u32(key);
  };
  auto f64Or = [&](const std::string& key, double fallback) -> absl::StatusOr<double> {
    if (file.find(p + key) == nullptr) return fallback;
    return file.getFloat(p + key);
  };
  CLEAVE_ASSIGN_OR_RETURN(c.num_layers, u32("block_count"));
  // GLM-4.5's files count its multi-token-prediction layers (after the others) in
  // block_count; they are not run.
  CLEAVE_ASSIGN_OR_RETURN(uint32_t nextn, u32Or("nextn_predict_layers", 0));
  if (nextn >= c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", p, "nextn_predict_layers ",
                                                   nextn, " must be below ", p, "block_count ",
                                                   c.num_layers));
  }
  c.num_layers -= nextn;
  CLEAVE_ASSIGN_OR_RETURN(c.max_position_embeddings, u32("context_length"));
  CLEAVE_ASSIGN_OR_RETURN(c.hidden_size, u32("embedding_length"));
  CLEAVE_ASSIGN_OR_RETURN(c.intermediate_size, u32Or("feed_forward_length", 0));
  CLEAVE_ASSIGN_OR_RETURN(c.num_heads, u32("attention.head_count"));
  CLEAVE_ASSIGN_OR_RETURN(c.num_kv_heads, u32Or("attention.head_count_kv", c.num_heads));
  if (c.num_heads == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": ", p, "attention.head_count must be positive"));
  }
  CLEAVE_ASSIGN_OR_RETURN(c.head_dim, u32Or("attention.key_length", c.hidden_size / c.num_heads));
  CLEAVE_ASSIGN_OR_RETURN(c.rms_norm_eps, f64Or("attention.layer_norm_rms_epsilon", 1e-6));
  CLEAVE_ASSIGN_OR_RETURN(c.rope_theta, f64Or("rope.freq_base", 10000.0));
  if (file.find(p + "vocab_size") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(c.vocab_size, u32("vocab_size"));
  } else if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<uint32_t>(tokens->array_size);
  }
  if (file.find(p + "rope.scaling.type") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(c.rope_scaling.type, file.getString(p + "rope.scaling.type"));
    if (c.rope_scaling.type != "none" && c.rope_scaling.type != "linear" &&
        c.rope_scaling.type != "yarn") {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", p, "rope.scaling.type \"",
                                                     c.rope_scaling.type, "\" is not supported"));
    }
    CLEAVE_ASSIGN_OR_RETURN(c.rope_scaling.factor, f64Or("rope.scaling.factor", 1.0));
    CLEAVE_ASSIGN_OR_RETURN(c.rope_scaling.original_max_position_embeddings,
                            u32Or("rope.scaling.original_context_length", 0));
  }
  c.tie_word_embeddings = file.findTensor("output.weight") == nullptr;
  c.attention_bias = file.findTensor("blk.0.attn_q.bias") != nullptr;
  c.o_bias = file.findTensor("blk.0.attn_output.bias") != nullptr;
  c.qk_norm = file.findTensor("blk.0.attn_q_norm.weight") != nullptr;
  if (file.find("tokenizer.ggml.bos_token_id") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(uint64_t bos, file.getUint("tokenizer.ggml.bos_token_id"));
    c.bos_token_id = static_cast<uint32_t>(bos);
  }
  // End of sequence, and llama.cpp's end-of-turn and end-of-message tokens.
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
    if (file.find(key) == nullptr) continue;
    CLEAVE_ASSIGN_OR_RETURN(uint64_t id, file.getUint(key));
    if (id > UINT32_MAX)
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", key, " is too large"));
    addStopId(c, static_cast<uint32_t>(id));
  }
  CLEAVE_ASSIGN_OR_RETURN(uint32_t experts, u32Or("expert_count", 0));
  if (experts > 0) {
    MoeConfig moe;
    moe.num_experts = experts;
    CLEAVE_ASSIGN_OR_RETURN(moe.experts_per_token, u32("expert_used_count"));
    CLEAVE_ASSIGN_OR_RETURN(moe.expert_intermediate_size,
                            u32Or("expert_feed_forward_length", c.intermediate_size));
    CLEAVE_ASSIGN_OR_RETURN(moe.shared_experts, u32Or("expert_shared_count", 0));
    moe.shared_expert_intermediate_size = moe.expert_intermediate_size;
    CLEAVE_ASSIGN_OR_RETURN(moe.routed_scaling_factor, f64Or("expert_weights_scale", 1.0));
    CLEAVE_ASSIGN_OR_RETURN(moe.first_k_dense, u32Or("leading_dense_block_count", 0));
    CLEAVE_ASSIGN_OR_RETURN(moe.n_group, u32Or("expert_group_count", 1));
    CLEAVE_ASSIGN_OR_RETURN(moe.topk_group, u32Or("expert_group_used_count", 1));
    CLEAVE_ASSIGN_OR_RETURN(uint32_t gating, u32Or("expert_gating_func", 1));
    moe.scoring = gating == 2 ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
    if (file.find(p + "expert_weights_norm") != nullptr) {
      CLEAVE_ASSIGN_OR_RETURN(moe.norm_topk_prob, file.getBool(p + "expert_weights_norm"));
    } else {
      // As llama.cpp reads such files: Mixtral ("llama") and Qwen3-MoE renormalize their top k.
      moe.norm_topk_prob = c.architecture == Architecture::kLlama ||
                           c.architecture == Architecture::kQwen3Moe ||
                           c.architecture == Architecture::kQwen35;
    }
    moe.score_correction_bias = file.findTensor("blk." + std::to_string(moe.first_k_dense) +
                                                ".exp_probs_b.bias") != nullptr;
    if (moe.experts_per_token == 0 || moe.experts_per_token > moe.num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": ", p, "expert_used_count must be in 1..", moe.num_experts));
    }
    if (moe.n_group == 0 || moe.num_experts % moe.n_group != 0 || moe.topk_group == 0 ||
        moe.topk_group > moe.n_group) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": ", p, "expert_group_count must divide expert_count (", moe.num_experts,
          ") and ", p, "expert_group_used_count be in 1..expert_group_count"));
    }
    if (moe.scoring == MoeScoring::kSoftmax && moe.topk_group < moe.n_group) {
      return absl::UnimplementedError(absl::StrCat(
          file.path(), ": ", p,
          "expert_group_used_count below expert_group_count with softmax gating (DeepSeek-V2's "
          "group_limited_greedy) is not supported"));
    }
    if (c.architecture == Architecture::kMiniMaxM2) {
      // llama.cpp's minimax-m2: sigmoid scores unless expert_gating_func says otherwise, the
      // top k renormalized (no key says so).
      if (file.find(p + "expert_gating_func") == nullptr) moe.scoring = MoeScoring::kSigmoid;
      moe.norm_topk_prob = true;
    }
    if (c.architecture == Architecture::kLlama) c.architecture = Architecture::kMixtral;
    if (c.architecture == Architecture::kGptOss) {
      // llama.cpp's gpt-oss: softmax over the top-k logits, biases, and the clamped SwiGLU
      // with its fixed limit and gain (no keys for them).
      moe.norm_topk_prob = true;
      moe.router_bias = moe.expert_bias = true;
      moe.swiglu_limit = 7.0;
      moe.swiglu_alpha = 1.702;
    }
    c.moe = moe;
  }
  if (c.architecture == Architecture::kGptOss) {
    // Sliding windows on the even layers (llama.cpp's pattern of 2), sinks, O's bias, and
    // YaRN as gpt-oss was trained with it (not truncated).
    c.attention_sinks = true;
    CLEAVE_ASSIGN_OR_RETURN(c.sliding_window, u32Or("attention.sliding_window", 0));
    if (c.sliding_window > 0) {
      c.sliding_layers.assign(c.num_layers, false);
      for (uint32_t l = 0; l < c.num_layers; l += 2) c.sliding_layers[l] = true;
    }
    c.rope_scaling.truncate = false;
  }
  if (c.model_type == "smollm3") {
    // No key states the NoPE layers: llama.cpp takes every fourth, as the checkpoints have them.
    c.nope_layers.assign(c.num_layers, false);
    for (uint32_t l = 3; l < c.num_layers; l += 4) c.nope_layers[l] = true;
  }
  if (c.architecture == Architecture::kPhi3) {
    // A window on every layer, as transformers applies Phi-3's sliding_window (llama.cpp
    // turns it off for Phi-3 files; the model was trained with it).
    CLEAVE_ASSIGN_OR_RETURN(c.sliding_window, u32Or("attention.sliding_window", 0));
    if (c.sliding_window > 0) c.sliding_layers.assign(c.num_layers, true);
    if (file.findTensor("blk.0.attn_qkv.bias") != nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          file.path(), ": blk.0.attn_qkv.bias (a bias on Phi-3's fused QKV) is not supported"));
    }
    if (file.findTensor("rope_factors_long.weight") != nullptr) {
      // longrope, as llama.cpp's converter writes it: the factors as tensors, the pretraining
      // context and the attention factor as keys.
      c.rope_scaling = RopeScaling();
      c.rope_scaling.type = "longrope";
      CLEAVE_ASSIGN_OR_RETURN(c.rope_scaling.short_factor,
                              ropeFactors(file, "rope_factors_short.weight"));
      CLEAVE_ASSIGN_OR_RETURN(c.rope_scaling.long_factor,
                              ropeFactors(file, "rope_factors_long.weight"));
      CLEAVE_ASSIGN_OR_RETURN(uint32_t original, u32Or("rope.scaling.original_context_length", 0));
      if (file.find(p + "rope.scaling.attn_factor") != nullptr) {
        CLEAVE_ASSIGN_OR_RETURN(c.rope_scaling.attention_factor,
                                file.getFloat(p + "rope.scaling.attn_factor"));
      }
      finishLongrope(original, std::nullopt, c);
    }
  }
  if (c.architecture == Architecture::kGlm4)
    c.post_norms = true;  // post_attention_norm, post_ffw_norm
  if (c.architecture == Architecture::kGemma3 || c.architecture == Architecture::kGemma2) {
    // As llama.cpp runs gemma2 and gemma3 files (whose norm weights hold 1 + w already):
    // Gemma 3 every sixth layer global, the others sliding with base 10000 and no rope
    // scaling; Gemma 2 every other layer sliding (the even ones), one rotation, the attention
    // scores soft-capped. The 27B models (Gemma 3: 62 layers, Gemma 2: 46) scale their queries
    // by hidden / heads (their query_pre_attn_scalar, which the files do not state), the
    // others by head_dim.
    const bool gemma3 = c.architecture == Architecture::kGemma3;
    c.embedding_scale = std::sqrt(static_cast<double>(c.hidden_size));
    c.post_norms = true;
    c.mlp_activation = MlpActivation::kGeluTanh;
    const bool large = c.num_layers == (gemma3 ? 62u : 46u);
    c.attention_scale =
        1.0 / std::sqrt(static_cast<double>(large ? c.hidden_size / c.num_heads : c.head_dim));
    if (gemma3) c.sliding_rope_theta = 10000.0;
    CLEAVE_ASSIGN_OR_RETURN(c.final_logit_softcap, f64Or("final_logit_softcapping", 0.0));
    CLEAVE_ASSIGN_OR_RETURN(c.attention_softcap, f64Or("attn_logit_softcapping", 0.0));
    if (c.final_logit_softcap < 0 || c.attention_softcap < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": ", p, "final_logit_softcapping and ", p,
                       "attn_logit_softcapping must not be negative"));
    }
    CLEAVE_ASSIGN_OR_RETURN(c.sliding_window, u32Or("attention.sliding_window", 0));
    if (c.sliding_window > 0) {
      c.sliding_layers.assign(c.num_layers, false);
      for (uint32_t l = 0; l < c.num_layers; ++l)
        c.sliding_layers[l] = gemma3 ? (l + 1) % 6 != 0 : l % 2 == 0;
    }
  }
  if (c.architecture == Architecture::kMiniMaxM2 || c.architecture == Architecture::kOlmo2) {
    // Q and K normed across heads (attn_q_norm of heads x head size); OLMo's norms after
    // attention and the MLP only.
    c.qk_norm_across_heads = c.qk_norm;
    if (c.architecture == Architecture::kOlmo2) {
      c.pre_norms = false;
      c.post_norms = true;
      if (file.find(p + "attention.sliding_window") != nullptr) {
        return absl::UnimplementedError(absl::StrCat(
            file.path(), ": ", p,
            "attention.sliding_window (OLMo 3's windows) is not read from GGUF files; serve "
            "the checkpoint's folder"));
      }
    }
  }
  if (c.architecture == Architecture::kGranite) {
    // llama.cpp's names for the four multipliers (its converter writes each; a missing one
    // is transformers' default, 1 — llama.cpp would take 1/√head_dim for the softmax).
    CLEAVE_ASSIGN_OR_RETURN(c.embedding_scale, f64Or("embedding_scale", 1.0));
    CLEAVE_ASSIGN_OR_RETURN(c.residual_scale, f64Or("residual_scale", 1.0));
    CLEAVE_ASSIGN_OR_RETURN(c.attention_scale, f64Or("attention.scale", 1.0));
    CLEAVE_ASSIGN_OR_RETURN(c.logits_scaling, f64Or("logit_scale", 1.0));
    for (double v : {c.embedding_scale, c.residual_scale, c.attention_scale, c.logits_scaling}) {
      if (!(v > 0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            file.path(), ": ", p, "embedding_scale, residual_scale, attention.scale and ",
            "logit_scale must be positive numbers"));
      }
    }
  }
  if (c.architecture == Architecture::kQwen35) {
    // llama.cpp's qwen35 files: the Gated DeltaNet layers' sizes as ssm.* keys (key heads as
    // groups, value heads as the time-step rank, all value dims as the inner size), every
    // full_attention_interval-th layer attending with its gate and per-head Q/K norms; the
    // value heads in tiled order (LinearAttentionConfig::tiled_value_heads).
    LinearAttentionConfig la;
    CLEAVE_ASSIGN_OR_RETURN(la.conv_kernel, u32("ssm.conv_kernel"));
    CLEAVE_ASSIGN_OR_RETURN(la.key_head_dim, u32("ssm.state_size"));
    CLEAVE_ASSIGN_OR_RETURN(la.key_heads, u32("ssm.group_count"));
    CLEAVE_ASSIGN_OR_RETURN(la.value_heads, u32("ssm.time_step_rank"));
    CLEAVE_ASSIGN_OR_RETURN(uint32_t inner, u32("ssm.inner_size"));
    CLEAVE_ASSIGN_OR_RETURN(uint32_t interval, u32Or("full_attention_interval", 4));
    if (la.value_heads == 0 || inner % la.value_heads != 0 || interval == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": ", p, "ssm.inner_size (", inner, ") must be a multiple of ",
                       p, "ssm.time_step_rank (", la.value_heads, "), and ", p,
                       "full_attention_interval positive"));
    }
    la.value_head_dim = inner / la.value_heads;
    la.tiled_value_heads = true;
    la.layers.assign(c.num_layers, false);
    for (uint32_t l = 0; l < c.num_layers; ++l) la.layers[l] = (l + 1) % interval != 0;
    c.linear_attention = std::move(la);
    c.qk_norm = true;
    c.attention_output_gate = true;
    if (c.moe) {  // qwen35moe: one shared expert, scaled by its gate (ffn_gate_inp_shexp).
      c.moe->shared_experts = 1;
      CLEAVE_ASSIGN_OR_RETURN(c.moe->shared_expert_intermediate_size,
                              u32("expert_shared_feed_forward_length"));
      c.moe->shared_expert_gate = true;
    }
  }
  if (c.architecture != Architecture::kDeepseekV3) {
    // Rotary embedding on the leading part of each head (GLM-4.5, Phi-4-mini), NEOX-paired.
    CLEAVE_ASSIGN_OR_RETURN(uint32_t rotated, u32Or("rope.dimension_count", c.head_dim));
    if (rotated != c.head_dim) {
      if (c.architecture != Architecture::kGlm4Moe && c.architecture != Architecture::kGlm4 &&
          c.architecture != Architecture::kPhi3 && c.architecture != Architecture::kMiniMaxM2 &&
          c.architecture != Architecture::kQwen35) {
        return absl::UnimplementedError(absl::StrCat(
            file.path(), ": ", p, "rope.dimension_count ", rotated, " of head size ", c.head_dim,
            " (rotary embedding on part of each head) is supported for glm4, glm4moe, minimax-m2 "
            "and phi3 only"));
      }
      if (rotated == 0 || rotated > c.head_dim || rotated % 2 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(file.path(), ": ", p, "rope.dimension_count ", rotated,
                         " must be even and in 2..", c.head_dim, " (the head size)"));
      }
      c.rotary_dim = rotated;
    }
  }
  if (c.architecture == Architecture::kDeepseekV3) {
    // llama.cpp's deepseek2 files: latent attention written as one KV head whose key is the
    // latent row (key_length = kv_lora + rope, value_length = kv_lora), the heads' own sizes
    // as key_length_mla and value_length_mla (older files: the heads' sizes as key_length and
    // value_length); the rope part rotates adjacent pairs. YaRN's mscale_all_dim is stored as
    // 0.1 · mscale_all_dim (yarn_log_multiplier); mscale is taken equal to it, as DeepSeek-V2-Lite,
    // V3, R1 and Kimi-K2 publish them.
    MlaConfig mla;
    CLEAVE_ASSIGN_OR_RETURN(mla.q_lora_rank, u32Or("attention.q_lora_rank", 0));
    CLEAVE_ASSIGN_OR_RETURN(mla.kv_lora_rank, u32Or("attention.kv_lora_rank", 0));
    CLEAVE_ASSIGN_OR_RETURN(mla.qk_rope_head_dim, u32Or("rope.dimension_count", 0));
    CLEAVE_ASSIGN_OR_RETURN(c.head_dim, u32Or("attention.key_length_mla", c.head_dim));
    CLEAVE_ASSIGN_OR_RETURN(mla.v_head_dim, u32Or("attention.value_length", 0));
    CLEAVE_ASSIGN_OR_RETURN(mla.v_head_dim, u32Or("attention.value_length_mla", mla.v_head_dim));
    if (mla.kv_lora_rank == 0 || mla.qk_rope_head_dim == 0 || mla.qk_rope_head_dim % 2 != 0 ||
        mla.v_head_dim == 0 || c.head_dim <= mla.qk_rope_head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": ", p, "attention.kv_lora_rank, ", p, "rope.dimension_count (even), ", p,
          "attention.key_length_mla (above the rope part) and ", p,
          "attention.value_length_mla must be positive"));
    }
    mla.qk_nope_head_dim = c.head_dim - mla.qk_rope_head_dim;
    mla.rope_interleave = true;
    c.mla = mla;
    c.num_kv_heads = c.num_heads;  // The one "KV head" is the latent, every rank's whole.
    CLEAVE_ASSIGN_OR_RETURN(double log_mul, f64Or("rope.scaling.yarn_log_multiplier", 0.0));
    c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim = log_mul / 0.1;
  }
  CLEAVE_RETURN_IF_ERROR(checkShape(c, file.path()));
  return c;
}

}  // namespace cleave::model
