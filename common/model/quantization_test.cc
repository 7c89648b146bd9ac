// Reading the quantization scheme of a checkpoint folder: the three conventions
// (model/quantization.h) as their tools write them, and the errors a wrong or unsupported
// config gets. The decoded values are checked against the tools' own decoding by the
// engine's HF logits tests (tests/golden/quantize_formats.py).
#include "common/model/quantization.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

namespace cleave::model {
namespace {

using ::testing::HasSubstr;

const std::string kEngineDir = std::string(CLEAVE_GOLDEN_DIR) + "/engine/hf/";

class QuantizationConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("cleave_quant_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A folder whose config.json has `quantization_config`.
  absl::StatusOr<QuantizationInfo> read(const nlohmann::json& quantization_config) {
    std::ofstream(dir_ / "config.json") << nlohmann::json{
        {"model_type", "llama"},
        {"quantization_config",
         quantization_config}}.dump();
    return readQuantizationInfo(dir_.string());
  }
  // compressed-tensors' config with one group quantizing weights as `weights`.
  static nlohmann::json compressed(const std::string& format, const nlohmann::json& weights) {
    return {{"quant_method", "compressed-tensors"},
            {"format", format},
            {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}}}}},
            {"ignore", {"lm_head"}}};
  }
  std::filesystem::path dir_;
};

TEST_F(QuantizationConfigTest, TheGoldenCheckpointsAreRecognized) {
  struct Case {
    const char* model;
    QuantScheme scheme;
    QuantFormat format;
    uint32_t block_rows, block_cols;
    const char* description;
    bool activations;  // activations_quantized: made to run W8A8 / W4A4
  };
  for (const Case& c : std::vector<Case>{
           {"llama_fp8", QuantScheme::kFp8, QuantFormat::kHfFp8, 16, 32,
            "fp8 16x32 blocks (hf-fp8)", true},
           {"llama_fp8_modelopt", QuantScheme::kFp8, QuantFormat::kModelOpt, 0, 0,
            "fp8 per tensor (modelopt)", true},
           {"llama_fp8_ct_channel", QuantScheme::kFp8, QuantFormat::kCompressedTensors, 1, 0,
            "fp8 per channel (compressed-tensors)", false},
           {"llama_fp8_ct_block", QuantScheme::kFp8, QuantFormat::kCompressedTensors, 16, 32,
            "fp8 16x32 blocks (compressed-tensors)", false},
           {"llama_nvfp4_modelopt", QuantScheme::kNvfp4, QuantFormat::kModelOpt, 0, 0,
            "nvfp4 groups of 16 (modelopt)", true},
           {"llama_nvfp4_ct", QuantScheme::kNvfp4, QuantFormat::kCompressedTensors, 0, 0,
            "nvfp4 groups of 16 (compressed-tensors)", true},
           {"qwen3_moe_int4_ct", QuantScheme::kInt4, QuantFormat::kCompressedTensors, 0, 0,
            "int4 groups of 32 (compressed-tensors)", false},
           {"gpt_oss_mxfp4", QuantScheme::kMxfp4, QuantFormat::kNone, 0, 0,
            "mxfp4 experts, groups of 32", false},
       }) {
    SCOPED_TRACE(c.model);
    auto info = readQuantizationInfo(kEngineDir + c.model);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->scheme, c.scheme);
    EXPECT_EQ(info->format, c.format);
    EXPECT_EQ(info->block_rows, c.block_rows);
    EXPECT_EQ(info->block_cols, c.block_cols);
    EXPECT_EQ(info->describe(), c.description);
    EXPECT_EQ(info->activations_quantized, c.activations);
    if (c.format != QuantFormat::kHfFp8 && c.scheme != QuantScheme::kMxfp4)
      EXPECT_THAT(info->excluded_modules, ::testing::Contains("lm_head"));
  }
}

TEST_F(QuantizationConfigTest, ModelOptInConfigJsonIsRead) {
  auto info = read({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16}});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->scheme, QuantScheme::kNvfp4);
  EXPECT_EQ(info->format, QuantFormat::kModelOpt);
  info = read({{"quant_method", "modelopt"}, {"quant_algo", "W4A8_AWQ"}});
  EXPECT_THAT(info.status().message(), HasSubstr("quantization_config.quant_algo \"W4A8_AWQ\""));
}

