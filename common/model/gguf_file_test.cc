#include "common/model/gguf_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/model/gguf_builder_for_test.h"

namespace cleave::model {
namespace {

using testing::GgufBuilder;
using ::testing::HasSubstr;

absl::StatusOr<std::unique_ptr<GgufFile>> parseBytes(std::string bytes) {
  return GgufFile::parse(MappedFile::fromBuffer("test.gguf", std::move(bytes)));
}

std::string floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
}

std::string validFile() {
  return GgufBuilder()
      .kvString("general.architecture", "llama")
      .kvU32("llama.block_count", 2)
      .kvF32("llama.rope.freq_base", 10000.0f)
      .kvBool("tokenizer.ggml.add_bos_token", true)
      .kvStringArray("tokenizer.ggml.tokens", {"a", "b", "c"})
      .kvI32Array("tokenizer.ggml.token_type", {1, 1, 3})
      .tensor("w", {4, 2}, 0, 0, floats({1, 2, 3, 4, 5, 6, 7, 8}))
      .tensor("v", {3}, 0, 64, floats({-1, -2, -3}))
      .build();
}

TEST(GgufFileTest, ParsesMetadataAndTensors) {
  auto file = parseBytes(validFile());
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& gguf = **file;
  EXPECT_EQ(gguf.version(), 3u);
  EXPECT_EQ(gguf.alignment(), 32u);
  EXPECT_EQ(gguf.dataOffset() % 32, 0u);
  EXPECT_EQ(*gguf.getString("general.architecture"), "llama");
  EXPECT_EQ(*gguf.getUint("llama.block_count"), 2u);
  EXPECT_EQ(*gguf.getInt("llama.block_count"), 2);
  EXPECT_FLOAT_EQ(*gguf.getFloat("llama.rope.freq_base"), 10000.0f);
  EXPECT_TRUE(*gguf.getBool("tokenizer.ggml.add_bos_token"));
  EXPECT_THAT(**gguf.getStringArray("tokenizer.ggml.tokens"),
              ::testing::ElementsAre("a", "b", "c"));
  EXPECT_THAT(**gguf.getIntArray("tokenizer.ggml.token_type"), ::testing::ElementsAre(1, 1, 3));
  ASSERT_EQ(gguf.tensors().size(), 2u);
  const GgufTensor* w = gguf.findTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_THAT(w->dims, ::testing::ElementsAre(4, 2));
  EXPECT_EQ(w->num_elements, 8u);
  EXPECT_EQ(w->num_bytes, 32u);
  float first;
  std::memcpy(&first, w->data, 4);
  EXPECT_EQ(first, 1.0f);
  EXPECT_EQ(gguf.findTensor("v")->offset, 64u);
  EXPECT_EQ(gguf.totalTensorBytes(), 44u);
  EXPECT_EQ(gguf.findTensor("missing"), nullptr);
}

TEST(GgufFileTest, TypedGettersNameTheKey) {
  auto file = parseBytes(validFile());
  ASSERT_TRUE(file.ok());
  auto missing = (*file)->getUint("llama.context_length");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("test.gguf: metadata \"llama.context_length\""));
  auto wrong = (*file)->getUint("general.architecture");
  EXPECT_THAT(wrong.status().message(), HasSubstr("is string, expected an unsigned integer"));
  EXPECT_FALSE((*file)->getStringArray("tokenizer.ggml.token_type").ok());
  EXPECT_FALSE((*file)->getBool("llama.block_count").ok());
}

TEST(GgufFileTest, Version2IsAcceptedAndOthersAreNot) {
  EXPECT_TRUE(parseBytes(GgufBuilder(2).kvU32("a", 1).build()).ok());
  auto v1 = parseBytes(GgufBuilder(1).build());
  EXPECT_THAT(v1.status().message(), HasSubstr("version 1 is not supported"));
  auto swapped = parseBytes(GgufBuilder(0x03000000).build());
  EXPECT_THAT(swapped.status().message(), HasSubstr("unsupported GGUF version"));
}

TEST(GgufFileTest, WrongMagicIsNamed) {
  std::string bytes = validFile();
  bytes[0] = 'X';
  EXPECT_THAT(parseBytes(bytes).status().message(), HasSubstr("not a GGUF file"));
}

TEST(GgufFileTest, EveryTruncationIsAnErrorNotACrash) {
  std::string bytes = validFile();
  for (size_t size = 0; size < bytes.size(); ++size) {
    auto file = parseBytes(bytes.substr(0, size));
    EXPECT_FALSE(file.ok()) << "truncated to " << size << " bytes parsed";
    if (!file.ok()) EXPECT_THAT(file.status().message(), HasSubstr("test.gguf"));
  }
}

TEST(GgufFileTest, RandomCorruptionNeverCrashes) {
  std::string bytes = validFile();
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string corrupt = bytes;
    int flips = 1 + trial % 4;
    for (int f = 0; f < flips; ++f) corrupt[rng() % corrupt.size()] = static_cast<char>(rng());
    auto file = parseBytes(corrupt);
    if (file.ok()) {
      for (const GgufTensor& t : (*file)->tensors()) {
        // Accepted tensors must lie inside the buffer.
        ASSERT_LE(t.offset + t.num_bytes + (*file)->dataOffset(), corrupt.size());
      }
    }
  }
}

