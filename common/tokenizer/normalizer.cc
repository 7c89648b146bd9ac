#include "common/tokenizer/normalizer.h"

#include "common/tokenizer/nfc.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

std::string replaceAll(absl::string_view text, const NormalizerStep& step) {
  std::string out;
  out.reserve(text.size());
  if (step.regex != nullptr) {
    size_t prev = 0;
    step.regex->forEachMatch(text, [&](size_t start, size_t end) {
      out.append(text.data() + prev, start - prev);
      out += step.content;
      prev = end;
    });
    out.append(text.data() + prev, text.size() - prev);
    return out;
  }
  if (step.text.empty()) return std::string(text);
  size_t prev = 0;
  for (size_t at = text.find(step.text); at != absl::string_view::npos;
       at = text.find(step.text, prev)) {
    out.append(text.data() + prev, at - prev);
    out += step.content;
    prev = at + step.text.size();
  }
  out.append(text.data() + prev, text.size() - prev);
  return out;
}

std::string stripWhitespace(absl::string_view text, bool left, bool right) {
  size_t begin = 0;
  size_t end = text.size();
  if (left) {
    while (begin < end) {
      char32_t cp = 0;
      const size_t n = utf8SequenceLength(text, begin, &cp);
      if (n == 0 || !isUnicodeWhitespace(cp)) break;
      begin += n;
    }
  }
  if (right) {
    while (end > begin) {
      // Step back to the start of the last character.
      size_t start = end - 1;
      while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
      char32_t cp = 0;
      const size_t n = utf8SequenceLength(text, start, &cp);
      if (n != end - start || !isUnicodeWhitespace(cp)) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

}  // namespace

std::string Normalizer::apply(absl::string_view text) const {
  std::string current(text);
  for (const NormalizerStep& step : steps_) {
    switch (step.kind) {
      case NormalizerStep::Kind::kPrepend:
        if (!current.empty()) current.insert(0, step.text);
        break;
      case NormalizerStep::Kind::kReplace: current = replaceAll(current, step); break;
      case NormalizerStep::Kind::kStrip:
        current = stripWhitespace(current, step.strip_left, step.strip_right);
        break;
      case NormalizerStep::Kind::kNfc: current = toNfc(current); break;
    }
  }
  return current;
}

}  // namespace cleave::tokenizer
