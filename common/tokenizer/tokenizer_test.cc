// The tokenizer.json pipeline on small hand-made tokenizers (expected ids from the Hugging
// Face tokenizers library on the same documents), plus properties: lossless round trips,
// thread safety.
#include "common/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/tokenizer/nfc.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/test_tokenizers.h"

namespace cleave::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

std::unique_ptr<Tokenizer> load(const nlohmann::json& doc) {
  auto tok = Tokenizer::fromTokenizerJsonText(doc.dump(), "test.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

constexpr EncodeOptions kParse{.add_special_tokens = true, .parse_special = true};
constexpr EncodeOptions kPlain{.add_special_tokens = false, .parse_special = false};

TEST(ByteLevelTest, MatchesReference) {
  auto tok = load(testing::tinyByteLevel());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocabSize(), 267u);
  EXPECT_THAT(tok->encode("the cat in the hat", kParse),
              ElementsAre(266, 116, 257, 262, 263, 258, 32, 104, 261));
  EXPECT_THAT(tok->encode("<|eot|>the", kParse), ElementsAre(266, 264, 116, 257));
  EXPECT_THAT(tok->encode("x  <tool>  y", kParse), ElementsAre(266, 120, 265, 121));
  EXPECT_THAT(tok->encode("é€😀", kParse),
              ElementsAre(266, 195, 169, 226, 130, 172, 240, 159, 152, 128));
  EXPECT_THAT(tok->encode("  in\n\n", kParse), ElementsAre(266, 32, 263, 10, 10));
  EXPECT_EQ(tok->bosId(), 266u);
  EXPECT_TRUE(tok->isSpecial(264));
  EXPECT_FALSE(tok->isSpecial(265));
  EXPECT_EQ(tok->piece(257).value(), "he");
  EXPECT_EQ(tok->piece(32).value(), "Ġ");
  EXPECT_FALSE(tok->piece(9999).ok());
}

TEST(ByteLevelTest, SpecialTextIsPlainTextUnlessParsed) {
  auto tok = load(testing::tinyByteLevel());
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->encode("<|eot|>the", kPlain),
              ElementsAre(60, 124, 101, 111, 116, 124, 62, 116, 257));
  // Non-special added tokens are matched either way.
  EXPECT_THAT(tok->encode("x <tool> y", kPlain), ElementsAre(120, 265, 121));
}

TEST(ByteLevelTest, AddedTokenAlreadyInTheVocabularyKeepsTheModelId) {
  nlohmann::json doc = testing::tinyByteLevel();
  doc["added_tokens"].push_back(testing::addedToken(267, "he", false));
  auto tok = load(doc);
  ASSERT_NE(tok, nullptr);
  // "he" is cut out as an added token (so " the" cannot merge into "Ġthe"), with id 257.
  EXPECT_THAT(tok->encode(" the", kPlain), ElementsAre(256, 257));
}

TEST(ByteLevelTest, DecodeSkipsSpecialTokensOnRequest) {
  auto tok = load(testing::tinyByteLevel());
  ASSERT_NE(tok, nullptr);
  const std::vector<TokenId> ids = {266, 116, 257, 264, 265};
  EXPECT_EQ(tok->decode(ids, false), "<|bos|>the<|eot|><tool>");
  EXPECT_EQ(tok->decode(ids, true), "the<tool>");
  EXPECT_EQ(tok->decode(std::vector<TokenId>{9999, 116}, false), "t");  // Unknown ids vanish.
}

TEST(ByteLevelTest, EveryByteSequenceRoundTrips) {
  auto tok = load(testing::tinyByteLevel());
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string text(rng() % 64, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 256);
    if (i % 3 == 0) {
      for (char& c : text) c = " abcdefthin\n\xe2\x82\xac"[rng() % 14];
    }
    EXPECT_EQ(tok->decode(tok->encode(text, kPlain), false), text) << i;
  }
}

