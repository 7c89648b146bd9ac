#include "common/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/model/gguf_builder_for_test.h"
#include "common/model/gguf_file.h"

namespace cleave::model {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::string kConfigs = std::string(CLEAVE_GOLDEN_DIR) + "/configs";

std::optional<uint32_t> optionalId(const nlohmann::json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<uint32_t>();
}

// Checks the config in `path` against transformers' values in `want`.
void checkConfig(const std::string& path, const nlohmann::json& want) {
  auto config = loadModelConfig(path);
  if (!want["cleave_supported"].get<bool>()) {
    ASSERT_FALSE(config.ok());
    EXPECT_THAT(config.status().message(),
                HasSubstr("\"" + want["architecture"].get<std::string>() + "\""));
    EXPECT_THAT(config.status().message(), HasSubstr("config.json"));
    return;
  }
  ASSERT_TRUE(config.ok()) << config.status();
  const ModelConfig& c = *config;
  EXPECT_EQ(c.model_type, want["architecture"].get<std::string>());
  EXPECT_EQ(c.hidden_size, want["hidden_size"].get<uint32_t>());
  EXPECT_EQ(c.intermediate_size, want["intermediate_size"].get<uint32_t>());
  EXPECT_EQ(c.num_layers, want["num_hidden_layers"].get<uint32_t>());
  EXPECT_EQ(c.num_heads, want["num_attention_heads"].get<uint32_t>());
  EXPECT_EQ(c.num_kv_heads, want["num_key_value_heads"].get<uint32_t>());
  // For MLA Cleave's head_dim is the Q/K head (no-rope + rope parts).
  EXPECT_EQ(c.head_dim, want.value("mla", false) ? want["mla_dims"]["qk_head_dim"].get<uint32_t>()
                                                 : want["head_dim"].get<uint32_t>());
  EXPECT_EQ(c.vocab_size, want["vocab_size"].get<uint32_t>());
  EXPECT_EQ(c.max_position_embeddings, want["max_position_embeddings"].get<uint32_t>());
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, want["rms_norm_eps"].get<double>());
  EXPECT_DOUBLE_EQ(c.rope_theta, want["rope_theta"].get<double>());
  std::string rope_type = want["rope_type"].get<std::string>();
  EXPECT_EQ(c.rope_scaling.type, rope_type == "default" ? "none" : rope_type);
  if (want["rope_scaling"].is_object() && want["rope_scaling"].contains("factor")) {
    EXPECT_DOUBLE_EQ(c.rope_scaling.factor, want["rope_scaling"]["factor"].get<double>());
  }
  if (want["rope_scaling"].is_object() &&
      want["rope_scaling"].contains("original_max_position_embeddings")) {
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings,
              want["rope_scaling"]["original_max_position_embeddings"].get<uint32_t>());
  }
  EXPECT_EQ(c.tie_word_embeddings, want["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(c.attention_bias, want["attention_bias"].get<bool>());
  if (!c.mla) {  // MLA's rotary part is qk_rope_head_dim, below.
    EXPECT_EQ(c.rotary_dim == 0 ? c.head_dim : c.rotary_dim, want["rotary_dim"].get<uint32_t>());
  }
  if (want.contains("qk_norm")) EXPECT_EQ(c.qk_norm, want["qk_norm"].get<bool>());
  if (want.contains("sandwich_norms")) {  // Gemma 3
    EXPECT_TRUE(c.post_norms);
    EXPECT_DOUBLE_EQ(c.embedding_scale, want["embedding_scale"].get<double>());
    EXPECT_EQ(c.mlp_activation, MlpActivation::kGeluTanh);
    EXPECT_DOUBLE_EQ(c.attention_scale,
                     1.0 / std::sqrt(want["query_pre_attn_scalar"].get<double>()));
    EXPECT_DOUBLE_EQ(c.sliding_rope_theta, want["sliding_rope_theta"].get<double>());
    EXPECT_DOUBLE_EQ(c.final_logit_softcap, want["final_logit_softcapping"].is_null()
                                                ? 0.0
                                                : want["final_logit_softcapping"].get<double>());
  } else {
    EXPECT_FALSE(c.post_norms);
    EXPECT_EQ(c.embedding_scale, 1.0);
    EXPECT_EQ(c.attention_scale, 0.0);
  }
  EXPECT_EQ(c.bos_token_id, optionalId(want["bos_token_id"]));
  std::vector<uint32_t> eos;
  if (want["eos_token_id"].is_array())
    eos = want["eos_token_id"].get<std::vector<uint32_t>>();
  else if (!want["eos_token_id"].is_null())
    eos.push_back(want["eos_token_id"].get<uint32_t>());
  EXPECT_EQ(c.eos_token_ids, eos);
  EXPECT_EQ(c.mla.has_value(), want.value("mla", false));
  const nlohmann::json& moe = want["moe"];
  ASSERT_EQ(c.moe.has_value(), moe.is_object() && !moe["num_experts"].is_null());
  if (c.moe) {
    EXPECT_EQ(c.moe->num_experts, moe["num_experts"].get<uint32_t>());
    EXPECT_EQ(c.moe->experts_per_token, moe["experts_per_token"].get<uint32_t>());
    if (!moe["moe_intermediate_size"].is_null()) {
      EXPECT_EQ(c.moe->expert_intermediate_size, moe["moe_intermediate_size"].get<uint32_t>());
    }
    EXPECT_EQ(c.moe->norm_topk_prob, moe["norm_topk_prob"].get<bool>());
    EXPECT_EQ(c.moe->shared_experts, moe["shared_experts"].get<uint32_t>());
    EXPECT_EQ(c.moe->scoring == MoeScoring::kSigmoid,
              moe["scoring"].get<std::string>() == "sigmoid");
    if (!moe["n_group"].is_null()) EXPECT_EQ(c.moe->n_group, moe["n_group"].get<uint32_t>());
    if (!moe["topk_group"].is_null())
      EXPECT_EQ(c.moe->topk_group, moe["topk_group"].get<uint32_t>());
    if (!moe["routed_scaling_factor"].is_null()) {
      EXPECT_DOUBLE_EQ(c.moe->routed_scaling_factor, moe["routed_scaling_factor"].get<double>());
    }
    if (!moe["first_k_dense_replace"].is_null()) {
      EXPECT_EQ(c.moe->first_k_dense, moe["first_k_dense_replace"].get<uint32_t>());
    }
  }
  EXPECT_EQ(c.attention_sinks, want.value("attention_sinks", false));
  EXPECT_EQ(c.o_bias, want.value("o_proj_bias", false));
  EXPECT_EQ(c.rope_scaling.truncate, want.value("rope_truncate", true));
  if (want.contains("swiglu_limit")) {  // gpt-oss's experts
    EXPECT_DOUBLE_EQ(c.moe->swiglu_limit, want["swiglu_limit"].get<double>());
    EXPECT_DOUBLE_EQ(c.moe->swiglu_alpha, want["swiglu_alpha"].get<double>());
    EXPECT_TRUE(c.moe->router_bias && c.moe->expert_bias);
  }
  if (want.contains("sliding_window") && !want["sliding_window"].is_null()) {
    EXPECT_EQ(c.sliding_window, want["sliding_window"].get<uint32_t>());
    ASSERT_EQ(c.sliding_layers.size(), want["layer_types"].size());
    for (uint32_t l = 0; l < c.num_layers; ++l) {
      const bool sliding = want["layer_types"][l] == "sliding_attention";
      EXPECT_EQ(c.attentionWindow(l), sliding ? c.sliding_window : 0u) << "layer " << l;
    }
  } else {
    EXPECT_EQ(c.sliding_window, 0u);
    EXPECT_EQ(c.attentionWindow(0), 0u);
  }
  if (c.mla) {
    const nlohmann::json& dims = want["mla_dims"];
    EXPECT_EQ(c.mla->kv_lora_rank, dims["kv_lora_rank"].get<uint32_t>());
    EXPECT_EQ(c.mla->qk_rope_head_dim, dims["qk_rope_head_dim"].get<uint32_t>());
    EXPECT_EQ(c.mla->rope_interleave, want.value("rope_interleave", true));
    const KvCacheShape kv = kvCacheShape(c);
    EXPECT_EQ(kv.parts, 1);
    EXPECT_EQ(kv.heads, 1u);
    EXPECT_EQ(kv.head_dim, c.mla->kv_lora_rank + c.mla->qk_rope_head_dim);
  } else {
    const KvCacheShape kv = kvCacheShape(c);
    EXPECT_EQ(kv.parts, 2);
    EXPECT_EQ(kv.heads, c.num_kv_heads);
    EXPECT_EQ(kv.head_dim, c.head_dim);
  }
}

// config.json files written by transformers' config classes; the expected values are
// those classes' own attributes.
TEST(ModelConfigGoldenTest, EveryConfigMatchesTransformers) {
  size_t checked = 0;
  for (const auto& entry : fs::directory_iterator(kConfigs)) {
    SCOPED_TRACE(entry.path().filename().string());
    std::ifstream in(entry.path() / "expected.json");
    ASSERT_TRUE(in.good());
    nlohmann::json want = nlohmann::json::parse(in);
    // The layout published checkpoints use, and the one transformers 5 writes.
    for (const fs::path& folder : {entry.path(), entry.path() / "transformers_v5"}) {
      if (!fs::exists(folder / "config.json")) continue;
      SCOPED_TRACE(folder.string());
      checkConfig(folder.string(), want);
    }
    ++checked;
  }
  EXPECT_GE(checked, 10u);
}

TEST(ModelConfigTest, BadFieldsNameTheFileAndField) {
  const std::pair<const char*, const char*> cases[] = {
      {"not a JSON object", "[1]"},
      {"model_type is missing", R"({"hidden_size": 8})"},
      {"\"bert\" is not a supported architecture", R"({"model_type": "bert"})"},
      {"hidden_size must be a non-negative integer", R"({"model_type":"llama","hidden_size":-1})"},
      {"num_hidden_layers is missing",
       R"({"model_type":"llama","hidden_size":8,"intermediate_size":8})"},
      {"must divide num_attention_heads",
       R"({"model_type":"llama","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":3,"vocab_size":5})"},
      {"rope_scaling.rope_type \"weird\"",
       R"({"model_type":"llama","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":5,"rope_scaling":{"rope_type":"weird"}})"},
      {"num_experts_per_tok must be in 1..4",
       R"({"model_type":"mixtral","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":5,"num_local_experts":4,"num_experts_per_tok":9})"},
      {"topk_method \"group_limited_greedy\"",
       R"({"model_type":"deepseek_v2","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":5,"n_routed_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":4,"topk_method":"group_limited_greedy","n_group":2,"topk_group":1,"kv_lora_rank":4,"qk_nope_head_dim":4,"qk_rope_head_dim":2,"v_head_dim":4})"},
      {"layer_types must list the 2 layers",
       R"({"model_type":"gpt_oss","hidden_size":8,"intermediate_size":8,"num_hidden_layers":2,"num_attention_heads":2,"vocab_size":5,"num_local_experts":4,"num_experts_per_tok":2,"sliding_window":4,"layer_types":["full_attention"]})"},
      {"layer_types layer 1: \"local\" is not sliding_attention or full_attention",
       R"({"model_type":"gpt_oss","hidden_size":8,"intermediate_size":8,"num_hidden_layers":2,"num_attention_heads":2,"vocab_size":5,"num_local_experts":4,"num_experts_per_tok":2,"sliding_window":4,"layer_types":["full_attention","local"]})"},
      {"sliding_window must be positive when layer_types names sliding layers",
       R"({"model_type":"gpt_oss","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":5,"num_local_experts":4,"num_experts_per_tok":2,"sliding_window":null,"layer_types":["sliding_attention"]})"},
      {"partial_rotary_factor 0.5 (rotary embedding on part of each head) is supported for "
       "glm4, glm4_moe, minimax_m2, phi3 and qwen3_5 only",
       R"({"model_type":"llama","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":5,"rope_parameters":{"rope_type":"default","rope_theta":10000,"partial_rotary_factor":0.5}})"},
      {"partial_rotary_factor 0.75 of head_dim 4 must be in (0, 1) and give an even number",
       R"({"model_type":"phi3","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":5,"partial_rotary_factor":0.75})"},
      {"sliding_window must be a non-negative integer",
       R"({"model_type":"mistral","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":5,"sliding_window":"wide"})"},
      {"model_type must be a string", R"({"model_type":3,"hidden_size":8})"},
      {"text_config must be an object", R"({"model_type":"gemma3","text_config":[1]})"},
      {"swiglu_limit must be > 0",
       R"({"model_type":"gpt_oss","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":5,"num_local_experts":4,"num_experts_per_tok":2,"swiglu_limit":0})"},
  };
  for (const auto& [expected, json] : cases) {
    auto config = parseConfigJson(json, "my/config.json");
    ASSERT_FALSE(config.ok()) << expected;
    EXPECT_THAT(config.status().message(), HasSubstr(expected));
    EXPECT_THAT(config.status().message(), HasSubstr("my/config.json"));
  }
}

TEST(ModelConfigTest, GenerationConfigAddsItsEndOfTurnIds) {
  const fs::path dir =
      fs::temp_directory_path() / ("cleave_generation_config_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(fs::path(kConfigs) / "llama3_rope" / "config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  auto base = loadModelConfig(dir.string());
  ASSERT_TRUE(base.ok()) << base.status();
  std::vector<uint32_t> want = base->eos_token_ids;
  ASSERT_FALSE(want.empty());
  // The first id repeats config.json's (kept once); the others are added in order.
  std::ofstream(dir / "generation_config.json")
      << R"({"bos_token_id": 1, "eos_token_id": [)" << want[0] << R"(, 7, 5]})";
  auto merged = loadModelConfig(dir.string());
  ASSERT_TRUE(merged.ok()) << merged.status();
  want.push_back(7);
  want.push_back(5);
  EXPECT_EQ(merged->eos_token_ids, want);
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": "x"})";
  auto bad = loadModelConfig(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("generation_config.json: field 'eos_token_id'"));
  fs::remove_all(dir);
}

TEST(ModelConfigTest, SmolLm2GgufMetadata) {
  std::string path = std::string(CLEAVE_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing; run scripts/install-deps.sh";
  auto config = loadModelConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, Architecture::kLlama);
  EXPECT_EQ(config->num_layers, 30u);
  EXPECT_EQ(config->hidden_size, 576u);
  EXPECT_EQ(config->intermediate_size, 1536u);
  EXPECT_EQ(config->num_heads, 9u);
  EXPECT_EQ(config->num_kv_heads, 3u);
  EXPECT_EQ(config->head_dim, 64u);
  EXPECT_EQ(config->vocab_size, 49152u);
  EXPECT_EQ(config->max_position_embeddings, 8192u);
  EXPECT_DOUBLE_EQ(config->rope_theta, 100000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(config->rms_norm_eps), 1e-5f);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->bos_token_id, 1u);
  EXPECT_THAT(config->eos_token_ids, ::testing::ElementsAre(2));
  EXPECT_FALSE(config->moe.has_value());
}

TEST(ModelConfigTest, GgufMoeAndUnsupportedArchitectures) {
  using testing::GgufBuilder;
  auto parse = [](std::string bytes) {
    auto file = GgufFile::parse(MappedFile::fromBuffer("moe.gguf", std::move(bytes)));
    EXPECT_TRUE(file.ok()) << file.status();
    return configFromGguf(**file);
  };
  auto moe = parse(GgufBuilder()
                       .kvString("general.architecture", "qwen3moe")
                       .kvU32("qwen3moe.block_count", 2)
                       .kvU32("qwen3moe.context_length", 4096)
                       .kvU32("qwen3moe.embedding_length", 64)
                       .kvU32("qwen3moe.attention.head_count", 4)
                       .kvU32("qwen3moe.attention.head_count_kv", 2)
                       .kvU32("qwen3moe.vocab_size", 100)
                       .kvU32("qwen3moe.expert_count", 8)
                       .kvU32("qwen3moe.expert_used_count", 2)
                       .kvU32("qwen3moe.expert_feed_forward_length", 32)
                       .kvBool("qwen3moe.expert_weights_norm", true)
                       .build());
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->architecture, Architecture::kQwen3Moe);
  ASSERT_TRUE(moe->moe.has_value());
  EXPECT_EQ(moe->moe->num_experts, 8u);
  EXPECT_EQ(moe->moe->expert_intermediate_size, 32u);
  EXPECT_TRUE(moe->moe->norm_topk_prob);
  EXPECT_EQ(moe->head_dim, 16u);

  auto bad = parse(GgufBuilder().kvString("general.architecture", "rwkv6").build());
  EXPECT_THAT(bad.status().message(), HasSubstr("\"rwkv6\" is not supported"));
  auto missing = parse(GgufBuilder().kvString("general.architecture", "llama").build());
  EXPECT_THAT(missing.status().message(), HasSubstr("llama.block_count"));
}

