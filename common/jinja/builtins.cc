#include "common/jinja/builtins.h"

#include <algorithm>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "common/jinja/arguments.h"
#include "common/jinja/text.h"
#include "common/status_macros.h"

namespace cleave::jinja {

using namespace args;  // NOLINT: the argument helpers every builtin uses

absl::StatusOr<List> iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return List{};
    case Value::Kind::kList: return value.asList();
    case Value::Kind::kDict: {
      List keys;
      for (Value& k : value.asDict().keys()) keys.push_back(std::move(k));
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
    if (arg.isDict()) {
      if (input.isInt()) return arg.asDict().findInt(input.asInt()) != nullptr;
      return input.isString() && arg.asDict().find(input.asString()) != nullptr;
    }
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(arg));
    return std::any_of(items.begin(), items.end(), [&](const Value& v) { return equal(v, input); });
  }
  return bad(name, "no such test");
}

namespace {

// A method bound to `self`: its arguments checked by `fn`.
Value bound(Value self, std::function<absl::StatusOr<Value>(const Value&, const CallArgs&)> fn) {
  const Value captured = self;
  return Value::function(
      [self = std::move(self), fn = std::move(fn)](const CallArgs& args) { return fn(self, args); },
      &captured);
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
  if (name == "format") {
    // str.format with plain fields: {}, {0}, {name}; {{ and }} are braces. No format specs.
    return bound(self, [what](const Value& s, const CallArgs& args) -> absl::StatusOr<Value> {
      const std::string& f = s.asString();
      std::string out;
      size_t next_auto = 0;
      for (size_t i = 0; i < f.size(); ++i) {
        if ((f[i] == '{' || f[i] == '}') && i + 1 < f.size() && f[i + 1] == f[i]) {
          out += f[i++];
          continue;
        }
        if (f[i] == '}') return bad(what, "single '}' in the format string");
        if (f[i] != '{') {
          out += f[i];
          continue;
        }
        const size_t close = f.find('}', i);
        if (close == std::string::npos) return bad(what, "unmatched '{' in the format string");
        const std::string field = f.substr(i + 1, close - i - 1);
        i = close;
        const Value* value = nullptr;
        if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
          const size_t index = field.empty() ? next_auto++ : std::stoul(field.substr(0, 9));
          if (index < args.positional.size()) value = &args.positional[index];
        } else {
          for (const auto& [k, v] : args.keyword) {
            if (k == field) value = &v;
          }
        }
        if (value == nullptr)
          return bad(what, absl::StrCat("no argument for the field '{", field, "}'"));
        out += value->str();
        CLEAVE_RETURN_IF_ERROR(checkBuilt(what, static_cast<double>(out.size())));
      }
      return Value(std::move(out));
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
      const Dict& dict = d.asDict();
      const std::vector<Value> keys = dict.keys();
      for (size_t i = 0; i < keys.size(); ++i) {
        const Value& v = i < dict.items.size() ? dict.items[i].second
                                               : dict.int_items[i - dict.items.size()].second;
        if (name == "items") out.push_back(Value::tuple(List{keys[i], v}));
        if (name == "keys") out.push_back(keys[i]);
        if (name == "values") out.push_back(v);
      }
      return Value(std::move(out));
    });
  }
  if (name == "get") {
    return bound(self, [what](const Value& d, const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(auto a, bind(what, args, {"key", "default"}));
      const Value* found = a[0].isString() ? d.asDict().find(a[0].asString())
                           : a[0].isInt()  ? d.asDict().findInt(a[0].asInt())
                                           : nullptr;
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
  if (object.isDict() && key.isNumber() && !key.isFloat()) {
    if (const Value* v = object.asDict().findInt(key.asInt())) return *v;
    return Value::undefined(absl::StrCat("'dict object' has no item ", key.asInt()));
  }
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
