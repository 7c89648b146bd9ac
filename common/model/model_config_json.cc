// config.json (Hugging Face) into a ModelConfig: the generic fields, then each family's.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/json_fields.h"
#include "common/model/model_config.h"
#include "common/model/model_config_internal.h"
#include "common/status_macros.h"

namespace cleave::model {
namespace {

std::string supportedList() {
  std::vector<std::string> names;
  for (const ArchName& a : architectures()) names.push_back(a.hf);
  return absl::StrJoin(names, ", ");
}

// Fills rope_scaling from a config.json "rope_scaling" (or "rope_parameters") object.
absl::Status parseRopeScaling(const JsonFields& rope, RopeScaling& out) {
  CLEAVE_ASSIGN_OR_RETURN(std::string type, rope.stringOr("rope_type", ""));
  if (type.empty()) {
    CLEAVE_ASSIGN_OR_RETURN(type, rope.stringOr("type", "none"));
  }
  if (type == "default") type = "none";
  if (type == "su") type = "longrope";  // Its name in the first Phi-3 128k checkpoints.
  if (type != "none" && type != "linear" && type != "dynamic" && type != "llama3" &&
      type != "yarn" && type != "longrope") {
    return rope.error("rope_type", absl::StrCat("\"", type,
                                                "\" is not supported (none, linear, dynamic, "
                                                "llama3, yarn, longrope)"));
  }
  out.type = type;
  CLEAVE_ASSIGN_OR_RETURN(out.factor, rope.numberOr("factor", 1.0));
  CLEAVE_ASSIGN_OR_RETURN(out.low_freq_factor, rope.numberOr("low_freq_factor", 1.0));
  CLEAVE_ASSIGN_OR_RETURN(out.high_freq_factor, rope.numberOr("high_freq_factor", 4.0));
  CLEAVE_ASSIGN_OR_RETURN(out.original_max_position_embeddings,
                          rope.uintOr("original_max_position_embeddings", 0));
  CLEAVE_ASSIGN_OR_RETURN(out.beta_fast, rope.numberOr("beta_fast", 32.0));
  CLEAVE_ASSIGN_OR_RETURN(out.beta_slow, rope.numberOr("beta_slow", 1.0));
  CLEAVE_ASSIGN_OR_RETURN(out.mscale, rope.numberOr("mscale", 0.0));
  CLEAVE_ASSIGN_OR_RETURN(out.truncate, rope.boolOr("truncate", true));
  CLEAVE_ASSIGN_OR_RETURN(out.mscale_all_dim, rope.numberOr("mscale_all_dim", 0.0));
  CLEAVE_ASSIGN_OR_RETURN(out.attention_factor, rope.optionalNumber("attention_factor"));
  if (out.type == "longrope") {
    CLEAVE_ASSIGN_OR_RETURN(out.short_factor, rope.numbers("short_factor"));
    CLEAVE_ASSIGN_OR_RETURN(out.long_factor, rope.numbers("long_factor"));
  }
  if (out.type != "none" && !(out.factor > 0)) return rope.error("factor", "must be > 0");
  if ((out.type == "llama3" || out.type == "yarn") && out.original_max_position_embeddings == 0) {
    return rope.error("original_max_position_embeddings", "is required for this rope type");
  }
  return absl::OkStatus();
}

// Qwen3-MoE's (and Qwen3-Next's) dense layers: every decoder_sparse_step-th layer is MoE but
// those mlp_only_layers lists.
absl::Status parseMoeLayers(const JsonFields& f, MoeConfig& moe) {
  CLEAVE_ASSIGN_OR_RETURN(moe.sparse_step, f.uintOr("decoder_sparse_step", 1));
  if (const nlohmann::json* dense = f.get("mlp_only_layers")) {
    if (!dense->is_array()) return f.error("mlp_only_layers", "must be an array of layer indices");
    for (const auto& layer : *dense) {
      if (!layer.is_number_unsigned()) return f.error("mlp_only_layers", "must hold layer indices");
      moe.dense_layers.push_back(layer.get<uint32_t>());
    }
  }
  return absl::OkStatus();
}

absl::Status parseMoe(const JsonFields& f, ModelConfig& config) {
  MoeConfig moe;
  switch (config.architecture) {
    case Architecture::kMixtral: {
      CLEAVE_ASSIGN_OR_RETURN(moe.num_experts, f.uint("num_local_experts"));
      CLEAVE_ASSIGN_OR_RETURN(moe.experts_per_token, f.uint("num_experts_per_tok"));
      moe.expert_intermediate_size = config.intermediate_size;
      moe.norm_topk_prob = true;  // Softmax over the selected experts' logits.
      break;
    }
    case Architecture::kQwen3Moe: {
      // Older files say num_experts, newer ones num_local_experts.
      CLEAVE_ASSIGN_OR_RETURN(moe.num_experts,
                              f.uint(f.has("num_experts") ? "num_experts" : "num_local_experts"));
      CLEAVE_ASSIGN_OR_RETURN(moe.experts_per_token, f.uint("num_experts_per_tok"));
      CLEAVE_ASSIGN_OR_RETURN(moe.expert_intermediate_size, f.uint("moe_intermediate_size"));
      CLEAVE_ASSIGN_OR_RETURN(moe.norm_topk_prob, f.boolOr("norm_topk_prob", false));
      CLEAVE_RETURN_IF_ERROR(parseMoeLayers(f, moe));
      break;
    }
    case Architecture::kMiniMaxM2: {
      // Sigmoid scores; the top k of score + correction bias, their scores renormalized.
      CLEAVE_ASSIGN_OR_RETURN(moe.num_experts, f.uint("num_local_experts"));
      CLEAVE_ASSIGN_OR_RETURN(moe.experts_per_token, f.uint("num_experts_per_tok"));
      moe.expert_intermediate_size = config.intermediate_size;
      moe.norm_topk_prob = true;
      moe.scoring = MoeScoring::kSigmoid;
      CLEAVE_ASSIGN_OR_RETURN(moe.score_correction_bias, f.boolOr("use_routing_bias", true));
      CLEAVE_ASSIGN_OR_RETURN(std::string scoring, f.stringOr("scoring_func", "sigmoid"));
      if (scoring != "sigmoid")
        return f.error("scoring_func",
                       absl::StrCat("\"", scoring, "\" is not supported (sigmoid)"));
      break;
    }
    case Architecture::kGptOss: {
      // The router's top-k logits softmaxed: the softmax over all, renormalized over the k.
      CLEAVE_ASSIGN_OR_RETURN(moe.num_experts, f.uint("num_local_experts"));
      CLEAVE_ASSIGN_OR_RETURN(
          moe.experts_per_token,
          f.uint(f.has("num_experts_per_tok") ? "num_experts_per_tok" : "experts_per_token"));
      moe.expert_intermediate_size = config.intermediate_size;
      moe.norm_topk_prob = true;
      moe.router_bias = moe.expert_bias = true;
      CLEAVE_ASSIGN_OR_RETURN(moe.swiglu_limit, f.numberOr("swiglu_limit", 7.0));
      CLEAVE_ASSIGN_OR_RETURN(moe.swiglu_alpha, f.numberOr("swiglu_alpha", 1.702));
      if (!(moe.swiglu_limit > 0)) return f.error("swiglu_limit", "must be > 0");
      break;
    }
    case Architecture::kGlm4Moe:
    case Architecture::kDeepseekV3: {
      // DeepSeek-V2 routes by softmax over the experts, greedy or group-limited, and scales
      // the chosen weights without renormalizing them (its norm_topk_prob is unused).
      const bool v2 = config.model_type == "deepseek_v2";
      CLEAVE_ASSIGN_OR_RETURN(moe.num_experts, f.uint("n_routed_experts"));
      CLEAVE_ASSIGN_OR_RETURN(moe.experts_per_token, f.uint("num_experts_per_tok"));
      CLEAVE_ASSIGN_OR_RETURN(moe.expert_intermediate_size, f.uint("moe_intermediate_size"));
      CLEAVE_ASSIGN_OR_RETURN(moe.norm_topk_prob, f.boolOr("norm_topk_prob", true));
      if (v2) moe.norm_topk_prob = false;
      CLEAVE_ASSIGN_OR_RETURN(moe.shared_experts, f.uintOr("n_shared_experts", 0));
      moe.shared_expert_intermediate_size = moe.expert_intermediate_size;
      CLEAVE_ASSIGN_OR_RETURN(moe.n_group, f.uintOr("n_group", 1));
      CLEAVE_ASSIGN_OR_RETURN(moe.topk_group, f.uintOr("topk_group", 1));
      CLEAVE_ASSIGN_OR_RETURN(moe.routed_scaling_factor, f.numberOr("routed_scaling_factor", 1.0));
      CLEAVE_ASSIGN_OR_RETURN(moe.first_k_dense, f.uintOr("first_k_dense_replace", 0));
      CLEAVE_ASSIGN_OR_RETURN(std::string scoring,
                              f.stringOr("scoring_func", v2 ? "softmax" : "sigmoid"));
      if (scoring != "sigmoid" && scoring != "softmax") {
        return f.error("scoring_func",
                       absl::StrCat("\"", scoring, "\" is not supported (sigmoid, softmax)"));
      }
      moe.scoring = scoring == "sigmoid" ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
      CLEAVE_ASSIGN_OR_RETURN(std::string method,
                              f.stringOr("topk_method", v2 ? "greedy" : "noaux_tc"));
      moe.score_correction_bias = method == "noaux_tc";
      if (method == "greedy") moe.n_group = moe.topk_group = 1;
      if (method == "group_limited_greedy" && moe.n_group > 1) {
        return f.error("topk_method",
                       "\"group_limited_greedy\" (groups ranked by their best expert) is not "
                       "supported yet; greedy and noaux_tc are");
      }
      if (moe.n_group == 0 || moe.num_experts % moe.n_group != 0) {
        return f.error("n_group",
                       absl::StrCat("must divide n_routed_experts (", moe.num_experts, ")"));
      }
      if (moe.topk_group == 0 || moe.topk_group > moe.n_group) {
        return f.error("topk_group", absl::StrCat("must be in 1..n_group (", moe.n_group, ")"));
      }
      if (config.architecture == Architecture::kGlm4Moe) break;  // Grouped-query attention.
      MlaConfig mla;
      CLEAVE_ASSIGN_OR_RETURN(mla.q_lora_rank, f.uintOr("q_lora_rank", 0));
      CLEAVE_ASSIGN_OR_RETURN(mla.kv_lora_rank, f.uint("kv_lora_rank"));
      CLEAVE_ASSIGN_OR_RETURN(mla.qk_nope_head_dim, f.uint("qk_nope_head_dim"));
      CLEAVE_ASSIGN_OR_RETURN(mla.qk_rope_head_dim, f.uint("qk_rope_head_dim"));
      CLEAVE_ASSIGN_OR_RETURN(mla.v_head_dim, f.uint("v_head_dim"));
      CLEAVE_ASSIGN_OR_RETURN(mla.rope_interleave, f.boolOr("rope_interleave", true));
      if (v2) mla.rope_interleave = true;  // V2 rotates adjacent pairs (as complex numbers).
      if (mla.kv_lora_rank == 0 || mla.qk_rope_head_dim == 0 || mla.qk_rope_head_dim % 2 != 0 ||
          mla.v_head_dim == 0) {
        return f.error("kv_lora_rank",
                       "kv_lora_rank and v_head_dim must be positive and qk_rope_head_dim even "
                       "and positive");
      }
      // Q and K heads are the no-rope part and the rope part side by side.
      config.head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
      config.mla = mla;
      break;
    }
    case Architecture::kQwen35: {
      // Qwen3-Next: Qwen3-MoE's choice of MoE layers (none without experts).
      const bool next = config.model_type == "qwen3_next";
      if (config.model_type != "qwen3_5_moe_text" && !next) return absl::OkStatus();  // Dense.
      CLEAVE_ASSIGN_OR_RETURN(moe.num_experts, f.uint("num_experts"));
      if (next && moe.num_experts == 0) return absl::OkStatus();
      CLEAVE_ASSIGN_OR_RETURN(moe.experts_per_token, f.uint("num_experts_per_tok"));
      CLEAVE_ASSIGN_OR_RETURN(moe.expert_intermediate_size, f.uint("moe_intermediate_size"));
      // Qwen3.5-MoE's router always renormalizes (its config has no such field).
      moe.norm_topk_prob = true;
      if (next) {
        CLEAVE_ASSIGN_OR_RETURN(moe.norm_topk_prob, f.boolOr("norm_topk_prob", true));
        CLEAVE_RETURN_IF_ERROR(parseMoeLayers(f, moe));
      }
      moe.shared_experts = 1;
      CLEAVE_ASSIGN_OR_RETURN(moe.shared_expert_intermediate_size,
                              f.uint("shared_expert_intermediate_size"));
      moe.shared_expert_gate = true;
      break;
    }
    default: return absl::OkStatus();
  }
  if (moe.num_experts == 0 || moe.experts_per_token == 0 ||
      moe.experts_per_token > moe.num_experts) {
    return f.error("num_experts_per_tok",
                   absl::StrCat("must be in 1..", moe.num_experts, " (the number of experts)"));
  }
  config.moe = moe;
  return absl::OkStatus();
}

// config.json's "sliding_window": `absent` when the key is missing, none when it is null.
absl::StatusOr<std::optional<uint32_t>> slidingWindow(const JsonFields& f,
                                                      std::optional<uint32_t> absent) {
  if (!f.names("sliding_window")) return absent;
  return f.optionalUint("sliding_window");
}

// A window of `window` on every layer but each `every`-th (Gemma 3's, OLMo 3's and EXAONE 4's
// defaults).
void slideAllButEvery(uint32_t window, uint32_t every, ModelConfig& c) {
  c.sliding_window = window;
  c.sliding_layers.assign(c.num_layers, false);
  for (uint32_t l = 0; l < c.num_layers; ++l) c.sliding_layers[l] = (l + 1) % every != 0;
}

// Which of `layers` layers layer_types names `type`, the others being "full_attention".
absl::StatusOr<std::vector<bool>> layersOfType(const JsonFields& f, uint32_t layers,
                                               const std::string& type) {
  const nlohmann::json* types = f.get("layer_types");
  if (types == nullptr || !types->is_array() || types->size() != layers) {
    return f.error("layer_types",
                   absl::StrCat("must list the ", layers, " layers' attention types"));
  }
  std::vector<bool> marked(layers, false);
  for (uint32_t l = 0; l < layers; ++l) {
    const nlohmann::json& t = (*types)[l];
    if (t == type) {
      marked[l] = true;
    } else if (t != "full_attention") {
      return f.error("layer_types", absl::StrCat("layer ", l, ": ", t.dump(), " is not ", type,
                                                 " or full_attention"));
    }
  }
  return marked;
}

// gpt-oss's sliding-window layers: "sliding_window" positions (`absent` when the key is
// missing) on the layers "layer_types" names "sliding_attention" (by default every even
// layer, as transformers fills it in).
absl::Status parseSlidingLayers(const JsonFields& f, ModelConfig& c,
                                std::optional<uint32_t> absent = std::nullopt) {
  CLEAVE_ASSIGN_OR_RETURN(std::optional<uint32_t> window, slidingWindow(f, absent));
  const nlohmann::json* types = f.get("layer_types");
  if (!window || *window == 0) {
    if (types != nullptr && types->is_array() &&
        std::find(types->begin(), types->end(), "sliding_attention") != types->end()) {
      return f.error("sliding_window", "must be positive when layer_types names sliding layers");
    }
    return absl::OkStatus();
  }
  c.sliding_window = *window;
  c.sliding_layers.assign(c.num_layers, false);
  if (types == nullptr || types->is_null()) {
    for (uint32_t l = 0; l < c.num_layers; l += 2) c.sliding_layers[l] = true;
    return absl::OkStatus();
  }
  CLEAVE_ASSIGN_OR_RETURN(c.sliding_layers, layersOfType(f, c.num_layers, "sliding_attention"));
  return absl::OkStatus();
}

// SmolLM3: the layers no_rope_layers marks 0 (by default every no_rope_layer_interval-th, 4)
// attend without rotary embedding; with use_sliding_window, the layers layer_types names
// sliding (by default those without rotation) attend to their last sliding_window positions.
absl::Status parseSmolLm3(const JsonFields& f, ModelConfig& c) {
  c.nope_layers.assign(c.num_layers, false);
  if (const nlohmann::json* list = f.get("no_rope_layers")) {
    if (!list->is_array() || list->size() != c.num_layers) {
      return f.error("no_rope_layers",
                     absl::StrCat("must list the ", c.num_layers, " layers' 1 (rotary) or 0"));
    }
    for (uint32_t l = 0; l < c.num_layers; ++l) {
      const nlohmann::json& v = (*list)[l];
      if (!v.is_number_integer() || (v != 0 && v != 1)) {
        return f.error("no_rope_layers",
                       absl::StrCat("layer ", l, ": ", v.dump(), " is not 0 or 1"));
      }
      c.nope_layers[l] = v == 0;
    }
  } else {
    CLEAVE_ASSIGN_OR_RETURN(uint32_t interval, f.uintOr("no_rope_layer_interval", 4));
    if (interval == 0) return f.error("no_rope_layer_interval", "must be positive");
    for (uint32_t l = 0; l < c.num_layers; ++l) c.nope_layers[l] = (l + 1) % interval == 0;
  }
  CLEAVE_ASSIGN_OR_RETURN(bool sliding, f.boolOr("use_sliding_window", false));
  CLEAVE_ASSIGN_OR_RETURN(std::optional<uint32_t> window, f.optionalUint("sliding_window"));
  if (!sliding || !window || *window == 0) return absl::OkStatus();
  if (f.has("layer_types")) return parseSlidingLayers(f, c);
  c.sliding_window = *window;
  c.sliding_layers = c.nope_layers;
  return absl::OkStatus();
}

// Mistral's and Phi-3's window: "sliding_window" positions on every layer; null for none,
// and `absent` when the key is missing, as transformers' config class defaults it (Mistral
// 4096, Phi-3 none).
absl::Status parseUniformWindow(const JsonFields& f, std::optional<uint32_t> absent,
                                ModelConfig& c) {
  CLEAVE_ASSIGN_OR_RETURN(std::optional<uint32_t> window, slidingWindow(f, absent));
  if (!window || *window == 0) return absl::OkStatus();
  c.sliding_window = *window;
  c.sliding_layers.assign(c.num_layers, true);
  return absl::OkStatus();
}

// Gemma 3's config.json as published leaves most fields to transformers' Gemma3TextConfig
// defaults (the 4B's text_config names five); they are filled in here. A multimodal
// checkpoint's text model is its text_config, with the top level's token ids.
nlohmann::json gemma3TextConfig(const nlohmann::json& json) {
  const bool nested = json.value("model_type", "") == "gemma3" && json.contains("text_config") &&
                      json["text_config"].is_object();
  nlohmann::json text = nested ? json["text_config"] : json;
  // The multimodal checkpoint's token ids are its top level's (text_config keeps defaults).
  for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (nested && json.contains(id) && !json[id].is_null()) text[id] = json[id];
  }
  static const nlohmann::json kDefaults = {{"vocab_size", 262208u},
                                           {"hidden_size", 2304u},
                                           {"intermediate_size", 9216u},
                                           {"num_hidden_layers", 26u},
                                           {"num_attention_heads", 8u},
                                           {"num_key_value_heads", 4u},
                                           {"head_dim", 256u},
                                           {"max_position_embeddings", 131072u},
                                           {"rms_norm_eps", 1e-6},
                                           {"query_pre_attn_scalar", 256u},
                                           {"sliding_window", 4096u},
                                           {"tie_word_embeddings", true},
                                           {"hidden_activation", "gelu_pytorch_tanh"},
                                           {"bos_token_id", 2u},
                                           {"eos_token_id", 1u}};
  for (const auto& [key, value] : kDefaults.items()) {
    if (!text.contains(key)) text[key] = value;
  }
  text["model_type"] = json.value("model_type", "gemma3_text");
  return text;
}

// Mistral 3's multimodal checkpoints (Mistral-Small-3.1/3.2, Ministral 3): the text model is
// text_config (model_type mistral, its default, or ministral3), with the top level's token
// ids; Ministral 3's rotation defaults to transformers' (YaRN 16x over 16384 positions, the
// query temperature 0.1) when it names none.
nlohmann::json mistral3TextConfig(const nlohmann::json& json) {
  nlohmann::json text = json["text_config"];
  for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (json.contains(id) && !json[id].is_null() && !text.contains(id)) text[id] = json[id];
  }
  if (!text.contains("model_type")) text["model_type"] = "mistral";
  return text;
}

