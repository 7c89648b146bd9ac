// Grammar against hand-written languages: regular grammars against the same language as a
// Regex (a different front end and automaton), recursive ones against checkers written
// here; what the compiler refuses, and where.
#include "services/engine/grammar.h"

#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/engine/json_mask_check.h"
#include "services/engine/regex_constraint.h"

namespace cleave::engine {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const Grammar> compiled(std::string_view text) {
  auto grammar = Grammar::compile(text);
  EXPECT_TRUE(grammar.ok()) << text << ": " << grammar.status();
  return grammar.ok() ? *grammar : nullptr;
}

// Random strings over `alphabet` up to `length`, and the regex's verdict on each.
TEST(GrammarTest, RegularGrammarsMatchAsTheirRegexes) {
  const std::tuple<const char*, const char*, const char*> cases[] = {
      {R"(root ::= "yes" | "no")", "yes|no", "yesno"},
      {"root ::= [0-9]+ (\".\" [0-9]+)?\n", R"(\d+(\.\d+)?)", "0129."},
      {R"(root ::= item ("," ws item)*
          item ::= [a-c]{1,3}   # a short word
          ws   ::= [ ]?)",
       "[a-c]{1,3}(, ?[a-c]{1,3})*", "abc, "},
      {R"(root ::= ("ab" | "c")* "d"?)", "(ab|c)*d?", "abcd"},
      {R"(root ::= [^a-y] . [\x41-\x43])", "[^a-y].[A-C]", "azAC"},
  };
  std::mt19937 rng(3);
  for (const auto& [text, pattern, alphabet] : cases) {
    const std::shared_ptr<const Grammar> grammar = compiled(text);
    ASSERT_NE(grammar, nullptr);
    auto regex = Regex::compile(pattern);
    ASSERT_TRUE(regex.ok()) << regex.status();
    const std::string letters = alphabet;
    int matches = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      for (size_t n = rng() % 9; n > 0; --n) s += letters[rng() % letters.size()];
      EXPECT_EQ(grammar->fullMatch(s), (*regex)->fullMatch(s)) << text << " on '" << s << "'";
      matches += (*regex)->fullMatch(s);
    }
    EXPECT_GT(matches, 10) << text;
  }
}

// Balanced brackets, and arithmetic over them: recursion through the middle and the end
// of rules.
TEST(GrammarTest, RecursiveGrammarsMatchTheirLanguages) {
  const std::shared_ptr<const Grammar> brackets = compiled(R"g(
      root ::= pair*
      pair ::= "(" root ")" | "[" root "]")g");
  ASSERT_NE(brackets, nullptr);
  auto balanced = [](const std::string& s) {
    std::string open;
    for (char c : s) {
      if (c == '(' || c == '[') {
        open += c;
      } else if (open.empty() || (c == ')') != (open.back() == '(')) {
        return false;
      } else {
        open.pop_back();
      }
    }
    return open.empty();
  };
  std::mt19937 rng(5);
  int matched = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string s;
    for (size_t n = rng() % 12; n > 0; --n) s += "()[]"[rng() % 4];
    EXPECT_EQ(brackets->fullMatch(s), balanced(s)) << s;
    matched += balanced(s);
  }
  EXPECT_GT(matched, 20);
  const std::shared_ptr<const Grammar> arithmetic = compiled(R"g(
      root   ::= expr
      expr   ::= term (("+" | "-") term)*
      term   ::= factor (("*" | "/") factor)*
      factor ::= [0-9]+ | "(" expr ")" | "-" factor)g");
  ASSERT_NE(arithmetic, nullptr);
  for (const char* yes : {"1", "1+2*3", "(1+2)*3", "-(4)/--2", "((((7))))", "1*(2-(3+4))"})
    EXPECT_TRUE(arithmetic->fullMatch(yes)) << yes;
  for (const char* no : {"", "1+", "(1", "1)", "*2", "1++2", "()", "1 + 2"})
    EXPECT_FALSE(arithmetic->fullMatch(no)) << no;
  const std::shared_ptr<const Grammar> accents =
      compiled(R"(root ::= "caf\u00e9" [\u00e0-\u00ff])");
  ASSERT_NE(accents, nullptr);
  EXPECT_TRUE(accents->fullMatch("caf\u00e9\u00e0"));
  EXPECT_FALSE(accents->fullMatch("caf\u00e9a"));
  // Deep nesting is followed up to the call depth.
  std::string deep = std::string(100, '(') + "1" + std::string(100, ')');
  EXPECT_TRUE(arithmetic->fullMatch(deep));
}

