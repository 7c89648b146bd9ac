// Speculative decoding's drafts, by prompt lookup: where a sequence's last few tokens
// occurred before in it (its prompt or its output), the tokens that followed then are
// guessed to follow now. Free to compute, and right often where output repeats its input:
// quoting, editing code, extracting fields, or a model that loops. The scheduler verifies
// a sequence's drafts in one forward pass (scheduler.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/flags.h"

namespace cleave::engine {

struct NgramOptions {
  int64_t min = 2;  // Shortest suffix that may match.
  int64_t max = 4;  // Longest suffix tried (longer matches win).
};

struct SpeculativeOptions {
  // Drafts per sequence and step, at most (0: off). Verified by a model that returns several
  // rows of logits a step (TpGroup::multiRowLogits: the CPU model, the CUDA one with
  // max_logit_rows); with another backend nothing is drafted.
  int64_t tokens = 0;
  NgramOptions ngram;

  // --speculative-tokens, --prompt-lookup-min, --prompt-lookup-max.
  void addFlags(FlagSet& flags);
};

// InvalidArgument naming the flag out of range.
absl::Status validate(const SpeculativeOptions& options);

// Up to `count` drafts for what follows `tokens`: the suffix of between options.min and
// options.max tokens with the longest earlier occurrence (the most recent of equals), and
// the tokens after that occurrence, into `drafts` (cleared first; empty when nothing
// matches or count <= 0). An occurrence overlapping the suffix continues its period: after
// "a b a b" come "a b a ...". Time: O(tokens.size() * options.max).
void proposeNgram(std::span<const uint32_t> tokens, const NgramOptions& options, int64_t count,
                  std::vector<uint32_t>& drafts);

}  // namespace cleave::engine