// Float32 bytes of `values` (a GGUF tensor's data).
std::string f32Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), 4 * values.size());
}

// llama.cpp's OLMo 2 files: norms after attention and the MLP only, Q and K normed across
// heads (attn_q_norm present); a window (OLMo 3's) refused naming the key.
TEST(ModelConfigTest, GgufOlmo2) {
  using testing::GgufBuilder;
  auto olmo2 = [](bool window) {
    GgufBuilder b;
    b.kvString("general.architecture", "olmo2")
        .kvU32("olmo2.block_count", 2)
        .kvU32("olmo2.context_length", 4096)
        .kvU32("olmo2.embedding_length", 64)
        .kvU32("olmo2.feed_forward_length", 96)
        .kvU32("olmo2.attention.head_count", 4)
        .kvU32("olmo2.vocab_size", 100);
    if (window) b.kvU32("olmo2.attention.sliding_window", 4096);
    b.tensor("blk.0.attn_q_norm.weight", {64}, 0, 0, std::string(256, '\0'));
    auto file = GgufFile::parse(MappedFile::fromBuffer("olmo2.gguf", b.build()));
    EXPECT_TRUE(file.ok()) << file.status();
    return configFromGguf(**file);
  };
  auto c = olmo2(false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kOlmo2);
  EXPECT_FALSE(c->pre_norms);
  EXPECT_TRUE(c->post_norms && c->qk_norm && c->qk_norm_across_heads);
  auto windowed = olmo2(true);
  EXPECT_EQ(windowed.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(windowed.status().message(), HasSubstr("olmo2.attention.sliding_window"));
}

// llama.cpp's Phi-3 files: a window on every layer from phi3.attention.sliding_window (as
// transformers applies it); rotary embedding on part of each head; longrope's factors from
// the rope_factors_* tensors (a missing or misshapen one refused, naming it); a bias on the
// fused QKV refused.
TEST(ModelConfigTest, GgufPhi3) {
  using testing::GgufBuilder;
  // longrope: 0 none, else that many factors per set (with the attention factor key when 2).
  auto phi3 = [](uint32_t rotated, int longrope, uint32_t window = 2047, bool qkv_bias = false) {
    GgufBuilder b;
    b.kvString("general.architecture", "phi3")
        .kvU32("phi3.block_count", 3)
        .kvU32("phi3.context_length", 4096)
        .kvU32("phi3.embedding_length", 64)
        .kvU32("phi3.feed_forward_length", 176)
        .kvU32("phi3.attention.head_count", 4)
        .kvU32("phi3.attention.head_count_kv", 4)
        .kvU32("phi3.rope.dimension_count", rotated)
        .kvU32("phi3.attention.sliding_window", window)
        .kvU32("phi3.vocab_size", 100)
        .kvU32("phi3.rope.scaling.original_context_length", 1024);
    if (longrope > 0) {
      std::vector<float> factors(longrope);
      for (int i = 0; i < longrope; ++i) factors[i] = 1.0f + 0.5f * static_cast<float>(i);
      b.tensor("rope_factors_long.weight", {factors.size()}, 0, 0, f32Bytes(factors));
      for (float& f : factors) f = 1.0f / f;
      b.tensor("rope_factors_short.weight", {factors.size()}, 0, 64, f32Bytes(factors));
      if (longrope == 2) b.kvF32("phi3.rope.scaling.attn_factor", 1.25f);
    }
    if (qkv_bias) b.tensor("blk.0.attn_qkv.bias", {192}, 0, 0, std::string(768, '\0'));
    auto file = GgufFile::parse(MappedFile::fromBuffer("phi3.gguf", b.build()));
    EXPECT_TRUE(file.ok()) << file.status();
    return configFromGguf(**file);
  };
  auto c = phi3(16, false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kPhi3);
  EXPECT_EQ(c->head_dim, 16u);
  for (uint32_t l = 0; l < 3; ++l) EXPECT_EQ(c->attentionWindow(l), 2047u) << l;
  EXPECT_TRUE(c->tie_word_embeddings);   // No output.weight in the file.
  auto unwindowed = phi3(16, false, 0);  // Phi-4's files: a window of 0, none.
  ASSERT_TRUE(unwindowed.ok()) << unwindowed.status();
  EXPECT_EQ(unwindowed->attentionWindow(0), 0u);
  auto biased = phi3(16, false, 2047, true);
  EXPECT_EQ(biased.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(biased.status().message(), HasSubstr("blk.0.attn_qkv.bias"));
  auto partial = phi3(12, false);  // Phi-4-mini's files rotate part of each head.
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_EQ(partial->rotary_dim, 12u);
  auto odd = phi3(11, false);
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(odd.status().message(), HasSubstr("phi3.rope.dimension_count 11 must be even"));
  auto longrope = phi3(12, 6);  // Phi-4-mini: factors for the 6 pairs that rotate.
  ASSERT_TRUE(longrope.ok()) << longrope.status();
  const RopeScaling& r = longrope->rope_scaling;
  EXPECT_EQ(r.type, "longrope");
  EXPECT_EQ(r.original_max_position_embeddings, 1024u);
  EXPECT_DOUBLE_EQ(r.factor, 4.0);  // Context 4096 over 1024, as the converter derives it.
  ASSERT_TRUE(r.attention_factor.has_value());
  EXPECT_NEAR(*r.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(1024.0)), 1e-12);
  ASSERT_EQ(r.long_factor.size(), 6u);
  EXPECT_EQ(r.long_factor[5], 3.5);
  EXPECT_FLOAT_EQ(static_cast<float>(r.short_factor[1]), 1 / 1.5f);
  auto stated = phi3(4, 2);  // The file's attention factor wins.
  ASSERT_TRUE(stated.ok()) << stated.status();
  EXPECT_DOUBLE_EQ(*stated->rope_scaling.attention_factor, 1.25);
  auto short_set = phi3(16, 6);  // 8 pairs rotate: 6 factors are too few.
  EXPECT_EQ(short_set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_set.status().message(), HasSubstr("per rotary pair (8"));
}

// Which families' attention_bias puts a bias on O too (Llama's, SmolLM3's; Seed-OSS by
// attention_out_bias; Qwen2's and Mistral's never), and mlp_bias refused.
TEST(ModelConfigTest, AttentionAndMlpBiases) {
  auto parse = [](const std::string& type, const std::string& extra) {
    return parseConfigJson(R"({"model_type": ")" + type +
                               R"(", "hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "intermediate_size": 96,
                               "vocab_size": 100)" +
                               extra + "}",
                           "config.json");
  };
  for (const auto& [type, extra, q, o] :
       {std::tuple{"llama", R"(, "attention_bias": true)", true, true},
        std::tuple{"smollm3", R"(, "attention_bias": true)", true, true},
        std::tuple{"qwen2", "", true, false}, std::tuple{"seed_oss", "", true, false},
        std::tuple{"seed_oss", R"(, "attention_out_bias": true)", true, true},
        std::tuple{"llama", "", false, false}}) {
    SCOPED_TRACE(std::string(type) + extra);
    auto c = parse(type, extra);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->attention_bias, q);
    EXPECT_EQ(c->o_bias, o);
  }
  auto mlp = parse("llama", R"(, "mlp_bias": true)");
  EXPECT_EQ(mlp.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(mlp.status().message(), HasSubstr("mlp_bias"));
}

