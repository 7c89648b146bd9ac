// Regex against Python's re.fullmatch (tests/golden/gen_regex.py); RegexConstraint's mask
// against NFA simulation on SmolLM2's vocabulary and on a small one whose automaton
// outgrows the DFA cache; what the compiler refuses, and why.
#include "services/engine/regex.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/engine/json_mask_check.h"
#include "services/engine/regex_constraint.h"

namespace cleave::engine {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const Regex> compiled(std::string_view pattern) {
  auto regex = Regex::compile(pattern);
  EXPECT_TRUE(regex.ok()) << pattern << ": " << regex.status();
  return regex.ok() ? *regex : nullptr;
}

TEST(RegexTest, MatchesAsPythonDoes) {
  std::ifstream in(std::string(CLEAVE_GOLDEN_DIR) + "/regex/fullmatch.json");
  ASSERT_TRUE(in) << "run tests/golden/gen_regex.py";
  const nlohmann::json golden = nlohmann::json::parse(in);
  int checked = 0, matching = 0;
  for (const nlohmann::json& entry : golden) {
    const std::string pattern = entry["pattern"];
    const std::shared_ptr<const Regex> regex = compiled(pattern);
    if (regex == nullptr) continue;
    for (const nlohmann::json& c : entry["cases"]) {
      const std::string text = c[0];
      const bool expected = c[1];
      EXPECT_EQ(regex->fullMatch(text), expected) << pattern << " on '" << text << "'";
      ++checked;
      matching += expected;
    }
  }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(matching, 200);
}

TEST(RegexTest, RefusesWhatItCannotFollowSayingWhat) {
  const std::pair<const char*, const char*> cases[] = {
      {"(a)\\1", "backreference"},
      {"(?=a)a", "lookaround"},
      {"a\\bb", "\\b"},
      {"a**", "repeats a repeat"},
      {"*a", "nothing to repeat"},
      {"(ab", "unterminated group"},
      {"ab)", "unbalanced ')'"},
      {"[ab", "unterminated class"},
      {"a{1001}", "more than 1000"},
      {"a{100000}", "more than 1000"},
      {"a{2,99999999999}", "more than 1000"},
      {"a{3,2}", "n < m"},
      {"[z-a]", "out of order"},
      {"a^b", "only ^ at the start"},
      {"a$b", "only ^ at the start"},
      {"a++", "possessive"},
      {"\\q", "\\q"},
      {"\xff", "UTF-8"},
      {"(a{1000}){1000}", "automaton states"},
      {"\\", "lone backslash"},
      {"[\\", "lone backslash"},
      {"[a-\\", "lone backslash"},
  };
  EXPECT_THAT(Regex::compile(std::string(100000, '(')).status().message(),
              HasSubstr("more than 64 deep"));
  for (const auto& [pattern, why] : cases) {
    auto regex = Regex::compile(pattern);
    ASSERT_FALSE(regex.ok()) << pattern;
    EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument) << pattern;
    EXPECT_THAT(regex.status().message(), HasSubstr(why)) << pattern;
    EXPECT_THAT(regex.status().message(), HasSubstr("at byte")) << pattern;
  }
}

TEST(RegexTest, ChoicesMatchTheirTextsExactly) {
  auto choice = outputPattern("", {"a.b", "c|d", "(x)*", "caf\u00e9"});
  ASSERT_TRUE(choice.ok()) << choice.status();
  for (const char* yes : {"a.b", "c|d", "(x)*", "caf\u00e9"})
    EXPECT_TRUE((*choice)->fullMatch(yes));
  for (const char* no : {"axb", "c", "d", "(x)", "", "cafe", "a.bc|d"})
    EXPECT_FALSE((*choice)->fullMatch(no)) << no;
  EXPECT_EQ(*outputPattern("", {}), nullptr);
  EXPECT_THAT(outputPattern("a", {"b"}).status().message(), HasSubstr("cannot both be set"));
  EXPECT_THAT(outputPattern("", {"a", ""}).status().message(),
              HasSubstr("sampling.choice[1] must be 1 to 4096 bytes"));
  EXPECT_THAT(outputPattern("(", {}).status().message(), HasSubstr("sampling.regex: "));
  EXPECT_THAT(outputPattern(std::string(kMaxRegexBytes + 1, 'a'), {}).status().message(),
              HasSubstr("at most 64 KiB"));
}

// Repeats of nothing compile at once; an empty class leaves no state to wait on.
TEST(RegexTest, EmptyRepeatsAndClassesLeadNowhere) {
  const std::shared_ptr<const Regex> empty = compiled("a(?:(?:(?:(?:){1000}){1000}){1000}){1000}");
  ASSERT_NE(empty, nullptr);
  EXPECT_TRUE(empty->fullMatch("a"));
  const std::shared_ptr<const Regex> none = compiled(R"(a[^\s\S]|b)");
  ASSERT_NE(none, nullptr);
  RegexDfa dfa(none, 16);
  EXPECT_EQ(dfa.step(dfa.start(), 'a'), RegexDfa::kDead);
  EXPECT_TRUE(none->fullMatch("b"));
}

