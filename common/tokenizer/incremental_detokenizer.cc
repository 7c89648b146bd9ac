// IncrementalDetokenizer: text for a growing token sequence, one token at a time.
//
// The window holds the ids from the prefix offset on. window_[0, read_) were already
// emitted; their text decoded on its own is prefix_text_. Each push decodes the window and
// emits what follows prefix_text_, unless it ends inside a character; then the window
// advances so that the last emitted tokens become the new prefix. Decoding the prefix
// again keeps context-dependent decoders (a leading-space strip, Metaspace's first token)
// consistent, and the window stays a few tokens long.
#include <algorithm>
#include <utility>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

// Tokens that decode to nothing or to part of a character can pile up; past this many the
// window advances anyway (held bytes are then emitted with U+FFFD).
constexpr size_t kMaxPending = 32;

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(TokenId id) {
  // Skipped tokens are dropped before decoding in the full decode too.
  if (skip_special_tokens_ && tokenizer_.isSpecial(id)) return "";
  window_.push_back(id);
  const std::string text = tokenizer_.decode(window_, skip_special_tokens_);
  absl::string_view fresh = text;
  if (fresh.substr(0, prefix_text_.size()) == prefix_text_) {
    fresh.remove_prefix(prefix_text_.size());
  } else {
    // A decoder whose earlier text changed with later tokens: emit past the old length.
    fresh.remove_prefix(std::min(prefix_text_.size(), fresh.size()));
  }
  const bool force = window_.size() - read_ > kMaxPending;
  if (!force && (fresh.empty() || incompleteUtf8Suffix(fresh) > 0)) return "";
  std::string out = sanitizeUtf8(fresh);
  window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(read_));
  read_ = window_.size();
  prefix_text_ = tokenizer_.decode(window_, skip_special_tokens_);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out;
  if (read_ < window_.size()) {
    const std::string text = tokenizer_.decode(window_, skip_special_tokens_);
    absl::string_view fresh = text;
    fresh.remove_prefix(std::min(prefix_text_.size(), fresh.size()));
    out = sanitizeUtf8(fresh);
  }
  window_.clear();
  read_ = 0;
  prefix_text_.clear();
  return out;
}

}  // namespace cleave::tokenizer
