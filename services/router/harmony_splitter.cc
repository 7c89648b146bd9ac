#include "services/router/harmony_splitter.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace cleave::router {
namespace {

constexpr absl::string_view kMessage = "<|message|>";
constexpr absl::string_view kChannel = "<|channel|>";
// A header longer than this with no <|message|> is not one: the reply is content.
constexpr size_t kMaxHeader = 512;

// The word after `key` in `header` (up to a blank or a special token), or "".
absl::string_view wordAfter(absl::string_view header, absl::string_view key) {
  const size_t at = header.find(key);
  if (at == absl::string_view::npos) return "";
  absl::string_view rest = header.substr(at + key.size());
  return rest.substr(0, std::min(rest.find_first_of(" \t\n<"), rest.size()));
}

// How many bytes at the end of `text` may be the start of a special token ("<", "<|...")
// still arriving.
size_t pendingTag(absl::string_view text) {
  const size_t at = text.rfind('<');
  if (at == absl::string_view::npos) return 0;
  const absl::string_view tail = text.substr(at);
  if (tail.size() == 1) return 1;
  const bool open = tail[1] == '|' && tail.find("|>") == absl::string_view::npos;
  return open && tail.size() < 32 ? tail.size() : 0;
}

}  // namespace

void HarmonySplitter::openMessage(absl::string_view header, std::string& content) {
  const absl::string_view recipient = wordAfter(header, "to=");
  if (!recipient.empty()) {
    target_ = Target::kCall;
    absl::StrAppend(&content, kChannel, "commentary to=", recipient, kMessage);
  } else {
    target_ = wordAfter(header, kChannel) == "analysis" ? Target::kReasoning : Target::kContent;
  }
  state_ = State::kBody;
}

void HarmonySplitter::push(absl::string_view text, bool at_end, std::string& reasoning,
                           std::string& content) {
  held_.append(text.data(), text.size());
  for (;;) {
    if (state_ == State::kHeader) {
      const size_t message = absl::string_view(held_).find(kMessage);
      if (message != std::string::npos) {
        openMessage(absl::string_view(held_).substr(0, message), content);
        held_.erase(0, message + kMessage.size());
        continue;
      }
      const absl::string_view start = absl::StripLeadingAsciiWhitespace(held_);
      const bool may_be_header = absl::StartsWith(start, "<|") || absl::StartsWith("<|", start);
      if (may_be_header && held_.size() <= kMaxHeader) {
        if (at_end) held_.clear();  // A header cut off: no body follows it.
        return;
      }
      target_ = Target::kContent;  // Plain text, not a message.
      state_ = State::kBody;
      continue;
    }
    // The body runs to the first special token that ends it or starts the next message.
    size_t end = std::string::npos, skip = 0;
    for (absl::string_view tag :
         {"<|end|>", "<|call|>", "<|return|>", "<|start|>", "<|channel|>"}) {
      const size_t at = absl::string_view(held_).find(tag);
      if (at < end) {
        end = at;
        // A message's own end is dropped; the next message's start is its header.
        skip =
            absl::StartsWith(tag, "<|start") || absl::StartsWith(tag, "<|channel") ? 0 : tag.size();
      }
    }
    const size_t keep = end != std::string::npos ? held_.size() - end
                        : at_end                 ? 0
                                                 : pendingTag(held_);
    const absl::string_view body = absl::string_view(held_).substr(0, held_.size() - keep);
    absl::StrAppend(target_ == Target::kReasoning ? &reasoning : &content, body);
    const bool closed = end != std::string::npos;
    if (target_ == Target::kCall && (closed || at_end)) absl::StrAppend(&content, "<|call|>");
    held_.erase(0, held_.size() - keep);
    if (!closed) return;
    held_.erase(0, skip);
    state_ = State::kHeader;
  }
}

}  // namespace cleave::router
