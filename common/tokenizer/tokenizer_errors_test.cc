// Bad tokenizer.json input: every problem is an InvalidArgument naming the file and the
// field, never a crash. Also a crude mutation sweep over a valid document.
#include <random>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/tokenizer/test_tokenizers.h"
#include "common/tokenizer/tokenizer.h"

namespace cleave::tokenizer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::Status loadStatus(const std::string& text) {
  return Tokenizer::fromTokenizerJsonText(text, "bad.json").status();
}

absl::Status loadStatus(const nlohmann::json& doc) { return loadStatus(doc.dump()); }

// Asserts an InvalidArgument whose message names the file and `field`.
void expectFieldError(const absl::Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), AllOf(HasSubstr("bad.json"), HasSubstr(field)));
}

TEST(TokenizerErrorsTest, InvalidJson) {
  expectFieldError(loadStatus(std::string("{\"model\": ")), "invalid JSON");
  expectFieldError(loadStatus(std::string("[1, 2]")), "(root)");
  expectFieldError(loadStatus(std::string("{}")), "'model'");
}

TEST(TokenizerErrorsTest, UnsupportedModelTypesNameTheField) {
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    nlohmann::json doc = testing::tinyByteLevel();
    doc["model"]["type"] = type;
    const absl::Status status = loadStatus(doc);
    expectFieldError(status, "model.type");
    EXPECT_THAT(std::string(status.message()), HasSubstr(type));
  }
}

TEST(TokenizerErrorsTest, VocabProblems) {
  nlohmann::json doc = testing::tinyByteLevel();
  doc["model"]["vocab"] = {1, 2, 3};
  expectFieldError(loadStatus(doc), "model.vocab");

  doc = testing::tinyByteLevel();
  doc["model"]["vocab"]["hello"] = -4;
  expectFieldError(loadStatus(doc), "model.vocab[\"hello\"]");

  doc = testing::tinyByteLevel();
  doc["model"]["vocab"]["hello"] = "7";
  expectFieldError(loadStatus(doc), "model.vocab[\"hello\"]");

  doc = testing::tinyByteLevel();
  doc["model"]["vocab"]["hello"] = 4000000000u;  // Would need a 4G-entry id table.
  expectFieldError(loadStatus(doc), "model.vocab[\"hello\"]");

  doc = testing::tinyByteLevel();
  doc["added_tokens"][0]["id"] = 1u << 30;
  expectFieldError(loadStatus(doc), "added_tokens[0].id");

  doc = testing::tinyByteLevel();
  doc["added_tokens"][1].erase("content");
  expectFieldError(loadStatus(doc), "added_tokens[1].content");

  doc = testing::tinySpm();
  doc["model"]["unk_token"] = "<missing>";
  expectFieldError(loadStatus(doc), "model.unk_token");
}

TEST(TokenizerErrorsTest, MergeProblems) {
  nlohmann::json doc = testing::tinyByteLevel();
  doc["model"]["merges"].push_back("zz qq");
  expectFieldError(loadStatus(doc), "model.merges[8]");

  doc = testing::tinyByteLevel();
  doc["model"]["merges"].push_back("a b c");
  expectFieldError(loadStatus(doc), "model.merges[8]");

  doc = testing::tinyByteLevel();
  doc["model"]["merges"].push_back("a b");  // "ab" is not in the vocabulary.
  expectFieldError(loadStatus(doc), "model.merges[8]");

  doc = testing::tinyByteLevel();
  doc["model"]["merges"].push_back(17);
  expectFieldError(loadStatus(doc), "model.merges[8]");

  doc = testing::tinyByteLevel();
  doc["model"]["merges"] = "a b";
  expectFieldError(loadStatus(doc), "model.merges");
}

