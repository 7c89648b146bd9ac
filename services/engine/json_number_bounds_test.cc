// NumberText against a validator's view of bounds: the text converted with strtod and
// compared as doubles, as Python's jsonschema and JavaScript validators do. Every number of
// up to five characters is checked both ways (taken iff valid), every prefix taken is shown
// to have a valid completion, and random walks over long bounds end valid.
#include "services/engine/json_number_bounds.h"

#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace cleave::engine {
namespace {

struct Case {
  const char* name;
  std::optional<double> low, high;
  bool low_exclusive = false, high_exclusive = false;
  bool integer = false;

  NumberBounds bounds() const {
    NumberBounds b{
        .low_exclusive = low_exclusive, .high_exclusive = high_exclusive, .integer = integer};
    if (low) b.low = Decimal::fromDouble(*low);
    if (high) b.high = Decimal::fromDouble(*high);
    return b;
  }
  // The validator: a JSON number text of at most 15 significant digits (NumberText's
  // subset), converted to a double and compared with the bounds as doubles.
  bool valid(const std::string& text) const {
    if (!jsonNumber(text) || (integer && text.find('.') != std::string::npos)) return false;
    int significant = 0;
    bool nonzero = false;
    for (char c : text) {
      if (c >= '1' && c <= '9') nonzero = true;
      significant += nonzero && c >= '0' && c <= '9';
    }
    if (significant > NumberBounds::kMaxSignificantDigits) return false;
    const double v = std::strtod(text.c_str(), nullptr);
    if (low && (low_exclusive ? !(v > *low) : !(v >= *low))) return false;
    if (high && (high_exclusive ? !(v < *high) : !(v <= *high))) return false;
    return true;
  }
  // -?(0|[1-9][0-9]*)(\.[0-9]+)?
  static bool jsonNumber(const std::string& t) {
    size_t i = t.starts_with('-') ? 1 : 0;
    if (i >= t.size() || !isdigit(t[i])) return false;
    if (t[i] == '0' && i + 1 < t.size() && isdigit(t[i + 1])) return false;
    while (i < t.size() && isdigit(t[i])) ++i;
    if (i == t.size()) return true;
    if (t[i] != '.' || i + 1 == t.size()) return false;
    for (++i; i < t.size(); ++i) {
      if (!isdigit(t[i])) return false;
    }
    return true;
  }
  static bool isdigit(char c) { return c >= '0' && c <= '9'; }
};

const Case kCases[] = {
    {"min 0", 0.0, std::nullopt},
    {"exclusive min 0", 0.0, std::nullopt, true},
    {"0..120 integer", 0.0, 120.0, false, false, true},
    {"min -273.15", -273.15, std::nullopt},
    {"0.1 to below 0.3", 0.1, 0.3, false, true},
    {"integer from 1.5", 1.5, std::nullopt, false, false, true},
    {"above 5 to 5.5", 5.0, 5.5, true},
    {"within 1e-3 of 0", -1e-3, 1e-3},
    {"integer at most -7", std::nullopt, -7.0, false, false, true},
    {"below -0.5", std::nullopt, -0.5, false, true},
    {"99 to 101 exclusive", 99.0, 101.0, true, true},
    {"exactly 42", 42.0, 42.0},
    {"above 0.30000000000000004", 0.30000000000000004, 1.0, true},
    {"1e-20 to 2e-20", 1e-20, 2e-20},
    {"from 0.2999999999999999", 0.2999999999999999, 0.5},  // 16 digits: 0.2 leads nowhere.
    {"12345.678 to 12345.679", 12345.678, 12345.679},
    {"integer 1e13 or more", 1e13, std::nullopt, false, false, true},
    {"at most 1e300", std::nullopt, 1e300},
    {"1.7976931348623157e308 or more", 1.7976931348623157e308, std::nullopt},
};

const std::string kBytes = "-.0123456789";

// Pushes `text` byte by byte; false at the first byte refused.
bool takes(const std::string& text, const NumberBounds& bounds, NumberText* out = nullptr) {
  NumberText t;
  for (char c : text) {
    if (!t.push(static_cast<uint8_t>(c), bounds)) return false;
  }
  if (out != nullptr) *out = t;
  return true;
}

bool ends(const std::string& text, const NumberBounds& bounds) {
  NumberText t;
  return takes(text, bounds, &t) && t.complete(bounds);
}

// A completion of `t` (text so far `text`) that the number may end with, found by following
// the bytes it takes; empty when there is none within `depth` bytes.
std::string complete(const NumberText& t, const std::string& text, const NumberBounds& bounds,
                     int depth) {
  if (t.complete(bounds)) return text;
  if (depth == 0) return "";
  for (char c : kBytes) {
    NumberText next = t;
    if (!next.push(static_cast<uint8_t>(c), bounds)) continue;
    std::string done = complete(next, text + c, bounds, depth - 1);
    if (!done.empty()) return done;
  }
  return "";
}

TEST(DecimalTest, ComparesExactlyAndPrintsShortest) {
  EXPECT_EQ(Decimal::fromDouble(0.1).text(), "0.1");
  EXPECT_EQ(Decimal::fromDouble(-273.15).text(), "-273.15");
  EXPECT_EQ(Decimal::fromDouble(1e-7).text(), "0.0000001");
  EXPECT_EQ(Decimal::fromDouble(1.5e300).text(), "15e+299");
  EXPECT_EQ(Decimal::fromDouble(0.30000000000000004).text(), "0.30000000000000004");
  EXPECT_EQ(Decimal::fromInteger(-120).text(), "-120");
  EXPECT_EQ(Decimal::fromUnsigned(18446744073709551615ULL).text(), "1000000000000000000");
  EXPECT_LT(compare(Decimal::fromDouble(0.3), Decimal::fromDouble(0.30000000000000004)), 0);
  EXPECT_GT(compare(Decimal::fromDouble(-0.3), Decimal::fromDouble(-0.30000000000000004)), 0);
  EXPECT_EQ(compare(Decimal::fromDouble(-0.0), Decimal::fromInteger(0)), 0);
  EXPECT_EQ(compare(Decimal::of(1200, -2), Decimal::fromInteger(12)), 0);
  EXPECT_LT(compare(Decimal::fromDouble(1e-300), Decimal::fromDouble(2e-300)), 0);
  EXPECT_GT(compare(Decimal::fromDouble(1e20), Decimal::fromInteger(99999999999)), 0);
}

// Every JSON number of at most five characters: taken whole and ended iff the validator
// accepts it.
TEST(NumberTextTest, ShortNumbersAreTakenExactlyWhenValid) {
  for (const Case& c : kCases) {
    const NumberBounds bounds = c.bounds();
    int checked = 0;
    // `t`: the text taken so far (nullopt once a byte was refused).
    std::function<void(const std::optional<NumberText>&, const std::string&)> each =
        [&](const std::optional<NumberText>& t, const std::string& text) {
          if (!text.empty() && Case::jsonNumber(text)) {
            EXPECT_EQ(t && t->complete(bounds), c.valid(text)) << c.name << ": " << text;
            ++checked;
          }
          if (text.size() == 5) return;
          for (char b : kBytes) {
            std::optional<NumberText> next = t;
            if (next && !next->push(static_cast<uint8_t>(b), bounds)) next.reset();
            each(next, text + b);
          }
        };
    each(NumberText(), "");
    EXPECT_GT(checked, 100000) << c.name;
  }
}

// Every prefix the text takes, up to four characters, has a completion the validator
// accepts: the output never reaches a dead end.
TEST(NumberTextTest, EveryPrefixTakenCanEndValid) {
  for (const Case& c : kCases) {
    const NumberBounds bounds = c.bounds();
    if (!NumberText().reachable(bounds)) {  // Past every number of 15 digits.
      EXPECT_STREQ(c.name, "1.7976931348623157e308 or more");
      continue;
    }
    int prefixes = 0;
    std::function<void(const NumberText&, const std::string&)> each = [&](const NumberText& t,
                                                                          const std::string& text) {
      const std::string done = complete(t, text, bounds, 130);
      EXPECT_FALSE(done.empty()) << c.name << ": nothing valid follows " << text;
      EXPECT_TRUE(done.empty() || c.valid(done)) << c.name << ": " << done;
      ++prefixes;
      if (text.size() == 4) return;
      for (char b : kBytes) {
        NumberText next = t;
        if (next.push(static_cast<uint8_t>(b), bounds)) each(next, text + b);
      }
    };
    each(NumberText(), "");
    EXPECT_GT(prefixes, 1) << c.name;
  }
}

// Random walks over the bytes taken, ending where the number may end with a chance of one
// in four: every walk ends, valid.
TEST(NumberTextTest, RandomWalksEndValid) {
  std::mt19937 rng(7);
  for (const Case& c : kCases) {
    const NumberBounds bounds = c.bounds();
    if (!NumberText().reachable(bounds)) continue;
    for (int walk = 0; walk < 300; ++walk) {
      NumberText t;
      std::string text;
      for (;;) {
        if (t.complete(bounds) && rng() % 4 == 0) break;
        std::vector<char> next;
        for (char b : kBytes) {
          NumberText probe = t;
          if (probe.push(static_cast<uint8_t>(b), bounds)) next.push_back(b);
        }
        if (next.empty()) break;
        const char b = next[rng() % next.size()];
        ASSERT_TRUE(t.push(static_cast<uint8_t>(b), bounds));
        text += b;
      }
      ASSERT_TRUE(t.complete(bounds)) << c.name << ": dead end at " << text;
      EXPECT_TRUE(c.valid(text)) << c.name << ": " << text;
    }
  }
}

TEST(NumberTextTest, LongBoundsAreMetToTheLastDigit) {
  const NumberBounds above = kCases[12].bounds();  // (0.30000000000000004, 1]
  EXPECT_FALSE(ends("0.3", above));
  EXPECT_TRUE(ends("0.30000000000001", above));
  EXPECT_TRUE(takes("0.300000000000001", above));    // 15 significant digits.
  EXPECT_FALSE(takes("0.3000000000000001", above));  // 16.
  EXPECT_FALSE(takes("1.1", above));
  const NumberBounds tiny = kCases[13].bounds();  // [1e-20, 2e-20]
  EXPECT_TRUE(ends("0.00000000000000000001", tiny));
  EXPECT_FALSE(takes("0.0000000000000000001", tiny));
  EXPECT_FALSE(takes("1e-20", tiny));  // No exponent.
  const NumberBounds huge = kCases[18].bounds();
  EXPECT_FALSE(NumberText().reachable(huge));
}

}  // namespace
}  // namespace cleave::engine
