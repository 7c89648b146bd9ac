// Compares the tokenizers with goldens from the reference libraries (tests/golden/
// gen_tokenizers.py): Hugging Face tokenizers for the tokenizer.json files, llama.cpp and
// transformers for the SmolLM2 GGUF vocabulary. Every id and every decoded byte must match.
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

using Json = nlohmann::json;

const std::string kTokenizers = std::string(CLEAVE_GOLDEN_DIR) + "/tokenizers";
const std::string kSmolLm2 = std::string(CLEAVE_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

Json readJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return Json::parse(in);
}

std::string unbase64(const Json& value) {
  std::string out;
  EXPECT_TRUE(absl::Base64Unescape(value.get<std::string>(), &out));
  return out;
}

std::vector<TokenId> ids(const Json& value) { return value.get<std::vector<TokenId>>(); }

// Checks the streaming detokenizer against decode() on `token_ids`.
void expectStreamMatchesDecode(const Tokenizer& tok, const std::vector<TokenId>& token_ids,
                               bool skip_special, const std::string& tag) {
  IncrementalDetokenizer stream(tok, skip_special);
  std::string streamed;
  for (TokenId id : token_ids) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(isValidUtf8(piece)) << tag;
    streamed += piece;
  }
  streamed += stream.finish();
  const std::string full = tok.decode(token_ids, skip_special);
  if (isValidUtf8(full)) {
    EXPECT_EQ(streamed, full) << tag;
  } else {
    EXPECT_EQ(streamed, sanitizeUtf8(full)) << tag;
  }
}

class HfGoldenTest : public testing::TestWithParam<std::string> {};

TEST_P(HfGoldenTest, MatchesTokenizersLibrary) {
  const std::string dir = kTokenizers + "/" + GetParam();
  auto loaded = Tokenizer::load(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Tokenizer& tok = **loaded;
  const Json golden = readJson(dir + "/golden.json");
  EXPECT_EQ(tok.vocabSize(), golden["vocab_size"].get<size_t>());
  for (const auto& [text, id] : golden["special_tokens"].items()) {
    EXPECT_TRUE(tok.isSpecial(id.get<TokenId>())) << text;
  }
  int checked = 0;
  for (const Json& c : golden["cases"]) {
    const std::string tag = absl::StrCat(GetParam(), "/", c["tag"].get<std::string>(),
                                         c["add_special_tokens"].get<bool>() ? "+special" : "");
    const std::string text = unbase64(c["text_b64"]);
    const EncodeOptions options{.add_special_tokens = c["add_special_tokens"].get<bool>(),
                                .parse_special = c["parse_special"].get<bool>()};
    const std::vector<TokenId> got = tok.encode(text, options);
    EXPECT_EQ(got, ids(c["ids"])) << tag;
    std::vector<std::string> pieces;
    for (TokenId id : got) pieces.push_back(tok.piece(id).value_or("<missing>"));
    EXPECT_EQ(pieces, c["pieces"].get<std::vector<std::string>>()) << tag;
    EXPECT_EQ(tok.decode(ids(c["ids"]), false), unbase64(c["decoded_b64"])) << tag;
    EXPECT_EQ(tok.decode(ids(c["ids"]), true), unbase64(c["decoded_skip_special_b64"])) << tag;
    expectStreamMatchesDecode(tok, ids(c["ids"]), true, tag);
    expectStreamMatchesDecode(tok, ids(c["ids"]), false, tag);
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, HfGoldenTest,
                         testing::Values("bytelevel_bpe", "spm_bpe", "gpt2_bpe"));

class SmolLm2GoldenTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kSmolLm2)) {
      GTEST_SKIP() << kSmolLm2 << " is missing: run scripts/install-deps.sh";
    }
    auto loaded = Tokenizer::load(kSmolLm2);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    tok_ = *std::move(loaded);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(SmolLm2GoldenTest, MatchesLlamaCpp) {
  const Json golden = readJson(kTokenizers + "/smollm2_gguf/golden_llamacpp.json");
  int checked = 0;
  for (const Json& c : golden["cases"]) {
    const std::string tag = c["tag"].get<std::string>();
    const std::string text = unbase64(c["text_b64"]);
    const auto plain = tok_->encode(text, {.add_special_tokens = false, .parse_special = false});
    const auto parsed = tok_->encode(text, {.add_special_tokens = false, .parse_special = true});
    const auto with_bos = tok_->encode(text, {.add_special_tokens = true, .parse_special = false});
    if (!c["valid_utf8"].get<bool>()) {
      // llama.cpp reads ill-formed bytes as U+FFFD; Cleave keeps every byte the vocabulary
      // can spell and reads the others (0xC0, 0xFE, 0xFF here) as U+FFFD.
      EXPECT_EQ(sanitizeUtf8(tok_->decode(plain, false)), sanitizeUtf8(text)) << tag;
      expectStreamMatchesDecode(*tok_, plain, true, tag);
      continue;
    }
    EXPECT_EQ(plain, ids(c["ids"])) << tag;
    EXPECT_EQ(parsed, ids(c["ids_parse_special"])) << tag;
    EXPECT_EQ(with_bos, ids(c["ids_add_bos"])) << tag;
    EXPECT_EQ(tok_->decode(ids(c["ids"]), true), unbase64(c["detok_b64"])) << tag;
    EXPECT_EQ(tok_->decode(ids(c["ids_parse_special"]), false),
              unbase64(c["detok_parse_special_b64"]))
        << tag;
    EXPECT_EQ(tok_->decode(ids(c["ids_parse_special"]), true),
              unbase64(c["detok_parse_special_unrendered_b64"]))
        << tag;
    expectStreamMatchesDecode(*tok_, ids(c["ids_parse_special"]), true, tag);
    expectStreamMatchesDecode(*tok_, ids(c["ids_parse_special"]), false, tag);
    ++checked;
  }
  EXPECT_GT(checked, 70);
}

TEST_F(SmolLm2GoldenTest, MatchesTransformersWhereItAgreesWithLlamaCpp) {
  const Json golden = readJson(kTokenizers + "/smollm2_gguf/golden_hf.json");
  std::set<std::string> disagreeing;
  for (const Json& d : golden["disagreements"]) disagreeing.insert(d["tag"].get<std::string>());
  int checked = 0;
  for (const Json& c : golden["cases"]) {
    const std::string tag = c["tag"].get<std::string>();
    const std::string text = unbase64(c["text_b64"]);
    // transformers always parses special-token text.
    const auto got = tok_->encode(text, {.add_special_tokens = false, .parse_special = true});
    EXPECT_EQ(tok_->decode(ids(c["ids"]), false), unbase64(c["decoded_b64"])) << tag;
    if (disagreeing.count(tag) != 0) continue;  // Checked against llama.cpp above.
    EXPECT_EQ(got, ids(c["ids"])) << tag;
    EXPECT_EQ(tok_->encode(text, {.add_special_tokens = true, .parse_special = true}),
              ids(c["ids_add_special_tokens"]))
        << tag;
    ++checked;
  }
  EXPECT_GT(checked, 70);
}

}  // namespace
}  // namespace cleave::tokenizer