// Ministral 3's transformers defaults: no window, YaRN with Llama 4's query temperature.
nlohmann::json ministral3Defaults(nlohmann::json text) {
  if (!text.contains("rope_parameters") && !text.contains("rope_scaling")) {
    text["rope_parameters"] = {{"rope_type", "yarn"},
                               {"rope_theta", 1000000.0},
                               {"factor", 16.0},
                               {"original_max_position_embeddings", 16384u},
                               {"beta_fast", 32.0},
                               {"beta_slow", 1.0},
                               {"mscale", 1.0},
                               {"mscale_all_dim", 1.0},
                               {"llama_4_scaling_beta", 0.1}};
  }
  return text;
}

// The rotation of each kind of layer (Gemma 3, OLMo 3): rope_parameters.full_attention for the
// global layers (or the legacy rope_theta and rope_scaling; base `global_theta` when neither
// names one), rope_parameters.sliding_attention for the sliding layers, which rotate
// unscaled with base `sliding_theta` unless it names its own.
absl::Status parseRopePerLayerType(const JsonFields& f, double global_theta, double sliding_theta,
                                   ModelConfig& c) {
  CLEAVE_ASSIGN_OR_RETURN(JsonFields rope, f.object("rope_parameters"));
  CLEAVE_ASSIGN_OR_RETURN(JsonFields global, rope.object("full_attention"));
  CLEAVE_ASSIGN_OR_RETURN(JsonFields local, rope.object("sliding_attention"));
  CLEAVE_ASSIGN_OR_RETURN(c.rope_theta, global.numberOr("rope_theta", global_theta));
  c.rope_scaling = RopeScaling();
  if (f.has("rope_scaling")) {
    CLEAVE_ASSIGN_OR_RETURN(JsonFields scaling, f.object("rope_scaling"));
    CLEAVE_RETURN_IF_ERROR(parseRopeScaling(scaling, c.rope_scaling));
  } else if (rope.has("full_attention")) {
    CLEAVE_RETURN_IF_ERROR(parseRopeScaling(global, c.rope_scaling));
  } else if (f.has("rope_parameters") && !rope.has("sliding_attention")) {
    // One flat object: the global layers' rotation.
    CLEAVE_ASSIGN_OR_RETURN(c.rope_theta, rope.numberOr("rope_theta", c.rope_theta));
    CLEAVE_RETURN_IF_ERROR(parseRopeScaling(rope, c.rope_scaling));
  }
  CLEAVE_ASSIGN_OR_RETURN(c.sliding_rope_theta, local.numberOr("rope_theta", sliding_theta));
  CLEAVE_ASSIGN_OR_RETURN(std::string local_type, local.stringOr("rope_type", "default"));
  if (local_type != "default") {
    return local.error(
        "rope_type",
        absl::StrCat("\"", local_type, "\" is not supported for sliding layers (default)"));
  }
  return absl::OkStatus();
}