struct BadCase {
  const char* expected;
  std::string bytes;
};

TEST(GgufFileTest, MalformedFilesAreClearErrors) {
  std::string u32;
  GgufBuilder::put<uint32_t>(u32, 7);
  std::string huge_string;
  GgufBuilder::put<uint64_t>(huge_string, uint64_t{1} << 40);
  std::string huge_array;
  GgufBuilder::put<uint32_t>(huge_array, 4);
  GgufBuilder::put<uint64_t>(huge_array, uint64_t{1} << 60);
  std::string bad_bool(1, '\x07');
  const BadCase cases[] = {
      {"metadata_kv_count", GgufBuilder().countsOverride(0, uint64_t{1} << 62).build()},
      {"tensor_count", GgufBuilder().countsOverride(uint64_t{1} << 62, 0).build()},
      {"string length", GgufBuilder().kvRaw("k", 8, huge_string).build()},
      {"runs past the end", GgufBuilder().kvRaw("k", 9, huge_array).build()},
      {"unknown value type 13", GgufBuilder().kvRaw("k", 13, u32).build()},
      {"is not 0 or 1", GgufBuilder().kvRaw("k", 7, bad_bool).build()},
      {"duplicate key", GgufBuilder().kvU32("k", 1).kvU32("k", 2).build()},
      {"general.alignment", GgufBuilder().kvU32("general.alignment", 48).build()},
      {"n_dims 0", GgufBuilder().tensor("t", {}, 0, 0, "").build()},
      {"n_dims 5", GgufBuilder().tensor("t", {1, 1, 1, 1, 1}, 0, 0, floats({1})).build()},
      {"makes the element count overflow",
       GgufBuilder().tensor("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0, "").build()},
      {"dimension 0 = 0", GgufBuilder().tensor("t", {0}, 0, 0, "").build()},
      {"unknown tensor type id 99", GgufBuilder().tensor("t", {1}, 99, 0, floats({1})).build()},
      {"not a multiple of the Q4_0 block size", GgufBuilder().tensor("t", {31}, 2, 0, "").build()},
      {"not a multiple of the alignment",
       GgufBuilder().tensor("t", {1}, 0, 4, floats({1})).build()},
      {"past the end of the data section",
       GgufBuilder().tensor("t", {4}, 0, 0, floats({1})).build().substr(0, 40 + 32)},
      {"overlap", GgufBuilder()
                      .tensor("a", {16}, 0, 0, floats(std::vector<float>(16, 1)))
                      .tensor("b", {16}, 0, 32, floats(std::vector<float>(16, 2)))
                      .build()},
      {"duplicate tensor name", GgufBuilder()
                                    .tensor("a", {1}, 0, 0, floats({1}))
                                    .tensor("a", {1}, 0, 32, floats({1}))
                                    .build()},
  };
  for (const BadCase& c : cases) {
    auto file = parseBytes(c.bytes);
    ASSERT_FALSE(file.ok()) << c.expected;
    EXPECT_THAT(file.status().message(), HasSubstr(c.expected));
    EXPECT_THAT(file.status().message(), HasSubstr("test.gguf"));
  }
}

TEST(GgufFileTest, MissingFileNamesThePath) {
  auto file = GgufFile::open("/nonexistent/model.gguf");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("/nonexistent/model.gguf"));
}

// The real SmolLM2 file against the metadata the `gguf` package reads from it.
class SmolLm2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::string(CLEAVE_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(path_)) {
      GTEST_SKIP() << path_ << " is missing; run scripts/install-deps.sh";
    }
  }
  std::string path_;
};

nlohmann::json loadGolden(const std::string& relative) {
  std::ifstream in(std::string(CLEAVE_GOLDEN_DIR) + "/" + relative);
  EXPECT_TRUE(in.good()) << "missing golden " << relative;
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
}

TEST_F(SmolLm2Test, MetadataAndTensorDirectoryMatchTheGgufPackage) {
  auto file = GgufFile::open(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& gguf = **file;
  nlohmann::json golden = loadGolden("gguf/smollm2_metadata.json");
  ASSERT_FALSE(golden.is_null());
  EXPECT_EQ(gguf.version(), golden["version"].get<uint32_t>());
  EXPECT_EQ(*gguf.getString("general.architecture"), "llama");
  EXPECT_EQ(*gguf.getUint("llama.block_count"), 30u);
  ASSERT_EQ(gguf.tensors().size(), golden["tensors"].size());
  for (const auto& expected : golden["tensors"]) {
    const GgufTensor* tensor = gguf.findTensor(expected["name"].get<std::string>());
    ASSERT_NE(tensor, nullptr) << expected["name"];
    EXPECT_EQ(tensor->dims, expected["dims"].get<std::vector<uint64_t>>()) << tensor->name;
    EXPECT_STREQ(tensorTypeName(tensor->type), expected["type"].get<std::string>().c_str());
    EXPECT_EQ(tensor->offset, expected["offset"].get<uint64_t>()) << tensor->name;
    EXPECT_EQ(tensor->num_bytes, expected["n_bytes"].get<uint64_t>()) << tensor->name;
  }
  const auto& tokens = **gguf.getStringArray("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.size(), 49152u);
}

}  // namespace
}  // namespace cleave::model