// SmolLM3: every fourth layer unrotated by default, or as no_rope_layers lists them; with
// use_sliding_window those layers (or the ones layer_types names) attend to a window; tied
// embeddings unless told otherwise; a malformed list refused naming it.
TEST(ModelConfigTest, SmolLm3NopeLayers) {
  auto parse = [](const std::string& extra) {
    return parseConfigJson(R"({"model_type": "smollm3", "hidden_size": 64, "num_hidden_layers": 8,
                               "num_attention_heads": 4, "intermediate_size": 96,
                               "vocab_size": 100)" +
                               extra + "}",
                           "config.json");
  };
  auto c = parse("");
  ASSERT_TRUE(c.ok()) << c.status();
  for (uint32_t l = 0; l < 8; ++l) EXPECT_EQ(c->rotates(l), l != 3 && l != 7) << l;
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->attentionWindow(3), 0u);
  auto listed =
      parse(R"(, "no_rope_layers": [0, 1, 1, 1, 1, 1, 1, 0], "tie_word_embeddings": false)");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_FALSE(listed->rotates(0));
  EXPECT_TRUE(listed->rotates(3));
  EXPECT_FALSE(listed->tie_word_embeddings);
  auto windowed = parse(R"(, "use_sliding_window": true, "sliding_window": 64)");
  ASSERT_TRUE(windowed.ok()) << windowed.status();
  EXPECT_EQ(windowed->attentionWindow(3), 64u);
  EXPECT_EQ(windowed->attentionWindow(2), 0u);
  auto short_list = parse(R"(, "no_rope_layers": [1, 0])");
  EXPECT_THAT(short_list.status().message(), HasSubstr("no_rope_layers must list the 8 layers"));
  auto bad_value = parse(R"(, "no_rope_layers": [1, 1, 2, 1, 1, 1, 1, 0])");
  EXPECT_THAT(bad_value.status().message(), HasSubstr("layer 2: 2 is not 0 or 1"));
}

