#include "common/tokenizer/pre_tokenizer.h"

#include <utility>

namespace cleave::tokenizer {
namespace {

struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

// Matches of a step's pattern in `text`, with the gaps between them, covering all of it.
std::vector<Span> findSpans(const PreTokenizerStep& step, absl::string_view text) {
  std::vector<Span> spans;
  size_t prev = 0;
  auto onMatch = [&](size_t start, size_t end) {
    if (start > prev) spans.push_back(Span{prev, start, false});
    spans.push_back(Span{start, end, true});
    prev = end;
  };
  if (step.regex != nullptr) {
    step.regex->forEachMatch(text, onMatch);
  } else if (!step.literal.empty()) {
    for (size_t at = text.find(step.literal); at != absl::string_view::npos;
         at = text.find(step.literal, prev)) {
      onMatch(at, at + step.literal.size());
    }
  }
  if (prev < text.size()) spans.push_back(Span{prev, text.size(), false});
  return spans;
}

// Applies the split behavior, as Hugging Face's split_with_behavior does (merged behaviors
// only attach a match to a neighbour that is not itself a match).
std::vector<Span> applyBehavior(std::vector<Span> spans, SplitBehavior behavior) {
  std::vector<Span> out;
  out.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::kIsolated: return spans;
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) out.push_back(s);
      }
      return out;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (!out.empty() && s.is_match == previous_match) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& s = spans[i];
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().begin = s.begin;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return std::vector<Span>(out.rbegin(), out.rend());
    }
  }
  return spans;
}

}  // namespace

void PreTokenizer::apply(absl::string_view segment, bool at_start, Sink sink) const {
  run(0, segment, at_start, sink);
}

void PreTokenizer::run(size_t step, absl::string_view piece, bool at_start, Sink sink) const {
  if (piece.empty()) return;
  if (step == steps_.size()) {
    sink(piece);
    return;
  }
  const PreTokenizerStep& s = steps_[step];
  switch (s.kind) {
    case PreTokenizerStep::Kind::kSplit: runSplit(step, piece, at_start, sink); return;
    case PreTokenizerStep::Kind::kPrefixSpace: {
      if (piece[0] == ' ') {
        run(step + 1, piece, at_start, sink);
      } else {
        std::string spaced;
        spaced.reserve(piece.size() + 1);
        spaced.push_back(' ');
        spaced.append(piece.data(), piece.size());
        run(step + 1, spaced, at_start, sink);
      }
      return;
    }
    case PreTokenizerStep::Kind::kMetaspace: runMetaspace(step, piece, at_start, sink); return;
  }
}

void PreTokenizer::runSplit(size_t step, absl::string_view piece, bool at_start, Sink sink) const {
  const PreTokenizerStep& s = steps_[step];
  if (s.behavior == SplitBehavior::kIsolated && s.regex != nullptr) {
    // The common case streams: gaps and matches alike become pieces.
    size_t prev = 0;
    s.regex->forEachMatch(piece, [&](size_t start, size_t end) {
      if (start > prev)
        run(step + 1, piece.substr(prev, start - prev), at_start && prev == 0, sink);
      if (end > start)
        run(step + 1, piece.substr(start, end - start), at_start && start == 0, sink);
      prev = end;
    });
    if (prev < piece.size()) {
      run(step + 1, piece.substr(prev), at_start && prev == 0, sink);
    }
    return;
  }
  std::vector<Span> spans = findSpans(s, piece);
  if (s.invert) {
    for (Span& span : spans) span.is_match = !span.is_match;
  }
  for (const Span& span : applyBehavior(std::move(spans), s.behavior)) {
    if (span.end > span.begin) {
      run(step + 1, piece.substr(span.begin, span.end - span.begin), at_start && span.begin == 0,
          sink);
    }
  }
}

void PreTokenizer::runMetaspace(size_t step, absl::string_view piece, bool at_start,
                                Sink sink) const {
  const PreTokenizerStep& s = steps_[step];
  const absl::string_view rep = s.replacement;
  std::string text;
  text.reserve(piece.size() + rep.size() * 2);
  for (char c : piece) {
    if (c == ' ') {
      text.append(rep.data(), rep.size());
    } else {
      text.push_back(c);
    }
  }
  const bool starts_with_rep = absl::string_view(text).substr(0, rep.size()) == rep;
  const bool prepend =
      !starts_with_rep && (s.prepend_scheme == PrependScheme::kAlways ||
                           (s.prepend_scheme == PrependScheme::kFirst && at_start));
  if (prepend) text.insert(0, rep.data(), rep.size());
  const absl::string_view view = text;
  if (!s.split || rep.empty()) {
    run(step + 1, view, at_start, sink);
    return;
  }
  // Split before each replacement character (MergedWithNext): a run of them leaves single
  // ones behind, the last attached to the word that follows.
  size_t begin = 0;
  for (size_t at = view.find(rep); at != absl::string_view::npos;
       at = view.find(rep, at + rep.size())) {
    if (at > begin) {
      run(step + 1, view.substr(begin, at - begin), at_start && begin == 0, sink);
      begin = at;
    }
  }
  if (begin < view.size()) run(step + 1, view.substr(begin), at_start && begin == 0, sink);
}

}  // namespace cleave::tokenizer
