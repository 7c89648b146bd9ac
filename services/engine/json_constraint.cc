#include "services/engine/json_constraint.h"

#include <algorithm>
#include <limits>
#include <random>

#include "common/tokenizer/tokenizer.h"

namespace cleave::engine {
namespace {

bool isBlank(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool isDigit(uint8_t c) { return c >= '0' && c <= '9'; }
bool isHex(uint8_t c) { return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

bool JsonGrammar::pushAll(std::string_view bytes) {
  JsonGrammar next = *this;
  for (char c : bytes) {
    if (!next.step(static_cast<uint8_t>(c))) return false;
  }
  *this = next;
  return true;
}

bool JsonGrammar::push(uint8_t c) {
  JsonGrammar next = *this;
  if (!next.step(c)) return false;
  *this = next;
  return true;
}

bool JsonGrammar::blank(uint8_t c) {
  if (!isBlank(c) || blanks_ >= kMaxBlanks) return false;
  ++blanks_;
  return true;
}

bool JsonGrammar::open(bool array) {
  if (depth_ >= kMaxDepth) return false;
  arrays_ = array ? arrays_ | (uint64_t{1} << depth_) : arrays_ & ~(uint64_t{1} << depth_);
  ++depth_;
  mode_ = array ? Mode::kValueOrEnd : Mode::kKeyOrEnd;
  return true;
}

void JsonGrammar::valueEnded() { mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue; }

bool JsonGrammar::value(uint8_t c) {
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
      if (c != '-' && !isDigit(c)) return false;
      mode_ = Mode::kNumber;
      number_ = c == '-' ? Number::kMinus : c == '0' ? Number::kZero : Number::kInt;
      digits_ = 1;
      return true;
  }
  mode_ = Mode::kLiteral;
  return true;
}

bool JsonGrammar::step(uint8_t c) {
  if (!isBlank(c) || mode_ == Mode::kString) blanks_ = 0;
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
    case Mode::kValue: return isBlank(c) ? blank(c) : value(c);
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
      if (!isHex(c)) return false;
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
          return isDigit(c) ? take(Number::kInt) : false;
        case Number::kInt:
          if (isDigit(c)) return more(kMaxDigits);
          [[fallthrough]];
        case Number::kZero:
          if (c == '.') return take(Number::kDot);
          if (c == 'e' || c == 'E') return take(Number::kExp);
          break;
        case Number::kDot: return isDigit(c) ? take(Number::kFrac) : false;
        case Number::kFrac:
          if (isDigit(c)) return more(kMaxDigits);
          if (c == 'e' || c == 'E') return take(Number::kExp);
          break;
        case Number::kExp:
          if (c == '+' || c == '-') return take(Number::kExpSign);
          [[fallthrough]];
        case Number::kExpSign: return isDigit(c) ? take(Number::kExpDigits) : false;
        case Number::kExpDigits:
          if (isDigit(c)) return more(kMaxExponentDigits);
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

TokenBytes::TokenBytes(const tokenizer::Tokenizer& tokenizer) : bytes_(tokenizer.vocabSize()) {
  // A token's bytes in context: what it adds after an ordinary token (a decoder may strip
  // the leading space of a text's first token).
  const std::vector<tokenizer::TokenId> anchor =
      tokenizer.encode("a", {.add_special_tokens = false});
  const std::string before = tokenizer.decode(anchor, true);
  std::vector<tokenizer::TokenId> pair = anchor;
  pair.push_back(0);
  for (uint32_t id = 0; id < bytes_.size(); ++id) {
    if (tokenizer.isSpecial(id)) continue;
    pair.back() = id;
    const std::string both = tokenizer.decode(pair, true);
    bytes_[id] =
        both.starts_with(before) ? both.substr(before.size()) : tokenizer.decode({&id, 1}, true);
  }
  // The bytes add up: sample pairs of ordinary tokens decode to their bytes joined.
  std::mt19937_64 random(bytes_.size());
  std::vector<tokenizer::TokenId> three = anchor;
  three.resize(anchor.size() + 2);
  for (int checked = 0, tries = 0; checked < 256 && tries < 4096 && exact_; ++tries) {
    const uint32_t x = random() % bytes_.size(), y = random() % bytes_.size();
    if (bytes_[x].empty() || bytes_[y].empty()) continue;
    three[anchor.size()] = x;
    three[anchor.size() + 1] = y;
    exact_ = tokenizer.decode(three, true) == before + bytes_[x] + bytes_[y];
    ++checked;
  }
  sortIntoGroups();
}

TokenBytes::TokenBytes(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  sortIntoGroups();
}

void TokenBytes::sortIntoGroups() {
  by_first_.assign(256, {});
  plain_.assign(bytes_.size(), false);
  for (uint32_t id = 0; id < bytes_.size(); ++id) {
    const std::string& b = bytes_[id];
    if (b.empty()) continue;
    by_first_[static_cast<uint8_t>(b[0])].push_back(id);
    // Plain: a grammar between string characters takes it and stays in that string.
    JsonGrammar probe;
    if (b.find_first_of("\"\\") != std::string::npos || !probe.pushAll("{\"")) continue;
    plain_[id] = probe.pushAll(b) && probe.betweenStringCharacters();
  }
  // Within a first byte: one-byte tokens, then by second byte (stable: ids ascending).
  auto second = [&](uint32_t id) {
    return bytes_[id].size() < 2 ? -1 : static_cast<int>(static_cast<uint8_t>(bytes_[id][1]));
  };
  groups_.assign(256 * 258, 0);
  for (int first = 0; first < 256; ++first) {
    std::vector<uint32_t>& ids = by_first_[first];
    std::stable_sort(ids.begin(), ids.end(),
                     [&](uint32_t a, uint32_t b) { return second(a) < second(b); });
    size_t* at = &groups_[static_cast<size_t>(first) * 258];
    for (int k = -1, i = 0; k <= 256; ++k) {
      at[k + 1] = static_cast<size_t>(i);
      while (k < 256 && i < static_cast<int>(ids.size()) && second(ids[i]) == k) ++i;
    }
  }
}

JsonConstraint::JsonConstraint(std::shared_ptr<const TokenBytes> bytes, std::vector<uint32_t> ends)
    : bytes_(std::move(bytes)), ends_(std::move(ends)) {}

void JsonConstraint::mask(std::span<float> logits) const {
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  const TokenBytes& bytes = *bytes_;
  keep_.assign(logits.size(), 0);
  if (!grammar_.complete()) {
    // Only tokens whose first byte the grammar takes can be allowed; between string
    // characters, plain text always is.
    const bool in_string = grammar_.betweenStringCharacters();
    auto keep = [&](uint32_t id, bool allowed) {
      if (id < logits.size()) keep_[id] = allowed;
    };
    for (int first = 0; first < 256; ++first) {
      const std::vector<uint32_t>& ids = bytes.startingWith(static_cast<uint8_t>(first));
      if (ids.empty()) continue;
      JsonGrammar next = grammar_;
      if (!next.push(static_cast<uint8_t>(first))) continue;
      if (in_string) {  // nearly everything goes: plain text at once, the rest simulated
        for (uint32_t id : ids) {
          JsonGrammar rest = grammar_;
          keep(id, bytes.plainText(id) || rest.pushAll(bytes[id]));
        }
        continue;
      }
      const auto [single, single_end] = bytes.group(static_cast<uint8_t>(first), -1);
      for (size_t i = single; i < single_end; ++i) keep(ids[i], true);
      // Then by second byte: a group whose second byte the grammar refuses is skipped whole.
      for (int second = 0; second < 256; ++second) {
        const auto [begin, end] = bytes.group(static_cast<uint8_t>(first), second);
        if (begin == end) continue;
        JsonGrammar two = next;
        if (!two.push(static_cast<uint8_t>(second))) continue;
        for (size_t i = begin; i < end; ++i) {
          JsonGrammar rest = two;
          keep(ids[i], rest.pushAll(std::string_view(bytes[ids[i]]).substr(2)));
        }
      }
    }
  }
  for (uint32_t end : ends_) {
    if (end < logits.size()) keep_[end] = grammar_.complete();
  }
  bool any = false;
  for (size_t id = 0; id < logits.size(); ++id) {
    if (keep_[id]) {
      any = true;
    } else {
      logits[id] = kNever;
    }
  }
  // A dead end (a vocabulary without the bytes the grammar needs): end the sequence.
  if (!any && !ends_.empty() && ends_[0] < logits.size()) logits[ends_[0]] = 0.0f;
}

bool JsonConstraint::accept(uint32_t token) {
  if (std::find(ends_.begin(), ends_.end(), token) != ends_.end()) return grammar_.complete();
  return token < bytes_->size() && !(*bytes_)[token].empty() && grammar_.pushAll((*bytes_)[token]);
}

}  // namespace cleave::engine
