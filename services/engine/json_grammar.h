// JsonGrammar recognizes, byte by byte, one JSON object as RFC 8259 defines it (and as
// nlohmann::json and Python's json parse it): strings of valid UTF-8 without control
// characters, escapes including \uXXXX (except surrogates, which a model can write as
// UTF-8), numbers (at most 100 digits a part, 2 of exponent: always a finite double),
// true/false/null, nesting at most 32 deep. Whitespace runs between tokens are capped at 16
// bytes (a model can otherwise pad forever). A value grammar for constrained decoding
// (json_constraint.h); json_schema.h follows a schema on top of it.
//
// Threading: a value type; each copy belongs to one user.
#pragma once

#include <cstdint>
#include <string_view>

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
  friend class JsonSchemaGrammar;  // Follows the syntax's state.
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

}  // namespace cleave::engine
