// GGUF tokenizers built in memory: the SentencePiece ("llama") model's score-ordered merges
// and byte fallback, the gpt2 model's merges and pre-tokenizer selection, and errors naming
// the metadata key.
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"

#include "common/model/gguf_builder_for_test.h"
#include "common/model/gguf_file.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/tokenizer.h"

namespace cleave::tokenizer {
namespace {

using model::testing::GgufBuilder;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

GgufBuilder& f32Array(GgufBuilder& b, const std::string& key, const std::vector<float>& v) {
  std::string bytes;
  GgufBuilder::put<uint32_t>(bytes, 6);
  GgufBuilder::put<uint64_t>(bytes, v.size());
  for (float x : v) GgufBuilder::put(bytes, x);
  return b.kvRaw(key, 9, bytes);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> fromBytes(const std::string& bytes) {
  auto file = model::GgufFile::parse(model::MappedFile::fromBuffer("test.gguf", bytes));
  if (!file.ok()) return file.status();
  return Tokenizer::fromGguf(**file);
}

// SentencePiece vocabulary: control tokens, <0x..> bytes for 'A' and the bytes of "é", then
// pieces scored so that "▁a" + "b" beats "a" + "b".
GgufBuilder llamaVocab() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<0x41>", "<0xC3>", "<0xA9>", "▁", "a",
                                     "b",     "▁a",  "ab",   "▁ab",    "▁b",     "<tool>"};
  std::vector<float> scores = {0, 0, 0, 0, 0, 0, -1, -2, -3, -4, -6, -5, -7, 0};
  std::vector<int32_t> types = {2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1, 1, 1, 4};
  GgufBuilder b;
  b.kvString("tokenizer.ggml.model", "llama")
      .kvStringArray("tokenizer.ggml.tokens", tokens)
      .kvI32Array("tokenizer.ggml.token_type", types)
      .kvU32("tokenizer.ggml.bos_token_id", 1)
      .kvU32("tokenizer.ggml.eos_token_id", 2)
      .kvU32("tokenizer.ggml.unknown_token_id", 0);
  f32Array(b, "tokenizer.ggml.scores", scores);
  return b;
}

TEST(GgufLlamaTest, MergesFollowScoresAndBytesFallBack) {
  auto tok = fromBytes(llamaVocab().build());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const EncodeOptions plain{.add_special_tokens = false};
  // "▁ab": "▁"+"a" (-4) first, then "▁a"+"b" (-5); "ab" (-6) never gets a chance.
  EXPECT_THAT((*tok)->encode("ab", plain), ElementsAre(11));
  EXPECT_THAT((*tok)->encode("ab b", plain), ElementsAre(11, 12));
  // 'A' and 'é' are not pieces: their bytes; 'Z' has no byte token: <unk>.
  EXPECT_THAT((*tok)->encode("Aé", plain), ElementsAre(6, 3, 4, 5));
  EXPECT_THAT((*tok)->encode("Z", plain), ElementsAre(6, 0));
  // BOS by default; special text parsed only on request; user-defined always.
  EXPECT_THAT((*tok)->encode("a", {}), ElementsAre(1, 9));
  EXPECT_THAT((*tok)->encode("a<tool>b", plain), ElementsAre(9, 13, 12));
  EXPECT_THAT((*tok)->encode("<s>a", {.add_special_tokens = false, .parse_special = true}),
              ElementsAre(1, 9));
  EXPECT_EQ((*tok)->decode(std::vector<TokenId>{1, 11, 12, 6, 3, 4, 5}, true), "ab b Aé");
  EXPECT_EQ((*tok)->decode(std::vector<TokenId>{1, 11, 13}, false), "<s> ab<tool>");
  EXPECT_EQ((*tok)->bosId(), 1u);
  EXPECT_EQ((*tok)->eosId(), 2u);
  EXPECT_TRUE((*tok)->isSpecial(0));
  EXPECT_FALSE((*tok)->isSpecial(13));
}

GgufBuilder gpt2Vocab(const std::string& pre) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b)
    tokens.push_back(byteLevelEncode(std::string(1, static_cast<char>(b))));
  tokens.push_back("Ġh");       // 256
  tokens.push_back("Ġhi");      // 257
  tokens.push_back("<|end|>");  // 258
  std::vector<int32_t> types(tokens.size(), 1);
  types[258] = 3;
  GgufBuilder b;
  b.kvString("tokenizer.ggml.model", "gpt2")
      .kvString("tokenizer.ggml.pre", pre)
      .kvStringArray("tokenizer.ggml.tokens", tokens)
      .kvI32Array("tokenizer.ggml.token_type", types)
      .kvStringArray("tokenizer.ggml.merges", {"Ġ h", "Ġh i"})
      .kvU32("tokenizer.ggml.eos_token_id", 258);
  return b;
}

