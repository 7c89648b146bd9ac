// JsonGrammar against nlohmann::json's parser on valid documents, their prefixes and their
// one-byte mutations; JsonConstraint's mask on a small vocabulary, whose draws always end
// in a document the parser reads as an object.
#include "services/engine/json_constraint.h"
#include "services/engine/json_grammar_inl.h"
#include "services/engine/json_mask_check.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace cleave::engine {
namespace {

using Json = nlohmann::json;

// All of `text` taken, and the object closed.
bool accepts(const std::string& text) {
  JsonGrammar grammar;
  return grammar.pushAll(text) && grammar.complete();
}

bool parsesAsObject(const std::string& text) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !j.is_discarded() && j.is_object();
}

TEST(JsonGrammarTest, HandCases) {
  for (const char* ok :
       {"{}", " {}", "{\"a\":1}", "{\"a\": [1, -2.5e+3, 0, true, false, null]}",
        "{\"k\":{\"n\":{}},\"s\":\"\\u00e9\\n\\\"x\"}", "{\"\xc3\xa9\": \"\xf0\x9f\x99\x82\"}",
        "{\"a\":[]}", "{\"a\":[[],{}]} "}) {
    EXPECT_TRUE(accepts(ok)) << ok;
    EXPECT_TRUE(parsesAsObject(ok)) << ok;
  }
  for (const char* bad :
       {"[]", "1", "\"s\"", "{", "{\"a\"}", "{\"a\":}", "{\"a\":01}", "{\"a\":1,}", "{\"a\":[1,]}",
        "{a:1}", "{\"a\":tru}", "{\"a\":.5}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}",
        "{\"a\":\"\xc3\"}", "{\"a\":\"\xe0\x80\x80\"}", "{\"a\":\"\\ud800\"}", "{}}", "{} x"}) {
    EXPECT_FALSE(accepts(bad)) << bad;
  }
  // Nesting stops at 32; blank runs at 16.
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonGrammar::kMaxDepth; ++i) deep += "[";
  JsonGrammar grammar;
  EXPECT_TRUE(grammar.pushAll(deep));
  EXPECT_FALSE(grammar.push('['));
  EXPECT_TRUE(grammar.pushAll(std::string(16, ' ')));
  EXPECT_FALSE(grammar.push(' '));
}

Json randomValue(std::mt19937_64& random, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 4 ? 4 : 6);
  switch (kind(random)) {
    case 0: return std::uniform_int_distribution<int64_t>(-1000000, 1000000)(random);
    case 1: return std::uniform_real_distribution<double>(-1e6, 1e6)(random);
    case 2: return std::bernoulli_distribution(0.5)(random);
    case 3: return nullptr;
    case 4: {
      const char* pieces[] = {"a",  "Z",    " ",        "\"",           "\\",
                              "\n", "\t",   "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x99\x82",
                              "/",  "\x7f", "0"};
      std::string s;
      for (int n = std::uniform_int_distribution<int>(0, 6)(random); n > 0; --n) {
        s += pieces[std::uniform_int_distribution<size_t>(0, std::size(pieces) - 1)(random)];
      }
      return s;
    }
    case 5: {
      Json a = Json::array();
      for (int n = std::uniform_int_distribution<int>(0, 3)(random); n > 0; --n) {
        a.push_back(randomValue(random, depth + 1));
      }
      return a;
    }
    default: {
      Json o = Json::object();
      for (int n = std::uniform_int_distribution<int>(0, 3)(random); n > 0; --n) {
        o[std::string(1, static_cast<char>('a' + n))] = randomValue(random, depth + 1);
      }
      return o;
    }
  }
}

TEST(JsonGrammarTest, AgreesWithAParserOnRandomDocumentsAndMutations) {
  std::mt19937_64 random(20261203);
  int mutated_valid = 0, mutated_invalid = 0;
  for (int doc = 0; doc < 400; ++doc) {
    Json object = Json::object();
    object["root"] = randomValue(random, 0);
    for (int indent : {-1, 1}) {
      const std::string text = object.dump(indent);
      ASSERT_TRUE(accepts(text)) << text;
      // Every prefix is taken; only the whole closes the object.
      JsonGrammar grammar;
      for (size_t i = 0; i < text.size(); ++i) {
        ASSERT_FALSE(grammar.complete()) << text.substr(0, i);
        ASSERT_TRUE(grammar.push(static_cast<uint8_t>(text[i]))) << text.substr(0, i + 1);
      }
      // One byte replaced, dropped or added: the grammar and the parser agree.
      for (int m = 0; m < 8; ++m) {
        std::string changed = text;
        const size_t at = std::uniform_int_distribution<size_t>(0, text.size() - 1)(random);
        const char byte = "{}[]\":,0-.e\\ a\x80\xc3"[random() % 17];
        switch (random() % 3) {
          case 0: changed[at] = byte; break;
          case 1: changed.erase(at, 1); break;
          default: changed.insert(at, 1, byte); break;
        }
        // What the grammar refuses on purpose: escapes (surrogates among them), exponents of
        // three digits and more.
        if (changed.find("\\u") != std::string::npos ||
            std::regex_search(changed, std::regex("[eE][+-]?[0-9]{3}"))) {
          continue;
        }
        const bool parsed = parsesAsObject(changed);
        EXPECT_EQ(accepts(changed), parsed) << changed;
        (parsed ? mutated_valid : mutated_invalid)++;
      }
    }
  }
  EXPECT_GT(mutated_valid, 100);  // both verdicts were exercised
  EXPECT_GT(mutated_invalid, 1000);
}

