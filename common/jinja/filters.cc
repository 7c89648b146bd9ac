// Jinja's filters (builtins.h), as Jinja 3 defines them.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/jinja/arguments.h"
#include "common/jinja/builtins.h"
#include "common/jinja/text.h"
#include "common/status_macros.h"

namespace cleave::jinja {
namespace {

using namespace args;  // NOLINT: the argument helpers every builtin uses

// Jinja's attribute getter for filters: "a.b.0" walks dicts and lists.
Value walkAttribute(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.isUndefined()) return v;
    int64_t index = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
    const bool number = !part.empty() && ec == std::errc() && end == part.data() + part.size();
    v = number ? getItem(v, Value(index)) : getItem(v, Value(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return v;
}

Value lowered(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.isString()) return Value(text::lower(v.asString()));
  return v;
}

Value keyOf(const Value& item, const Value& attribute, bool case_sensitive) {
  const Value v = attribute.isString() ? walkAttribute(item, attribute.asString()) : item;
  return lowered(v, case_sensitive);
}

absl::StatusOr<List> sorted(const List& items, const Value& attribute, bool case_sensitive,
                            bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) keyed.emplace_back(keyOf(item, attribute, case_sensitive), item);
  absl::Status failure;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto r = reverse ? less(b.first, a.first) : less(a.first, b.first);
    if (!r.ok()) {
      failure = r.status();
      return false;
    }
    return *r;
  });
  CLEAVE_RETURN_IF_ERROR(failure);
  List out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return out;
}

// The test name and its arguments after `skip` leading positionals (select, selectattr).
CallArgs testArgs(const CallArgs& args, size_t skip) {
  CallArgs rest;
  for (size_t i = skip + 1; i < args.positional.size(); ++i)
    rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

absl::StatusOr<List> selectItems(const std::string& filter, const Value& input_value,
                                 const CallArgs& args) {
  // As Jinja: a false input (none, empty) selects nothing.
  const Value input = input_value.truthy() ? input_value : Value(List{});
  const bool by_attribute = filter == "selectattr" || filter == "rejectattr";
  const bool keep = filter == "select" || filter == "selectattr";
  CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input));
  const size_t skip = by_attribute ? 1 : 0;
  if (by_attribute && args.positional.empty()) return bad(filter, "needs an attribute name");
  std::optional<std::string> test;
  if (args.positional.size() > skip) {
    CLEAVE_ASSIGN_OR_RETURN(test, stringArg(filter, args.positional[skip]));
  }
  const CallArgs rest = testArgs(args, skip);
  List out;
  for (const Value& item : items) {
    const Value subject = by_attribute ? walkAttribute(item, args.positional[0].str()) : item;
    bool pass = subject.truthy();
    if (test) {
      if (!isTest(*test)) return bad(filter, absl::StrCat("no test named '", *test, "'"));
      CLEAVE_ASSIGN_OR_RETURN(pass, applyTest(*test, subject, rest));
    }
    if (pass == keep) out.push_back(item);
  }
  return out;
}

absl::StatusOr<Value> indent(const Value& input, const CallArgs& args) {
  CLEAVE_ASSIGN_OR_RETURN(auto a, bind("indent", args, {"width", "first", "blank"}));
  std::string pad = "    ";
  if (a[0].isString()) {
    pad = a[0].asString();
  } else if (!a[0].isUndefined()) {
    CLEAVE_ASSIGN_OR_RETURN(int64_t width, intArg("indent", a[0]));
    pad = std::string(static_cast<size_t>(std::clamp<int64_t>(width, 0, 1 << 16)), ' ');
  }
  // Jinja appends a newline before splitting lines, so a trailing one survives.
  const std::vector<std::string> lines = text::splitlines(input.str() + "\n");
  CLEAVE_RETURN_IF_ERROR(checkBuilt(
      "indent", static_cast<double>(input.str().size()) +
                    static_cast<double>(lines.size() + 1) * static_cast<double>(pad.size())));
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    const bool indented = i > 0 && (a[2].truthy() || !lines[i].empty());
    out += (indented ? pad : "") + lines[i];
  }
  if (a[1].truthy()) out = pad + out;
  return Value(out);
}