// MiniMax-M2 as published: rotary_dim rather than a factor (64 of 128), Q/K norms across
// heads, sigmoid routing with a correction bias, renormalized; other norm layouts and
// scorings refused naming the field.
TEST(ModelConfigTest, MiniMaxM2) {
  auto parse = [](const std::string& extra) {
    return parseConfigJson(R"({"model_type": "minimax_m2", "hidden_size": 3072,
                               "num_hidden_layers": 62, "num_attention_heads": 48,
                               "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 1536,
                               "num_local_experts": 256, "num_experts_per_tok": 8,
                               "vocab_size": 200064, "rope_theta": 5000000, "rotary_dim": 64,
                               "qk_norm_type": "per_layer", "scoring_func": "sigmoid",
                               "use_qk_norm": true)" +
                               extra + "}",
                           "config.json");
  };
  auto c = parse("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kMiniMaxM2);
  EXPECT_EQ(c->rotary_dim, 64u);
  EXPECT_TRUE(c->qk_norm && c->qk_norm_across_heads);
  ASSERT_TRUE(c->moe.has_value());
  EXPECT_EQ(c->moe->num_experts, 256u);
  EXPECT_EQ(c->moe->expert_intermediate_size, 1536u);
  EXPECT_EQ(c->moe->scoring, MoeScoring::kSigmoid);
  EXPECT_TRUE(c->moe->score_correction_bias && c->moe->norm_topk_prob);
  EXPECT_EQ(c->moe->n_group, 1u);
  EXPECT_EQ(c->rope_theta, 5000000.0);
  auto unbiased = parse(R"(, "use_routing_bias": false)");
  ASSERT_TRUE(unbiased.ok()) << unbiased.status();
  EXPECT_FALSE(unbiased->moe->score_correction_bias);
  auto per_head = parse(R"(, "qk_norm_type": "per_head")");
  EXPECT_THAT(per_head.status().message(), HasSubstr("qk_norm_type \"per_head\" is not"));
  auto softmax = parse(R"(, "scoring_func": "softmax")");
  EXPECT_THAT(softmax.status().message(), HasSubstr("scoring_func \"softmax\" is not"));
}