TEST(JsonConstraintTest, DrawsUnderTheMaskEndInAnObject) {
  // A small vocabulary: pieces of JSON, some prose, a special token, and an end token.
  std::vector<std::string> pieces = {"{",  "}",  "\"", "a",   ":",   "1",    " ",     ",",
                                     "[",  "]",  "",   "{\"", "\":", "true", "hello", "\n\n\n",
                                     "0.", "5e", "-",  "\",", "}}",  "x\"}", ""};
  const uint32_t end = static_cast<uint32_t>(pieces.size()) - 1;  // special: no bytes
  auto bytes = std::make_shared<const TokenBytes>(pieces);
  std::mt19937_64 random(7);
  int closed = 0;
  for (int run = 0; run < 300; ++run) {
    JsonConstraint constraint(bytes, {end});
    std::string text;
    for (int step = 0; step < 200; ++step) {
      std::vector<float> logits(pieces.size() + 3, 0.0f);  // wider than the vocabulary
      constraint.mask(logits);
      for (size_t id = pieces.size(); id < logits.size(); ++id) EXPECT_TRUE(std::isinf(logits[id]));
      EXPECT_TRUE(std::isinf(logits[10]));  // the other special token, never
      std::vector<uint32_t> allowed;
      for (uint32_t id = 0; id < logits.size(); ++id) {
        if (!std::isinf(logits[id])) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty()) << text;
      const uint32_t token = allowed[random() % allowed.size()];
      if (token == end) {
        EXPECT_TRUE(constraint.complete());
        EXPECT_TRUE(parsesAsObject(text)) << text;
        ++closed;
        break;
      }
      text += pieces[token];
      constraint.accept(token);
      JsonGrammar check;
      ASSERT_TRUE(check.pushAll(text)) << text;
    }
  }
  EXPECT_GT(closed, 30);
}

// On a real vocabulary, the grouped mask allows exactly the tokens whose bytes continue the
// object, checked token by token, in every state a reply passes through.
TEST(JsonConstraintTest, TheMaskIsExactOnARealVocabulary) {
  uint32_t end = 0;
  const std::shared_ptr<const TokenBytes> bytes = smolLm2TokenBytes(end);
  if (bytes == nullptr) GTEST_SKIP() << "SmolLM2 missing";
  JsonConstraint constraint(bytes, {end});
  expectMaskExact(constraint, JsonGrammar(), *bytes, end,
                  "{\"name\": \"Fel\u00e9ix \xc3\xa9\\n\", \"age\": [12.5e3, -0, true, null, {}]}",
                  3);
}

// A SentencePiece-style vocabulary whose decoder strips a text's leading space: a token's
// bytes are read in context, so "▁x" adds " x", and the bytes of tokens put together are
// their text.
TEST(TokenBytesTest, ReadsEachTokenInContext) {
  auto tokenizer = tokenizer::Tokenizer::load(std::string(CLEAVE_GOLDEN_DIR) +
                                              "/tokenizers/spm_bpe/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const TokenBytes bytes(**tokenizer);
  EXPECT_TRUE(bytes.exact());
  int spaced = 0;
  for (uint32_t id = 0; id < bytes.size(); ++id) {
    auto piece = (*tokenizer)->piece(id);
    if (!piece.ok() || (*tokenizer)->isSpecial(id)) continue;
    if (piece->starts_with("\xe2\x96\x81") && piece->size() > 3) {  // "▁" and more
      EXPECT_TRUE(bytes[id].starts_with(" ")) << *piece << " -> '" << bytes[id] << "'";
      ++spaced;
    }
  }
  EXPECT_GT(spaced, 50);
}

}  // namespace
}  // namespace cleave::engine
