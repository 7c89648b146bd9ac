// Building byte-level NFAs (Regex's states, regex.h) from parsed trees, for the regular
// expressions of regex.h and the grammars of grammar.h: sets of code points become
// sequences of UTF-8 byte ranges; concatenation, alternation and counted repeats become
// forks; a call of a grammar rule becomes a kCall state.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "services/engine/regex.h"

namespace cleave::engine {

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// A set of code points: sorted, disjoint, non-adjacent ranges (after normalize()).
using CharSet = std::vector<std::pair<uint32_t, uint32_t>>;
void normalize(CharSet& set);
// Every scalar value (surrogates are not characters) outside `set`.
CharSet complement(const CharSet& set);
// The UTF-8 character at `pos` of `text` into `cp`, `pos` moved past it; false (`pos` left
// where it was) when it is not one (truncated, overlong, a surrogate, past U+10FFFF).
bool decodeUtf8(std::string_view text, size_t& pos, uint32_t& cp);

// A parsed pattern or rule body.
struct NfaNode {
  enum class Kind { kEmpty, kSet, kConcat, kAlt, kRepeat, kCall } kind = Kind::kEmpty;
  CharSet set;
  std::vector<NfaNode> children;
  int min = 0, max = -1;  // kRepeat: max -1 is unbounded
  int32_t rule = -1;      // kCall: the rule called
};

// Whether `node` can only match the empty string without any state of its own (empty
// groups and sequences, and repeats of them).
bool matchesOnlyEmpty(const NfaNode& node);

// Appends states to `states`, back to front (each node's states made knowing where they
// lead); at most Regex::kMaxStates in all, after which full() and nothing more is added.
class NfaEmitter {
 public:
  explicit NfaEmitter(std::vector<Regex::State>* states) : states_(states) {}
  int32_t add(Regex::State s);
  int32_t fork(int32_t next, int32_t alt);
  // The entry state of `node`'s states, which end at `out`. A kCall state's alt is the
  // rule's index (its start is for the caller to put there).
  int32_t emit(const NfaNode& node, int32_t out);
  bool full() const { return full_; }

 private:
  std::vector<Regex::State>* states_;
  bool full_ = false;
};

// Bytes no state's range tells apart form a class: the runs between the ranges' ends.
void classifyBytes(const std::vector<Regex::State>& states, std::array<uint8_t, 256>& byte_class,
                   std::vector<uint8_t>& class_first);

}  // namespace cleave::engine