// Gemma 2: transformers' soft caps when the config has no key (50 on the scores, 30 on the
// logits), none for a null one; every other layer sliding (4096 by default); no Q/K norms.
TEST(ModelConfigTest, Gemma2) {
  auto parse = [](const std::string& extra) {
    return parseConfigJson(R"({"model_type": "gemma2", "hidden_size": 3584,
                               "num_hidden_layers": 42, "num_attention_heads": 16,
                               "num_key_value_heads": 8, "head_dim": 256,
                               "intermediate_size": 14336, "vocab_size": 256000,
                               "hidden_activation": "gelu_pytorch_tanh")" +
                               extra + "}",
                           "config.json");
  };
  auto c = parse("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kGemma2);
  EXPECT_EQ(c->attention_softcap, 50.0);
  EXPECT_EQ(c->final_logit_softcap, 30.0);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->pre_norms && c->post_norms);
  EXPECT_EQ(c->attentionWindow(0), 4096u);
  EXPECT_EQ(c->attentionWindow(1), 0u);
  EXPECT_EQ(c->sliding_rope_theta, 0.0);
  EXPECT_DOUBLE_EQ(c->attention_scale, 1.0 / 16.0);  // query_pre_attn_scalar 256
  EXPECT_TRUE(c->tie_word_embeddings);  // Published configs leave it to the class: tied.
  auto uncapped = parse(R"(, "attn_logit_softcapping": null, "final_logit_softcapping": null)");
  ASSERT_TRUE(uncapped.ok()) << uncapped.status();
  EXPECT_EQ(uncapped->attention_softcap, 0.0);
  EXPECT_EQ(uncapped->final_logit_softcap, 0.0);
  auto negative = parse(R"(, "attn_logit_softcapping": -1)");
  EXPECT_THAT(negative.status().message(), HasSubstr("attn_logit_softcapping must be positive"));
}

// EXAONE 4.0: post norms only with per-head Q/K norms; by transformers' defaults every fourth
// layer global and unrotated, the others sliding over 4096 positions; no window: every layer
// global and rotated; a pattern string without layer_types refused naming it.
TEST(ModelConfigTest, Exaone4) {
  auto parse = [](const std::string& extra) {
    return parseConfigJson(R"({"model_type": "exaone4", "hidden_size": 64,
                               "num_hidden_layers": 8, "num_attention_heads": 4,
                               "intermediate_size": 96, "vocab_size": 100)" +
                               extra + "}",
                           "config.json");
  };
  auto c = parse("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kExaone4);
  EXPECT_FALSE(c->pre_norms);
  EXPECT_TRUE(c->post_norms && c->qk_norm);
  EXPECT_FALSE(c->qk_norm_across_heads);
  for (uint32_t l = 0; l < 8; ++l) {
    EXPECT_EQ(c->attentionWindow(l), l % 4 == 3 ? 0u : 4096u) << l;
    EXPECT_EQ(c->rotates(l), l % 4 != 3) << l;
  }
  auto global = parse(R"(, "sliding_window": null)");
  ASSERT_TRUE(global.ok()) << global.status();
  EXPECT_EQ(global->attentionWindow(3), 0u);
  EXPECT_TRUE(global->rotates(3));
  auto lettered = parse(R"(, "sliding_window_pattern": "LLLG")");
  EXPECT_THAT(lettered.status().message(), HasSubstr("sliding_window_pattern must be a number"));
}