// On SmolLM2's vocabulary, the constraint's mask (cached transitions, grouped tokens,
// cached masks) allows exactly the tokens whose bytes keep a configuration alive, stepped
// afresh from the text so far; random allowed tokens walk to a whole root (the grammar is
// bounded, and recursive through `inner`).
TEST(GrammarConstraintTest, TheMaskIsExactOnARealVocabulary) {
  uint32_t end = 0;
  const std::shared_ptr<const TokenBytes> bytes = smolLm2TokenBytes(end);
  if (bytes == nullptr) GTEST_SKIP() << "SmolLM2 missing";
  const std::shared_ptr<const Grammar> grammar = compiled(R"g(
      root   ::= "[" (expr ("," " "? expr){0,3})? "]"
      expr   ::= term (("+" | "-") term){0,2}
      term   ::= [0-9]{1,3} | "(" inner ")" | "x"
      inner  ::= [0-9]+ ("*" inner)?)g");
  ASSERT_NE(grammar, nullptr);
  for (uint32_t seed : {1u, 2u, 3u}) {
    GrammarConstraint constraint(bytes, {end}, grammar);
    GrammarDfa reference(grammar, 1);
    GrammarDfa::Set set = reference.set(reference.start());
    std::mt19937 rng(seed);
    std::string text;
    for (int step = 0; step < 400; ++step) {
      std::vector<float> logits(bytes->size(), 1.0f);
      constraint.mask(logits);
      const bool whole = std::any_of(set.begin(), set.end(), [&](const GrammarDfa::Config& c) {
        return grammar->states()[c.state].kind == Regex::State::Kind::kMatch;
      });
      std::vector<uint32_t> allowed;
      for (uint32_t id = 0; id < bytes->size(); ++id) {
        bool want = id == end ? whole : false;
        if (id != end && !(*bytes)[id].empty()) {
          GrammarDfa::Set after = set;
          for (char c : (*bytes)[id]) {
            after = reference.stepSet(after, static_cast<uint8_t>(c));
            if (after.empty()) break;
          }
          want = !after.empty();
        }
        ASSERT_EQ(!std::isinf(logits[id]), want)
            << "token " << id << " '" << (*bytes)[id] << "' after '" << text << "'";
        if (want && id != end) allowed.push_back(id);
      }
      if (allowed.empty()) {  // Only the end is left: the text is whole, not a dead end.
        EXPECT_TRUE(whole) << text;
        break;
      }
      const uint32_t token = allowed[rng() % allowed.size()];
      ASSERT_TRUE(constraint.accept(token));
      text += (*bytes)[token];
      for (char c : (*bytes)[token]) set = reference.stepSet(set, static_cast<uint8_t>(c));
    }
    EXPECT_TRUE(grammar->fullMatch(text)) << text;
    EXPECT_TRUE(constraint.matched()) << text;
  }
}

TEST(GrammarTest, RefusesWhatItCannotFollowSayingWhere) {
  const std::pair<const char*, const char*> cases[] = {
      {R"(start ::= "a")", "no rule named 'root'"},
      {R"(root ::= item)", "uses rule 'item', which it does not define (at line 1, column 10)"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defines rule 'root' twice (at line 2, column 1)"},
      {R"(root ::= root "a" | "b")", "left recursion (root -> root"},
      {"root ::= x\nx ::= y? \"a\"\ny ::= x \"b\"", "left recursion (x -> y -> x"},
      {R"(root ::= "abc)", "unterminated string"},
      {R"(root ::= [a-)", "unterminated class"},
      {R"(root ::= [z-a])", "out of order"},
      {R"g(root ::= ("a")g", "unterminated group"},
      {R"(root ::= "a"{2,1})", "n < m"},
      {R"(root ::= "a"{1001})", "more than 1000"},
      {R"(root = "a")", "expects ::="},
      {R"(root ::= "\u12")", "without 4 hex digits"},
      {R"g(root ::= "a" ) "b")g", "expects a rule name"},
      {R"(root ::= @)", "'@' where an item should be"},
      {R"(root ::= "a"*+)", "repeats a repeat"},
      {"root ::= \"a\" | \"b\" loop\nloop ::= \"c\" loop", "rule 'loop', which can never end"},
      {"root ::= \"\xed\xa0\x80\"", "not valid UTF-8 (at line 1, column 11)"},
      {"root ::= [\xe0\x80\x80]", "not valid UTF-8"},
  };
  for (const auto& [text, why] : cases) {
    auto grammar = Grammar::compile(text);
    ASSERT_FALSE(grammar.ok()) << text;
    EXPECT_EQ(grammar.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(grammar.status().message(), HasSubstr(why)) << text;
  }
  EXPECT_THAT(outputGrammar("root ::= x").status().message(), HasSubstr("sampling.grammar: "));
  EXPECT_EQ(*outputGrammar(""), nullptr);
  // Repeats of nothing compile at once, to nothing; an empty class matches nothing.
  const std::shared_ptr<const Grammar> empty =
      compiled(R"(root ::= "a" (((""{1000}){1000}){1000}){1000} ("" | ()){1000})");
  ASSERT_NE(empty, nullptr);
  EXPECT_TRUE(empty->fullMatch("a"));
  const std::shared_ptr<const Grammar> none = compiled(R"(root ::= "a" [] | "b")");
  ASSERT_NE(none, nullptr);
  EXPECT_FALSE(none->fullMatch("a"));
  GrammarDfa dfa(none, 16);
  EXPECT_EQ(dfa.step(dfa.start(), 'a'), GrammarDfa::kDead);  // No dead end past "a".
  EXPECT_TRUE(none->fullMatch("b"));
  // Right recursion and a nullable rule before a call are fine.
  EXPECT_NE(compiled("root ::= \"a\" root | \"\"\nopt ::= \"\""), nullptr);
  EXPECT_NE(compiled("root ::= opt \"a\"\nopt ::= \"b\"?"), nullptr);
}

}  // namespace
}  // namespace cleave::engine
