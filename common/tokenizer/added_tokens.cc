#include "common/tokenizer/added_tokens.h"

#include <algorithm>
#include <utility>

#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

// Start of the whitespace run that ends at `end` (Rust's char::is_whitespace).
size_t whitespaceRunStart(absl::string_view text, size_t floor, size_t end) {
  size_t begin = end;
  while (begin > floor) {
    size_t start = begin - 1;
    while (start > floor && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    char32_t cp = 0;
    if (utf8SequenceLength(text, start, &cp) != begin - start || !isUnicodeWhitespace(cp)) break;
    begin = start;
  }
  return begin;
}

size_t whitespaceRunEnd(absl::string_view text, size_t begin) {
  size_t end = begin;
  while (end < text.size()) {
    char32_t cp = 0;
    const size_t n = utf8SequenceLength(text, end, &cp);
    if (n == 0 || !isUnicodeWhitespace(cp)) break;
    end += n;
  }
  return end;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens, AddedTokenPolicy policy)
    : policy_(policy) {
  terminal_.push_back(-1);
  for (AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    const auto index = static_cast<uint32_t>(tokens_.size());
    uint64_t node = 0;
    for (char c : token.content) {
      const uint64_t key = (node << 8) | static_cast<uint8_t>(c);
      auto [it, inserted] = edges_.try_emplace(key, static_cast<uint32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    first_byte_[static_cast<uint8_t>(token.content[0])] = true;
    // A later token with the same content replaces the earlier one.
    terminal_[node] = index;
    tokens_.push_back(std::move(token));
  }
  for (uint32_t i = 0; i < tokens_.size(); ++i) by_length_.push_back(i);
  std::stable_sort(by_length_.begin(), by_length_.end(), [&](uint32_t a, uint32_t b) {
    return tokens_[a].content.size() > tokens_[b].content.size();
  });
  const bool any_single_word = std::any_of(tokens_.begin(), tokens_.end(),
                                           [](const AddedToken& t) { return t.single_word; });
  if (any_single_word) {
    auto regex = Regex::compile(R"([\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\x{200C}\x{200D}])");
    if (regex.ok()) word_char_ = *std::move(regex);
  }
}

int64_t AddedTokenMatcher::longestAt(absl::string_view text, size_t pos) const {
  int64_t best = -1;
  uint64_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges_.find((node << 8) | static_cast<uint8_t>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = terminal_[node];
  }
  return best;
}

bool AddedTokenMatcher::isWordBoundaryOk(absl::string_view text, size_t begin, size_t end) const {
  if (word_char_ == nullptr) return true;
  auto isWordChar = [&](size_t start, size_t n) {
    if (n == 0) return false;
    bool full = false;
    word_char_->forEachMatch(text.substr(start, n),
                             [&](size_t s, size_t e) { full = full || (s == 0 && e == n); });
    return full;
  };
  if (begin > 0) {
    size_t start = begin - 1;
    while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    if (utf8SequenceLength(text, start) == begin - start && isWordChar(start, begin - start)) {
      return false;
    }
  }
  if (end < text.size() && isWordChar(end, utf8SequenceLength(text, end))) return false;
  return true;
}

void AddedTokenMatcher::split(absl::string_view text, bool parse_special,
                              std::vector<Segment>* out) const {
  out->clear();
  if (tokens_.empty()) {
    if (!text.empty()) out->push_back(Segment{0, text.size(), -1});
    return;
  }
  if (policy_ == AddedTokenPolicy::kLeftmostLongest) {
    splitLeftmostLongest(text, parse_special, out);
  } else {
    splitLongestFirst(text, parse_special, out);
  }
}

void AddedTokenMatcher::splitLeftmostLongest(absl::string_view text, bool parse_special,
                                             std::vector<Segment>* out) const {
  size_t text_start = 0;  // Start of the pending text segment.
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    const int64_t index = longestAt(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t begin = pos;
    size_t end = pos + token.content.size();
    pos = end;  // The scan resumes after the match whether or not it is used.
    if (token.special && !parse_special) continue;
    if (token.single_word && !isWordBoundaryOk(text, begin, end)) continue;
    if (token.lstrip) begin = whitespaceRunStart(text, text_start, begin);
    if (token.rstrip) end = whitespaceRunEnd(text, end);
    if (begin > text_start) out->push_back(Segment{text_start, begin, -1});
    out->push_back(Segment{begin, end, static_cast<int64_t>(token.id)});
    text_start = end;
    pos = std::max(pos, end);
  }
  if (text_start < text.size()) out->push_back(Segment{text_start, text.size(), -1});
}

void AddedTokenMatcher::splitLongestFirst(absl::string_view text, bool parse_special,
                                          std::vector<Segment>* out) const {
  // Which searched tokens occur at all, in one pass over the text.
  std::vector<bool> occurs(tokens_.size(), false);
  bool any = false;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) continue;
    uint64_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      auto it = edges_.find((node << 8) | static_cast<uint8_t>(text[i]));
      if (it == edges_.end()) break;
      node = it->second;
      const int64_t t = terminal_[node];
      if (t >= 0 && (parse_special || !tokens_[t].special)) {
        occurs[t] = true;
        any = true;
      }
    }
  }
  out->clear();
  if (!text.empty()) out->push_back(Segment{0, text.size(), -1});
  if (!any) return;
  // Longest tokens first: each cuts its non-overlapping occurrences out of the text parts
  // that no longer token has claimed.
  std::vector<Segment> next;
  for (uint32_t t : by_length_) {
    if (!occurs[t]) continue;
    const absl::string_view content = tokens_[t].content;
    next.clear();
    for (const Segment& seg : *out) {
      if (seg.id >= 0) {
        next.push_back(seg);
        continue;
      }
      const absl::string_view part = text.substr(seg.begin, seg.end - seg.begin);
      size_t prev = 0;
      for (size_t at = part.find(content); at != absl::string_view::npos;
           at = part.find(content, prev)) {
        if (at > prev) next.push_back(Segment{seg.begin + prev, seg.begin + at, -1});
        next.push_back(Segment{seg.begin + at, seg.begin + at + content.size(),
                               static_cast<int64_t>(tokens_[t].id)});
        prev = at + content.size();
      }
      if (prev < part.size()) next.push_back(Segment{seg.begin + prev, seg.end, -1});
    }
    out->swap(next);
  }
}

}  // namespace cleave::tokenizer
