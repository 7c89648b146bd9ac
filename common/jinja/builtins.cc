#include "common/jinja/builtins.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "common/jinja/text.h"
#include "common/status_macros.h"

namespace cleave::jinja {
namespace {

absl::Status bad(absl::string_view what, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
}

// No filter or method builds a str longer than this (a template's own limits are lower;
// this keeps one call from allocating without bound before they are checked).
constexpr double kMaxBuiltBytes = 64 << 20;

absl::Status checkBuilt(absl::string_view what, double bytes) {
  if (bytes > kMaxBuiltBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": result larger than 64 MiB"));
  }
  return absl::OkStatus();
}

// The size of s.replace(from, to, count) before building it.
absl::Status checkReplace(absl::string_view what, const std::string& s, const std::string& from,
                          const std::string& to, int64_t count) {
  double hits = static_cast<double>(text::count(s, from));
  if (count >= 0) hits = std::min(hits, static_cast<double>(count));
  return checkBuilt(what, static_cast<double>(s.size()) + hits * static_cast<double>(to.size()));
}

// Positional and keyword arguments matched to `names` (Python's binding): a value per
// name, Undefined where not given. Errors for extra or unknown arguments.
absl::StatusOr<std::vector<Value>> bind(absl::string_view what, const CallArgs& args,
                                        std::initializer_list<const char*> names) {
  std::vector<Value> out(names.size());
  if (args.positional.size() > names.size()) {
    return bad(what, absl::StrCat("takes at most ", names.size(), " arguments, got ",
                                  args.positional.size()));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (const char* n : names) {
      if (key == n) break;
      ++i;
    }
    if (i == names.size())
      return bad(what, absl::StrCat("unexpected keyword argument '", key, "'"));
    out[i] = value;
  }
  return out;
}

absl::StatusOr<std::string> stringArg(absl::string_view what, const Value& v) {
  if (!v.isString()) return bad(what, absl::StrCat("expected a str, got ", v.typeName()));
  return v.asString();
}

absl::StatusOr<int64_t> intArg(absl::string_view what, const Value& v) {
  if (!v.isInt() && !v.isBool())
    return bad(what, absl::StrCat("expected an int, got ", v.typeName()));
  return v.asInt();
}

std::optional<std::string> optionalString(const Value& v) {
  if (v.isString()) return v.asString();
  return std::nullopt;
}

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

absl::StatusOr<List> selectItems(const std::string& filter, const Value& input,
                                 const CallArgs& args) {
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
  const std::string s = text::strip(input.asString(), std::nullopt, true, true);
  if (s.empty()) return fallback;
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

absl::StatusOr<Value> sliceString(const std::string& s, bool reverse) {
  std::u32string t = text::decode(s);
  if (reverse) std::reverse(t.begin(), t.end());
  return Value(text::encode(t));
}

}  // namespace

absl::StatusOr<List> iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return List{};
    case Value::Kind::kList: return value.asList();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, v] : value.asDict().items) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (char32_t c : text::decode(value.asString()))
        chars.emplace_back(text::encode(std::u32string(1, c)));
      return chars;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("'", value.typeName(), "' object is not iterable"));
  }
}

