#include "common/tokenizer/utf8.h"

#include <algorithm>

namespace cleave::tokenizer {
namespace {

// Well-formed sequences (Unicode Table 3-7): the allowed range of the second byte depends on
// the lead byte; later bytes are plain continuation bytes.
struct LeadInfo {
  uint8_t length;  // 0: never a lead byte.
  uint8_t second_lo;
  uint8_t second_hi;
};

LeadInfo leadInfo(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes from `pos` that form a valid (possibly incomplete) prefix of a sequence,
// and whether that prefix is complete.
size_t validPrefix(absl::string_view text, size_t pos, bool* complete) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const LeadInfo info = leadInfo(p[pos]);
  *complete = false;
  if (info.length == 0) return 0;
  if (info.length == 1) {
    *complete = true;
    return 1;
  }
  size_t n = 1;
  while (n < info.length && pos + n < text.size()) {
    const uint8_t c = p[pos + n];
    const bool ok =
        n == 1 ? (c >= info.second_lo && c <= info.second_hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) break;
    ++n;
  }
  *complete = n == info.length;
  return n;
}

}  // namespace

size_t utf8SequenceLength(absl::string_view text, size_t pos, char32_t* cp) {
  if (pos >= text.size()) return 0;
  bool complete = false;
  const size_t n = validPrefix(text, pos, &complete);
  if (!complete) return 0;
  if (cp != nullptr) {
    const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + pos;
    switch (n) {
      case 1: *cp = p[0]; break;
      case 2: *cp = (char32_t{p[0] & 0x1Fu} << 6) | (p[1] & 0x3Fu); break;
      case 3:
        *cp = (char32_t{p[0] & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) | (p[2] & 0x3Fu);
        break;
      default:
        *cp = (char32_t{p[0] & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) |
              (char32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3Fu);
        break;
    }
  }
  return n;
}

size_t utf8LeadLength(absl::string_view text, size_t pos) {
  const auto b = static_cast<uint8_t>(text[pos]);
  size_t n = 1;
  if (b >= 0xF0) {
    n = 4;
  } else if (b >= 0xE0) {
    n = 3;
  } else if (b >= 0xC0) {
    n = 2;
  }
  return std::min(n, text.size() - pos);
}

bool isValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8SequenceLength(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t incompleteUtf8Suffix(absl::string_view text) {
  // A lead byte at most 3 bytes from the end whose sequence is a valid, unfinished prefix.
  const size_t limit = std::min<size_t>(3, text.size());
  for (size_t back = 1; back <= limit; ++back) {
    const size_t pos = text.size() - back;
    const auto b = static_cast<uint8_t>(text[pos]);
    if (b >= 0x80 && b <= 0xBF) continue;  // A continuation byte: look further back.
    bool complete = false;
    const size_t n = validPrefix(text, pos, &complete);
    return (!complete && n == back) ? back : 0;
  }
  return 0;
}

void appendUtf8(char32_t cp, std::string* out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = kReplacementChar;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string sanitizeUtf8(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    bool complete = false;
    const size_t n = validPrefix(text, i, &complete);
    if (complete) {
      out.append(text.data() + i, n);
      i += n;
    } else {
      appendUtf8(kReplacementChar, &out);
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

bool isUnicodeWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace cleave::tokenizer