absl::StatusOr<Value> minMax(const std::string& name, const Value& input, const CallArgs& args) {
  CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"case_sensitive", "attribute"}));
  CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input));
  if (items.empty()) return Value::undefined(absl::StrCat("no ", name, " of an empty sequence"));
  CLEAVE_ASSIGN_OR_RETURN(List order, sorted(items, a[1], a[0].truthy(), false));
  return name == "min" ? order.front() : order.back();
}

absl::StatusOr<Value> toNumber(const std::string& name, const Value& input, const CallArgs& args) {
  const bool want_int = name == "int";
  CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"default", "base"}));
  const Value fallback = a[0].isUndefined() ? (want_int ? Value(0) : Value(0.0)) : a[0];
  // A float too large for an int64 (or NaN) gives the default, as a failed conversion does.
  const auto toInt = [&](double d) {
    return d > -9.2e18 && d < 9.2e18 ? Value(static_cast<int64_t>(d)) : fallback;
  };
  if (input.isNumber()) {
    if (want_int) return input.isFloat() ? toInt(input.asDouble()) : Value(input.asInt());
    return Value(input.asDouble());
  }
  if (!input.isString()) return fallback;
  std::string s = text::strip(input.asString(), std::nullopt, true, true);
  if (s.empty()) return fallback;
  // Python reads "1_000" as 1000: an underscore between two digits.
  for (size_t i = 1; i + 1 < s.size(); ++i) {
    if (s[i] == '_' && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      s.erase(i, 1);
    }
  }
  char* end = nullptr;
  if (want_int) {
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (end == s.c_str() + s.size() && errno == 0) return Value(static_cast<int64_t>(i));
  }
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return fallback;
  if (want_int) return toInt(d);
  return Value(d);
}

// A dict's (key, value) tuples in iteration order.
List itemPairs(const Dict& dict) {
  List pairs;
  for (const auto& [k, v] : dict.items) pairs.push_back(Value::tuple(List{Value(k), v}));
  for (const auto& [k, v] : dict.int_items) pairs.push_back(Value::tuple(List{Value(k), v}));
  return pairs;
}

absl::StatusOr<Value> sliceString(const std::string& s, bool reverse) {
  std::u32string t = text::decode(s);
  if (reverse) std::reverse(t.begin(), t.end());
  return Value(text::encode(t));
}

}  // namespace