bool isFilter(absl::string_view name) {
  static const char* kNames[] = {"abs",    "capitalize", "count",   "d",       "default",  "first",
                                 "float",  "indent",     "int",     "items",   "join",     "last",
                                 "length", "list",       "lower",   "map",     "max",      "min",
                                 "reject", "rejectattr", "replace", "reverse", "round",    "safe",
                                 "select", "selectattr", "sort",    "string",  "sum",      "title",
                                 "tojson", "trim",       "unique",  "upper",   "wordcount"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool isTest(absl::string_view name) {
  static const char* kNames[] = {
      "boolean", "callable", "defined",  "divisibleby", "eq",          "equalto",
      "even",    "false",    "float",    "ge",          "greaterthan", "gt",
      "in",      "integer",  "iterable", "le",          "lessthan",    "lower",
      "lt",      "mapping",  "ne",       "none",        "number",      "odd",
      "sameas",  "sequence", "string",   "true",        "undefined",   "upper",
      "==",      "!=",       "<",        "<=",          ">",           ">="};
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
  if (name == "safe") return input;
  if (name == "length" || name == "count") {
    CLEAVE_RETURN_IF_ERROR(noArgs());
    switch (input.kind()) {
      case Value::Kind::kUndefined: return Value(0);
      case Value::Kind::kString: return Value(static_cast<int64_t>(text::length(input.asString())));
      case Value::Kind::kList: return Value(static_cast<int64_t>(input.asList().size()));
      case Value::Kind::kDict: return Value(static_cast<int64_t>(input.asDict().items.size()));
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
    List pairs;
    for (const auto& [k, v] : input.asDict().items)
      pairs.push_back(Value::tuple(List{Value(k), v}));
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
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(input));
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

absl::StatusOr<bool> applyTest(const std::string& name, const Value& input, const CallArgs& args) {
  const Value arg = args.positional.empty() ? Value() : args.positional[0];
  if (name == "defined") return !input.isUndefined();
  if (name == "undefined") return input.isUndefined();
  if (name == "none") return input.isNone();
  if (name == "boolean") return input.isBool();
  if (name == "true") return input.isBool() && input.asBool();
  if (name == "false") return input.isBool() && !input.asBool();
  if (name == "integer") return input.isInt();
  if (name == "float") return input.isFloat();
  if (name == "number") return input.isNumber();
  if (name == "string") return input.isString();
  if (name == "mapping") return input.isDict();
  if (name == "iterable")
    return input.isString() || input.isList() || input.isDict() || input.isUndefined();
  if (name == "sequence") return input.isString() || input.isList() || input.isDict();
  if (name == "callable") return input.isFunction();
  if (name == "lower" || name == "upper") {
    // str.islower / isupper: no character of the other case, and at least one cased one.
    if (!input.isString()) return false;
    const std::string& s = input.asString();
    const bool cased = text::lower(s) != text::upper(s);
    return cased && (name == "lower" ? text::lower(s) == s : text::upper(s) == s);
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(input, arg);
  if (name == "ne" || name == "!=") return !equal(input, arg);
  if (name == "sameas") {
    if (input.kind() != arg.kind()) return false;
    if (input.isNone() || input.isUndefined()) return true;
    if (input.isBool()) return input.asBool() == arg.asBool();
    return equal(input, arg);
  }
  if (name == "lt" || name == "lessthan" || name == "<") return less(input, arg);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(arg, input);
  if (name == "le" || name == "<=") {
    CLEAVE_ASSIGN_OR_RETURN(bool greater, less(arg, input));
    return !greater;
  }
  if (name == "ge" || name == ">=") {
    CLEAVE_ASSIGN_OR_RETURN(bool smaller, less(input, arg));
    return !smaller;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    CLEAVE_ASSIGN_OR_RETURN(int64_t n, intArg(name, input));
    if (name == "odd") return n % 2 != 0;
    if (name == "even") return n % 2 == 0;
    CLEAVE_ASSIGN_OR_RETURN(int64_t d, intArg(name, arg));
    if (d == 0) return bad(name, "division by zero");
    return d == -1 || n % d == 0;
  }
  if (name == "in") {
    if (arg.isString() && input.isString())
      return arg.asString().find(input.asString()) != std::string::npos;
    if (arg.isDict()) return input.isString() && arg.asDict().find(input.asString()) != nullptr;
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(arg));
    return std::any_of(items.begin(), items.end(), [&](const Value& v) { return equal(v, input); });
  }
  return bad(name, "no such test");
}

namespace {

// A method bound to `self`: its arguments checked by `fn`.
Value bound(Value self, std::function<absl::StatusOr<Value>(const Value&, const CallArgs&)> fn) {
  return Value::function([self = std::move(self), fn = std::move(fn)](const CallArgs& args) {
    return fn(self, args);
  });
}

Value stringMethod(const Value& self, const std::string& name) {
  const std::string what = absl::StrCat("str.", name);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return bound(self, [name, what](const Value& s, const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(auto a, bind(what, args, {"chars"}));
      return Value(
          text::strip(s.asString(), optionalString(a[0]), name != "rstrip", name != "lstrip"));
    });
  }
  if (name == "split") {
    return bound(self, [what](const Value& s, const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(auto a, bind(what, args, {"sep", "maxsplit"}));
      int64_t maxsplit = -1;
      if (!a[1].isUndefined()) {
        CLEAVE_ASSIGN_OR_RETURN(maxsplit, intArg(what, a[1]));
      }
      const std::optional<std::string> sep = optionalString(a[0]);
      if (sep && sep->empty()) return bad(what, "empty separator");
      List parts;
      for (auto& p : text::split(s.asString(), sep, maxsplit)) parts.emplace_back(std::move(p));
      return Value(std::move(parts));
    });
  }
  if (name == "startswith" || name == "endswith") {
    return bound(self, [name, what](const Value& s, const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(auto a, bind(what, args, {"prefix"}));
      List options = a[0].isList() ? a[0].asList() : List{a[0]};
      for (const Value& o : options) {
        CLEAVE_ASSIGN_OR_RETURN(std::string p, stringArg(what, o));
        const std::string& str = s.asString();
        const bool hit =
            name == "startswith"
                ? str.compare(0, p.size(), p) == 0
                : str.size() >= p.size() && str.compare(str.size() - p.size(), p.size(), p) == 0;
        if (hit) return Value(true);
      }
      return Value(false);
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
      name == "splitlines" || name == "isdigit" || name == "isspace" || name == "isalpha") {
    return bound(self, [name, what](const Value& s, const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(auto a, bind(what, args, {}));
      const std::string& str = s.asString();
      if (name == "upper") return Value(text::upper(str));
      if (name == "lower") return Value(text::lower(str));
      if (name == "title") return Value(text::pythonTitle(str));
      if (name == "capitalize") return Value(text::capitalize(str));
      if (name == "splitlines") {
        List lines;
        for (auto& l : text::splitlines(str)) lines.emplace_back(std::move(l));
        return Value(std::move(lines));
      }
      const std::u32string t = text::decode(str);
      if (t.empty()) return Value(false);
      return Value(std::all_of(t.begin(), t.end(), [&](char32_t c) {
        if (name == "isdigit") return c >= '0' && c <= '9';
        if (name == "isspace") return text::isSpace(c);
        return text::toUpper(c) != text::toLower(c);
      }));
    });
  }
  if (name == "replace") {
    return bound(self, [what](const Value& s, const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(auto a, bind(what, args, {"old", "new", "count"}));
      CLEAVE_ASSIGN_OR_RETURN(std::string from, stringArg(what, a[0]));
      CLEAVE_ASSIGN_OR_RETURN(std::string to, stringArg(what, a[1]));
      int64_t n = -1;
      if (!a[2].isUndefined()) {
        CLEAVE_ASSIGN_OR_RETURN(n, intArg(what, a[2]));
      }
      CLEAVE_RETURN_IF_ERROR(checkReplace(what, s.asString(), from, to, n));
      return Value(text::replace(s.asString(), from, to, n));
    });
  }
  if (name == "find" || name == "count") {
    return bound(self, [name, what](const Value& s, const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(auto a, bind(what, args, {"sub"}));
      CLEAVE_ASSIGN_OR_RETURN(std::string part, stringArg(what, a[0]));
      return Value(name == "find" ? text::find(s.asString(), part)
                                  : text::count(s.asString(), part));
    });
  }
  if (name == "join") {
    return bound(self, [what](const Value& s, const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(auto a, bind(what, args, {"iterable"}));
      CLEAVE_ASSIGN_OR_RETURN(List items, iterate(a[0]));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        CLEAVE_ASSIGN_OR_RETURN(std::string item, stringArg(what, items[i]));
        if (i > 0) out += s.asString();
        out += item;
        CLEAVE_RETURN_IF_ERROR(checkBuilt(what, static_cast<double>(out.size())));
      }
      return Value(std::move(out));
    });
  }
  return Value::undefined(absl::StrCat("str object has no attribute '", name, "'"));
}

Value dictMethod(const Value& self, const std::string& name) {
  const std::string what = absl::StrCat("dict.", name);
  if (name == "items" || name == "keys" || name == "values") {
    return bound(self, [name, what](const Value& d, const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(auto a, bind(what, args, {}));
      List out;
      for (const auto& [k, v] : d.asDict().items) {
        if (name == "items") out.push_back(Value::tuple(List{Value(k), v}));
        if (name == "keys") out.emplace_back(k);
        if (name == "values") out.push_back(v);
      }
      return Value(std::move(out));
    });
  }
  if (name == "get") {
    return bound(self, [what](const Value& d, const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(auto a, bind(what, args, {"key", "default"}));
      const Value* found = a[0].isString() ? d.asDict().find(a[0].asString()) : nullptr;
      if (found != nullptr) return *found;
      return a[1].isUndefined() ? Value::none() : a[1];
    });
  }
  return Value();
}

}  // namespace

Value getAttribute(const Value& object, const std::string& name) {
  if (object.isString()) return stringMethod(object, name);
  if (object.isDict()) {
    Value method = dictMethod(object, name);
    if (!method.isUndefined()) return method;
    if (const Value* v = object.asDict().find(name)) return *v;
  }
  if (object.isNamespace()) {
    if (const Value* v = object.asNamespace().attributes.find(name)) return *v;
  }
  return Value::undefined(
      absl::StrCat("'", object.typeName(), " object' has no attribute '", name, "'"));
}

Value getItem(const Value& object, const Value& key) {
  if (key.isNumber() && !key.isFloat() && (object.isList() || object.isString())) {
    int64_t i = key.asInt();
    if (object.isList()) {
      const auto n = static_cast<int64_t>(object.asList().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return object.asList()[static_cast<size_t>(i)];
    } else {
      const std::u32string t = text::decode(object.asString());
      const auto n = static_cast<int64_t>(t.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value(text::encode(t.substr(static_cast<size_t>(i), 1)));
    }
    return Value::undefined(absl::StrCat(object.typeName(), " index out of range"));
  }
  if (key.isString()) {
    if (object.isDict()) {
      if (const Value* v = object.asDict().find(key.asString())) return *v;
    }
    return getAttribute(object, key.asString());
  }
  return Value::undefined(
      absl::StrCat("'", object.typeName(), " object' has no item ", key.repr()));
}

const Dict& globals() {
  static const Dict* kGlobals = [] {
    auto* d = new Dict;
    d->set("range", Value::function([](const CallArgs& args) -> absl::StatusOr<Value> {
             if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
               return bad("range", "takes 1 to 3 positional arguments");
             }
             int64_t v[3] = {0, 0, 1};
             for (size_t i = 0; i < args.positional.size(); ++i) {
               CLEAVE_ASSIGN_OR_RETURN(v[i], intArg("range", args.positional[i]));
             }
             if (args.positional.size() == 1) std::swap(v[0], v[1]);
             if (v[2] == 0) return bad("range", "step must not be zero");
             List out;
             for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1];) {
               if (out.size() >= 100000) return bad("range", "more than 100000 items");
               out.emplace_back(i);
               if (__builtin_add_overflow(i, v[2], &i)) break;
             }
             return Value(std::move(out));
           }));
    const auto keywordDict = [](absl::string_view what,
                                const CallArgs& args) -> absl::StatusOr<Dict> {
      Dict attributes;
      if (args.positional.size() > 1) return bad(what, "takes at most one positional argument");
      if (!args.positional.empty()) {
        if (!args.positional[0].isDict()) return bad(what, "expected a dict");
        attributes = args.positional[0].asDict();
      }
      for (const auto& [k, v] : args.keyword) attributes.set(k, v);
      return attributes;
    };
    d->set("namespace",
           Value::function([keywordDict](const CallArgs& args) -> absl::StatusOr<Value> {
             CLEAVE_ASSIGN_OR_RETURN(Dict attributes, keywordDict("namespace", args));
             for (const auto& [k, v] : attributes.items) {
               if (!k.empty() && k[0] == '_') {
                 return bad("namespace",
                            absl::StrCat("attribute '", k, "' starts with an underscore"));
               }
             }
             return Value::makeNamespace(std::move(attributes));
           }));
    d->set("dict", Value::function([keywordDict](const CallArgs& args) -> absl::StatusOr<Value> {
             CLEAVE_ASSIGN_OR_RETURN(Dict attributes, keywordDict("dict", args));
             return Value(std::move(attributes));
           }));
    d->set("raise_exception", Value::function([](const CallArgs& args) -> absl::StatusOr<Value> {
             const std::string message = args.positional.empty() ? "" : args.positional[0].str();
             return absl::InvalidArgumentError(absl::StrCat(kRaisedPrefix, message));
           }));
    d->set("strftime_now", Value::function([](const CallArgs& args) -> absl::StatusOr<Value> {
             CLEAVE_ASSIGN_OR_RETURN(auto a, bind("strftime_now", args, {"format"}));
             CLEAVE_ASSIGN_OR_RETURN(std::string format, stringArg("strftime_now", a[0]));
             const std::time_t now = std::time(nullptr);
             std::tm local{};
             localtime_r(&now, &local);
             char buf[256];
             const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
             return Value(std::string(buf, n));
           }));
    return d;
  }();
  return *kGlobals;
}

}  // namespace cleave::jinja
