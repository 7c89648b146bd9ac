#include "services/engine/lora_adapter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include <unistd.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "services/engine/tp_group.h"

namespace cleave::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kGolden = CLEAVE_GOLDEN_DIR;

nlohmann::json readJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

std::vector<float> goldenLogits(const nlohmann::json& prompt) {
  std::string raw;
  EXPECT_TRUE(absl::Base64Unescape(prompt["logits_b64"].get<std::string>(), &raw));
  std::vector<float> out(raw.size() / sizeof(float));
  std::memcpy(out.data(), raw.data(), out.size() * sizeof(float));
  return out;
}

// Largest per-row error relative to the row's largest reference logit.
double worstRelative(std::span<const float> got, std::span<const float> want, int64_t vocab) {
  EXPECT_EQ(got.size(), want.size());
  if (got.size() != want.size()) return std::nan("");
  double worst = 0;
  for (size_t row = 0; row * vocab < want.size(); ++row) {
    double peak = 0, err = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const size_t i = row * vocab + v;
      if (std::isnan(got[i])) return std::nan("");
      peak = std::max(peak, std::fabs(double{want[i]}));
      err = std::max(err, std::fabs(double{got[i]} - want[i]));
    }
    worst = std::max(worst, err / peak);
  }
  return worst;
}