TEST(GgufGpt2Test, EncodesAndDecodes) {
  auto tok = fromBytes(gpt2Vocab("smollm").build());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->encode("a hi 12<|end|>", {.add_special_tokens = true}),
              ElementsAre('a', 257, ' ', '1', '2', '<', '|', 'e', 'n', 'd', '|', '>'));
  EXPECT_THAT((*tok)->encode(" hi<|end|>", {.parse_special = true}), ElementsAre(257, 258));
  EXPECT_EQ((*tok)->decode(std::vector<TokenId>{257, 258}, false), " hi<|end|>");
  EXPECT_EQ((*tok)->decode(std::vector<TokenId>{257, 258}, true), " hi");
}

// The spm_bpe golden tokenizer.json as a "llama" GGUF vocabulary scored by merge order
// (-id: its pieces are numbered in merge order), as converters score BPE pieces. llama.cpp's
// score-ordered merging must then reproduce the Hugging Face goldens.
TEST(GgufLlamaTest, ScoreOrderedMergesReproduceTheSpmGoldens) {
  const std::string dir = std::string(CLEAVE_GOLDEN_DIR) + "/tokenizers/spm_bpe";
  std::ifstream json_in(dir + "/tokenizer.json");
  std::ifstream golden_in(dir + "/golden.json");
  ASSERT_TRUE(json_in.good() && golden_in.good());
  const auto doc = nlohmann::json::parse(json_in);
  const auto golden = nlohmann::json::parse(golden_in);
  std::vector<std::string> tokens(doc["model"]["vocab"].size());
  for (const auto& [text, id] : doc["model"]["vocab"].items()) tokens[id.get<size_t>()] = text;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (size_t i = 0; i < tokens.size(); ++i) {
    scores.push_back(-static_cast<float>(i));
    types.push_back(i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
  }
  GgufBuilder b;
  b.kvString("tokenizer.ggml.model", "llama")
      .kvStringArray("tokenizer.ggml.tokens", tokens)
      .kvI32Array("tokenizer.ggml.token_type", types)
      .kvU32("tokenizer.ggml.bos_token_id", 1)
      .kvU32("tokenizer.ggml.eos_token_id", 2)
      .kvU32("tokenizer.ggml.unknown_token_id", 0);
  f32Array(b, "tokenizer.ggml.scores", scores);
  auto tok = fromBytes(b.build());
  ASSERT_TRUE(tok.ok()) << tok.status();
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    std::string text;
    ASSERT_TRUE(absl::Base64Unescape(c["text_b64"].get<std::string>(), &text));
    const EncodeOptions options{.add_special_tokens = c["add_special_tokens"].get<bool>(),
                                .parse_special = c["parse_special"].get<bool>()};
    const auto expected = c["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ((*tok)->encode(text, options), expected) << c["tag"];
    std::string decoded;
    ASSERT_TRUE(absl::Base64Unescape(c["decoded_skip_special_b64"].get<std::string>(), &decoded));
    EXPECT_EQ((*tok)->decode(expected, true), decoded) << c["tag"];
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

TEST(GgufErrorsTest, NameTheMetadataKey) {
  auto status = fromBytes(gpt2Vocab("no-such-pre").build()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("tokenizer.ggml.pre"));

  GgufBuilder bert;
  bert.kvString("tokenizer.ggml.model", "bert").kvStringArray("tokenizer.ggml.tokens", {"a"});
  status = fromBytes(bert.build()).status();
  EXPECT_THAT(std::string(status.message()), HasSubstr("tokenizer.ggml.model"));

  GgufBuilder merges;
  merges.kvString("tokenizer.ggml.model", "gpt2")
      .kvStringArray("tokenizer.ggml.tokens", {"a", "b"})
      .kvStringArray("tokenizer.ggml.merges", {"a b"});  // "ab" is not a token.
  status = fromBytes(merges.build()).status();
  EXPECT_THAT(std::string(status.message()), HasSubstr("tokenizer.ggml.merges[0]"));

  GgufBuilder out_of_range;
  out_of_range.kvString("tokenizer.ggml.model", "llama")
      .kvStringArray("tokenizer.ggml.tokens", {"a"})
      .kvU32("tokenizer.ggml.bos_token_id", 7);
  status = fromBytes(out_of_range.build()).status();
  EXPECT_THAT(std::string(status.message()), HasSubstr("tokenizer.ggml.bos_token_id"));

  GgufBuilder bad_utf8;
  bad_utf8.kvString("tokenizer.ggml.model", "llama")
      .kvStringArray("tokenizer.ggml.tokens", {"a", "\xff"});
  status = fromBytes(bad_utf8.build()).status();
  EXPECT_THAT(std::string(status.message()), HasSubstr("tokenizer.ggml.tokens[1]"));

  GgufBuilder bad_types;
  bad_types.kvString("tokenizer.ggml.model", "llama")
      .kvStringArray("tokenizer.ggml.tokens", {"a", "b"})
      .kvI32Array("tokenizer.ggml.token_type", {1});
  status = fromBytes(bad_types.build()).status();
  EXPECT_THAT(std::string(status.message()), HasSubstr("tokenizer.ggml.token_type"));
}

}  // namespace
}  // namespace cleave::tokenizer
