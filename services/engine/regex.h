// A regular expression over UTF-8 text, compiled to a byte-level NFA (Thompson's
// construction) for constrained decoding (regex_constraint.h): the output must match the
// whole pattern, as Python's re.fullmatch(pattern, text, re.ASCII) would.
//
// Syntax, the part Python's re and ECMAScript share:
//   literals (any UTF-8 character), escapes \. \\ \n \t \r \f \v \0 and of any punctuation,
//   \d \D \w \W \s \S (ASCII classes and their complements), . (any character but \n),
//   classes [abc] [a-z] [^...] (with those escapes inside; ranges of any characters),
//   groups (...) (?:...) (?P<name>...) (?<name>...), alternation |, quantifiers * + ? {m}
//   {m,} {m,n} {,n} (m, n at most 1000) and their lazy forms (the same language), ^ at the start
//   and $ at the end (the match is whole anyway).
// Anything else (backreferences, lookaround, \b, flags, possessive quantifiers), groups
// nested more than 64 deep and patterns of more than kMaxStates states are InvalidArgument
// naming what and its byte offset.
//
// Threading: immutable after compile().
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace cleave::engine {

class Regex {
 public:
  // An NFA state: a byte range leading to `next`, a fork (epsilon moves to `next` and
  // `alt`), the match, or (in grammars, grammar.h) a call of the rule starting at `alt`
  // that returns to `next`, a rule's match being its return.
  struct State {
    enum class Kind : uint8_t { kByte, kFork, kMatch, kCall } kind;
    uint8_t lo = 0, hi = 0;
    int32_t next = -1, alt = -1;
  };
  // At most this many NFA states (a pattern of large counted repeats is refused).
  static constexpr int64_t kMaxStates = 1 << 16;
  static constexpr int kMaxRepeat = 1000;

  static absl::StatusOr<std::shared_ptr<const Regex>> compile(std::string_view pattern);
  // `text` with every character that means something in a pattern escaped: a pattern
  // matching exactly it.
  static std::string escape(std::string_view text);

  const std::vector<State>& states() const { return states_; }
  int32_t start() const { return start_; }
  const std::string& pattern() const { return pattern_; }
  // Whether the whole of `text` matches (an NFA simulation: for tests and checks).
  bool fullMatch(std::string_view text) const;
  // The states reachable from `states` by epsilon moves (forks), sorted, each once; the set
  // a DFA state stands for.
  void close(std::vector<int32_t>& states) const;
  // Bytes no state's range tells apart form a class: the runs of bytes between the ends of
  // the ranges. Every byte of a class moves any set of states alike.
  uint8_t byteClass(uint8_t byte) const { return byte_class_[byte]; }
  int classes() const { return static_cast<int>(class_first_.size()); }
  uint8_t classFirst(uint8_t c) const { return class_first_[c]; }
  // Sets `row[b]` to `to` for every byte b of `byte`'s class.
  void fillClass(uint8_t byte, int32_t* row, int32_t to) const {
    const uint8_t c = byteClass(byte);
    for (int b = classFirst(c); b < 256 && byteClass(static_cast<uint8_t>(b)) == c; ++b)
      row[b] = to;
  }

 private:
  friend class RegexCompiler;
  friend class GrammarCompiler;
  void classify();

  std::string pattern_;
  std::vector<State> states_;
  int32_t start_ = 0;
  std::array<uint8_t, 256> byte_class_{};
  std::vector<uint8_t> class_first_;  // A class's first byte; its bytes run to the next's.
};

// A DFA over bytes for a Regex: each state a set of NFA states (Regex::close), its
// transitions filled in as they are first taken, up to `max_states` states (a step to a
// new state past that is kFull). expandAll() fills in every state and transition at once,
// after which the DFA is only read.
//
// Threading: step() and reset() write; after expandAll(), next() may be called from any
// thread.
class RegexDfa {
 public:
  using Source = Regex;
  using Set = std::vector<int32_t>;
  static constexpr int32_t kDead = 0;  // The empty set: nothing can follow.
  // At most this many NFA states held by all the DFA states together (each set is kept
  // twice): a pattern of huge sets is stepped uncached rather than stored.
  static constexpr size_t kMaxStored = size_t{1} << 21;
  static constexpr int32_t kFull = -2;  // A new state, but max_states are held.

  RegexDfa(std::shared_ptr<const Regex> regex, size_t max_states);
  const Regex& regex() const { return *regex_; }
  int32_t start() const { return start_; }
  bool accepting(int32_t state) const { return accepting_[state]; }
  const std::vector<int32_t>& set(int32_t state) const { return sets_[state]; }
  size_t size() const { return sets_.size(); }
  // The state after `byte` (kDead, or kFull when it would be new and there is no room).
  int32_t step(int32_t state, uint8_t byte);
  // After expandAll(): the state after `byte`.
  int32_t next(int32_t state, uint8_t byte) const {
    return next_[static_cast<size_t>(state) * 256 + byte];
  }
  // The NFA states after `byte` from `set`, closed.
  std::vector<int32_t> stepSet(const std::vector<int32_t>& set, uint8_t byte) const;
  // Forgets every state but the dead one; returns the state of `set`, the new start.
  int32_t reset(std::vector<int32_t> set);
  // Every state reachable from the start and its transitions; false when there are more
  // than max_states, or building them takes more than `max_work` steps of NFA states (the
  // cost of a state's transitions grows with its set). Then charsToAccept() is known too.
  bool expandAll(uint64_t max_work);
  // NFA states stepped through to build transitions so far.
  uint64_t work() const { return work_; }
  // After expandAll(): the fewest characters (UTF-8 lead bytes) that take `state` to an
  // accepting one; kNever when none does.
  static constexpr uint32_t kNever = UINT32_MAX;
  uint32_t charsToAccept(int32_t state) const { return to_accept_[state]; }
  // After expandAll(): the most characters that take `state` to an accepting one (kNever
  // when none does; kUnbounded when as many as wanted can).
  static constexpr uint32_t kUnbounded = UINT32_MAX - 1;
  uint32_t longestToAccept(int32_t state) const { return to_longest_[state]; }

 private:
  int32_t intern(std::vector<int32_t> set);

  std::shared_ptr<const Regex> regex_;
  size_t max_states_;
  std::vector<std::vector<int32_t>> sets_;
  std::map<std::vector<int32_t>, int32_t> ids_;
  std::vector<int32_t> next_;  // state * 256 + byte -> state (-1: not yet known)
  std::vector<uint8_t> accepting_;
  std::vector<uint32_t> to_accept_;
  std::vector<uint32_t> to_longest_;
  int32_t start_ = kDead;
  uint64_t work_ = 0;  // NFA states stepped through by step() so far.
  size_t stored_ = 0;  // The sets' sizes, together.
};

// Limits of SamplingParams.regex and .choice.
inline constexpr size_t kMaxRegexBytes = 64 << 10;
inline constexpr size_t kMaxChoices = 1024;
inline constexpr size_t kMaxChoiceBytes = 4096;

// The pattern an output must match, from the API's regex or choice (at most one set; the
// choices as an alternation of their escaped texts): nullptr when neither is set, or
// InvalidArgument naming the field ("sampling.regex", "sampling.choice") and what to fix.
absl::StatusOr<std::shared_ptr<const Regex>> outputPattern(std::string_view regex,
                                                           const std::vector<std::string>& choice);

}  // namespace cleave::engine
