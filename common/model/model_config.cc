#include "common/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/model/gguf_file.h"
#include "common/model/json_fields.h"
#include "common/model/model_config_internal.h"
#include "common/status_macros.h"

namespace cleave::model {
namespace {

constexpr ArchName kArchitectures[] = {
    {"llama", "llama", Architecture::kLlama},
    // Mistral (7B, Nemo, Small): Llama's graph, every layer attending to `sliding_window`
    // positions when the config sets one; llama.cpp files name it "llama".
    {"mistral", "llama", Architecture::kLlama},
    // Ministral 3: Mistral's graph with YaRN and Llama 4's query temperature past the
    // original context (query_scale_beta); no GGUF layout is read for it.
    {"ministral3", "-", Architecture::kLlama},
    // SmolLM3: Llama's graph with every fourth layer unrotated (nope_layers); llama.cpp's
    // files permute Q and K as for llama.
    {"smollm3", "smollm3", Architecture::kLlama},
    // Seed-OSS: Llama's graph with biases on Q, K and V (and on O when the config says);
    // no GGUF layout is read for it.
    {"seed_oss", "-", Architecture::kLlama},
    {"qwen2", "qwen2", Architecture::kQwen2},
    {"qwen3", "qwen3", Architecture::kQwen3},
    {"mixtral", "mixtral", Architecture::kMixtral},
    {"qwen3_moe", "qwen3moe", Architecture::kQwen3Moe},
    {"deepseek_v3", "deepseek2", Architecture::kDeepseekV3},
    // DeepSeek-V2 and V2-Lite: V3's graph with softmax routing (V2's defaults below).
    {"deepseek_v2", "deepseek2", Architecture::kDeepseekV3},
    {"gpt_oss", "gpt-oss", Architecture::kGptOss},
    // Phi-3 and Phi-4: Llama's graph with Q, K, V in one matrix (qkv_proj; GGUF attn_qkv) and
    // gate and up in another (gate_up_proj; GGUF ffn_up), and a window on every layer when the
    // config sets one (Phi-3-mini 4k: 2047).
    {"phi3", "phi3", Architecture::kPhi3},
    // GLM-4.5, GLM-4.5-Air, GLM-4.6: DeepSeek-V3's sigmoid routing with a correction bias,
    // shared experts and dense first layers, on grouped-query attention (Q/K/V biases,
    // optional per-head Q/K norms) rotating half of each head.
    {"glm4_moe", "glm4moe", Architecture::kGlm4Moe},
    // Gemma 3 (1B: gemma3_text; 4B, 12B, 27B: gemma3, the text model's config under
    // text_config): five sliding-window layers to one global, sandwich norms, a GELU MLP.
    {"gemma3_text", "gemma3", Architecture::kGemma3},
    {"gemma3", "gemma3", Architecture::kGemma3},
    // Gemma 2: Gemma 3's norms, MLP and scales without Q/K norms, every other layer sliding,
    // the attention scores soft-capped.
    {"gemma2", "gemma2", Architecture::kGemma2},
    // MiniMax-M2 (and M2.1): Mixtral's layout (block_sparse_moe, experts w1/w2/w3) routed by
    // sigmoid scores with a correction bias, renormalized; Q and K each normed across all
    // their heads; rotary embedding on the first rotary_dim values of each head.
    {"minimax_m2", "minimax-m2", Architecture::kMiniMaxM2},
    // OLMo 2: norms after attention and after the MLP only, Q and K normed across heads.
    // OLMo 3 adds sliding-window layers (three of every four) with their own rotation (its
    // GGUF files, whose windows llama.cpp states its own way, are not read).
    {"olmo2", "olmo2", Architecture::kOlmo2},
    {"olmo3", "-", Architecture::kOlmo2},
    // Granite 3.x (dense): Llama's graph with the embeddings, each block's output and the
    // logits scaled, and a softmax scale of its own (attention_multiplier); attention_bias
    // covers O too.
    {"granite", "granite", Architecture::kGranite},
    // EXAONE 4.0: OLMo 2's norms (after attention and the MLP only) with per-head Q/K norms;
    // three sliding-window layers to one global, the global ones without rotary embedding.
    {"exaone4", "-", Architecture::kExaone4},
    // GLM-4 (GLM-4-9B/32B-0414, GLM-Z1): norms before and after attention and the MLP, Q/K/V
    // biases, gate and up in one matrix, rotary embedding on adjacent pairs of the first half
    // of each head.
    {"glm4", "glm4", Architecture::kGlm4},
    // Qwen3.5 (dense; qwen3_5 holds the text model's config under text_config): Gated DeltaNet
    // linear attention on three layers of four, gated attention with per-head Q/K norms on a
    // quarter of each head's values rotated on the others, every norm weight stored as an
    // offset from 1. No GGUF layout is read for it.
    {"qwen3_5_text", "qwen35", Architecture::kQwen35},
    {"qwen3_5", "-", Architecture::kQwen35},
    // Qwen3.5-MoE: Qwen3.5 with a mixture of experts on every layer (softmax top-k,
    // renormalized) beside one shared expert whose output a learned sigmoid gate scales.
    {"qwen3_5_moe_text", "qwen35moe", Architecture::kQwen35},
    {"qwen3_5_moe", "-", Architecture::kQwen35},
    // Qwen3-Next: Qwen3.5-MoE's graph with each key head's projections side by side
    // (LinearAttentionConfig::grouped_qkvz, grouped_ba) and Qwen3-MoE's choice of MoE layers;
    // llama.cpp's files (qwen3next) split q, k, v and z as Qwen3.5's but keep b and a grouped.
    {"qwen3_next", "-", Architecture::kQwen35},
};

absl::StatusOr<std::string> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// generation_config.json's eos_token_id (a chat model's end-of-turn ids, e.g. Llama 3's
// <|eot_id|>, often only there) joins config.json's.
absl::Status addGenerationConfig(const std::string& path, ModelConfig& c) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return absl::OkStatus();
  CLEAVE_ASSIGN_OR_RETURN(std::string text, readFile(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  const nlohmann::json ids = it->is_array() ? *it : nlohmann::json::array({*it});
  for (const auto& id : ids) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": field 'eos_token_id': must be a token id or a list of them"));
    }
    addStopId(c, id.get<uint32_t>());
  }
  return absl::OkStatus();
}

}  // namespace