// OLMo 2 and 3: post norms only, Q and K normed across heads; OLMo 3's sliding layers
// (layer_types, by default three of every four; a window of sliding_window, 4096 when absent)
// rotate with their own parameters.
absl::Status parseOlmo(const JsonFields& f, ModelConfig& c) {
  c.pre_norms = false;
  c.post_norms = true;
  c.qk_norm = c.qk_norm_across_heads = true;
  if (c.model_type != "olmo3") return absl::OkStatus();
  CLEAVE_ASSIGN_OR_RETURN(double theta, f.numberOr("rope_theta", 500000.0));
  CLEAVE_RETURN_IF_ERROR(parseRopePerLayerType(f, theta, theta, c));
  if (f.has("layer_types")) return parseSlidingLayers(f, c, 4096);
  CLEAVE_ASSIGN_OR_RETURN(std::optional<uint32_t> window, slidingWindow(f, 4096));
  if (window && *window > 0) slideAllButEvery(*window, 4, c);
  return absl::OkStatus();
}

// EXAONE 4.0: post norms only, per-head Q/K norms; with a window (sliding_window, 4096 when
// absent, null for none) the layers layer_types names sliding (by default all but every
// sliding_window_pattern-th, 4) attend to it and the others attend to everything without
// rotary embedding.
absl::Status parseExaone4(const JsonFields& f, ModelConfig& c) {
  c.pre_norms = false;
  c.post_norms = true;
  c.qk_norm = true;
  if (f.has("layer_types")) {
    CLEAVE_RETURN_IF_ERROR(parseSlidingLayers(f, c, 4096));
  } else {
    CLEAVE_ASSIGN_OR_RETURN(std::optional<uint32_t> window, slidingWindow(f, 4096));
    if (!window || *window == 0) return absl::OkStatus();
    if (const nlohmann::json* pattern = f.get("sliding_window_pattern");
        pattern != nullptr && !pattern->is_number_unsigned()) {
      return f.error("sliding_window_pattern",
                     "must be a number of layers when layer_types is absent");
    }
    CLEAVE_ASSIGN_OR_RETURN(uint32_t every, f.uintOr("sliding_window_pattern", 4));
    if (every == 0) return f.error("sliding_window_pattern", "must be positive");
    slideAllButEvery(*window, every, c);
  }
  if (c.sliding_window == 0) return absl::OkStatus();
  c.nope_layers.assign(c.num_layers, false);  // The global layers: no rotary embedding.
  for (uint32_t l = 0; l < c.num_layers; ++l) c.nope_layers[l] = c.attentionWindow(l) == 0;
  return absl::OkStatus();
}

