// When a sequence's generation ends: end-of-sequence or stop token ids, stop strings found
// in the generated text (also when one spans several tokens), or the token limit. Text that
// could still be the start of a stop string is held back so a client never sees part of a
// stop string.
//
// Threading: one per sequence, used by one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cleave::engine {

enum class StopReason { kNone, kStopToken, kStopString, kLength };

struct StopCriteria {
  std::vector<uint32_t> stop_token_ids;  // Including the model's end-of-sequence ids.
  std::vector<std::string> stop_strings;
  int64_t max_new_tokens = 0;  // 0: no limit.
  // Neither stop tokens nor stop strings end the sequence before this many tokens (the
  // scheduler holds stop tokens off until then).
  int64_t min_new_tokens = 0;
};

class StopChecker {
 public:
  explicit StopChecker(StopCriteria criteria);

  // Records token `id`, whose decoded text is `text` (the newly completed UTF-8 from an
  // IncrementalDetokenizer). Returns the text that may be shown now (not a stop string
  // and not a possible start of one).
  std::string push(uint32_t id, const std::string& text);
  // The text held back, to show when the sequence ends for another reason.
  std::string flush();

  StopReason reason() const { return reason_; }
  bool stopped() const { return reason_ != StopReason::kNone; }
  // The stop string or token that ended the sequence, as text ("" otherwise).
  const std::string& matched() const { return matched_; }

 private:
  StopCriteria criteria_;
  int64_t generated_ = 0;
  std::string held_;
  StopReason reason_ = StopReason::kNone;
  std::string matched_;
};

}  // namespace cleave::engine