// Qwen3.5 as published (multimodal: the text model under text_config, token ids and the tied
// head at the top level; mrope's sections, which text alone rotates as plain RoPE, ignored):
// every fourth layer attends, the others are linear attention; a quarter of each head
// rotates. Layer types other than the two, or a linear config that cannot be split, refused.
TEST(ModelConfigTest, Qwen35) {
  auto parse = [](const std::string& text_extra, const std::string& top_extra = "") {
    return parseConfigJson(
        R"({"model_type": "qwen3_5", "eos_token_id": 248046, "tie_word_embeddings": true,
            "text_config": {"model_type": "qwen3_5_text", "hidden_size": 1024,
              "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
              "head_dim": 256, "intermediate_size": 3584, "vocab_size": 248320,
              "linear_num_key_heads": 16, "linear_num_value_heads": 16,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                "partial_rotary_factor": 0.25, "mrope_interleaved": true,
                "mrope_section": [11, 11, 10]})" +
            text_extra + "}" + top_extra + "}",
        "config.json");
  };
  auto c = parse("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen35);
  EXPECT_TRUE(c->tie_word_embeddings && c->qk_norm && c->attention_output_gate);
  EXPECT_EQ(c->eos_token_ids, std::vector<uint32_t>{248046});
  EXPECT_EQ(c->rotary_dim, 64u);
  EXPECT_EQ(c->rope_theta, 1e7);
  ASSERT_TRUE(c->linear_attention.has_value());
  EXPECT_EQ(c->linear_attention->key_heads, 16u);
  EXPECT_EQ(c->linear_attention->key_head_dim, 128u);
  EXPECT_EQ(c->linear_attention->value_head_dim, 128u);
  EXPECT_EQ(c->linear_attention->conv_kernel, 4u);
  for (uint32_t l = 0; l < 8; ++l) EXPECT_EQ(c->isLinearLayer(l), l % 4 != 3) << l;
  EXPECT_EQ(c->kvLayers(), 2u);
  EXPECT_EQ(c->kvLayer(7), 1u);
  EXPECT_EQ(c->linearLayer(6), 5u);
  auto listed = parse(R"(, "layer_types": ["full_attention", "linear_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "full_attention", "linear_attention"])");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->kvLayers(), 3u);
  EXPECT_EQ(listed->kvLayer(6), 2u);
  auto sliding = parse(R"(, "layer_types": ["sliding_attention", "linear_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "full_attention", "linear_attention"])");
  EXPECT_THAT(sliding.status().message(),
              HasSubstr("layer 0: \"sliding_attention\" is not linear_attention"));
  auto all_linear = parse(R"(, "full_attention_interval": 9)");
  EXPECT_THAT(all_linear.status().message(), HasSubstr("leaves no full_attention layer"));
  auto uneven = parse(R"(, "linear_num_value_heads": 24)");
  EXPECT_THAT(uneven.status().message(), HasSubstr("linear_num_key_heads (16) must divide"));
  auto flat = parseConfigJson(R"({"model_type": "qwen3_5", "hidden_size": 64})", "config.json");
  EXPECT_THAT(flat.status().message(), HasSubstr("must hold its text model's in text_config"));
  // Qwen3.5-MoE (35B-A3B's shape): experts on every layer, no dense MLP size, one gated
  // shared expert.
  auto moe = parseConfigJson(
      R"({"model_type": "qwen3_5_moe", "text_config": {"hidden_size": 2048,
          "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
          "vocab_size": 248320, "num_experts": 256, "num_experts_per_tok": 8,
          "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512}})",
      "config.json");
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->model_type, "qwen3_5_moe_text");
  EXPECT_EQ(moe->intermediate_size, 0u);
  EXPECT_EQ(moe->head_dim, 256u);
  ASSERT_TRUE(moe->moe.has_value());
  EXPECT_TRUE(moe->moe->norm_topk_prob && moe->moe->shared_expert_gate);
  EXPECT_EQ(moe->moe->shared_experts, 1u);
  EXPECT_EQ(moe->moe->shared_expert_intermediate_size, 512u);
  for (uint32_t l = 0; l < 40; ++l) EXPECT_TRUE(moe->isMoeLayer(l)) << l;
  EXPECT_EQ(moe->kvLayers(), 10u);
  EXPECT_FALSE(moe->linear_attention->grouped_qkvz || moe->linear_attention->grouped_ba);
  // Qwen3-Next (80B-A3B's shape): grouped projections, Qwen3-MoE's dense layers.
  auto next = parseConfigJson(
      R"({"model_type": "qwen3_next", "hidden_size": 2048, "intermediate_size": 5120,
          "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
          "vocab_size": 151936, "num_experts": 512, "num_experts_per_tok": 10,
          "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
          "decoder_sparse_step": 1, "mlp_only_layers": [0], "norm_topk_prob": true,
          "full_attention_interval": 4, "partial_rotary_factor": 0.25, "head_dim": 256})",
      "config.json");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->linear_attention->grouped_qkvz && next->linear_attention->grouped_ba);
  EXPECT_EQ(next->linear_attention->value_heads, 32u);
  EXPECT_FALSE(next->isMoeLayer(0));
  EXPECT_TRUE(next->isMoeLayer(1) && next->moe->shared_expert_gate);
  EXPECT_EQ(next->kvLayers(), 12u);
}

// Granite 3's multipliers (granite-3.3-8b's), and one that is not positive refused naming it.
TEST(ModelConfigTest, Granite) {
  auto parse = [](const std::string& extra) {
    return parseConfigJson(R"({"model_type": "granite", "hidden_size": 4096,
                               "num_hidden_layers": 40, "num_attention_heads": 32,
                               "num_key_value_heads": 8, "intermediate_size": 12800,
                               "vocab_size": 49159, "embedding_multiplier": 12.0,
                               "residual_multiplier": 0.22, "attention_multiplier": 0.0078125,
                               "attention_bias": false)" +
                               extra + "}",
                           "config.json");
  };
  auto c = parse(R"(, "logits_scaling": 16.0)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kGranite);
  EXPECT_EQ(c->embedding_scale, 12.0);
  EXPECT_EQ(c->residual_scale, 0.22);
  EXPECT_EQ(c->attention_scale, 0.0078125);
  EXPECT_EQ(c->logits_scaling, 16.0);
  EXPECT_FALSE(c->o_bias);
  auto zero = parse(R"(, "logits_scaling": 0)");
  EXPECT_THAT(zero.status().message(), HasSubstr("logits_scaling must be a positive number"));
}

// OLMo 2 and 3: post norms only, Q/K norms across heads; OLMo 3 by transformers' defaults (a
// window of 4096 on three layers of every four, every layer type rotating with rope_theta).
TEST(ModelConfigTest, Olmo) {
  auto parse = [](const std::string& type, const std::string& extra) {
    return parseConfigJson(R"({"model_type": ")" + type + R"(", "hidden_size": 64,
                               "num_hidden_layers": 8, "num_attention_heads": 4,
                               "intermediate_size": 96, "vocab_size": 100)" +
                               extra + "}",
                           "config.json");
  };
  auto olmo2 = parse("olmo2", R"(, "rope_theta": 500000)");
  ASSERT_TRUE(olmo2.ok()) << olmo2.status();
  EXPECT_FALSE(olmo2->pre_norms);
  EXPECT_TRUE(olmo2->post_norms && olmo2->qk_norm && olmo2->qk_norm_across_heads);
  EXPECT_EQ(olmo2->attentionWindow(0), 0u);
  auto olmo3 = parse("olmo3", R"(, "rope_theta": 250000)");
  ASSERT_TRUE(olmo3.ok()) << olmo3.status();
  for (uint32_t l = 0; l < 8; ++l) EXPECT_EQ(olmo3->attentionWindow(l), l % 4 == 3 ? 0u : 4096u);
  EXPECT_EQ(olmo3->rope_theta, 250000.0);
  EXPECT_EQ(olmo3->sliding_rope_theta, 250000.0);
  auto none = parse("olmo3", R"(, "sliding_window": null)");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->attentionWindow(0), 0u);
  EXPECT_EQ(olmo3->rms_norm_eps, 1e-5);  // OLMo's default
  // layer_types without a window: transformers' 4096.
  auto typed = parse("olmo3", R"(, "layer_types": ["sliding_attention", "full_attention",
                                  "sliding_attention", "full_attention", "sliding_attention",
                                  "full_attention", "sliding_attention", "full_attention"])");
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_EQ(typed->attentionWindow(0), 4096u);
  EXPECT_EQ(typed->attentionWindow(1), 0u);
  // One flat rotation object: the global layers'.
  auto flat = parse("olmo3", R"(, "rope_parameters": {"rope_type": "yarn", "factor": 8.0,
                                 "original_max_position_embeddings": 8192, "rope_theta": 1e6})");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(flat->rope_scaling.type, "yarn");
  EXPECT_EQ(flat->rope_theta, 1e6);
  auto scaled =
      parse("olmo3", R"(, "rope_parameters": {"sliding_attention": {"rope_type": "yarn"}})");
  EXPECT_THAT(scaled.status().message(), HasSubstr("not supported for sliding layers"));
}