// Granite's multipliers, as transformers' GraniteConfig defaults them (1, and a softmax scale
// of 1 — the published configs state each).
absl::Status parseGranite(const JsonFields& f, ModelConfig& c) {
  CLEAVE_ASSIGN_OR_RETURN(c.embedding_scale, f.numberOr("embedding_multiplier", 1.0));
  CLEAVE_ASSIGN_OR_RETURN(c.residual_scale, f.numberOr("residual_multiplier", 1.0));
  CLEAVE_ASSIGN_OR_RETURN(c.attention_scale, f.numberOr("attention_multiplier", 1.0));
  CLEAVE_ASSIGN_OR_RETURN(c.logits_scaling, f.numberOr("logits_scaling", 1.0));
  for (const auto& [key, value] : {std::pair{"embedding_multiplier", c.embedding_scale},
                                   std::pair{"residual_multiplier", c.residual_scale},
                                   std::pair{"attention_multiplier", c.attention_scale},
                                   std::pair{"logits_scaling", c.logits_scaling}}) {
    if (!(value > 0) || !std::isfinite(value)) return f.error(key, "must be a positive number");
  }
  return absl::OkStatus();
}

// What Gemma 2 and 3 share beyond Llama's graph: embeddings times √hidden, norms after
// attention and the MLP too, the GELU MLP, the softmax scale of query_pre_attn_scalar, and the
// soft caps of the attention scores and the logits — `caps` when the config has no key for
// them (a null one: none).
absl::Status parseGemma(const JsonFields& f, std::pair<double, double> caps, ModelConfig& c) {
  c.embedding_scale = std::sqrt(static_cast<double>(c.hidden_size));
  c.post_norms = true;
  CLEAVE_ASSIGN_OR_RETURN(std::string activation, f.stringOr("hidden_activation", ""));
  if (activation != "gelu_pytorch_tanh" && activation != "gelu_new") {
    return f.error("hidden_activation",
                   absl::StrCat("\"", activation,
                                "\" is not supported (gelu_pytorch_tanh: GELU's tanh form)"));
  }
  c.mlp_activation = MlpActivation::kGeluTanh;
  CLEAVE_ASSIGN_OR_RETURN(double scalar, f.numberOr("query_pre_attn_scalar", 256));
  if (!(scalar > 0)) return f.error("query_pre_attn_scalar", "must be positive");
  c.attention_scale = 1.0 / std::sqrt(scalar);
  for (auto [key, absent, cap] :
       {std::tuple{"attn_logit_softcapping", caps.first, &c.attention_softcap},
        std::tuple{"final_logit_softcapping", caps.second, &c.final_logit_softcap}}) {
    std::optional<double> value = absent;
    if (f.names(key)) {
      CLEAVE_ASSIGN_OR_RETURN(value, f.optionalNumber(key));
    }
    *cap = value.value_or(0.0);
    if (*cap < 0 || !std::isfinite(*cap)) return f.error(key, "must be positive (or null: none)");
  }
  CLEAVE_ASSIGN_OR_RETURN(bool bidirectional, f.boolOr("use_bidirectional_attention", false));
  if (bidirectional) {
    return absl::UnimplementedError(
        absl::StrCat(c.source, ": use_bidirectional_attention (an encoder) is not supported"));
  }
  return absl::OkStatus();
}

