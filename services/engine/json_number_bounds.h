// Bounds on a JSON number — JSON Schema's minimum, maximum, exclusiveMinimum and
// exclusiveMaximum — followed byte by byte while the number is written (json_schema.h).
//
// A bounded number is written as a plain decimal (no exponent) of at most
// kMaxSignificantDigits significant digits, counted from its first nonzero digit, and at
// most kMaxFractionDigits after the point. Distinct decimals of at most 15 significant
// digits convert to distinct doubles in the same order (DBL_DIG), so comparing such a text
// exactly with the shortest decimal form of a bound gives the answer of a validator that
// compares doubles, and of one that compares integers exactly. A byte is taken only while
// some number the text can still become lies within the bounds, so a constrained output
// never walks into a dead end.
//
// Threading: NumberBounds is immutable; a NumberText is a value belonging to one grammar.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cleave::engine {

// An exact decimal: ±mantissa × 10^exponent, the mantissa below 10^18 without trailing
// zeros (zero is +0 × 10^0).
struct Decimal {
  bool negative = false;
  uint64_t mantissa = 0;
  int32_t exponent = 0;

  static Decimal of(uint64_t mantissa, int32_t exponent, bool negative = false);
  // The shortest decimal that converts back to `value` (finite).
  static Decimal fromDouble(double value);
  // Integers of 10^18 and more (in magnitude) become ±10^18: no bounded number reaches
  // them either way.
  static Decimal fromInteger(int64_t value);
  static Decimal fromUnsigned(uint64_t value);
  bool zero() const { return mantissa == 0; }
  Decimal negated() const { return of(mantissa, exponent, !negative); }
  std::string text() const;  // For messages: 1.5, -0.003, 12e+20.
};

// -1, 0 or 1 as a is below, equal to or above b.
int compare(const Decimal& a, const Decimal& b);

struct NumberBounds {
  std::optional<Decimal> low, high;
  bool low_exclusive = false, high_exclusive = false;
  bool integer = false;  // Multiples of 1 only.

  static constexpr int kMaxSignificantDigits = 15;
  static constexpr int kMaxFractionDigits = 100;  // JsonGrammar::kMaxDigits

  bool any() const { return low.has_value() || high.has_value(); }
  bool contains(const Decimal& value) const;
  // The same bounds on the negated numbers.
  NumberBounds mirrored() const;
};

// The text of a bounded number written so far.
class NumberText {
 public:
  // Takes the next byte of the number (the first is '-' or a digit; the syntax around it is
  // JsonGrammar's, checked before). False when it cannot continue a number within `bounds`
  // as this file says; the text is then unchanged.
  bool push(uint8_t c, const NumberBounds& bounds);
  // Whether the number may end here.
  bool complete(const NumberBounds& bounds) const;
  // Whether some number this text can still become lies within `bounds` (for the empty
  // text: whether any number does).
  bool reachable(const NumberBounds& bounds) const;

 private:
  Decimal value() const { return Decimal::of(mantissa_, -fraction_, negative_); }
  // `digit` taken: false past the caps on digits.
  bool digit(int digit);

  uint64_t mantissa_ = 0;  // The digits from the first nonzero one.
  uint8_t significant_ = 0;
  uint8_t fraction_ = 0;  // Digits after the point.
  bool negative_ = false;
  bool digits_ = false;      // A digit written.
  bool point_ = false;       // The point written.
  bool zero_whole_ = false;  // The integer part is "0".
};

}  // namespace cleave::engine
