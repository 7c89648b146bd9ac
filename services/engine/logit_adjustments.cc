#include "services/engine/logit_adjustments.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace cleave::engine {

absl::Status validate(const LogitAdjustments& adjustments, uint32_t vocab_size) {
  for (const auto& [token, bias] : adjustments.bias) {
    if (token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias: token id ", token, " is outside the vocabulary (", vocab_size, ")"));
    }
    if (!(std::isfinite(bias) && std::fabs(bias) <= kMaxLogitBias)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: the bias of token ", token,
                                                     " must be in [-", kMaxLogitBias, ", ",
                                                     kMaxLogitBias, "], got ", bias));
    }
  }
  for (uint32_t token : adjustments.allowed) {
    if (token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allowed_token_ids: token id ", token, " is outside the vocabulary (", vocab_size, ")"));
    }
  }
  if (adjustments.banned.size() > kMaxBannedSequences) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad_words_token_ids: ", adjustments.banned.size(), " sequences; at most ",
                     kMaxBannedSequences));
  }
  for (size_t i = 0; i < adjustments.banned.size(); ++i) {
    const std::vector<uint32_t>& words = adjustments.banned[i];
    if (words.empty() || words.size() > kMaxBannedLength) {
      return absl::InvalidArgumentError(absl::StrCat("bad_words_token_ids[", i, "]: ", words.size(),
                                                     " tokens; 1 to ", kMaxBannedLength,
                                                     " allowed"));
    }
    for (uint32_t token : words) {
      if (token >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("bad_words_token_ids[", i, "]: token id ",
                                                       token, " is outside the vocabulary (",
                                                       vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

bool applyAdjustments(const LogitAdjustments& adjustments, std::span<const uint32_t> output,
                      std::span<const uint32_t> held_off, std::span<float> logits, bool ban) {
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  for (const auto& [token, bias] : adjustments.bias) logits[token] += bias;
  if (!adjustments.allowed.empty()) {
    std::vector<float> kept;
    kept.reserve(adjustments.allowed.size());
    for (uint32_t token : adjustments.allowed) kept.push_back(logits[token]);
    std::fill(logits.begin(), logits.end(), kNever);
    for (size_t i = 0; i < kept.size(); ++i) logits[adjustments.allowed[i]] = kept[i];
  }
  bool banned = false;
  for (const std::vector<uint32_t>& words : adjustments.banned) {
    const size_t before = words.size() - 1;  // Tokens the output must end with.
    if (ban && output.size() >= before &&
        std::equal(words.begin(), words.end() - 1, output.end() - before)) {
      logits[words.back()] = kNever;
      banned = true;
    }
  }
  if (held_off.empty()) return banned;
  // Held off only while another token stays possible.
  bool other = false;
  for (size_t t = 0; t < logits.size() && !other; ++t) {
    other = logits[t] != kNever &&
            std::find(held_off.begin(), held_off.end(), static_cast<uint32_t>(t)) == held_off.end();
  }
  if (!other) return banned;
  for (uint32_t token : held_off) {
    if (token < logits.size()) logits[token] = kNever;
  }
  return banned;
}

}  // namespace cleave::engine