// Gemma 2: one rotation for every layer, a window of sliding_window (4096) on every other
// layer (layer_types, else the even ones), the scores capped at 50 and the logits at 30 unless
// the config says otherwise.
absl::Status parseGemma2(const JsonFields& f, ModelConfig& c) {
  CLEAVE_RETURN_IF_ERROR(parseGemma(f, {50.0, 30.0}, c));
  return parseSlidingLayers(f, c, 4096);
}

// Gemma 3's fields beyond those: per-head Q/K norms, the sliding layers (layer_types, or every
// sliding_window_pattern-th layer global) and their own rotary base
// (rope_parameters.sliding_attention, or the legacy rope_local_base_freq), the global layers'
// rotation (rope_parameters.full_attention, or rope_theta and rope_scaling).
absl::Status parseGemma3(const JsonFields& f, ModelConfig& c) {
  CLEAVE_RETURN_IF_ERROR(parseGemma(f, {0.0, 0.0}, c));
  c.qk_norm = true;

  CLEAVE_ASSIGN_OR_RETURN(double global_theta, f.numberOr("rope_theta", 1000000.0));
  CLEAVE_ASSIGN_OR_RETURN(double local_theta, f.numberOr("rope_local_base_freq", 10000.0));
  CLEAVE_RETURN_IF_ERROR(parseRopePerLayerType(f, global_theta, local_theta, c));

  CLEAVE_ASSIGN_OR_RETURN(std::optional<uint32_t> window, f.optionalUint("sliding_window"));
  if (f.has("layer_types")) return parseSlidingLayers(f, c);
  if (!window || *window == 0) return absl::OkStatus();
  CLEAVE_ASSIGN_OR_RETURN(uint32_t pattern, f.uintOr("sliding_window_pattern", 6));
  if (pattern == 0) return f.error("sliding_window_pattern", "must be positive");
  slideAllButEvery(*window, pattern, c);
  return absl::OkStatus();
}

