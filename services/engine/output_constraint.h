// What constrained decoding needs of a constraint on a sequence's output (JSON in
// json_constraint.h, a regular expression in regex_constraint.h): a mask before each draw
// and the token drawn.
//
// Threading: a constraint belongs to one sequence.
#pragma once

#include <cstdint>
#include <span>

namespace cleave::engine {

class OutputConstraint {
 public:
  virtual ~OutputConstraint() = default;
  // Sets the logits of the tokens that cannot come next to -infinity (logits.size() may
  // exceed the vocabulary: the rest are masked too).
  virtual void mask(std::span<float> logits) const = 0;
  // Advances past `token`; false (the state as it was) for one the mask would not allow.
  virtual bool accept(uint32_t token) = 0;
};

// Masks `logits` to the tokens `keep` marks (as many entries as logits). With none kept (a
// vocabulary without the bytes the constraint needs), the first of `ends` is left: the
// sequence ends instead of drawing from nothing.
void keepOnly(std::span<const uint8_t> keep, std::span<const uint32_t> ends,
              std::span<float> logits);

}  // namespace cleave::engine