bool isFilter(absl::string_view name) {
  static const char* kNames[] = {
      "abs",   "capitalize", "count",      "d",       "default", "dictsort",
      "first", "float",      "indent",     "int",     "items",   "join",
      "last",  "length",     "list",       "lower",   "map",     "max",
      "min",   "reject",     "rejectattr", "replace", "reverse", "round",
      "safe",  "select",     "selectattr", "sort",    "string",  "sum",
      "title", "tojson",     "trim",       "unique",  "upper",   "wordcount"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

absl::StatusOr<Value> applyFilter(const std::string& name, const Value& input,
                                  const CallArgs& args) {
  const auto noArgs = [&]() -> absl::Status {
    if (!args.positional.empty() || !args.keyword.empty()) return bad(name, "takes no arguments");
    return absl::OkStatus();
  };
  if (name == "default" || name == "d") {
    CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"default_value", "boolean"}));
    const Value fallback = a[0].isUndefined() ? Value(std::string()) : a[0];
    if (input.isUndefined() || (a[1].truthy() && !input.truthy())) return fallback;
    return input;
  }
  if (name == "safe") return input.isString() ? Value::markup(input.asString()) : input;
  if (name == "length" || name == "count") {
    CLEAVE_RETURN_IF_ERROR(noArgs());
    switch (input.kind()) {
      case Value::Kind::kUndefined: return Value(0);
      case Value::Kind::kString: return Value(static_cast<int64_t>(text::length(input.asString())));
      case Value::Kind::kList: return Value(static_cast<int64_t>(input.asList().size()));
      case Value::Kind::kDict: return Value(static_cast<int64_t>(input.asDict().size()));
      default:
        return bad(name, absl::StrCat("object of type '", input.typeName(), "' has no len()"));
    }
  }
  if (name == "string") return Value(input.str());
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    CLEAVE_RETURN_IF_ERROR(noArgs());
    const std::string s = input.str();
    if (name == "upper") return Value(text::upper(s));
    if (name == "lower") return Value(text::lower(s));
    if (name == "title") return Value(text::jinjaTitle(s));
    return Value(text::capitalize(s));
  }
  if (name == "trim") {
    CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"chars"}));
    return Value(text::strip(input.str(), optionalString(a[0]), true, true));
  }
  if (name == "wordcount")
    return Value(static_cast<int64_t>(text::split(input.str(), std::nullopt, -1).size()));
  if (name == "replace") {
    CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"old", "new", "count"}));
    CLEAVE_ASSIGN_OR_RETURN(std::string from, stringArg(name, a[0]));
    CLEAVE_ASSIGN_OR_RETURN(std::string to, stringArg(name, a[1]));
    int64_t n = -1;
    if (!a[2].isUndefined() && !a[2].isNone()) {
      CLEAVE_ASSIGN_OR_RETURN(n, intArg(name, a[2]));
    }
    CLEAVE_RETURN_IF_ERROR(checkReplace(name, input.str(), from, to, n));
    return Value(text::replace(input.str(), from, to, n));
  }
  if (name == "tojson") {
    CLEAVE_ASSIGN_OR_RETURN(
        auto a, bind(name, args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
    JsonStyle style{.sort_keys = a[3].truthy(), .ensure_ascii = a[0].truthy()};
    if (!a[1].isUndefined() && !a[1].isNone()) {
      CLEAVE_ASSIGN_OR_RETURN(int64_t w, intArg(name, a[1]));
      style.indent = static_cast<int>(std::clamp<int64_t>(w, 0, 64));
    }
    if (!a[2].isUndefined() && !a[2].isNone()) {
      if (!a[2].isList() || a[2].asList().size() != 2 || !a[2].asList()[0].isString() ||
          !a[2].asList()[1].isString()) {
        return bad(name, "separators must be a pair of strings");
      }
      style.item_separator = a[2].asList()[0].asString();
      style.key_separator = a[2].asList()[1].asString();
    }
    CLEAVE_ASSIGN_OR_RETURN(std::string json, toJson(input, style));
    return Value(std::move(json));
  }
  if (name == "indent") return indent(input, args);
  if (name == "abs") {
    CLEAVE_RETURN_IF_ERROR(noArgs());
    if (input.isFloat()) return Value(std::fabs(input.asDouble()));
    if (input.isNumber()) {
      if (input.asInt() == INT64_MIN) return bad(name, "integer overflow");
      return Value(input.asInt() < 0 ? -input.asInt() : input.asInt());
    }
    return bad(name, absl::StrCat("bad operand type for abs(): '", input.typeName(), "'"));
  }
  if (name == "round") {
    CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"precision", "method"}));
    if (!input.isNumber()) return bad(name, absl::StrCat("cannot round a ", input.typeName()));
    int64_t precision = 0;
    if (!a[0].isUndefined()) {
      CLEAVE_ASSIGN_OR_RETURN(precision, intArg(name, a[0]));
    }
    precision = std::clamp<int64_t>(precision, -30, 30);
    const std::string method = a[1].isString() ? a[1].asString() : "common";
    if (method == "common") {
      // Python's round(): an int stays as it is; a float rounds half to even on its exact
      // binary value, which printf's rounding is.
      if (!input.isFloat() && precision >= 0) return Value(input.asInt());
      if (!input.isFloat()) {
        // An int to a negative precision stays an int: half to even at 10^-precision.
        int64_t unit = 1;
        for (int64_t p = precision; p < 0 && unit <= INT64_MAX / 10; ++p) unit *= 10;
        const int64_t x = input.asInt();
        int64_t q = x / unit, rem = x % unit;
        if (rem < 0) {
          rem += unit;
          --q;
        }
        if (2 * rem > unit || (2 * rem == unit && q % 2 != 0)) ++q;
        int64_t r = 0;
        if (__builtin_mul_overflow(q, unit, &r)) return bad(name, "integer overflow");
        return Value(r);
      }
      if (precision >= 0) {
        char buf[512];
        std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), input.asDouble());
        return Value(std::strtod(buf, nullptr));
      }
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = input.asDouble() * scale;
    const double r = method == "floor"  ? std::floor(x)
                     : method == "ceil" ? std::ceil(x)
                                        : std::nearbyint(x);
    return Value(r / scale);
  }
  if (name == "int" || name == "float") return toNumber(name, input, args);
  if (name == "first" || name == "last") {
    CLEAVE_RETURN_IF_ERROR(noArgs());
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input));
    if (items.empty())
      return Value::undefined(absl::StrCat("no ", name, " item of an empty sequence"));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    CLEAVE_RETURN_IF_ERROR(noArgs());
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input));
    return Value(std::move(items));
  }
  if (name == "items") {
    CLEAVE_RETURN_IF_ERROR(noArgs());
    if (input.isUndefined()) return Value(List{});
    if (!input.isDict()) return bad(name, absl::StrCat("expected a dict, got ", input.typeName()));
    const List pairs = itemPairs(input.asDict());
    return Value(std::move(pairs));
  }
  if (name == "reverse") {
    CLEAVE_RETURN_IF_ERROR(noArgs());
    if (input.isString()) return sliceString(input.asString(), true);
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input));
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "join") {
    CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"d", "attribute"}));
    const std::string separator = a[0].isUndefined() ? "" : a[0].str();
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += separator;
      out += (a[1].isString() ? walkAttribute(items[i], a[1].asString()) : items[i]).str();
      CLEAVE_RETURN_IF_ERROR(checkBuilt(name, static_cast<double>(out.size())));
    }
    return Value(std::move(out));
  }
  if (name == "sort") {
    CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"reverse", "case_sensitive", "attribute"}));
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input));
    CLEAVE_ASSIGN_OR_RETURN(List out, sorted(items, a[2], a[1].truthy(), a[0].truthy()));
    return Value(std::move(out));
  }
  if (name == "unique") {
    CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"case_sensitive", "attribute"}));
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input));
    if (items.size() > 10000) return bad(name, "more than 10000 items");
    List out, seen;
    for (const Value& item : items) {
      const Value key = keyOf(item, a[1], a[0].truthy());
      if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); }))
        continue;
      seen.push_back(key);
      out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "min" || name == "max") return minMax(name, input, args);
  if (name == "dictsort") {
    CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"case_sensitive", "by", "reverse"}));
    if (!input.isDict()) return bad(name, absl::StrCat("expected a dict, got ", input.typeName()));
    const std::string by = a[1].isString() ? a[1].asString() : "key";
    if (by != "key" && by != "value") return bad(name, "by must be 'key' or 'value'");
    const List pairs = itemPairs(input.asDict());
    CLEAVE_ASSIGN_OR_RETURN(
        List out, sorted(pairs, Value(by == "key" ? "0" : "1"), a[0].truthy(), a[2].truthy()));
    return Value(std::move(out));
  }
  if (name == "sum") {
    CLEAVE_ASSIGN_OR_RETURN(auto a, bind(name, args, {"attribute", "start"}));
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input));
    Value total = a[1].isUndefined() ? Value(0) : a[1];
    for (const Value& item : items) {
      const Value v = a[0].isString() ? walkAttribute(item, a[0].asString()) : item;
      if (!v.isNumber() || !total.isNumber())
        return bad(name, absl::StrCat("cannot add a ", v.typeName()));
      if (v.isFloat() || total.isFloat()) {
        total = Value(total.asDouble() + v.asDouble());
        continue;
      }
      int64_t next = 0;
      if (__builtin_add_overflow(total.asInt(), v.asInt(), &next))
        return bad(name, "integer overflow");
      total = Value(next);
    }
    return total;
  }
  if (name == "map") {
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input.truthy() ? input : Value(List{})));
    List out;
    const Value* attribute = nullptr;
    const Value* fallback = nullptr;
    for (const auto& [k, v] : args.keyword) {
      if (k == "attribute") attribute = &v;
      if (k == "default") fallback = &v;
    }
    if (attribute != nullptr) {
      for (const Value& item : items) {
        Value v = walkAttribute(item, attribute->str());
        out.push_back(v.isUndefined() && fallback != nullptr ? *fallback : v);
      }
      return Value(std::move(out));
    }
    if (args.positional.empty()) return bad(name, "needs a filter name or attribute=");
    CLEAVE_ASSIGN_OR_RETURN(std::string filter, stringArg(name, args.positional[0]));
    if (!isFilter(filter)) return bad(name, absl::StrCat("no filter named '", filter, "'"));
    const CallArgs rest = testArgs(args, 0);
    for (const Value& item : items) {
      CLEAVE_ASSIGN_OR_RETURN(Value v, applyFilter(filter, item, rest));
      out.push_back(std::move(v));
    }
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    CLEAVE_ASSIGN_OR_RETURN(List out, selectItems(name, input, args));
    return Value(std::move(out));
  }
  return bad(name, "no such filter");
}

}  // namespace cleave::jinja
