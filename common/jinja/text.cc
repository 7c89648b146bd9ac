#include "common/jinja/text.h"

namespace cleave::jinja::text {

std::u32string decode(const std::string& utf8) {
  std::u32string out;
  out.reserve(utf8.size());
  size_t i = 0;
  while (i < utf8.size()) {
    const auto b = static_cast<unsigned char>(utf8[i]);
    int extra = b < 0x80           ? 0
                : (b >> 5) == 0x6  ? 1
                : (b >> 4) == 0xe  ? 2
                : (b >> 3) == 0x1e ? 3
                                   : -1;
    char32_t c = extra == 0 ? b : extra == 1 ? (b & 0x1f) : extra == 2 ? (b & 0x0f) : (b & 0x07);
    bool ok = extra >= 0 && i + static_cast<size_t>(extra) < utf8.size();
    for (int k = 1; ok && k <= extra; ++k) {
      const auto cont = static_cast<unsigned char>(utf8[i + static_cast<size_t>(k)]);
      if ((cont & 0xc0) != 0x80) ok = false;
      c = (c << 6) | (cont & 0x3f);
    }
    if (!ok) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    out += c;
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

std::string encode(const std::u32string& text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xe0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return out;
}

size_t length(const std::string& utf8) {
  size_t n = 0;
  for (unsigned char c : utf8) n += (c & 0xc0) != 0x80;
  return n;
}

bool isSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

char32_t toUpper(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
      c != 0x178 && c != 0x17f) {
    // Latin Extended-A pairs: even upper/odd lower, except 0x139-0x148 and 0x179-0x17e.
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    return odd_upper ? ((c % 2 == 0) ? c - 1 : c) : ((c % 2 == 1) ? c - 1 : c);
  }
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) return c - 32;  // Greek
  if (c == 0x3c2) return 0x3a3;
  if (c >= 0x430 && c <= 0x44f) return c - 32;  // Cyrillic
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}

char32_t toLower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
      c != 0x17f) {
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    return odd_upper ? ((c % 2 == 1) ? c + 1 : c) : ((c % 2 == 0) ? c + 1 : c);
  }
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}

namespace {

bool isCased(char32_t c) { return toUpper(c) != c || toLower(c) != c; }

std::string mapChars(const std::string& s, char32_t (*f)(char32_t)) {
  std::u32string t = decode(s);
  for (char32_t& c : t) c = f(c);
  return encode(t);
}

}  // namespace

std::string upper(const std::string& s) { return mapChars(s, toUpper); }
std::string lower(const std::string& s) { return mapChars(s, toLower); }

std::string capitalize(const std::string& s) {
  std::u32string t = decode(s);
  for (size_t i = 0; i < t.size(); ++i) t[i] = i == 0 ? toUpper(t[i]) : toLower(t[i]);
  return encode(t);
}

std::string pythonTitle(const std::string& s) {
  std::u32string t = decode(s);
  bool previous_cased = false;
  for (char32_t& c : t) {
    const bool cased = isCased(c);
    c = previous_cased ? toLower(c) : toUpper(c);
    previous_cased = cased;
  }
  return encode(t);
}

std::string jinjaTitle(const std::string& s) {
  std::u32string t = decode(s);
  bool word_start = true;
  for (char32_t& c : t) {
    const bool separator = isSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (separator) {
      word_start = true;
      continue;
    }
    c = word_start ? toUpper(c) : toLower(c);
    word_start = false;
  }
  return encode(t);
}

std::string strip(const std::string& s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  const std::u32string t = decode(s);
  const std::u32string set = chars ? decode(*chars) : std::u32string();
  const auto strippable = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : isSpace(c);
  };
  size_t begin = 0, end = t.size();
  if (left) {
    while (begin < end && strippable(t[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(t[end - 1])) --end;
  }
  return encode(t.substr(begin, end - begin));
}

std::vector<std::string> split(const std::string& s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string::npos) break;
      parts.push_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    parts.push_back(s.substr(start));
    return parts;
  }
  const std::u32string t = decode(s);
  size_t i = 0;
  while (i < t.size()) {
    while (i < t.size() && isSpace(t[i])) ++i;
    if (i == t.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      size_t end = t.size();
      while (end > i && isSpace(t[end - 1])) --end;
      parts.push_back(encode(t.substr(i, end - i)));
      break;
    }
    size_t j = i;
    while (j < t.size() && !isSpace(t[j])) ++j;
    parts.push_back(encode(t.substr(i, j - i)));
    i = j;
  }
  return parts;
}

std::vector<std::string> splitlines(const std::string& s) {
  const std::u32string t = decode(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const char32_t c = t[i];
    const bool end = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
                     c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!end) continue;
    lines.push_back(encode(t.substr(start, i - start)));
    if (c == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < t.size()) lines.push_back(encode(t.substr(start)));
  return lines;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  if (from.empty()) {
    const std::u32string t = decode(s);
    std::string out;
    int64_t done = 0;
    for (size_t i = 0; i <= t.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < t.size()) out += encode(std::u32string(1, t[i]));
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

int64_t find(const std::string& s, const std::string& part) {
  const size_t at = s.find(part);
  if (at == std::string::npos) return -1;
  return static_cast<int64_t>(length(s.substr(0, at)));
}

int64_t count(const std::string& s, const std::string& part) {
  if (part.empty()) return static_cast<int64_t>(length(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + part.size())) ++n;
  return n;
}

}  // namespace cleave::jinja::text
