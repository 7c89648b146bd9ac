#include "common/model/safetensors_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/model/quantization.h"

namespace cleave::model {
namespace {

using ::testing::HasSubstr;

const std::string kDir = std::string(CLEAVE_GOLDEN_DIR) + "/safetensors";

uint64_t fnv1a64(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

std::string hex(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(v));
  return text;
}

nlohmann::json expected() {
  std::ifstream in(kDir + "/expected.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

// Files written by the `safetensors` package read back exactly: names, dtypes, shapes,
// offsets, bytes and decoded values.
TEST(SafetensorsGoldenTest, EveryFileAndTensorMatches) {
  nlohmann::json golden = expected();
  ASSERT_GE(golden["files"].size(), 3u);
  size_t checked = 0;
  for (const auto& f : golden["files"]) {
    auto file = SafetensorsFile::open(kDir + "/" + f["file"].get<std::string>());
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->headerSize(), f["header_size"].get<uint64_t>());
    if (f.contains("metadata") && f["metadata"].is_object()) {
      for (auto it = f["metadata"].begin(); it != f["metadata"].end(); ++it) {
        EXPECT_EQ((*file)->metadata().at(it.key()), it.value().get<std::string>());
      }
    }
    ASSERT_EQ((*file)->tensors().size(), f["tensors"].size());
    for (const auto& t : f["tensors"]) {
      const SafetensorsTensor* tensor = (*file)->find(t["name"].get<std::string>());
      ASSERT_NE(tensor, nullptr) << t["name"];
      EXPECT_STREQ(tensorTypeName(tensor->dtype), t["dtype"].get<std::string>().c_str());
      EXPECT_EQ(tensor->shape, t["shape"].get<std::vector<uint64_t>>());
      EXPECT_EQ(tensor->file_offset,
                f["data_start"].get<uint64_t>() + t["data_offsets"][0].get<uint64_t>());
      EXPECT_EQ(tensor->num_bytes, t["n_bytes"].get<uint64_t>());
      EXPECT_EQ(hex(fnv1a64(tensor->data, tensor->num_bytes)), t["fnv1a64"].get<std::string>())
          << tensor->name;
      std::vector<float> values(tensor->num_elements, std::nanf("poison"));
      ASSERT_TRUE(
          dequantize(tensor->dtype, tensor->data, tensor->num_elements, values.data()).ok());
      const auto& want = t["values"];
      for (size_t i = 0; i < want.size(); ++i) {
        if (want[i].is_null()) continue;  // NaN in JSON.
        double w = want[i].get<double>();
        if (tensor->dtype == TensorType::kI64 || tensor->dtype == TensorType::kI32) {
          EXPECT_EQ(static_cast<double>(values[i]), static_cast<double>(static_cast<float>(w)))
              << tensor->name;
        } else {
          EXPECT_EQ(static_cast<double>(values[i]), w) << tensor->name << "[" << i << "]";
        }
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 9u);
}

TEST(SafetensorsGoldenTest, ShardedCheckpointFollowsItsIndex) {
  auto checkpoint = SafetensorsCheckpoint::open(kDir + "/sharded");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  nlohmann::json index = expected()["sharded_index"];
  EXPECT_EQ((*checkpoint)->files().size(), 2u);
  EXPECT_EQ((*checkpoint)->tensors().size(), index["weight_map"].size());
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    const SafetensorsTensor* t = (*checkpoint)->find(it.key());
    ASSERT_NE(t, nullptr) << it.key();
    EXPECT_THAT(t->file, HasSubstr(it.value().get<std::string>()));
  }
  EXPECT_EQ((*checkpoint)->totalTensorBytes(), index["metadata"]["total_size"].get<uint64_t>());
}

TEST(QuantizationGoldenTest, Fp8BlockScaledIsRecognizedAndDequantized) {
  auto info = readQuantizationInfo(kDir + "/fp8_block");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->scheme, QuantScheme::kFp8);
  EXPECT_EQ(info->block_rows, 128u);
  auto checkpoint = SafetensorsCheckpoint::open(kDir + "/fp8_block");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  nlohmann::json ref = expected()["dequant_reference"]["fp8_block"];
  auto weight = resolveQuantizedWeight(**checkpoint, *info, ref["tensor"].get<std::string>());
  ASSERT_TRUE(weight.ok()) << weight.status();
  std::vector<float> out(weight->rows * weight->cols, std::nanf("poison"));
  ASSERT_TRUE(dequantizeWeight(*weight, *info, out.data()).ok());
  EXPECT_EQ(hex(fnv1a64(out.data(), out.size() * 4)), ref["fnv1a64"].get<std::string>());
  for (const auto& at : ref["at"]) EXPECT_EQ(out[at[0].get<size_t>()], at[1].get<float>());
}

TEST(QuantizationGoldenTest, Nvfp4IsRecognizedAndDequantized) {
  auto info = readQuantizationInfo(kDir + "/nvfp4");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->scheme, QuantScheme::kNvfp4);
  EXPECT_THAT(info->excluded_modules, ::testing::ElementsAre("lm_head"));
  auto checkpoint = SafetensorsCheckpoint::open(kDir + "/nvfp4");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  nlohmann::json ref = expected()["dequant_reference"]["nvfp4"];
  auto weight = resolveQuantizedWeight(**checkpoint, *info, ref["tensor"].get<std::string>());
  ASSERT_TRUE(weight.ok()) << weight.status();
  EXPECT_EQ(weight->cols, 64u);
  EXPECT_NE(weight->input_scale, nullptr);
  std::vector<float> out(weight->rows * weight->cols, std::nanf("poison"));
  ASSERT_TRUE(dequantizeWeight(*weight, *info, out.data()).ok());
  EXPECT_EQ(hex(fnv1a64(out.data(), out.size() * 4)), ref["fnv1a64"].get<std::string>());
}

std::string fileWith(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\x01');
}

absl::Status parseError(const std::string& bytes) {
  auto file = SafetensorsFile::parse(MappedFile::fromBuffer("bad.safetensors", bytes));
  return file.status();
}

TEST(SafetensorsFileTest, MalformedHeadersAreClearErrors) {
  const std::pair<const char*, std::string> cases[] = {
      {"truncated", std::string(5, '\0')},
      {"header length", fileWith("{}", 0).substr(0, 8) + "{"},
      {"not a JSON object", fileWith("[1,2]", 0)},
      {"not a JSON object", fileWith("{\"a\":", 0)},
      {"unsupported dtype \"Q4\"",
       fileWith(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1)},
      {"\"shape\"", fileWith(R"({"a":{"dtype":"F32","shape":3,"data_offsets":[0,4]}})", 4)},
      {"data_offsets", fileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4)},
      {"need 8", fileWith(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4)},
      {"truncated", fileWith(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4)},
      {"overflows",
       fileWith(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
                4)},
      {"overlaps",
       fileWith(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           8)},
      {"hole", fileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)},
      {"belong to no tensor",
       fileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8)},
      {"__metadata__.k", fileWith(R"({"__metadata__":{"k":1}})", 0)},
  };
  for (const auto& [expected_text, bytes] : cases) {
    absl::Status status = parseError(bytes);
    ASSERT_FALSE(status.ok()) << expected_text;
    EXPECT_THAT(status.message(), HasSubstr(expected_text));
    EXPECT_THAT(status.message(), HasSubstr("bad.safetensors"));
  }
  EXPECT_TRUE(
      parseError(fileWith(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4)).ok());
}

TEST(SafetensorsFileTest, EveryTruncationOfARealFileFails) {
  std::ifstream in(kDir + "/all_dtypes.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 100u);
  for (size_t size = 0; size < bytes.size(); size += 7) {
    EXPECT_FALSE(parseError(bytes.substr(0, size)).ok()) << size;
  }
  EXPECT_TRUE(parseError(bytes).ok());
}

}  // namespace
}  // namespace cleave::model