TEST_F(QuantizationConfigTest, UnsupportedSchemesNameTheField) {
  struct Case {
    nlohmann::json config;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{{"quant_method", "gptq"}}, "quant_method \"gptq\" is not supported"},
           {compressed("pack-quantized", {{"type", "int"}, {"num_bits", 4}, {"strategy", "group"}}),
            "strategy \"group\" is not supported for int4"},
           {compressed("pack-quantized", {{"type", "int"},
                                          {"num_bits", 4},
                                          {"strategy", "group"},
                                          {"group_size", 128},
                                          {"symmetric", false}}),
            "asymmetric int4 weights (zero points) are not supported"},
           {compressed("pack-quantized", {{"type", "int"},
                                          {"num_bits", 4},
                                          {"strategy", "group"},
                                          {"group_size", 128},
                                          {"actorder", "group"}}),
            "actorder: activation-ordered groups are not supported"},
           {compressed("pack-quantized", {{"type", "int"},
                                          {"num_bits", 4},
                                          {"strategy", "tensor"},
                                          {"group_size", nullptr}}),
            "strategy \"tensor\" is not supported for int4"},
           {compressed("marlin-24", {{"type", "int"}, {"num_bits", 4}, {"strategy", "channel"}}),
            "format \"marlin-24\" is not supported for int4"},
           {compressed("pack-quantized",
                       {{"type", "int"}, {"num_bits", 8}, {"strategy", "channel"}}),
            "int 8-bit weights are not supported"},
           {compressed("float-quantized",
                       {{"type", "float"}, {"num_bits", 8}, {"strategy", "token"}}),
            "strategy \"token\" is not supported for FP8"},
           {compressed("float-quantized",
                       {{"type", "float"}, {"num_bits", 8}, {"strategy", "block"}}),
            "block with block_structure"},
           {compressed("dense", {{"type", "float"}, {"num_bits", 8}, {"strategy", "channel"}}),
            "format \"dense\" is not supported for FP8"},
           {compressed(
                "nvfp4-pack-quantized",
                {{"type", "float"}, {"num_bits", 4}, {"strategy", "group"}, {"group_size", 32}}),
            "must be NVFP4"},
           {{{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}},
            "config_groups must be a non-empty object"},
       }) {
    SCOPED_TRACE(c.config.dump());
    auto info = read(c.config);
    ASSERT_FALSE(info.ok());
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(info.status().message(), HasSubstr(c.message));
    EXPECT_THAT(info.status().message(), HasSubstr("config.json"));
  }
}

TEST_F(QuantizationConfigTest, GroupsMustAgree) {
  nlohmann::json config =
      compressed("float-quantized", {{"type", "float"}, {"num_bits", 8}, {"strategy", "channel"}});
  config["config_groups"]["group_1"] = {
      {"targets", {"re:.*down_proj"}},
      {"weights", {{"type", "float"}, {"num_bits", 8}, {"strategy", "tensor"}}}};
  auto info = read(config);
  EXPECT_THAT(info.status().message(), HasSubstr("config_groups.group_1.weights differs"));
}

// Int4 rows become Q4_0 blocks with the same codes and each group's scale, exactly: where a
// scale is no fp16 value, or a group is not whole blocks, there is no such file (nullopt).
TEST(Int4AsQ4_0Test, KeepsTheCodesAndScalesExactlyOrDeclines) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255);
  const uint64_t rows = 3, cols = 128;
  std::vector<uint8_t> codes(rows * cols / 2);
  for (uint8_t& b : codes) b = static_cast<uint8_t>(byte(rng));
  SafetensorsTensor packed{.name = "x.weight_packed",
                           .dtype = TensorType::kI32,
                           .shape = {rows, cols / 8},
                           .data = codes.data()};
  QuantizedWeight w{.codes = TensorType::kI4,
                    .weight = &packed,
                    .rows = rows,
                    .cols = cols,
                    .block_rows = 1,
                    .block_cols = 64};
  ScaleGrid grid{.values = {0.5f, 0.0078125f, 0.25f, 3.0f, 0.125f, 1.5f},
                 .block_rows = 1,
                 .block_cols = 64,
                 .grid_cols = 2};
  std::optional<std::vector<uint8_t>> q4 = int4AsQ4_0(w, grid);
  ASSERT_TRUE(q4.has_value());
  std::vector<float> got(rows * cols, std::nanf("")), want(rows * cols);
  ASSERT_TRUE(dequantize(TensorType::kQ4_0, q4->data(), rows * cols, got.data()).ok());
  ASSERT_TRUE(dequantize(TensorType::kI4, codes.data(), rows * cols, want.data()).ok());
  for (uint64_t i = 0; i < rows * cols; ++i)
    want[i] *= grid.values[(i / cols) * 2 + (i % cols) / 64];
  EXPECT_EQ(got, want);
  grid.values[4] = 0.1f;  // Not an fp16 value.
  EXPECT_FALSE(int4AsQ4_0(w, grid).has_value());
  grid.values[4] = 0.125f;
  grid.block_cols = w.block_cols = 16;  // Groups smaller than a block.
  grid.grid_cols = 8;
  grid.values.assign(rows * 8, 0.5f);
  EXPECT_FALSE(int4AsQ4_0(w, grid).has_value());
}

}  // namespace
}  // namespace cleave::model
