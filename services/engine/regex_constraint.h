// Constrained decoding to a regular expression (the API's regex and choice outputs) or to a
// grammar (its grammar output; grammar.h, the same walk over a pushdown automaton): before
// each draw, tokens whose bytes lead the pattern's automaton nowhere are masked out; a token
// that ends the sequence is allowed once the output so far matches the whole pattern.
//
// The automaton is the pattern's NFA (regex.h) determinized as it is walked: a DFA state is
// a set of NFA states, its transitions filled in on first use. A mask walks every token's
// bytes from the current state (tokens grouped by first byte, so a byte the pattern cannot
// take next rules out its whole group at once). At most kMaxDfaStates are kept; past that a
// walk goes on through NFA sets, and the next accepted token starts the cache afresh. The
// mask depends on the state alone, so the masks of the last kMaxCachedMasks states are
// kept as bitsets: a pattern that stays in a few states (free text, a repeated class) pays
// for the walk once.
//
// Threading: belongs to one sequence.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "services/engine/grammar.h"
#include "services/engine/json_constraint.h"
#include "services/engine/output_constraint.h"
#include "services/engine/regex.h"

namespace cleave::engine {

// `Dfa` is RegexDfa (a regular expression) or GrammarDfa (grammar.h, a grammar): its
// Source, Set, kDead, kFull, start, accepting, set, size, step, stepSet and reset.
template <class Dfa>
class AutomatonConstraint : public OutputConstraint {
 public:
  static constexpr size_t kMaxDfaStates = 4096;
  static constexpr size_t kMaxCachedMasks = 32;

  // `ends`: the tokens that end the sequence (at least one).
  AutomatonConstraint(std::shared_ptr<const TokenBytes> bytes, std::vector<uint32_t> ends,
                      std::shared_ptr<const typename Dfa::Source> source);

  void mask(std::span<float> logits) const override;
  bool accept(uint32_t token) override;
  // The output so far is whole (matches the pattern; is the grammar's root).
  bool matched() const { return dfa_.accepting(current_); }
  // DFA states cached now (at most kMaxDfaStates).
  size_t cachedStates() const { return dfa_.size(); }

 private:
  // Whether `bytes` lead somewhere from `state` (through uncached sets once the cache is
  // full).
  bool alive(int32_t state, std::string_view bytes) const;

  std::shared_ptr<const TokenBytes> bytes_;
  std::vector<uint32_t> ends_;
  mutable Dfa dfa_;
  mutable std::vector<uint8_t> keep_;  // mask(): the tokens allowed
  // DFA state -> its mask's bits (as many as the logits masked), ends included.
  mutable std::map<int32_t, std::vector<uint64_t>> masks_;
  int32_t current_;
};

using RegexConstraint = AutomatonConstraint<RegexDfa>;
using GrammarConstraint = AutomatonConstraint<GrammarDfa>;

}  // namespace cleave::engine