// Qwen3.5's text model: Gated DeltaNet on the layers layer_types names "linear_attention" (by
// default all but every full_attention_interval-th, 4), gated attention with per-head Q/K
// norms on the others (transformers' Qwen3_5TextConfig defaults for the heads).
absl::Status parseQwen35(const JsonFields& f, ModelConfig& c) {
  c.qk_norm = true;
  c.attention_output_gate = true;
  LinearAttentionConfig la;
  CLEAVE_ASSIGN_OR_RETURN(la.key_heads, f.uintOr("linear_num_key_heads", 16));
  CLEAVE_ASSIGN_OR_RETURN(la.value_heads, f.uintOr("linear_num_value_heads", 32));
  CLEAVE_ASSIGN_OR_RETURN(la.key_head_dim, f.uintOr("linear_key_head_dim", 128));
  CLEAVE_ASSIGN_OR_RETURN(la.value_head_dim, f.uintOr("linear_value_head_dim", 128));
  CLEAVE_ASSIGN_OR_RETURN(la.conv_kernel, f.uintOr("linear_conv_kernel_dim", 4));
  la.grouped_qkvz = la.grouped_ba = c.model_type == "qwen3_next";
  la.layers.assign(c.num_layers, false);
  if (f.has("layer_types")) {
    CLEAVE_ASSIGN_OR_RETURN(la.layers, layersOfType(f, c.num_layers, "linear_attention"));
  } else {
    CLEAVE_ASSIGN_OR_RETURN(uint32_t interval, f.uintOr("full_attention_interval", 4));
    if (interval == 0) return f.error("full_attention_interval", "must be positive");
    for (uint32_t l = 0; l < c.num_layers; ++l) la.layers[l] = (l + 1) % interval != 0;
  }
  c.linear_attention = std::move(la);
  return absl::OkStatus();
}

// Qwen3.5's published (multimodal) checkpoints hold the text model's config under
// text_config, with the token ids and the tied head at the top level.
nlohmann::json qwen35TextConfig(const nlohmann::json& json) {
  nlohmann::json text = json["text_config"];
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"}) {
    if (json.contains(key) && !json[key].is_null() && !text.contains(key)) text[key] = json[key];
  }
  text["model_type"] =
      json.value("model_type", "") == "qwen3_5_moe" ? "qwen3_5_moe_text" : "qwen3_5_text";
  return text;
}

}  // namespace