// Mistral 3's multimodal configs: the text model is text_config (mistral by default, or
// ministral3, whose rotation defaults to transformers' YaRN with Llama 4's query temperature);
// a mistral3 config without one is refused naming it.
TEST(ModelConfigTest, Mistral3TextConfig) {
  auto parse = [](const std::string& text) { return parseConfigJson(text, "config.json"); };
  const std::string dims =
      R"("hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 100)";
  auto small = parse(R"({"model_type": "mistral3", "text_config": {)" + dims +
                     R"(, "sliding_window": null, "max_position_embeddings": 131072}})");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->model_type, "mistral");
  EXPECT_EQ(small->attentionWindow(0), 0u);
  EXPECT_EQ(small->max_position_embeddings, 131072u);
  auto ministral = parse(
      R"({"model_type": "mistral3", "text_config": {"model_type": "ministral3", )" + dims + "}}");
  ASSERT_TRUE(ministral.ok()) << ministral.status();
  EXPECT_EQ(ministral->model_type, "ministral3");
  EXPECT_EQ(ministral->rope_scaling.type, "yarn");
  EXPECT_EQ(ministral->rope_scaling.factor, 16.0);
  EXPECT_EQ(ministral->query_scale_beta, 0.1);
  EXPECT_EQ(ministral->query_scale_period, 16384u);
  EXPECT_EQ(ministral->queryScale(16383), 1.0);
  EXPECT_NEAR(ministral->queryScale(40000), 1 + 0.1 * std::log(3.0), 1e-12);
  auto bare = parse(R"({"model_type": "mistral3", )" + dims + "}");
  EXPECT_EQ(bare.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bare.status().message(), HasSubstr("text_config"));
  auto text = parse(R"({"model_type": "mistral3", "text_config": 7})");
  EXPECT_THAT(text.status().message(), HasSubstr("text_config must be an object"));
}

// A config.json with longrope (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini): the factors, the
// top-level original_max_position_embeddings over the scaling object's, the stretch from the
// contexts unless stated, the attention factor derived unless stated; "su" read as longrope;
// factors of the wrong count or sign refused, naming the fields.
TEST(ModelConfigTest, Longrope) {
  auto parse = [](const std::string& rope, const std::string& top = "") {
    return parseConfigJson(
        R"({"model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100,
            "max_position_embeddings": 131072, "partial_rotary_factor": 0.75, )" +
            top + R"("rope_scaling": )" + rope + "}",
        "config.json");
  };
  const std::string factors =
      R"("short_factor": [1, 1.5, 2, 2.5, 3, 3.5], "long_factor": [4, 5, 6, 7, 8, 9])";
  auto c = parse(R"({"type": "longrope", )" + factors + "}",
                 R"("original_max_position_embeddings": 4096, )");
  ASSERT_TRUE(c.ok()) << c.status();
  const RopeScaling& r = c->rope_scaling;
  EXPECT_EQ(r.type, "longrope");
  EXPECT_EQ(c->rotary_dim, 12u);
  EXPECT_EQ(r.original_max_position_embeddings, 4096u);
  EXPECT_DOUBLE_EQ(r.factor, 32.0);
  EXPECT_NEAR(*r.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-12);
  EXPECT_EQ(r.short_factor, (std::vector<double>{1, 1.5, 2, 2.5, 3, 3.5}));
  EXPECT_EQ(r.long_factor.back(), 9);
  auto inner = parse(R"({"rope_type": "su", "original_max_position_embeddings": 8192, "factor": 2,
                         "attention_factor": 1.5, )" +
                     factors + "}");
  ASSERT_TRUE(inner.ok()) << inner.status();
  EXPECT_EQ(inner->rope_scaling.type, "longrope");
  EXPECT_EQ(inner->rope_scaling.original_max_position_embeddings, 8192u);
  EXPECT_DOUBLE_EQ(inner->rope_scaling.factor, 2.0);
  EXPECT_DOUBLE_EQ(*inner->rope_scaling.attention_factor, 1.5);
  auto few = parse(R"({"type": "longrope", "short_factor": [1, 2], "long_factor": [1, 2]})");
  EXPECT_EQ(few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(few.status().message(), HasSubstr("rope_scaling.short_factor"));
  auto negative = parse(R"({"type": "longrope", "short_factor": [1, 1, 1, 1, 1, -1],
                            "long_factor": [1, 1, 1, 1, 1, 1]})");
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  auto text = parse(R"({"type": "longrope", "short_factor": "1", "long_factor": []})");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("rope_scaling.short_factor must be an array"));
}

// llama.cpp's GLM-4.5 files: block_count counts the multi-token-prediction layer, the rotary
// part of each head is rope.dimension_count, routing as DeepSeek-V3's from the expert keys.
TEST(ModelConfigTest, GgufGlm4Moe) {
  using testing::GgufBuilder;
  auto glm = [](uint32_t nextn, uint32_t rotated) {
    GgufBuilder b;
    b.kvString("general.architecture", "glm4moe")
        .kvU32("glm4moe.block_count", 3 + nextn)
        .kvU32("glm4moe.context_length", 4096)
        .kvU32("glm4moe.embedding_length", 64)
        .kvU32("glm4moe.feed_forward_length", 176)
        .kvU32("glm4moe.attention.head_count", 4)
        .kvU32("glm4moe.attention.head_count_kv", 2)
        .kvU32("glm4moe.attention.key_length", 32)
        .kvU32("glm4moe.rope.dimension_count", rotated)
        .kvU32("glm4moe.expert_count", 8)
        .kvU32("glm4moe.expert_used_count", 2)
        .kvU32("glm4moe.expert_feed_forward_length", 16)
        .kvU32("glm4moe.expert_shared_count", 1)
        .kvU32("glm4moe.leading_dense_block_count", 1)
        .kvU32("glm4moe.expert_gating_func", 2)
        .kvBool("glm4moe.expert_weights_norm", true)
        .kvU32("glm4moe.nextn_predict_layers", nextn)
        .kvU32("glm4moe.vocab_size", 100);
    b.tensor("blk.1.exp_probs_b.bias", {8}, 0, 0, std::string(32, '\0'));
    auto file = GgufFile::parse(MappedFile::fromBuffer("glm.gguf", b.build()));
    EXPECT_TRUE(file.ok()) << file.status();
    return configFromGguf(**file);
  };
  auto c = glm(1, 16);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kGlm4Moe);
  EXPECT_EQ(c->num_layers, 3u);  // The prediction layer is not run.
  EXPECT_EQ(c->head_dim, 32u);
  EXPECT_EQ(c->rotary_dim, 16u);
  ASSERT_TRUE(c->moe.has_value());
  EXPECT_EQ(c->moe->scoring, MoeScoring::kSigmoid);
  EXPECT_TRUE(c->moe->score_correction_bias);
  EXPECT_TRUE(c->moe->norm_topk_prob);
  EXPECT_EQ(c->moe->shared_experts, 1u);
  EXPECT_FALSE(c->isMoeLayer(0));
  EXPECT_TRUE(c->isMoeLayer(2));
  auto all = glm(0, 32);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->num_layers, 3u);
  EXPECT_EQ(all->rotary_dim, 0u);  // Every dimension rotates.
  auto wide = glm(0, 40);
  EXPECT_THAT(wide.status().message(), HasSubstr("glm4moe.rope.dimension_count 40 must be even"));
}