std::span<const ArchName> architectures() { return kArchitectures; }
void addStopId(ModelConfig& c, uint32_t id) {
  if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end()) {
    c.eos_token_ids.push_back(id);
  }
}

void finishLongrope(uint32_t original, std::optional<double> factor, ModelConfig& c) {
  RopeScaling& s = c.rope_scaling;
  s.original_max_position_embeddings = original > 0 ? original : c.max_position_embeddings;
  s.factor = factor ? *factor
                    : static_cast<double>(c.max_position_embeddings) /
                          std::max<uint32_t>(s.original_max_position_embeddings, 1);
  if (!s.attention_factor) {
    s.attention_factor =
        s.factor <= 1.0
            ? 1.0
            : std::sqrt(1.0 + std::log(s.factor) / std::log(static_cast<double>(
                                                       s.original_max_position_embeddings)));
  }
}

absl::Status checkShape(const ModelConfig& c, const std::string& source) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  if (c.hidden_size == 0 || c.num_layers == 0 || c.num_heads == 0 || c.vocab_size == 0) {
    return bad(
        "hidden_size, num_hidden_layers, num_attention_heads and vocab_size must be positive");
  }
  if (c.num_kv_heads == 0 || c.num_heads % c.num_kv_heads != 0) {
    return bad(absl::StrCat("num_key_value_heads (", c.num_kv_heads,
                            ") must divide num_attention_heads (", c.num_heads, ")"));
  }
  if (c.head_dim == 0 || c.head_dim > 1024) {
    return bad(absl::StrCat("head_dim ", c.head_dim, " is not in 1..1024"));
  }
  if (c.num_layers > 1024 || c.num_heads > 1024 || c.hidden_size > (1u << 20)) {
    return bad("dimensions are implausibly large");
  }
  if (const LinearAttentionConfig* la = c.linear_attention ? &*c.linear_attention : nullptr) {
    if (la->key_heads == 0 || la->value_heads == 0 || la->key_head_dim == 0 ||
        la->value_head_dim == 0 || la->conv_kernel < 2 || la->key_head_dim > 1024 ||
        la->value_head_dim > 1024 || la->value_heads > 1024 || la->conv_kernel > 64) {
      return bad(absl::StrCat("linear attention's linear_num_key_heads, linear_num_value_heads, ",
                              "linear_key_head_dim, linear_value_head_dim (1..1024) and ",
                              "linear_conv_kernel_dim (2..64) are out of range"));
    }
    if (la->value_heads % la->key_heads != 0) {
      return bad(absl::StrCat("linear_num_key_heads (", la->key_heads,
                              ") must divide linear_num_value_heads (", la->value_heads, ")"));
    }
    if (la->layers.size() != c.num_layers) {
      return bad(
          absl::StrCat("layer_types names ", la->layers.size(), " layers of ", c.num_layers));
    }
    if (c.kvLayers() == 0) {
      return bad(
          "layer_types (or full_attention_interval) leaves no full_attention layer; a "
          "model of linear-attention layers alone is not supported");
    }
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "longrope") {
    const size_t pairs = (c.rotary_dim > 0 ? c.rotary_dim : c.head_dim) / 2;
    auto positive = [](double f) { return f > 0 && std::isfinite(f); };
    if (s.short_factor.size() != pairs || s.long_factor.size() != pairs ||
        !std::all_of(s.short_factor.begin(), s.short_factor.end(), positive) ||
        !std::all_of(s.long_factor.begin(), s.long_factor.end(), positive)) {
      return bad(absl::StrCat(
          "longrope needs one positive short and one positive long factor per rotary pair (", pairs,
          "; rope_scaling.short_factor and long_factor, or GGUF rope_factors_short and "
          "rope_factors_long), got ",
          s.short_factor.size(), " and ", s.long_factor.size()));
    }
    if (s.original_max_position_embeddings < 2) {
      return bad("longrope's original_max_position_embeddings must be at least 2");
    }
  }
  return absl::OkStatus();
}

