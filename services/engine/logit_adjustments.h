// What a request changes in each row of logits before it is sampled: a bias per token (the
// OpenAI API's logit_bias), a set of the only tokens allowed (vLLM's allowed_token_ids), the
// token sequences never produced (vLLM's bad_words), and the stop tokens held off until the
// output is long enough (min_new_tokens). Applied on the host, in that order, before any
// JSON mask and before the sampler's penalties.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace cleave::engine {

// The largest bias a token may get either way (the OpenAI API's range).
inline constexpr float kMaxLogitBias = 100.0f;

struct LogitAdjustments {
  std::vector<std::pair<uint32_t, float>> bias;  // Added to the token's logit.
  std::vector<uint32_t> allowed;                 // Empty: every token.
  // Sequences whose last token is not drawn after the rest of them.
  std::vector<std::vector<uint32_t>> banned;

  bool empty() const { return bias.empty() && allowed.empty() && banned.empty(); }
};

// The most banned sequences a request may have, and tokens in one.
inline constexpr size_t kMaxBannedSequences = 256;
inline constexpr size_t kMaxBannedLength = 64;

// InvalidArgument naming the field (logit_bias, allowed_token_ids, bad_words_token_ids) for a
// token outside the vocabulary, a bias outside [-kMaxLogitBias, kMaxLogitBias] (or not
// finite), or banned sequences past the limits.
absl::Status validate(const LogitAdjustments& adjustments, uint32_t vocab_size);

// Applies `adjustments` to `logits` (one row; `output`: the tokens generated so far, for the
// banned sequences; `ban` false leaves them out), then sets the logits of `held_off` (stop
// tokens before min_new_tokens) to -infinity, unless that would leave no token possible.
// Returns whether a banned sequence took a token away.
bool applyAdjustments(const LogitAdjustments& adjustments, std::span<const uint32_t> output,
                      std::span<const uint32_t> held_off, std::span<float> logits, bool ban = true);

}  // namespace cleave::engine