// llama.cpp's Gemma 3 files: what they leave unsaid is llama.cpp's rule (every sixth layer
// global, the sliding layers' base 10000, the 27B's 62 layers scaling queries by hidden /
// heads, the others by head_dim).
TEST(ModelConfigTest, GgufGemma3) {
  using testing::GgufBuilder;
  auto gemma = [](uint32_t layers, uint32_t hidden, uint32_t heads, uint32_t head_dim) {
    GgufBuilder b;
    b.kvString("general.architecture", "gemma3")
        .kvU32("gemma3.block_count", layers)
        .kvU32("gemma3.context_length", 131072)
        .kvU32("gemma3.embedding_length", hidden)
        .kvU32("gemma3.feed_forward_length", 4 * hidden)
        .kvU32("gemma3.attention.head_count", heads)
        .kvU32("gemma3.attention.head_count_kv", heads / 2)
        .kvU32("gemma3.attention.key_length", head_dim)
        .kvU32("gemma3.attention.sliding_window", 1024)
        .kvU32("gemma3.vocab_size", 100);
    auto file = GgufFile::parse(MappedFile::fromBuffer("gemma3.gguf", b.build()));
    EXPECT_TRUE(file.ok()) << file.status();
    return configFromGguf(**file);
  };
  auto c = gemma(34, 2560, 8, 256);  // 4B
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kGemma3);
  EXPECT_TRUE(c->post_norms);
  EXPECT_EQ(c->mlp_activation, MlpActivation::kGeluTanh);
  EXPECT_DOUBLE_EQ(c->embedding_scale, std::sqrt(2560.0));
  EXPECT_DOUBLE_EQ(c->attention_scale, 1.0 / 16);
  EXPECT_DOUBLE_EQ(c->sliding_rope_theta, 10000.0);
  for (uint32_t l = 0; l < 12; ++l) EXPECT_EQ(c->attentionWindow(l), l % 6 == 5 ? 0u : 1024u) << l;
  auto big = gemma(62, 5376, 32, 128);  // 27B: query_pre_attn_scalar 168
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_DOUBLE_EQ(big->attention_scale, 1.0 / std::sqrt(168.0));
}

// llama.cpp's deepseek2 files: the heads' sizes as key_length_mla / value_length_mla (newer
// files, whose key_length is the latent row) or as key_length / value_length (older ones);
// YaRN's mscale_all_dim as 0.1 times it.
TEST(ModelConfigTest, GgufDeepseek2) {
  using testing::GgufBuilder;
  auto deepseek = [](bool mla_keys) {
    GgufBuilder b;
    b.kvString("general.architecture", "deepseek2")
        .kvU32("deepseek2.block_count", 2)
        .kvU32("deepseek2.context_length", 4096)
        .kvU32("deepseek2.embedding_length", 64)
        .kvU32("deepseek2.attention.head_count", 4)
        .kvU32("deepseek2.attention.head_count_kv", mla_keys ? 1 : 4)
        .kvU32("deepseek2.attention.key_length", mla_keys ? 40 : 24)
        .kvU32("deepseek2.attention.value_length", mla_keys ? 32 : 16)
        .kvU32("deepseek2.attention.kv_lora_rank", 32)
        .kvU32("deepseek2.rope.dimension_count", 8)
        .kvString("deepseek2.rope.scaling.type", "yarn")
        .kvF32("deepseek2.rope.scaling.factor", 40.0f)
        .kvU32("deepseek2.rope.scaling.original_context_length", 4096)
        .kvF32("deepseek2.rope.scaling.yarn_log_multiplier", 0.1f)
        .kvU32("deepseek2.vocab_size", 100);
    if (mla_keys) {
      b.kvU32("deepseek2.attention.key_length_mla", 24)
          .kvU32("deepseek2.attention.value_length_mla", 16);
    }
    auto file = GgufFile::parse(MappedFile::fromBuffer("ds.gguf", b.build()));
    EXPECT_TRUE(file.ok()) << file.status();
    return configFromGguf(**file);
  };
  for (const bool mla_keys : {true, false}) {
    SCOPED_TRACE(mla_keys ? "key_length_mla" : "key_length");
    auto c = deepseek(mla_keys);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(c->mla.has_value());
    EXPECT_EQ(c->head_dim, 24u);
    EXPECT_EQ(c->mla->qk_nope_head_dim, 16u);
    EXPECT_EQ(c->mla->v_head_dim, 16u);
    EXPECT_EQ(c->mla->kv_lora_rank, 32u);
    EXPECT_TRUE(c->mla->rope_interleave);
    EXPECT_EQ(c->num_kv_heads, 4u);
    EXPECT_FLOAT_EQ(static_cast<float>(c->rope_scaling.mscale_all_dim), 1.0f);
    EXPECT_FLOAT_EQ(static_cast<float>(c->rope_scaling.mscale), 1.0f);
  }
}

TEST(ModelConfigTest, MoeLayerSchedule) {
  ModelConfig c;
  c.moe = MoeConfig{};
  c.moe->first_k_dense = 1;
  c.moe->dense_layers = {3};
  EXPECT_FALSE(c.isMoeLayer(0));
  EXPECT_TRUE(c.isMoeLayer(1));
  EXPECT_FALSE(c.isMoeLayer(3));
  c.moe->sparse_step = 2;
  EXPECT_FALSE(c.isMoeLayer(2));
  EXPECT_TRUE(c.isMoeLayer(5));
}

}  // namespace
}  // namespace cleave::model