const char* architectureName(Architecture arch) {
  for (const ArchName& a : architectures()) {
    if (a.arch == arch) return a.hf;
  }
  return "unknown";
}

bool ModelConfig::isMoeLayer(uint32_t layer) const {
  if (!moe) return false;
  if (layer < moe->first_k_dense) return false;
  for (uint32_t dense : moe->dense_layers) {
    if (dense == layer) return false;
  }
  return moe->sparse_step <= 1 || (layer + 1) % moe->sparse_step == 0;
}

uint32_t ModelConfig::attentionWindow(uint32_t layer) const {
  return layer < sliding_layers.size() && sliding_layers[layer] ? sliding_window : 0;
}

uint32_t ModelConfig::kvLayers() const {
  uint32_t linear = 0;
  for (uint32_t l = 0; l < num_layers; ++l) linear += isLinearLayer(l);
  return num_layers - linear;
}

uint32_t ModelConfig::kvLayer(uint32_t layer) const {
  uint32_t before = 0;
  for (uint32_t l = 0; l < layer; ++l) before += !isLinearLayer(l);
  return before;
}

double ModelConfig::queryScale(int64_t position) const {
  if (query_scale_beta == 0 || query_scale_period == 0) return 1.0;
  return 1.0 + query_scale_beta * std::log1p(static_cast<double>(position / query_scale_period));
}

absl::StatusOr<ModelConfig> loadModelConfig(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_directory(path, error)) {
    std::string config = (fs::path(path) / "config.json").string();
    CLEAVE_ASSIGN_OR_RETURN(std::string text, readFile(config));
    CLEAVE_ASSIGN_OR_RETURN(ModelConfig c, parseConfigJson(text, config));
    CLEAVE_RETURN_IF_ERROR(
        addGenerationConfig((fs::path(path) / "generation_config.json").string(), c));
    return c;
  }
  if (path.size() >= 5 && path.substr(path.size() - 5) == ".gguf") {
    CLEAVE_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
    return configFromGguf(*file);
  }
  CLEAVE_ASSIGN_OR_RETURN(std::string text, readFile(path));
  return parseConfigJson(text, path);
}

KvCacheShape kvCacheShape(const ModelConfig& config) {
  if (config.mla) {
    return {.parts = 1,
            .heads = 1,
            .head_dim = config.mla->kv_lora_rank + config.mla->qk_rope_head_dim,
            .replicated = true};
  }
  return {.parts = 2, .heads = config.num_kv_heads, .head_dim = config.head_dim};
}

}  // namespace cleave::model
