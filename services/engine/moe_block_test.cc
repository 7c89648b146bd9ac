#include "services/engine/moe_block.h"

#include "common/model/model_config.h"
#include "common/model/safetensors_file.h"
#include "services/engine/llama_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

namespace cleave::engine {
namespace {

// The routing decisions transformers' own MoE modules made for random hidden states, from
// the router logits they computed.
nlohmann::json routingGolden(const std::string& model) {
  std::ifstream in(std::string(CLEAVE_GOLDEN_DIR) + "/engine/hf/" + model + "/routing.json");
  EXPECT_TRUE(in.good()) << model;
  return nlohmann::json::parse(in);
}

// Some goldens store lists as JSON text.
nlohmann::json field(const nlohmann::json& j) {
  return j.is_string() ? nlohmann::json::parse(j.get<std::string>()) : j;
}

void expectRouting(const Routing& got, const nlohmann::json& ids, const nlohmann::json& weights) {
  EXPECT_EQ(got.experts, ids.get<std::vector<int32_t>>());
  std::vector<float> want = weights.get<std::vector<float>>();
  ASSERT_EQ(got.weights.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got.weights[i], want[i], 1e-6 * std::max(1.0f, want[i]));
}

TEST(MoeRoutingTest, SoftmaxTopKMatchesTransformers) {
  for (const char* model : {"mixtral_f32", "qwen3_moe_f32", "qwen3_moe_nonorm_f32"}) {
    SCOPED_TRACE(model);
    nlohmann::json golden = routingGolden(model);
    const nlohmann::json params = field(golden["params"]);
    for (const auto& layer : golden["layers"]) {
      nlohmann::json logits = field(layer["router_logits"]), ids = field(layer["ids"]),
                     weights = field(layer["weights"]);
      for (size_t t = 0; t < logits.size(); ++t) {
        std::vector<float> l = logits[t].get<std::vector<float>>();
        expectRouting(
            routeSoftmaxTopK(l.data(), static_cast<int64_t>(l.size()),
                             params["top_k"].get<int64_t>(), params["norm_topk_prob"].get<bool>()),
            ids[t], weights[t]);
      }
    }
  }
}

TEST(MoeRoutingTest, SigmoidGroupLimitedTopKMatchesDeepSeekV3) {
  nlohmann::json golden = routingGolden("deepseek_v3_moe_f32");
  const nlohmann::json params = field(golden["params"]);
  const GroupedRoutingParams p{.experts = params["num_experts"].get<int64_t>(),
                               .k = params["top_k"].get<int64_t>(),
                               .n_group = params["n_group"].get<int64_t>(),
                               .topk_group = params["topk_group"].get<int64_t>(),
                               .normalize = params["norm_topk_prob"].get<bool>(),
                               .scaling = params["routed_scaling_factor"].get<float>()};
  for (const auto& layer : golden["layers"]) {
    std::vector<float> bias = field(layer["e_score_correction_bias"]).get<std::vector<float>>();
    nlohmann::json logits = field(layer["router_logits"]), ids = field(layer["ids"]),
                   weights = field(layer["weights"]);
    ASSERT_EQ(logits.size(), 16u);
    for (size_t t = 0; t < logits.size(); ++t) {
      std::vector<float> l = logits[t].get<std::vector<float>>();
      expectRouting(routeSigmoidGroupedTopK(l.data(), bias.data(), p), ids[t], weights[t]);
    }
  }
}

// Whole MoE blocks (routing, experts and DeepSeek's shared experts) against the output
// transformers' own MoE modules gave for the same hidden states.
TEST(MoeBlockTest, BlockOutputsMatchTransformers) {
  for (const char* model : {"mixtral_f32", "qwen3_moe_f32", "qwen3_moe_nonorm_f32",
                            "deepseek_v3_moe_f32", "glm4_moe_f32"}) {
    SCOPED_TRACE(model);
    const std::string folder = std::string(CLEAVE_GOLDEN_DIR) + "/engine/hf/" + model;
    auto config = model::loadModelConfig(folder);
    ASSERT_TRUE(config.ok()) << config.status();
    auto checkpoint = model::SafetensorsCheckpoint::open(folder);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    cpu::ThreadPool pool(2);
    MoeRunner runner(*config->moe, config->hidden_size, pool);
    nlohmann::json golden = routingGolden(model);
    for (const auto& layer : golden["layers"]) {
      const uint32_t index = static_cast<uint32_t>(std::stoul(field(layer["layer"]).dump()));
      auto block = loadMoeBlock(**checkpoint, *config, index);
      ASSERT_TRUE(block.ok()) << block.status();
      std::vector<std::vector<float>> inputs =
          field(layer["inputs"]).get<std::vector<std::vector<float>>>();
      std::vector<std::vector<float>> want =
          field(layer["moe_output"]).get<std::vector<std::vector<float>>>();
      const int64_t hidden = config->hidden_size;
      std::vector<float> x, out(inputs.size() * hidden, std::nanf(""));
      for (const auto& row : inputs) x.insert(x.end(), row.begin(), row.end());
      runner.forward(*block, x.data(), static_cast<int64_t>(inputs.size()), out.data());
      double worst = 0, peak = 0;
      for (size_t t = 0; t < want.size(); ++t) {
        for (int64_t j = 0; j < hidden; ++j) {
          worst = std::max(worst, std::fabs(double(out[t * hidden + j]) - want[t][j]));
          peak = std::max(peak, std::fabs(double(want[t][j])));
        }
      }
      EXPECT_LE(worst, 1e-5 * peak) << "layer " << index;
    }
  }
}

}  // namespace
}  // namespace cleave::engine