TEST(TokenizerErrorsTest, UnsupportedComponentsNameTheirType) {
  nlohmann::json doc = testing::tinySpm();
  doc["normalizer"] = {{"type", "NFKC"}};
  auto status = loadStatus(doc);
  expectFieldError(status, "normalizer.type");
  EXPECT_THAT(std::string(status.message()), HasSubstr("NFKC"));

  doc = testing::tinySpm();
  doc["normalizer"]["normalizers"].push_back({{"type", "Lowercase"}});
  expectFieldError(loadStatus(doc), "normalizer.normalizers[2].type");

  doc = testing::tinyByteLevel();
  doc["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  expectFieldError(loadStatus(doc), "pre_tokenizer.type");

  doc = testing::tinyByteLevel();
  doc["decoder"] = {{"type", "WordPiece"}};
  expectFieldError(loadStatus(doc), "decoder.type");

  doc = testing::tinyByteLevel();
  doc["post_processor"] = {{"type", "Mystery"}};
  expectFieldError(loadStatus(doc), "post_processor.type");

  doc = testing::tinyByteLevel();
  doc["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "ByteLevel"}, {"use_regex", false}},
                            {{"type", "Digits"}, {"individual_digits", true}}}}};
  expectFieldError(loadStatus(doc), "pre_tokenizer.pretokenizers[1]");
}

TEST(TokenizerErrorsTest, BadPatternsAndValues) {
  nlohmann::json doc = testing::tinyByteLevel();
  doc["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expectFieldError(loadStatus(doc), "pre_tokenizer.pattern.Regex");

  doc = testing::tinyByteLevel();
  doc["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}};
  expectFieldError(loadStatus(doc), "pre_tokenizer.behavior");

  doc = testing::tinySpm();
  doc["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
  expectFieldError(loadStatus(doc), "pre_tokenizer.replacement");

  doc = testing::tinySpm();
  doc["decoder"]["decoders"][3]["start"] = -1;
  expectFieldError(loadStatus(doc), "decoder.decoders[3].start");

  doc = testing::tinySpm();
  doc["post_processor"]["single"][0]["SpecialToken"]["id"] = "<nope>";
  expectFieldError(loadStatus(doc), "post_processor.single[0].SpecialToken.id");

  doc = testing::tinySpm();
  doc["model"]["byte_fallback"] = "yes";
  expectFieldError(loadStatus(doc), "model.byte_fallback");
}

TEST(TokenizerErrorsTest, DeepNestingIsRejectedNotRecursedInto) {
  nlohmann::json node = {{"type", "Fuse"}};
  for (int i = 0; i < 50; ++i) node = {{"type", "Sequence"}, {"decoders", {node}}};
  nlohmann::json doc = testing::tinyByteLevel();
  doc["decoder"] = node;
  expectFieldError(loadStatus(doc), "decoder.decoders[0]");

  nlohmann::json steps = nlohmann::json::array();
  for (int i = 0; i < 5000; ++i) steps.push_back({{"type", "Digits"}});
  doc = testing::tinyByteLevel();
  doc["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", steps}};
  expectFieldError(loadStatus(doc), "pre_tokenizer.pretokenizers[64]");

  // Deeply nested JSON that is not a tokenizer at all.
  std::string deep(100000, '[');
  EXPECT_FALSE(loadStatus(deep).ok());
}

// Truncations and byte flips of a valid document load or fail cleanly; what loads encodes.
TEST(TokenizerErrorsTest, MutatedDocumentsNeverCrash) {
  const std::string valid = testing::tinySpm().dump();
  std::mt19937 rng(3);
  int loaded = 0;
  for (int i = 0; i < 400; ++i) {
    std::string text = valid;
    if (i % 2 == 0) {
      text.resize(rng() % text.size());
    } else {
      for (int k = 0; k < 2; ++k) {
        text[rng() % text.size()] = "{}[]\",:01 tnufalse\\"[rng() % 20];
      }
    }
    auto tok = Tokenizer::fromTokenizerJsonText(text, "mutated.json");
    if (!tok.ok()) continue;
    ++loaded;
    const auto ids = (*tok)->encode("hello world <s> \xff€", {.parse_special = true});
    (void)(*tok)->decode(ids, false);
  }
  EXPECT_GT(loaded, 0);
}

}  // namespace
}  // namespace cleave::tokenizer
