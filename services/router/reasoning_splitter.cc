#include "services/router/reasoning_splitter.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/router/partial_tag.h"

namespace cleave::router {
namespace {

constexpr absl::string_view kOpen = "<think>";
constexpr absl::string_view kClose = "</think>";

}  // namespace

absl::StatusOr<ReasoningFormat> reasoningFormat(absl::string_view name) {
  if (name.empty() || name == "none") return ReasoningFormat::kNone;
  if (name == "qwen3") return ReasoningFormat::kQwen3;
  if (name == "deepseek_r1") return ReasoningFormat::kDeepSeekR1;
  if (name == "glm45") return ReasoningFormat::kGlm45;
  if (name == "openai_gptoss") return ReasoningFormat::kGptOss;
  return absl::InvalidArgumentError(absl::StrCat("unknown reasoning parser '", name,
                                                 "': use qwen3, deepseek_r1, glm45 or "
                                                 "openai_gptoss (or none)"));
}

ReasoningSplitter::ReasoningSplitter(ReasoningFormat format)
    : reasoning_start_(format != ReasoningFormat::kNone && format != ReasoningFormat::kGlm45),
      state_(format == ReasoningFormat::kNone ? State::kContent : State::kStart) {
  if (format == ReasoningFormat::kGptOss) harmony_.emplace();
}

ReasoningSplitter::Parts ReasoningSplitter::push(absl::string_view text) {
  Parts out;
  if (harmony_) {
    harmony_->push(text, false, out.reasoning, out.content);
    return out;
  }
  held_.append(text.data(), text.size());
  drain(out, false);
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::finish() {
  Parts out;
  if (harmony_) {
    harmony_->push("", true, out.reasoning, out.content);
    return out;
  }
  drain(out, true);
  return out;
}

void ReasoningSplitter::drain(Parts& out, bool at_end) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        // Does the reply open the block itself (after blanks)? Undecided while it spells
        // a beginning of "<think>".
        const absl::string_view start = absl::StripLeadingAsciiWhitespace(held_);
        if (absl::StartsWith(start, kOpen)) {
          held_.erase(0, held_.size() - start.size() + kOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!at_end && absl::StartsWith(kOpen, start)) return;
        state_ = reasoning_start_ ? State::kReasoning : State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t close = absl::string_view(held_).find(kClose);
        if (close != absl::string_view::npos) {
          out.reasoning += held_.substr(0, close);
          held_.erase(0, close + kClose.size());
          state_ = State::kContent;
          continue;
        }
        const size_t keep = at_end ? 0 : partialTagLength(held_, kClose);
        out.reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return;
      }
      case State::kContent:
        out.content += held_;
        held_.clear();
        return;
    }
  }
}

}  // namespace cleave::router
