#include "services/engine/speculative.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace cleave::engine {

// Drafts past this many cost more to verify than they could save on any backend here.
constexpr int64_t kMaxSpeculativeTokens = 16;

void SpeculativeOptions::addFlags(FlagSet& flags) {
  flags.addInt("speculative-tokens", &tokens,
               "Speculative decoding: tokens each decoding sequence drafts per step by prompt "
               "lookup (what followed the last n-gram where it occurred before in the "
               "sequence), verified in one pass; the output is the same, faster where text "
               "repeats. 0: off");
  flags.addInt("prompt-lookup-min", &ngram.min,
               "Speculative decoding: the shortest n-gram whose earlier occurrence drafts");
  flags.addInt("prompt-lookup-max", &ngram.max,
               "Speculative decoding: the longest n-gram looked up (longer matches win)");
}

absl::Status validate(const SpeculativeOptions& options) {
  if (options.tokens < 0 || options.tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-tokens must be in 0..", kMaxSpeculativeTokens, ", got ", options.tokens));
  }
  if (options.ngram.min < 1 || options.ngram.max < options.ngram.min || options.ngram.max > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt-lookup-min and --prompt-lookup-max must satisfy 1 <= min <= max "
                     "<= 64, got ",
                     options.ngram.min, " and ", options.ngram.max));
  }
  return absl::OkStatus();
}

void proposeNgram(std::span<const uint32_t> tokens, const NgramOptions& options, int64_t count,
                  std::vector<uint32_t>& drafts) {
  drafts.clear();
  const int64_t size = static_cast<int64_t>(tokens.size());
  const int64_t longest = std::min(options.max, size - 1);
  if (count <= 0 || longest < options.min || options.min < 1) return;
  // An occurrence ending at `end` (exclusive, before the suffix's own end) matches the
  // suffix over `length` tokens; the most recent of the longest wins.
  int64_t best_end = -1, best_length = options.min - 1;
  for (int64_t end = size - 1; end >= options.min; --end) {
    int64_t length = 0;
    while (length < longest && length < end &&
           tokens[end - 1 - length] == tokens[size - 1 - length])
      ++length;
    if (length > best_length) {
      best_length = length;
      best_end = end;
      if (length == longest) break;
    }
  }
  if (best_end < 0) return;
  // What followed the occurrence; past the sequence's end, the drafts themselves (a loop
  // of period size - best_end goes on).
  for (int64_t i = 0; i < count; ++i) {
    const int64_t at = best_end + i;
    drafts.push_back(at < size ? tokens[at] : drafts[at - size]);
  }
}

}  // namespace cleave::engine
