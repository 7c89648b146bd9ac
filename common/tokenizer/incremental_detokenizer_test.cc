// IncrementalDetokenizer: never a broken character, held bytes flushed by finish(), and the
// streamed text equals decode() of the whole sequence.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/tokenizer/test_tokenizers.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

std::unique_ptr<Tokenizer> load(const nlohmann::json& doc) {
  return Tokenizer::fromTokenizerJsonText(doc.dump(), "test.json").value();
}

std::vector<std::string> stream(const Tokenizer& tok, const std::vector<TokenId>& ids,
                                bool skip_special = true) {
  IncrementalDetokenizer d(tok, skip_special);
  std::vector<std::string> out;
  for (TokenId id : ids) out.push_back(d.push(id));
  out.push_back(d.finish());
  return out;
}

std::string join(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& p : parts) s += p;
  return s;
}

TEST(IncrementalDetokenizerTest, HoldsBytesUntilTheCharacterCompletes) {
  auto tok = load(testing::tinyByteLevel());
  // "€" is E2 82 AC: three byte tokens.
  const auto out = stream(*tok, {116, 0xE2, 0x82, 0xAC, 257});
  EXPECT_EQ(out, (std::vector<std::string>{"t", "", "", "€", "he", ""}));
}

TEST(IncrementalDetokenizerTest, FinishFlushesAnIncompleteCharacterAsReplacement) {
  auto tok = load(testing::tinyByteLevel());
  const auto out = stream(*tok, {116, 0xE2, 0x82});
  EXPECT_EQ(out, (std::vector<std::string>{"t", "", "", "\xEF\xBF\xBD"}));
}

TEST(IncrementalDetokenizerTest, InvalidBytesAreReplacedRightAway) {
  auto tok = load(testing::tinyByteLevel());
  const auto out = stream(*tok, {0xFF, 116, 0xE2, 116});
  EXPECT_EQ(out, (std::vector<std::string>{"\xEF\xBF\xBD", "t", "", "\xEF\xBF\xBDt", ""}));
}

TEST(IncrementalDetokenizerTest, SkipsOrRendersSpecialTokens) {
  auto tok = load(testing::tinyByteLevel());
  EXPECT_EQ(join(stream(*tok, {266, 116, 264}, true)), "t");
  EXPECT_EQ(join(stream(*tok, {266, 116, 264}, false)), "<|bos|>t<|eot|>");
}

TEST(IncrementalDetokenizerTest, KeepsTheLeadingSpaceRulesOfSentencePiece) {
  auto tok = load(testing::tinySpm());
  // <s> ▁hello ▁world: the first space is stripped, the second kept.
  EXPECT_EQ(stream(*tok, {1, 271, 276}), (std::vector<std::string>{"", "hello", " world", ""}));
  // "▁▁" then "▁hello": "  hello" minus one leading space.
  EXPECT_EQ(join(stream(*tok, {277, 271})), tok->decode(std::vector<TokenId>{277, 271}, true));
  // Byte-fallback bytes of "€" (E2 82 AC at ids 229, 133, 175).
  EXPECT_EQ(stream(*tok, {271, 229, 133, 175}),
            (std::vector<std::string>{"hello", "", "", "€", ""}));
}

// Random id sequences: every push is valid UTF-8, and when decode() of the whole sequence
// is valid UTF-8 the pushes add up to it.
TEST(IncrementalDetokenizerTest, RandomSequencesMatchDecode) {
  for (const auto& doc : {testing::tinyByteLevel(), testing::tinySpm()}) {
    auto tok = load(doc);
    std::mt19937 rng(5);
    int compared = 0;
    for (int i = 0; i < 2000; ++i) {
      std::vector<TokenId> ids(rng() % 12);
      for (TokenId& id : ids) id = static_cast<TokenId>(rng() % tok->vocabSize());
      for (bool skip : {true, false}) {
        const auto parts = stream(*tok, ids, skip);
        for (const auto& p : parts) ASSERT_TRUE(isValidUtf8(p));
        const std::string full = tok->decode(ids, skip);
        if (isValidUtf8(full)) {
          EXPECT_EQ(join(parts), full);
          ++compared;
        }
      }
    }
    EXPECT_GT(compared, 500);
  }
}

TEST(IncrementalDetokenizerTest, WindowStaysSmall) {
  // Amortized O(1): a long stream of empty-text special tokens and ordinary ones.
  auto tok = load(testing::tinyByteLevel());
  IncrementalDetokenizer d(*tok);
  std::string all;
  for (int i = 0; i < 200000; ++i) all += d.push(i % 3 == 0 ? 264 : 258);
  all += d.finish();
  EXPECT_EQ(all.size(), 133333u * 4);  // "Ġthe" -> " the"
}

}  // namespace
}  // namespace cleave::tokenizer
