// A context-free grammar for constrained decoding (the API's grammar output, vLLM's
// guided_grammar), written in GBNF, the notation of llama.cpp's grammars:
//
//   root   ::= answer ws              # the output must be a whole `root`
//   answer ::= "yes" | "no" | number
//   number ::= "-"? [0-9]+ ("." [0-9]+)?
//   ws     ::= [ \t\n]*
//
// Rules `name ::= alternatives` (names of letters, digits, '-' and '_'; a rule may span lines,
// the next starts at its `name ::=`); string literals "..." and character classes [a-z]
// [^...] with escapes \n \t \r \\ \" \] \xHH \uHHHH \UHHHHHHHH; `.` for any character; rule
// references; ( ) groups; | ; postfix * + ? {m} {m,} {m,n} (counts up to 1000); # comments.
// A rule named "root" is required. Left recursion (a rule that can reach itself before
// reading anything), a rule that can never end, undefined rules, more than one repetition
// on an item and malformed text are InvalidArgument naming the line and column.
//
// The rules compile to one byte-level NFA (regex_nfa.h) whose kCall states enter a rule and
// whose kMatch state returns from one. GrammarDfa walks it as a pushdown automaton: a DFA
// state is a set of (NFA state, return stack) configurations, interned as it is first
// reached, as RegexDfa interns NFA sets; rules called last in a rule do not grow the stack.
//
// Threading: a Grammar is immutable and shared; a GrammarDfa belongs to one sequence.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "services/engine/regex.h"

namespace cleave::engine {

class Grammar {
 public:
  static constexpr size_t kMaxBytes = 64 << 10;
  static constexpr size_t kMaxRules = 1024;

  static absl::StatusOr<std::shared_ptr<const Grammar>> compile(std::string_view text);

  // States as Regex's, with kCall (alt: the callee's start; next: where it returns to) and
  // kMatch (the end of a rule).
  const std::vector<Regex::State>& states() const { return nfa_->states(); }
  const Regex& nfa() const { return *nfa_; }
  int32_t start() const { return nfa_->start(); }
  const std::string& text() const { return text_; }
  // Whether the whole of `text` is a `root` (a walk of a GrammarDfa: for tests and checks).
  bool fullMatch(std::string_view text) const;

 private:
  friend class GrammarCompiler;
  std::string text_;
  std::shared_ptr<Regex> nfa_;
};

// A DFA over configuration sets of a Grammar, filled in as it is walked, up to `max_states`
// states (a step to a new one past that is kFull), as RegexDfa is for a Regex.
class GrammarDfa {
 public:
  // An NFA state with the stack of states to return to (an id into this DFA's stacks).
  struct Config {
    int32_t state;
    int32_t stack;
    auto operator<=>(const Config&) const = default;
  };
  using Source = Grammar;
  using Set = std::vector<Config>;
  static constexpr int32_t kDead = 0;
  static constexpr int32_t kFull = -2;
  // Calls nested deeper than this, and configurations past kMaxConfigs in one set, are
  // dropped: a grammar that needs them cannot be followed that far, and an output that
  // reaches them ends there (the constraint then allows only the end).
  static constexpr int kMaxDepth = 1024;
  static constexpr size_t kMaxStacks = size_t{1} << 18;  // Return stacks made, in all.
  static constexpr size_t kMaxConfigs = 4096;
  // At most this many configurations held by all the DFA states together (each set is kept
  // twice): past it, steps go on uncached.
  static constexpr size_t kMaxStored = size_t{1} << 20;

  GrammarDfa(std::shared_ptr<const Grammar> grammar, size_t max_states);
  int32_t start() const { return start_; }
  bool accepting(int32_t state) const { return accepting_[static_cast<size_t>(state)]; }
  const Set& set(int32_t state) const { return sets_[static_cast<size_t>(state)]; }
  size_t size() const { return sets_.size(); }
  // The state after `byte` (kDead, or kFull when it would be new and there is no room).
  int32_t step(int32_t state, uint8_t byte);
  // The configurations after `byte` from `set`, closed.
  Set stepSet(const Set& set, uint8_t byte);
  // Forgets every state but the dead one; returns the state of `set`, the new start.
  int32_t reset(Set set);

 private:
  // The configurations reachable from `set` without reading: calls entered, ends of rules
  // returned from; those left wait on a byte or accept.
  Set close(Set set);
  int32_t push(int32_t state, int32_t below);
  int32_t intern(Set set);

  std::shared_ptr<const Grammar> grammar_;
  size_t max_states_;
  // Return stacks, shared: stack i is (state to return to, the stack below, its depth); 0
  // is the empty stack.
  struct Frame {
    int32_t state, below, depth;
  };
  std::vector<Frame> stacks_;
  std::map<std::pair<int32_t, int32_t>, int32_t> stack_ids_;
  std::vector<Set> sets_;
  std::map<Set, int32_t> ids_;
  std::vector<int32_t> next_;  // state * 256 + byte -> state (-1: not yet known)
  std::vector<uint8_t> accepting_;
  size_t stored_ = 0;  // The sets' sizes, together.
  int32_t start_ = kDead;
};

// The grammar of the API's grammar field: nullptr when empty, else compiled, or
// InvalidArgument naming "sampling.grammar" and what to fix.
absl::StatusOr<std::shared_ptr<const Grammar>> outputGrammar(std::string_view text);

}  // namespace cleave::engine
