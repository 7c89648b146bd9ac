#include "services/engine/json_number_bounds.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cleave::engine {
namespace {

constexpr uint64_t kPow10[] = {1ULL,
                               10ULL,
                               100ULL,
                               1000ULL,
                               10000ULL,
                               100000ULL,
                               1000000ULL,
                               10000000ULL,
                               100000000ULL,
                               1000000000ULL,
                               10000000000ULL,
                               100000000000ULL,
                               1000000000000ULL,
                               10000000000000ULL,
                               100000000000000ULL,
                               1000000000000000ULL,
                               10000000000000000ULL,
                               100000000000000000ULL,
                               1000000000000000000ULL,
                               10000000000000000000ULL};
constexpr uint64_t kMantissaLimit = kPow10[18];

int digitCount(uint64_t m) {
  int n = 1;
  while (n < 20 && m >= kPow10[n]) ++n;
  return n;
}

// The position of a nonzero decimal's leading digit: x is in [10^p, 10^(p+1)).
int64_t leading(const Decimal& x) { return digitCount(x.mantissa) - 1 + int64_t{x.exponent}; }

int compareMagnitudes(const Decimal& a, const Decimal& b) {
  if (a.zero() || b.zero()) return a.zero() == b.zero() ? 0 : (a.zero() ? -1 : 1);
  if (leading(a) != leading(b)) return leading(a) < leading(b) ? -1 : 1;
  // The same leading position and at most 18 digits each: they differ by at most 17.
  using Wide = unsigned __int128;
  Wide x = a.mantissa, y = b.mantissa;
  if (a.exponent > b.exponent) x *= kPow10[a.exponent - b.exponent];
  if (b.exponent > a.exponent) y *= kPow10[b.exponent - a.exponent];
  return x == y ? 0 : (x < y ? -1 : 1);
}

// The smallest number of at most kMaxSignificantDigits digits as written (below 10^15),
// a multiple of 10^min_exponent, that is at least `x` (above it when `strict`); x >= 0.
// nullopt when there is none.
std::optional<Decimal> smallestFrom(const Decimal& x, bool strict, int32_t min_exponent) {
  if (x.zero()) return strict ? Decimal::of(1, min_exponent) : x;
  const int64_t top = leading(x);
  if (top >= NumberBounds::kMaxSignificantDigits) return std::nullopt;
  // Written digits run from 10^top down to 10^step.
  const int64_t step =
      std::max<int64_t>(top - (NumberBounds::kMaxSignificantDigits - 1), min_exponent);
  if (x.exponent >= step) {  // x is on the grid: x < 10^15, so x / 10^step fits.
    if (!strict) return x;
    const uint64_t units = x.mantissa * kPow10[x.exponent - step];
    return Decimal::of(units + 1, static_cast<int32_t>(step));
  }
  const int64_t drop = step - x.exponent;                             // Digits of x below the grid.
  if (drop >= 19) return Decimal::of(1, static_cast<int32_t>(step));  // x < 10^step.
  const uint64_t units = x.mantissa / kPow10[drop];
  // Digits below the grid were dropped: the next grid point is above x.
  return Decimal::of(units + 1, static_cast<int32_t>(step));
}

// Whether a number of [from, to) (0 <= from < to) that the grid of smallestFrom() allows
// lies within `bounds`.
bool meets(const Decimal& from, const Decimal& to, const NumberBounds& bounds,
           int32_t min_exponent) {
  Decimal x = from;
  bool strict = false;
  if (bounds.low && compare(*bounds.low, from) >= 0) {
    x = *bounds.low;
    strict = bounds.low_exclusive;
  }
  const std::optional<Decimal> c = smallestFrom(x, strict, min_exponent);
  if (!c || compare(*c, to) >= 0) return false;
  if (!bounds.high) return true;
  const int above = compare(*c, *bounds.high);
  return above < 0 || (above == 0 && !bounds.high_exclusive);
}

}  // namespace

Decimal Decimal::of(uint64_t mantissa, int32_t exponent, bool negative) {
  if (mantissa == 0) return {};
  while (mantissa % 10 == 0) {
    mantissa /= 10;
    ++exponent;
  }
  CLEAVE_CHECK(mantissa < kMantissaLimit) << "decimal mantissa " << mantissa;
  return {.negative = negative, .mantissa = mantissa, .exponent = exponent};
}

Decimal Decimal::fromDouble(double value) {
  char text[64];
  const auto [end, error] = std::to_chars(text, text + sizeof(text) - 1, value);
  CLEAVE_CHECK(error == std::errc()) << "to_chars of " << value;
  *end = '\0';
  uint64_t mantissa = 0;
  int32_t exponent = 0;
  bool point = false;
  const char* p = text;
  const bool negative = *p == '-';
  if (negative) ++p;
  for (; p < end && *p != 'e'; ++p) {
    if (*p == '.') {
      point = true;
      continue;
    }
    mantissa = mantissa * 10 + static_cast<uint64_t>(*p - '0');  // At most 17 digits.
    if (point) --exponent;
  }
  if (p < end) exponent += static_cast<int32_t>(std::strtol(p + 1, nullptr, 10));
  return of(mantissa, exponent, negative);
}