absl::StatusOr<ModelConfig> parseConfigJson(absl::string_view text, const std::string& name) {
  nlohmann::json json = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a JSON object"));
  }
  // Gemma 3's text model: its fields (under text_config in multimodal checkpoints) with
  // transformers' defaults filled in.
  const auto type_field = json.find("model_type");
  const std::string type = type_field != json.end() && type_field->is_string()
                               ? type_field->get<std::string>()
                               : std::string();
  const bool qwen35_vl = type == "qwen3_5" || type == "qwen3_5_moe";
  const bool nested =
      (type == "gemma3" || type == "mistral3" || qwen35_vl) && json.contains("text_config");
  if (nested && !json["text_config"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": text_config must be an object"));
  }
  if ((type == "mistral3" || qwen35_vl) && !nested) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": a ", type,
                                                   " config must hold its text model's in "
                                                   "text_config"));
  }
  if (type == "gemma3_text" || type == "gemma3") json = gemma3TextConfig(json);
  if (type == "mistral3") json = mistral3TextConfig(json);
  if (qwen35_vl) json = qwen35TextConfig(json);
  if (const auto text_type = json.find("model_type");
      text_type != json.end() && *text_type == "ministral3") {
    json = ministral3Defaults(std::move(json));
  }
  JsonFields f(json, name, nested ? "text_config." : "");
  ModelConfig c;
  c.source = name;
  CLEAVE_ASSIGN_OR_RETURN(c.model_type, f.stringOr("model_type", ""));
  if (c.model_type.empty()) return f.missing("model_type");
  const ArchName* arch = nullptr;
  for (const ArchName& a : architectures()) {
    if (arch == nullptr && c.model_type == a.hf) arch = &a;
  }
  if (arch == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": model_type \"", c.model_type,
                     "\" is not a supported architecture (supported: ", supportedList(), ")"));
  }
  c.architecture = arch->arch;
  CLEAVE_ASSIGN_OR_RETURN(c.hidden_size, f.uint("hidden_size"));
  // Qwen3.5-MoE has no dense MLP (Qwen3-Next only on its mlp_only_layers).
  CLEAVE_ASSIGN_OR_RETURN(c.intermediate_size,
                          c.model_type == "qwen3_5_moe_text" || c.model_type == "qwen3_next"
                              ? f.uintOr("intermediate_size", 0)
                              : f.uint("intermediate_size"));
  CLEAVE_ASSIGN_OR_RETURN(c.num_layers, f.uint("num_hidden_layers"));
  CLEAVE_ASSIGN_OR_RETURN(c.num_heads, f.uint("num_attention_heads"));
  CLEAVE_ASSIGN_OR_RETURN(c.num_kv_heads, f.uintOr("num_key_value_heads", c.num_heads));
  CLEAVE_ASSIGN_OR_RETURN(c.vocab_size, f.uint("vocab_size"));
  CLEAVE_ASSIGN_OR_RETURN(c.max_position_embeddings, f.uintOr("max_position_embeddings", 2048));
  if (c.num_heads == 0) return f.error("num_attention_heads", "must be positive");
  CLEAVE_ASSIGN_OR_RETURN(c.head_dim,
                          f.uintOr("head_dim", c.architecture == Architecture::kGlm4 ? 128
                                               : c.architecture == Architecture::kQwen35
                                                   ? 256
                                                   : c.hidden_size / c.num_heads));
  // transformers' defaults for a key the file leaves out (published configs state them):
  // OLMo's and EXAONE's eps 1e-5, GLM-4's 1.5625e-7 and heads of 128, the others' 1e-6.
  const bool glm4 = c.architecture == Architecture::kGlm4;
  const double eps =
      c.architecture == Architecture::kOlmo2 || c.architecture == Architecture::kExaone4 ? 1e-5
      : glm4                                                                             ? 1.5625e-7
                                                                                         : 1e-6;
  CLEAVE_ASSIGN_OR_RETURN(c.rms_norm_eps, f.numberOr("rms_norm_eps", eps));
  // SmolLM3's and Gemma 2's config classes tie them unless told otherwise.
  CLEAVE_ASSIGN_OR_RETURN(
      c.tie_word_embeddings,
      f.boolOr("tie_word_embeddings",
               c.model_type == "smollm3" || c.architecture == Architecture::kGemma2));
  CLEAVE_ASSIGN_OR_RETURN(c.attention_bias,
                          f.boolOr("attention_bias", c.architecture == Architecture::kQwen2 ||
                                                         c.architecture == Architecture::kGlm4 ||
                                                         c.model_type == "seed_oss"));
  // Which families' attention_bias covers the output projection too (transformers' classes):
  // Llama's, SmolLM3's and Gemma 3's; Seed-OSS says apart; the others' never.
  if (c.model_type == "llama" || c.model_type == "smollm3" ||
      c.architecture == Architecture::kGemma3 || c.architecture == Architecture::kGemma2 ||
      c.architecture == Architecture::kGranite)
    c.o_bias = c.attention_bias;
  if (c.model_type == "seed_oss") {
    CLEAVE_ASSIGN_OR_RETURN(c.o_bias, f.boolOr("attention_out_bias", false));
  }
  CLEAVE_ASSIGN_OR_RETURN(bool mlp_bias, f.boolOr("mlp_bias", false));
  if (mlp_bias) {
    return absl::UnimplementedError(
        absl::StrCat(name, ": mlp_bias (biases on the MLP's projections) is not supported"));
  }
  c.qk_norm = c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe;
  if (c.architecture == Architecture::kGlm4Moe) {
    CLEAVE_ASSIGN_OR_RETURN(c.qk_norm, f.boolOr("use_qk_norm", false));
  }
  if (c.architecture == Architecture::kMiniMaxM2) {
    CLEAVE_ASSIGN_OR_RETURN(c.qk_norm, f.boolOr("use_qk_norm", true));
    CLEAVE_ASSIGN_OR_RETURN(std::string qk_norm_type, f.stringOr("qk_norm_type", "per_layer"));
    if (qk_norm_type != "per_layer") {
      return f.error("qk_norm_type", absl::StrCat("\"", qk_norm_type,
                                                  "\" is not supported (per_layer: one norm "
                                                  "across all heads)"));
    }
    c.qk_norm_across_heads = c.qk_norm;
  }
  if (c.architecture == Architecture::kGptOss) {
    c.o_bias = c.attention_bias;
    c.attention_sinks = true;
    CLEAVE_RETURN_IF_ERROR(parseSlidingLayers(f, c));
  }
  if (c.model_type == "mistral") CLEAVE_RETURN_IF_ERROR(parseUniformWindow(f, 4096, c));
  if (c.model_type == "ministral3") CLEAVE_RETURN_IF_ERROR(parseUniformWindow(f, std::nullopt, c));
  if (c.model_type == "smollm3") CLEAVE_RETURN_IF_ERROR(parseSmolLm3(f, c));
  if (c.architecture == Architecture::kPhi3)
    CLEAVE_RETURN_IF_ERROR(parseUniformWindow(f, std::nullopt, c));

  // Rope: legacy rope_theta + rope_scaling, or rope_parameters holding both.
  CLEAVE_ASSIGN_OR_RETURN(JsonFields rope_parameters, f.object("rope_parameters"));
  CLEAVE_ASSIGN_OR_RETURN(c.rope_theta, f.numberOr("rope_theta", 10000.0));
  CLEAVE_ASSIGN_OR_RETURN(c.rope_theta, rope_parameters.numberOr("rope_theta", c.rope_theta));
  if (f.has("rope_scaling") || f.has("rope_parameters")) {
    CLEAVE_ASSIGN_OR_RETURN(JsonFields rope,
                            f.has("rope_scaling") ? f.object("rope_scaling") : rope_parameters);
    CLEAVE_RETURN_IF_ERROR(parseRopeScaling(rope, c.rope_scaling));
    if (c.model_type == "ministral3") {
      CLEAVE_ASSIGN_OR_RETURN(c.query_scale_beta, rope.numberOr("llama_4_scaling_beta", 0.0));
      c.query_scale_period = c.rope_scaling.original_max_position_embeddings;
      if (c.query_scale_beta != 0 && c.query_scale_period == 0) {
        return rope.error("original_max_position_embeddings",
                          "is required with llama_4_scaling_beta (the query temperature's period)");
      }
    }
    if (c.rope_scaling.type == "longrope") {
      // Phi-3's configs give the pretraining context at the top level, which wins over the
      // scaling object's (as transformers reads it).
      CLEAVE_ASSIGN_OR_RETURN(uint32_t original,
                              f.uintOr("original_max_position_embeddings",
                                       c.rope_scaling.original_max_position_embeddings));
      CLEAVE_ASSIGN_OR_RETURN(std::optional<double> factor, rope.optionalNumber("factor"));
      finishLongrope(original, factor, c);
    }
  }
  // Rotary embedding on the leading part of each head: GLM-4.5 (0.5 unless the config says
  // otherwise, as transformers defaults it) and Phi-4-mini (0.75), whose transformers
  // classes rotate the first partial_rotary_factor · head_dim values; other families' do not.
  // MiniMax-M2's checkpoints give rotary_dim instead (a factor, when both are set, wins).
  const bool glm =
      c.architecture == Architecture::kGlm4Moe || c.architecture == Architecture::kGlm4;
  const bool minimax = c.architecture == Architecture::kMiniMaxM2;
  const bool qwen35 = c.architecture == Architecture::kQwen35;
  double partial_default = glm ? 0.5 : qwen35 ? 0.25 : 1.0;
  if (minimax && f.has("rotary_dim")) {
    CLEAVE_ASSIGN_OR_RETURN(uint32_t rotary, f.uint("rotary_dim"));
    partial_default = static_cast<double>(rotary) / c.head_dim;
  }
  CLEAVE_ASSIGN_OR_RETURN(double partial, f.numberOr("partial_rotary_factor", partial_default));
  CLEAVE_ASSIGN_OR_RETURN(partial, rope_parameters.numberOr("partial_rotary_factor", partial));
  if (partial != 1.0) {
    if (!glm && !minimax && !qwen35 && c.architecture != Architecture::kPhi3) {
      return absl::UnimplementedError(absl::StrCat(
          name, ": partial_rotary_factor ", partial, " (rotary embedding on part of each head) is ",
          "supported for glm4, glm4_moe, minimax_m2, phi3 and qwen3_5 only; model_type \"",
          c.model_type, "\" rotates all"));
    }
    const double dims = partial * c.head_dim;
    if (!(partial > 0 && partial < 1) || dims != std::floor(dims) ||
        static_cast<uint32_t>(dims) % 2 != 0) {
      return f.error("partial_rotary_factor",
                     absl::StrCat(partial, " of head_dim ", c.head_dim,
                                  " must be in (0, 1) and give an even number of dimensions"));
    }
    c.rotary_dim = static_cast<uint32_t>(dims);
  }

  if (c.architecture == Architecture::kGemma3) CLEAVE_RETURN_IF_ERROR(parseGemma3(f, c));
  if (c.architecture == Architecture::kGemma2) CLEAVE_RETURN_IF_ERROR(parseGemma2(f, c));
  if (c.architecture == Architecture::kOlmo2) CLEAVE_RETURN_IF_ERROR(parseOlmo(f, c));
  if (c.architecture == Architecture::kGranite) CLEAVE_RETURN_IF_ERROR(parseGranite(f, c));
  if (c.architecture == Architecture::kExaone4) CLEAVE_RETURN_IF_ERROR(parseExaone4(f, c));
  if (c.architecture == Architecture::kGlm4) c.post_norms = true;
  if (qwen35) CLEAVE_RETURN_IF_ERROR(parseQwen35(f, c));

  CLEAVE_ASSIGN_OR_RETURN(std::optional<uint32_t> bos, f.optionalUint("bos_token_id"));
  c.bos_token_id = bos;
  if (const nlohmann::json* eos = f.get("eos_token_id")) {
    if (eos->is_array()) {
      for (const auto& id : *eos) {
        if (!id.is_number_unsigned()) return f.error("eos_token_id", "must hold token ids");
        c.eos_token_ids.push_back(id.get<uint32_t>());
      }
    } else {
      CLEAVE_ASSIGN_OR_RETURN(std::optional<uint32_t> id, f.optionalUint("eos_token_id"));
      c.eos_token_ids.push_back(*id);
    }
  }
  CLEAVE_RETURN_IF_ERROR(parseMoe(f, c));
  CLEAVE_RETURN_IF_ERROR(checkShape(c, name));
  return c;
}

}  // namespace cleave::model
