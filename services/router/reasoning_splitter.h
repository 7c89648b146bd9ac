// Splits a reasoning model's reply into its reasoning (the text between <think> and
// </think>) and its content (what follows), as the reply streams in — what the HTTP API
// returns as `reasoning_content` and `content` with cleave-router --reasoning-parser.
//
//   deepseek_r1  DeepSeek-R1 and its distills;
//   qwen3        Qwen3, QwQ, Qwen3-Thinking: as deepseek_r1, except that a request whose
//                chat_template_kwargs turn enable_thinking off is not split (the template
//                closes the block itself; the server does not split it then);
//   glm45        GLM-4.5, GLM-4.6: the reply reasons only when it opens the block itself
//                (its template opens none; with thinking off it closes an empty one in the
//                prompt), so a reply without a leading <think> is all content;
//   openai_gptoss  gpt-oss's harmony channels (harmony_splitter.h; what follows here is
//                about the others).
// For qwen3 and deepseek_r1 the reply starts inside the reasoning block, whether the
// template opened it or the reply does (a leading <think>, after blanks, is dropped), and
// reasons until </think>; what follows is content. A reply that never closes its block is all
// reasoning. Tag text split across deltas is held back until it is known to be a tag or not.
//
// Threading: one splitter per reply.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/router/harmony_splitter.h"

namespace cleave::router {

enum class ReasoningFormat { kNone, kQwen3, kDeepSeekR1, kGlm45, kGptOss };

// "qwen3", "deepseek_r1", "glm45" or "openai_gptoss" ("" and "none": kNone); InvalidArgument
// naming the choices.
absl::StatusOr<ReasoningFormat> reasoningFormat(absl::string_view name);

class ReasoningSplitter {
 public:
  struct Parts {
    std::string reasoning;
    std::string content;
  };

  explicit ReasoningSplitter(ReasoningFormat format);

  // The parts a text delta adds.
  Parts push(absl::string_view text);
  // At the end of the reply: what was held back.
  Parts finish();

 private:
  enum class State { kStart, kReasoning, kContent };
  // Moves what `held_` decides into `out`.
  void drain(Parts& out, bool at_end);

  const bool reasoning_start_;  // Whether a reply that opens no block starts in one.
  State state_;
  std::string held_;
  std::optional<HarmonySplitter> harmony_;  // openai_gptoss: it does the splitting.
};

}  // namespace cleave::router