Decimal Decimal::fromUnsigned(uint64_t value) {
  int32_t exponent = 0;
  while (value != 0 && value % 10 == 0) {
    value /= 10;
    ++exponent;
  }
  if (value >= kMantissaLimit) return of(1, 18);
  return of(value, exponent);
}

Decimal Decimal::fromInteger(int64_t value) {
  const uint64_t magnitude =
      value < 0 ? uint64_t{0} - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  Decimal d = fromUnsigned(magnitude);
  d.negative = value < 0;
  return d;
}

std::string Decimal::text() const {
  std::string digits = std::to_string(mantissa);
  const std::string sign = negative ? "-" : "";
  if (exponent >= 0) {
    if (exponent > 20) return absl::StrCat(sign, digits, "e+", exponent);
    return absl::StrCat(sign, digits, std::string(static_cast<size_t>(exponent), '0'));
  }
  const int64_t point = static_cast<int64_t>(digits.size()) + exponent;
  if (point < -20) return absl::StrCat(sign, digits, "e", exponent);
  if (point > 0) {
    digits.insert(static_cast<size_t>(point), ".");
    return sign + digits;
  }
  return absl::StrCat(sign, "0.", std::string(static_cast<size_t>(-point), '0'), digits);
}

int compare(const Decimal& a, const Decimal& b) {
  const int sa = a.zero() ? 0 : (a.negative ? -1 : 1);
  const int sb = b.zero() ? 0 : (b.negative ? -1 : 1);
  if (sa != sb) return sa < sb ? -1 : 1;
  const int magnitudes = compareMagnitudes(a, b);
  return sa < 0 ? -magnitudes : magnitudes;
}

bool NumberBounds::contains(const Decimal& value) const {
  if (low) {
    const int c = compare(value, *low);
    if (c < 0 || (c == 0 && low_exclusive)) return false;
  }
  if (high) {
    const int c = compare(value, *high);
    if (c > 0 || (c == 0 && high_exclusive)) return false;
  }
  return true;
}

NumberBounds NumberBounds::mirrored() const {
  NumberBounds m{
      .low_exclusive = high_exclusive, .high_exclusive = low_exclusive, .integer = integer};
  if (high) m.low = high->negated();
  if (low) m.high = low->negated();
  return m;
}

bool NumberText::digit(int d) {
  if (zero_whole_ && !point_) return false;  // JSON has no leading zeros.
  if (point_) {
    if (fraction_ >= NumberBounds::kMaxFractionDigits) return false;
    ++fraction_;
  } else if (!digits_ && d == 0) {
    zero_whole_ = true;
  }
  digits_ = true;
  if (mantissa_ != 0 || d != 0) {
    if (significant_ >= NumberBounds::kMaxSignificantDigits) return false;
    mantissa_ = mantissa_ * 10 + static_cast<uint64_t>(d);
    ++significant_;
  }
  return true;
}

bool NumberText::push(uint8_t c, const NumberBounds& bounds) {
  NumberText next = *this;
  if (c == '-') {
    if (digits_ || negative_) return false;
    next.negative_ = true;
  } else if (c == '.') {
    // A point needs a digit after it, which must still count.
    if (bounds.integer || point_ || !digits_ ||
        significant_ >= NumberBounds::kMaxSignificantDigits) {
      return false;
    }
    next.point_ = true;
  } else if (c >= '0' && c <= '9') {
    if (!next.digit(c - '0')) return false;
  } else {
    return false;  // No exponent.
  }
  if (!next.reachable(bounds)) return false;
  *this = next;
  return true;
}

bool NumberText::complete(const NumberBounds& bounds) const {
  return digits_ && (!point_ || fraction_ > 0) && bounds.contains(value());
}

bool NumberText::reachable(const NumberBounds& bounds) const {
  if (!digits_) {  // A sign, if not written yet, and a first digit.
    for (const bool negative : {false, true}) {
      if (negative_ && !negative) continue;
      for (int d = 0; d <= 9; ++d) {
        NumberText first = *this;
        first.negative_ = negative;
        first.digit(d);
        if (first.reachable(bounds)) return true;
      }
    }
    return false;
  }
  // Nothing can follow: the number is what it is.
  if (significant_ >= NumberBounds::kMaxSignificantDigits ||
      fraction_ >= NumberBounds::kMaxFractionDigits || (bounds.integer && zero_whole_)) {
    return complete(bounds);
  }
  // What the digits can become, as magnitudes; a negative number's bounds mirrored.
  const NumberBounds mirrored = negative_ ? bounds.mirrored() : NumberBounds{};
  const NumberBounds& b = negative_ ? mirrored : bounds;
  const int32_t min_exponent = bounds.integer ? 0 : -NumberBounds::kMaxFractionDigits;
  if (point_ || zero_whole_) {  // Only more fraction digits: [text, text + 10^-fraction).
    return meets(Decimal::of(mantissa_, -fraction_), Decimal::of(mantissa_ + 1, -fraction_), b,
                 min_exponent);
  }
  // k more integer digits, then perhaps a fraction: [D 10^k, (D + 1) 10^k).
  for (int k = 0; significant_ + k <= NumberBounds::kMaxSignificantDigits; ++k) {
    if (meets(Decimal::of(mantissa_, k), Decimal::of(mantissa_ + 1, k), b, min_exponent))
      return true;
  }
  return false;
}

}  // namespace cleave::engine