TEST(SpmTest, MatchesReference) {
  auto tok = load(testing::tinySpm());
  ASSERT_NE(tok, nullptr);
  struct Case {
    std::string text;
    std::vector<TokenId> ids;
    std::string decoded;       // skip_special_tokens
    std::string decoded_full;  // with special tokens
  };
  const std::vector<Case> cases = {
      {"hello world", {1, 271, 276}, "hello world", "<s> hello world"},
      {"  hello", {1, 277, 271}, "  hello", "<s>   hello"},
      {"hello€", {1, 271, 229, 133, 175}, "hello€", "<s> hello€"},
      {"<s>hello</s>world", {1, 1, 271, 2, 276}, "hello world", "<s><s> hello</s> world"},
      {"Hello", {1, 259, 75, 261, 270}, "Hello", "<s> Hello"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(tok->encode(c.text, kParse), ElementsAreArray(c.ids)) << c.text;
    EXPECT_EQ(tok->decode(c.ids, true), c.decoded) << c.text;
    EXPECT_EQ(tok->decode(c.ids, false), c.decoded_full) << c.text;
  }
}

TEST(SpmTest, UnknownCharactersWithoutByteTokensFuseIntoOneUnk) {
  nlohmann::json doc = testing::tinySpm();
  doc["model"]["byte_fallback"] = false;
  auto tok = load(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->encode("hello€€", kPlain), ElementsAre(271, 0));
}

TEST(SpmTest, ValidAndInvalidTextRoundTrips) {
  auto tok = load(testing::tinySpm());
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(11);
  const std::vector<std::string> alphabet = {"h", "e",    "l",    "o",   " ", "w", "€",
                                             "😀", "\xff", "\x80", "<s>", "d", "  "};
  for (int i = 0; i < 300; ++i) {
    std::string text;
    for (int k = rng() % 12; k > 0; --k) text += alphabet[rng() % alphabet.size()];
    EXPECT_EQ(tok->decode(tok->encode(text, kPlain), true), text) << i;
  }
}

TEST(MetaspaceTest, PrependSchemeFirstOnlyAtTheStartOfTheInput) {
  nlohmann::json doc = testing::tinySpm();
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", true}};
  doc["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}};
  auto tok = load(doc);
  ASSERT_NE(tok, nullptr);
  const EncodeOptions parse{.add_special_tokens = false, .parse_special = true};
  EXPECT_THAT(tok->encode("hello world", parse), ElementsAre(271, 276));
  EXPECT_THAT(tok->encode("<s>hello  world", parse), ElementsAre(1, 260, 261, 270, 259, 276));
  EXPECT_THAT(tok->encode(" hello", parse), ElementsAre(271));
  EXPECT_EQ(tok->decode(std::vector<TokenId>{1, 260, 261, 270, 259, 276}, true), "hello  world");
}

// Pre-tokenizer pieces, as the reference's pre_tokenize_str gives them.
std::vector<std::string> pieces(const PreTokenizer& pre, const std::string& text) {
  std::vector<std::string> out;
  pre.apply(text, true, [&](absl::string_view w) { out.emplace_back(w); });
  return out;
}

PreTokenizer splitOn(const std::string& literal, SplitBehavior behavior, bool invert = false) {
  PreTokenizer pre;
  pre.addStep(PreTokenizerStep{.kind = PreTokenizerStep::Kind::kSplit,
                               .literal = literal,
                               .behavior = behavior,
                               .invert = invert});
  return pre;
}

TEST(PreTokenizerTest, SplitBehaviorsMatchReference) {
  const std::string s = "a--b-c---d-";
  EXPECT_THAT(pieces(splitOn("-", SplitBehavior::kRemoved), s), ElementsAre("a", "b", "c", "d"));
  EXPECT_THAT(pieces(splitOn("-", SplitBehavior::kIsolated), s),
              ElementsAre("a", "-", "-", "b", "-", "c", "-", "-", "-", "d", "-"));
  EXPECT_THAT(pieces(splitOn("-", SplitBehavior::kMergedWithPrevious), s),
              ElementsAre("a-", "-", "b-", "c-", "-", "-", "d-"));
  EXPECT_THAT(pieces(splitOn("-", SplitBehavior::kMergedWithNext), s),
              ElementsAre("a", "-", "-b", "-c", "-", "-", "-d", "-"));
  EXPECT_THAT(pieces(splitOn("-", SplitBehavior::kContiguous), s),
              ElementsAre("a", "--", "b", "-", "c", "---", "d", "-"));
  EXPECT_THAT(pieces(splitOn("-", SplitBehavior::kRemoved, true), s),
              ElementsAre("-", "-", "-", "-", "-", "-", "-"));
  EXPECT_THAT(pieces(splitOn("-", SplitBehavior::kMergedWithNext, true), s),
              ElementsAre("a-", "-", "b-", "c-", "-", "-", "d-"));
}

TEST(PreTokenizerTest, MetaspaceAndEmptyRegexMatches) {
  PreTokenizer meta;
  meta.addStep(PreTokenizerStep{.kind = PreTokenizerStep::Kind::kMetaspace,
                                .replacement = "▁",
                                .prepend_scheme = PrependScheme::kAlways});
  EXPECT_THAT(pieces(meta, "Hey   friend! "), ElementsAre("▁Hey", "▁", "▁", "▁friend!", "▁"));

  PreTokenizer thousands;
  thousands.addStep(PreTokenizerStep{
      .kind = PreTokenizerStep::Kind::kSplit,
      .regex = std::shared_ptr<const Regex>(Regex::compile(R"((?=(\d{3})+(?!\d)))").value())});
  EXPECT_THAT(pieces(thousands, "1234567"), ElementsAre("1", "234", "567"));
}

TEST(NfcTest, MatchesPythonUnicodedata) {
  // Expected values from unicodedata.normalize("NFC", ...).
  EXPECT_EQ(toNfc("cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(toNfc("\u212b"), "\u00c5");
  EXPECT_EQ(toNfc("\u1100\u1161\u11a8"), "\uac01");
  EXPECT_EQ(toNfc("a\u0323\u0302\u0301"), "\u1ead\u0301");
  EXPECT_EQ(toNfc("\u0344x"), "\u0308\u0301x");
  EXPECT_EQ(toNfc("\u1e0b\u0323"), "\u1e0d\u0307");
  EXPECT_EQ(toNfc("\ufb01 plain ascii"), "\ufb01 plain ascii");
  // Ill-formed bytes pass through and block composition.
  EXPECT_EQ(toNfc("e\xff\u0301"), "e\xff\u0301");
}

TEST(NfcTest, NormalizerInATokenizer) {
  nlohmann::json doc = testing::tinySpm();
  const nlohmann::json nfc = {{"type", "NFC"}};
  doc["normalizer"]["normalizers"].insert(doc["normalizer"]["normalizers"].begin(), nfc);
  auto tok = load(doc);
  ASSERT_NE(tok, nullptr);
  // "e" + U+0301 becomes U+00E9, which is not a piece: its two bytes.
  EXPECT_THAT(tok->encode("he\u0301", kPlain), ElementsAre(267, 198, 172));
}

TEST(TokenizerTest, EncodeIsThreadSafe) {
  auto tok = load(testing::tinyByteLevel());
  ASSERT_NE(tok, nullptr);
  const std::string text = "the cat in the hat <|eot|> sat on the mat. ";
  const std::vector<TokenId> expected = tok->encode(text, kParse);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (tok->encode(text, kParse) != expected) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(LoadTest, FolderWithConfigAdjustsBos) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "cleave_tok_folder";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << testing::tinySpm().dump();
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"add_bos_token": false, "add_eos_token": true, "bos_token": "<s>",
            "eos_token": {"content": "</s>"}})";
  auto tok = Tokenizer::load(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->encode("hello", kParse), ElementsAre(271, 2));
  EXPECT_EQ((*tok)->bosId(), 1u);
  EXPECT_EQ((*tok)->eosId(), 2u);

  auto direct = Tokenizer::load((dir / "tokenizer.json").string());
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_THAT((*direct)->encode("hello", kParse), ElementsAre(271, 2));
  std::filesystem::remove_all(dir);
}

TEST(LoadTest, MissingPathsAreNotFound) {
  EXPECT_EQ(Tokenizer::load("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
  const auto dir = std::filesystem::path(::testing::TempDir()) / "cleave_tok_empty";
  std::filesystem::create_directories(dir);
  auto status = Tokenizer::load(dir.string()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("tokenizer.json"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cleave::tokenizer