uint32_t argmax(std::span<const float> row) {
  return static_cast<uint32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

struct GoldenCase {
  const char* adapter;  // engine/lora/<adapter>
  const char* base;     // engine/hf/<base>, or engine/gguf/<base> for a .gguf
  int tp;
};

void PrintTo(const GoldenCase& c, std::ostream* os) {
  *os << c.adapter << " on " << c.base << ", tp " << c.tp;
}

std::string basePath(const std::string& base) {
  return kGolden + (absl::EndsWith(base, ".gguf") ? "/engine/gguf/" : "/engine/hf/") + base;
}

// PEFT's adapters on transformers' models: every position's logits of three prompts (one
// prefill chunk returning a row per token) and the greedy continuation, one token a step.
class LoraGoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(LoraGoldenTest, LogitsAndGreedyTokensMatchPeft) {
  const GoldenCase c = GetParam();
  const std::string folder = kGolden + "/engine/lora/" + c.adapter;
  const nlohmann::json golden = readJson(folder + "/logits.json");
  ASSERT_TRUE(golden.contains("prompts"));
  auto group = TpGroup::load(basePath(c.base), {.tp = c.tp, .threads = 2});
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_TRUE((*group)->allocateKv(64, 16).ok());
  auto index = (*group)->addAdapter("tuned", folder);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(*index, 0);
  EXPECT_EQ((*group)->adapterIndex("tuned"), 0);
  EXPECT_EQ((*group)->adapterIndex("other"), -1);
  const int64_t vocab = golden["vocab_size"].get<int64_t>();
  const double tolerance = golden["tolerance"]["max_rel"].get<double>();
  std::vector<int32_t> blocks(64);
  std::iota(blocks.begin(), blocks.end(), 0);
  for (const nlohmann::json& prompt : golden["prompts"]) {
    const std::vector<uint32_t> ids = prompt["ids"].get<std::vector<uint32_t>>();
    const std::vector<float> want = goldenLogits(prompt);
    const int64_t n = static_cast<int64_t>(ids.size());
    SequenceChunk chunk{.tokens = ids, .start = 0, .blocks = blocks, .logits = n, .adapter = 0};
    auto logits = (*group)->forward({&chunk, 1});
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_LE(worstRelative(*logits, want, vocab), tolerance) << c.adapter << " on " << c.base;
    // Without the adapter the same prompt gives other logits (the golden's adapter moves them
    // by base_logits_differ).
    chunk.adapter = -1;
    auto plain = (*group)->forward({&chunk, 1});
    ASSERT_TRUE(plain.ok());
    EXPECT_GT(worstRelative(*plain, want, vocab), 0.5 * golden["base_logits_differ"].get<double>());
    // Greedy, a token a step after the prompt.
    chunk.adapter = 0;
    chunk.logits = 1;
    auto first = (*group)->forward({&chunk, 1});
    ASSERT_TRUE(first.ok());
    std::vector<uint32_t> tokens = ids;
    tokens.push_back(argmax(*first));
    for (size_t step = 1; step < prompt["greedy_next"].size(); ++step) {
      SequenceChunk next{.tokens = std::span<const uint32_t>(tokens).last(1),
                         .start = static_cast<int64_t>(tokens.size()) - 1,
                         .blocks = blocks,
                         .adapter = 0};
      auto row = (*group)->forward({&next, 1});
      ASSERT_TRUE(row.ok());
      tokens.push_back(argmax(*row));
    }
    EXPECT_EQ(std::vector<uint32_t>(tokens.begin() + n, tokens.end()),
              prompt["greedy_next"].get<std::vector<uint32_t>>());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Adapters, LoraGoldenTest,
    ::testing::Values(GoldenCase{"llama_all_r8", "llama_f32", 1},
                      GoldenCase{"llama_all_r8", "llama_f32", 2},
                      GoldenCase{"llama_qv_rslora_bf16", "llama_f32", 1},
                      GoldenCase{"llama_qv_rslora_bf16", "llama_f32", 2},
                      GoldenCase{"mixtral_attn_r4", "mixtral_f32", 1},
                      // llama.cpp's layout: Q/K rows reordered for adjacent RoPE pairs.
                      GoldenCase{"mixtral_attn_r4", "mixtral_f32.gguf", 1},
                      GoldenCase{"mixtral_attn_r4", "mixtral_f32.gguf", 2}),
    [](const auto& info) {
      std::string name = std::string(info.param.adapter) + "_" + info.param.base + "_tp" +
                         std::to_string(info.param.tp);
      std::replace(name.begin(), name.end(), '.', '_');
      return name;
    });

// Chunks of one step with different adapters (and none) give each what it gets alone.
TEST(LoraBatchTest, ChunksWithDifferentAdaptersInOneStepGetTheirOwnLogits) {
  auto group = TpGroup::load(kGolden + "/engine/hf/llama_f32", {.tp = 1, .threads = 2});
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_TRUE((*group)->allocateKv(96, 16).ok());
  ASSERT_TRUE((*group)->addAdapter("all", kGolden + "/engine/lora/llama_all_r8").ok());
  ASSERT_TRUE((*group)->addAdapter("qv", kGolden + "/engine/lora/llama_qv_rslora_bf16").ok());
  EXPECT_EQ((*group)->addAdapter("qv", kGolden + "/engine/lora/llama_all_r8").status().code(),
            absl::StatusCode::kAlreadyExists);
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> token(0, 700);
  std::vector<std::vector<uint32_t>> prompts(4);
  // On 2 threads a lone 5-token chunk's updates split by columns, the longer ones' and the
  // step's by rows: the same bits either way.
  const size_t sizes[] = {5, 8, 20, 11};
  for (size_t s = 0; s < prompts.size(); ++s) {
    prompts[s].resize(sizes[s]);
    for (uint32_t& t : prompts[s]) t = token(rng);
  }
  const int32_t adapters[] = {0, -1, 1, 0};
  std::vector<std::vector<int32_t>> blocks(4);
  for (int s = 0; s < 4; ++s) blocks[s] = {s * 2, s * 2 + 1};
  // Alone, each in its own blocks.
  const int64_t vocab = 701;
  std::vector<std::vector<float>> alone;
  for (int s = 0; s < 4; ++s) {
    SequenceChunk chunk{.tokens = prompts[s], .blocks = blocks[s], .adapter = adapters[s]};
    auto logits = (*group)->forward({&chunk, 1});
    ASSERT_TRUE(logits.ok()) << logits.status();
    alone.emplace_back(logits->begin(), logits->end());
  }
  // Together, in other blocks (poisoned by the runs above), one row each.
  std::vector<SequenceChunk> batch;
  for (int s = 0; s < 4; ++s) {
    for (int32_t& b : blocks[s]) b += 8;
    batch.push_back({.tokens = prompts[s], .blocks = blocks[s], .adapter = adapters[s]});
  }
  auto together = (*group)->forward(batch);
  ASSERT_TRUE(together.ok()) << together.status();
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(worstRelative(together->subspan(s * vocab, vocab), alone[s], vocab), 0) << s;
  }
  // The adapters change the logits: sequence 1 (none) against itself with adapter 0.
  batch = {{.tokens = prompts[1], .blocks = blocks[1], .adapter = 0}};
  auto adapted = (*group)->forward(batch);
  ASSERT_TRUE(adapted.ok());
  EXPECT_GT(worstRelative(*adapted, alone[1], vocab), 1e-2);
  // An index never added is refused.
  batch[0].adapter = 2;
  EXPECT_EQ((*group)->forward(batch).status().code(), absl::StatusCode::kInvalidArgument);
}

// Writes a safetensors file of float32 tensors.
void writeSafetensors(const std::string& path,
                      const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (const auto& [name, shape] : tensors) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    header[name] = {{"dtype", "F32"},
                    {"shape", shape},
                    {"data_offsets", {data.size(), data.size() + count * 4}}};
    for (int64_t i = 0; i < count; ++i) {
      const float v = normal(rng);
      data.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  const std::string h = header.dump();
  const uint64_t size = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&size), 8);
  out << h << data;
}

class LoraLoadErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lora_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    auto base = loadLlama(kGolden + "/engine/hf/llama_f32");
    ASSERT_TRUE(base.ok()) << base.status();
    base_ = std::move(*base);
    auto moe = loadLlama(kGolden + "/engine/hf/mixtral_f32");
    ASSERT_TRUE(moe.ok()) << moe.status();
    moe_ = std::move(*moe);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An adapter of rank 4 on q_proj of layer 0 (the llama_f32 shapes) with `config` merged in
  // and `tensors` instead when given.
  absl::Status load(const nlohmann::json& config,
                    std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {},
                    const LlamaWeights* base = nullptr) {
    nlohmann::json c = {{"peft_type", "LORA"},          {"r", 4},         {"lora_alpha", 8},
                        {"target_modules", {"q_proj"}}, {"bias", "none"}, {"use_dora", false}};
    if (config.is_object()) c.update(config);
    std::ofstream(dir_ / "adapter_config.json") << c.dump();
    if (tensors.empty()) {
      tensors = {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", {4, 64}},
                 {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", {64, 4}}};
    }
    writeSafetensors((dir_ / "adapter_model.safetensors").string(), tensors);
    return loadLoraAdapter("x", dir_.string(), base ? *base : *base_).status();
  }

  fs::path dir_;
  std::unique_ptr<LlamaWeights> base_, moe_;
};

TEST_F(LoraLoadErrorTest, AWellFormedAdapterLoads) {
  EXPECT_TRUE(load({}).ok()) << load({});
  auto adapter = loadLoraAdapter("x", dir_.string(), *base_);
  ASSERT_TRUE(adapter.ok());
  EXPECT_EQ((*adapter)->rank, 4);
  EXPECT_FLOAT_EQ((*adapter)->scale, 2.0f);
  EXPECT_NE((*adapter)->find(0, LoraTarget::kQ), nullptr);
  EXPECT_EQ((*adapter)->find(0, LoraTarget::kK), nullptr);
  EXPECT_EQ((*adapter)->find(1, LoraTarget::kQ), nullptr);
  EXPECT_EQ((*adapter)->bytes(), (4 * 64 + 64 * 4) * 4);
  EXPECT_EQ((*adapter)->sha256.size(), 64u);
}

TEST_F(LoraLoadErrorTest, WhatDoesNotRunIsRefusedByName) {
  const std::string q = "base_model.model.model.layers.0.self_attn.q_proj.";
  struct Case {
    nlohmann::json config;
    std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{{"use_dora", true}}, {}, "use_dora is true: DoRA"},
      {{{"bias", "all"}}, {}, "bias is \"all\""},
      {{{"peft_type", "IA3"}}, {}, "only LORA"},
      {{{"target_modules", {"q_proj", "embed_tokens"}}},
       {},
       "target_modules names \"embed_tokens\""},
      {{{"modules_to_save", {"lm_head"}}}, {}, "modules_to_save"},
      {{{"rank_pattern", {{"q_proj", 8}}}}, {}, "per-module ranks"},
      {{{"r", 0}}, {}, "r must be at least 1"},
      {{{"r", 8}}, {}, "has shape [4, 64], the model needs [8, 64]"},
      {{}, {{q + "lora_A.weight", {4, 64}}, {q + "lora_B.weight", {32, 4}}}, "needs [64, 4]"},
      {{}, {{q + "lora_A.weight", {4, 64}}}, "has lora_A without lora_B"},
      {{},
       {{"base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight", {4, 64}}},
       "past the model's 2 layers"},
      {{},
       {{"base_model.model.model.embed_tokens.lora_embedding_A", {4, 701}}},
       "is not a LoRA update"},
      {{},
       {{"base_model.model.model.layers.0.mlp.q_proj.lora_A.weight", {4, 64}}},
       "is not a LoRA update"},
  };
  for (const Case& c : cases) {
    const absl::Status status = load(c.config, c.tensors);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  // A MoE layer's MLP is its experts.
  const absl::Status moe = load(
      {}, {{"base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight", {4, 64}}}, moe_.get());
  EXPECT_THAT(moe.message(), HasSubstr("mixture-of-experts layer"));
  // Missing files.
  fs::remove(dir_ / "adapter_model.safetensors");
  std::ofstream(dir_ / "adapter_model.bin") << "x";
  const absl::Status bin = loadLoraAdapter("x", dir_.string(), *base_).status();
  EXPECT_EQ(bin.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(bin.message(), HasSubstr("safe_serialization=True"));
  const absl::Status none = loadLoraAdapter("x", (dir_ / "nothing").string(), *base_).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.message(), HasSubstr("adapter_config.json"));
}

TEST(LoraModulesFlagTest, ParsesNamePathPairs) {
  auto specs = parseLoraModules("sql=/a/b,chat-v2=rel/dir");
  ASSERT_TRUE(specs.ok());
  ASSERT_EQ(specs->size(), 2u);
  EXPECT_EQ((*specs)[0].name, "sql");
  EXPECT_EQ((*specs)[0].path, "/a/b");
  EXPECT_EQ((*specs)[1].name, "chat-v2");
  EXPECT_EQ((*specs)[1].path, "rel/dir");
  EXPECT_TRUE(parseLoraModules("")->empty());
  for (const char* bad : {"sql", "=/a", "sql=", "a b=/x", "sql=/a,sql=/b"}) {
    EXPECT_EQ(parseLoraModules(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace cleave::engine
