// A sequence's tokens turned into the text deltas a client sees: UTF-8 safe (the bytes of an
// incomplete character held back), stop strings and stop tokens left out. It also finds a
// stop string its worker could not: one whose first tokens were decoded on an earlier
// worker, before the sequence moved.
//
// Threading: one per request, used by its thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cleave/v1/generation.pb.h"
#include "common/tokenizer/tokenizer.h"
#include "services/engine/stop_checker.h"

namespace cleave::router {

class TextStream {
 public:
  // Without a tokenizer there is no text: every call returns "".
  TextStream(const tokenizer::Tokenizer* tokenizer, const v1::StoppingCriteria& stopping,
             bool skip_special_tokens);

  // The text `token` adds; with `finish` when it is the sequence's last.
  std::string push(uint32_t token, std::optional<v1::FinishReason> finish);
  // The text still held back, at an end that came without a token.
  std::string end();
  // True once a stop string matched here (the text up to it was returned, and nothing
  // after): a sequence whose worker did not report it ends there.
  bool stoppedByString() const { return stopped_ && stopper_.stopped(); }
  std::string matched() const { return stopper_.matched(); }

 private:
  engine::StopChecker stopper_;
  std::optional<tokenizer::IncrementalDetokenizer> detokenizer_;
  bool include_stop_;  // stopping.include_stop_str_in_output
  bool stopped_ = false;
};

}  // namespace cleave::router
