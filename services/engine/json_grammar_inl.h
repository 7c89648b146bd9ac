// JsonGrammar's definitions, inline: the masks (json_constraint.cc, json_schema.cc) run
// them for every token they simulate, and want them inlined into their loops. Include in
// .cc files only.
#pragma once

#include <string_view>

#include "services/engine/json_grammar.h"

namespace cleave::engine {
namespace json_grammar_detail {

inline bool isBlank(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline bool isDigit(uint8_t c) { return c >= '0' && c <= '9'; }
inline bool isHex(uint8_t c) {
  return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace json_grammar_detail

inline bool JsonGrammar::pushAll(std::string_view bytes) {
  JsonGrammar next = *this;
  for (char c : bytes) {
    if (!next.step(static_cast<uint8_t>(c))) return false;
  }
  *this = next;
  return true;
}

inline bool JsonGrammar::push(uint8_t c) {
  JsonGrammar next = *this;
  if (!next.step(c)) return false;
  *this = next;
  return true;
}

inline bool JsonGrammar::blank(uint8_t c) {
  if (!json_grammar_detail::isBlank(c) || blanks_ >= kMaxBlanks) return false;
  ++blanks_;
  return true;
}

inline bool JsonGrammar::open(bool array) {
  if (depth_ >= kMaxDepth) return false;
  arrays_ = array ? arrays_ | (uint64_t{1} << depth_) : arrays_ & ~(uint64_t{1} << depth_);
  ++depth_;
  mode_ = array ? Mode::kValueOrEnd : Mode::kKeyOrEnd;
  return true;
}

inline void JsonGrammar::valueEnded() { mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue; }

inline bool JsonGrammar::value(uint8_t c) {
  switch (c) {
    case '{': return open(false);
    case '[': return open(true);
    case '"':
      mode_ = Mode::kString;
      key_ = false;
      return true;
    case 't': literal_ = "rue"; break;
    case 'f': literal_ = "alse"; break;
    case 'n': literal_ = "ull"; break;
    default:
      if (c != '-' && !json_grammar_detail::isDigit(c)) return false;
      mode_ = Mode::kNumber;
      number_ = c == '-' ? Number::kMinus : c == '0' ? Number::kZero : Number::kInt;
      digits_ = 1;
      return true;
  }
  mode_ = Mode::kLiteral;
  return true;
}

inline bool JsonGrammar::step(uint8_t c) {
  if (!json_grammar_detail::isBlank(c) || mode_ == Mode::kString) blanks_ = 0;
  switch (mode_) {
    case Mode::kStart: return c == '{' ? open(false) : blank(c);
    case Mode::kKeyOrEnd:
      if (c == '}') {
        --depth_;
        valueEnded();
        return true;
      }
      [[fallthrough]];
    case Mode::kKey:
      if (c != '"') return blank(c);
      mode_ = Mode::kString;
      key_ = true;
      return true;
    case Mode::kColon:
      if (c != ':') return blank(c);
      mode_ = Mode::kValue;
      return true;
    case Mode::kValueOrEnd:
      if (c == ']') {
        --depth_;
        valueEnded();
        return true;
      }
      [[fallthrough]];
    case Mode::kValue: return json_grammar_detail::isBlank(c) ? blank(c) : value(c);
    case Mode::kAfterValue:
      if (c == ',') {
        mode_ = topIsArray() ? Mode::kValue : Mode::kKey;
        return true;
      }
      if (c == (topIsArray() ? ']' : '}')) {
        --depth_;
        valueEnded();
        return true;
      }
      return blank(c);
    case Mode::kString:
      if (utf8_left_ > 0) {
        if (c < utf8_lo_ || c > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80;
        utf8_hi_ = 0xbf;
        return true;
      }
      if (c == '"') {
        if (key_) {
          mode_ = Mode::kColon;
        } else {
          valueEnded();
        }
        return true;
      }
      if (c == '\\') {
        mode_ = Mode::kEscape;
        return true;
      }
      if (c < 0x20) return false;
      if (c < 0x80) return true;
      // A UTF-8 lead byte, and the range its first continuation byte must be in (no
      // overlong forms, no surrogates, nothing past U+10FFFF).
      if (c >= 0xc2 && c <= 0xdf) {
        utf8_left_ = 1;
      } else if (c >= 0xe0 && c <= 0xef) {
        utf8_left_ = 2;
        if (c == 0xe0) utf8_lo_ = 0xa0;
        if (c == 0xed) utf8_hi_ = 0x9f;
      } else if (c >= 0xf0 && c <= 0xf4) {
        utf8_left_ = 3;
        if (c == 0xf0) utf8_lo_ = 0x90;
        if (c == 0xf4) utf8_hi_ = 0x8f;
      } else {
        return false;
      }
      return true;
    case Mode::kEscape:
      if (c == 'u') {
        mode_ = Mode::kUnicode;
        unicode_left_ = 4;
        return true;
      }
      if (std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) == std::string_view::npos) {
        return false;
      }
      mode_ = Mode::kString;
      return true;
    case Mode::kUnicode:
      if (!json_grammar_detail::isHex(c)) return false;
      // No surrogates (\uD800-\uDFFF): a lone one is not JSON parsers accept, and their
      // pairing is not followed here.
      if (unicode_left_ == 4) {
        high_d_ = c == 'd' || c == 'D';
      } else if (unicode_left_ == 3 && high_d_ && !(c >= '0' && c <= '7')) {
        return false;
      }
      if (--unicode_left_ == 0) mode_ = Mode::kString;
      return true;
    case Mode::kNumber: {
      auto take = [&](Number next) {
        number_ = next;
        digits_ = 1;
        return true;
      };
      // Another digit of the current part, within its bound.
      auto more = [&](int most) { return ++digits_ <= most; };
      switch (number_) {
        case Number::kMinus:
          if (c == '0') return take(Number::kZero);
          return json_grammar_detail::isDigit(c) ? take(Number::kInt) : false;
        case Number::kInt:
          if (json_grammar_detail::isDigit(c)) return more(kMaxDigits);
          [[fallthrough]];
        case Number::kZero:
          if (c == '.') return take(Number::kDot);
          if (c == 'e' || c == 'E') return take(Number::kExp);
          break;
        case Number::kDot: return json_grammar_detail::isDigit(c) ? take(Number::kFrac) : false;
        case Number::kFrac:
          if (json_grammar_detail::isDigit(c)) return more(kMaxDigits);
          if (c == 'e' || c == 'E') return take(Number::kExp);
          break;
        case Number::kExp:
          if (c == '+' || c == '-') return take(Number::kExpSign);
          [[fallthrough]];
        case Number::kExpSign:
          return json_grammar_detail::isDigit(c) ? take(Number::kExpDigits) : false;
        case Number::kExpDigits:
          if (json_grammar_detail::isDigit(c)) return more(kMaxExponentDigits);
          break;
      }
      // The number is complete: `c` belongs to what follows it.
      valueEnded();
      return step(c);
    }
    case Mode::kLiteral:
      if (c != static_cast<uint8_t>(*literal_)) return false;
      if (*++literal_ == '\0') {
        literal_ = nullptr;
        valueEnded();
      }
      return true;
    case Mode::kDone: return blank(c);
  }
  return false;
}

}  // namespace cleave::engine
