// Constrained decoding to one JSON object (the API's response_format "json_object"): before
// each draw, tokens whose bytes cannot continue a JSON object are masked out, and once the
// object is closed only a token that ends the sequence may follow.
//
// JsonGrammar recognizes, byte by byte, one JSON object as RFC 8259 defines it (and as
// nlohmann::json and Python's json parse it): strings of valid UTF-8 without control
// characters, escapes including \uXXXX (except surrogates, which a model can write as
// UTF-8), numbers (at most 100 digits a part, 2 of exponent: always a finite double),
// true/false/null, nesting at most 32 deep. Whitespace runs between
// tokens are capped at 16 bytes (a model can otherwise pad forever).
//
// The mask needs the bytes each token adds to the text: TokenBytes reads them from the
// tokenizer, each token after an ordinary one (a decoder may strip a text's leading space),
// and checks on sample pairs that the bytes of tokens put together are their text
// (exact()); special tokens add none and are never allowed, except those that end the
// sequence.
//
// Threading: a JsonConstraint belongs to one sequence; TokenBytes is immutable and shared.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cleave::tokenizer {
class Tokenizer;
}

namespace cleave::engine {

class JsonGrammar {
 public:
  // Takes `byte`; false (and the grammar unchanged) when it cannot continue the object.
  bool push(uint8_t byte);
  // Takes every byte, or none (false).
  bool pushAll(std::string_view bytes);
  // The object is closed.
  bool complete() const { return mode_ == Mode::kDone; }
  // Inside a string between characters: any text without '"', '\\' and control
  // characters, made of whole UTF-8 characters, continues it and leaves it so.
  bool betweenStringCharacters() const { return mode_ == Mode::kString && utf8_left_ == 0; }

  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxBlanks = 16;
  // Digits of a number's integer or fraction part, and of its exponent: every number the
  // grammar takes is a finite double.
  static constexpr int kMaxDigits = 100;
  static constexpr int kMaxExponentDigits = 2;

 private:
  enum class Mode : uint8_t {
    kStart,       // before the object
    kKeyOrEnd,    // after '{'
    kKey,         // after ',' in an object
    kColon,       // after a key
    kValue,       // after ':' or ',' in an array
    kValueOrEnd,  // after '['
    kAfterValue,  // after a value inside a container
    kString,
    kEscape,
    kUnicode,
    kNumber,
    kLiteral,
    kDone,
  };
  enum class Number : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

  bool step(uint8_t c);
  bool blank(uint8_t c);
  bool value(uint8_t c);
  bool open(bool array);
  // After a complete value or container.
  void valueEnded();
  bool topIsArray() const { return (arrays_ >> (depth_ - 1)) & 1; }

  Mode mode_ = Mode::kStart;
  bool key_ = false;  // the string being read is an object key
  Number number_ = Number::kMinus;
  uint8_t digits_ = 0;                       // of the number's current part
  uint8_t unicode_left_ = 0;                 // hex digits of a \u escape still to come
  bool high_d_ = false;                      // that escape's first hex digit is d (or D)
  uint8_t utf8_left_ = 0;                    // continuation bytes of a character still to come
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xbf;  // the next continuation byte's range
  const char* literal_ = nullptr;            // the rest of true/false/null still to come
  uint8_t depth_ = 0;
  uint64_t arrays_ = 0;  // bit d: the container at depth d + 1 is an array
  uint8_t blanks_ = 0;
};

// The bytes each token of a vocabulary adds to the text (empty for special tokens), and
// the groupings that make a mask cheap: tokens by first byte, and the tokens that are
// plain string text (whole UTF-8 characters, no '"', '\\' or control characters).
class TokenBytes {
 public:
  explicit TokenBytes(const tokenizer::Tokenizer& tokenizer);
  explicit TokenBytes(std::vector<std::string> bytes);
  // Whether the bytes of tokens put together are the text of the tokens together (checked
  // on sample pairs when read from a tokenizer); a constraint needs it.
  bool exact() const { return exact_; }
  const std::string& operator[](uint32_t id) const { return bytes_[id]; }
  size_t size() const { return bytes_.size(); }
  // The tokens starting with `byte`: those of one byte first, then by second byte.
  const std::vector<uint32_t>& startingWith(uint8_t byte) const { return by_first_[byte]; }
  // Within startingWith(first): [begin, end) of the one-byte tokens (second = -1) or of
  // those whose second byte is `second`.
  std::pair<size_t, size_t> group(uint8_t first, int second) const {
    const size_t* at = &groups_[first * 258 + static_cast<size_t>(second + 1)];
    return {at[0], at[1]};
  }
  bool plainText(uint32_t id) const { return plain_[id]; }

 private:
  void sortIntoGroups();

  std::vector<std::string> bytes_;
  std::vector<std::vector<uint32_t>> by_first_;
  std::vector<size_t> groups_;  // per first byte, 258 offsets into by_first_[first]
  std::vector<bool> plain_;
  bool exact_ = true;
};

class JsonConstraint {
 public:
  // `ends`: the tokens that end the sequence (at least one).
  JsonConstraint(std::shared_ptr<const TokenBytes> bytes, std::vector<uint32_t> ends);

  // Sets the logits of the tokens that cannot come next to -infinity (logits.size() may
  // exceed the vocabulary: the rest are masked too).
  void mask(std::span<float> logits) const;
  // Advances past `token`; false (the grammar as it was) for one the mask would not allow.
  bool accept(uint32_t token);
  bool complete() const { return grammar_.complete(); }

 private:
  std::shared_ptr<const TokenBytes> bytes_;
  mutable std::vector<uint8_t> keep_;  // mask(): the tokens allowed
  std::vector<uint32_t> ends_;
  JsonGrammar grammar_;
};

}  // namespace cleave::engine
