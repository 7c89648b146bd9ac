// Splits a gpt-oss reply, written in OpenAI's harmony format, into reasoning and content as it
// streams in — cleave-router --reasoning-parser openai_gptoss, as vLLM's gpt-oss support
// splits it.
//
// A reply (after the prompt's closing <|start|>assistant) is a run of messages, each
//   [<|start|>ROLE]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>FORMAT]<|message|>BODY
// ended by <|end|> (another message follows), <|call|> or <|return|> (both stop tokens, so
// usually the reply's end). Bodies of the `analysis` channel are reasoning; those of `final`,
// and `commentary` ones addressed to no one (preambles before a tool call), are content. A
// message addressed to a recipient (`to=functions.NAME`) is a tool call: it goes to the
// content as <|channel|>commentary to=RECIPIENT<|message|>BODY<|call|>, where
// --tool-call-parser openai finds it (tool_call_parser.h). A reply that opens no message is
// content. Special-token text split across deltas is held back until complete.
//
// Threading: one splitter per reply.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace cleave::router {

class HarmonySplitter {
 public:
  // Appends to `reasoning` and `content` what `text` adds; `at_end` once the reply ended
  // (what was held back is then decided).
  void push(absl::string_view text, bool at_end, std::string& reasoning, std::string& content);

 private:
  enum class State { kHeader, kBody };
  enum class Target { kReasoning, kContent, kCall };
  // Reads a complete header (the text before <|message|>): where the body goes.
  void openMessage(absl::string_view header, std::string& content);

  State state_ = State::kHeader;
  Target target_ = Target::kContent;
  std::string held_;
};

}  // namespace cleave::router