// The NFA states after `text` from `set` (empty: no continuation can match).
std::vector<int32_t> after(const Regex& regex, std::vector<int32_t> set, std::string_view text) {
  for (char c : text) {
    std::vector<int32_t> next;
    for (int32_t s : set) {
      const Regex::State& state = regex.states()[s];
      const auto b = static_cast<uint8_t>(c);
      if (state.kind == Regex::State::Kind::kByte && b >= state.lo && b <= state.hi)
        next.push_back(state.next);
    }
    regex.close(next);
    set = std::move(next);
    if (set.empty()) break;
  }
  return set;
}

// Draws tokens the mask allows (seeded), checking each mask against NFA simulation, until
// only the end is left or `steps` pass; returns the text, and in `largest_cache` the most
// DFA states the constraint held.
std::string walk(const Regex& regex, RegexConstraint& constraint, const TokenBytes& bytes,
                 uint32_t end, int steps, uint32_t seed, size_t* largest_cache = nullptr) {
  std::mt19937 rng(seed);
  std::string text;
  std::vector<int32_t> set = after(regex, {regex.start()}, "");
  regex.close(set);
  for (int step = 0; step < steps; ++step) {
    std::vector<float> logits(bytes.size(), 1.0f);
    constraint.mask(logits);
    if (largest_cache != nullptr)
      *largest_cache = std::max(*largest_cache, constraint.cachedStates());
    const bool matched = std::any_of(set.begin(), set.end(), [&](int32_t s) {
      return regex.states()[s].kind == Regex::State::Kind::kMatch;
    });
    std::vector<uint32_t> allowed;
    for (uint32_t id = 0; id < bytes.size(); ++id) {
      const bool want =
          id == end ? matched : !bytes[id].empty() && !after(regex, set, bytes[id]).empty();
      EXPECT_EQ(!std::isinf(logits[id]), want)
          << regex.pattern() << ": token " << id << " '" << bytes[id] << "' after '" << text << "'";
      if (want && id != end) allowed.push_back(id);
    }
    if (allowed.empty()) break;
    const uint32_t token = allowed[rng() % allowed.size()];
    EXPECT_TRUE(constraint.accept(token));
    text += bytes[token];
    set = after(regex, set, bytes[token]);
  }
  return text;
}

// Bounded patterns, so a walk of random allowed tokens ends in a match.
TEST(RegexConstraintTest, TheMaskIsExactOnARealVocabulary) {
  uint32_t end = 0;
  const std::shared_ptr<const TokenBytes> bytes = smolLm2TokenBytes(end);
  if (bytes == nullptr) GTEST_SKIP() << "SmolLM2 missing";
  for (const char* pattern :
       {R"(\d{4}-\d{2}-\d{2})", "(?:positive|negative|neutral)", "(yes|no)( (yes|no)){0,12}",
        R"([A-Z][a-z]{1,8}( [A-Z][a-z]{1,8})?, age \d{1,3}\.)"}) {
    const std::shared_ptr<const Regex> regex = compiled(pattern);
    ASSERT_NE(regex, nullptr);
    RegexConstraint constraint(bytes, {end}, regex);
    const std::string text = walk(*regex, constraint, *bytes, end, 40, 11);
    EXPECT_TRUE(regex->fullMatch(text)) << pattern << ": '" << text << "'";
    EXPECT_TRUE(constraint.matched());
    EXPECT_TRUE(constraint.accept(end));
  }
}

// (a|b)*a(a|b){13} needs 2^14 DFA states: past the cache's 4096, masks go on through NFA
// sets and the cache starts afresh, with the same answers.
TEST(RegexConstraintTest, AnAutomatonLargerThanTheCacheMasksTheSame) {
  std::vector<std::string> vocab = {"", "a", "b", "ab", "ba", "aab", "bba", "abab", "bbbb"};
  auto bytes = std::make_shared<const TokenBytes>(vocab);
  const std::shared_ptr<const Regex> regex = compiled("(a|b)*a(a|b){13}");
  ASSERT_NE(regex, nullptr);
  RegexConstraint constraint(bytes, {0}, regex);
  size_t largest = 0;
  walk(*regex, constraint, *bytes, 0, 3000, 5, &largest);
  EXPECT_EQ(largest, RegexConstraint::kMaxDfaStates);
  // A token the mask rules out is refused, leaving the state as it was.
  RegexConstraint digits(bytes, {0}, compiled("b{2}"));
  EXPECT_FALSE(digits.accept(1));
  EXPECT_FALSE(digits.accept(0));
  EXPECT_TRUE(digits.accept(2));
  EXPECT_FALSE(digits.matched());
  EXPECT_TRUE(digits.accept(2));
  EXPECT_TRUE(digits.matched());
  EXPECT_TRUE(digits.accept(0));
}

}  // namespace
}  // namespace cleave::engine
