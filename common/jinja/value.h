// The values a template computes with, with Python's meaning: chat templates are Jinja2
// as Python runs it, so `str()`, `==`, `<`, truthiness, `+` and JSON output follow
// CPython (what `{{ 7 / 2 }}` or `{{ [1, 'a'] }}` prints, that `1 == 1.0`, that a list
// compares element by element).
//
// Lists, dicts and namespaces are shared by reference like Python's; the rest are plain
// values. Dict keys are strings (what JSON and chat templates use). Undefined is Jinja's
// default Undefined: it prints as nothing, is false and iterates as empty, and any other
// use is an error naming the missing variable or key.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cleave::jinja {

class Value;
using List = std::vector<Value>;

// Insertion-ordered map (Python dicts keep insertion order; chat data is small, so lookups
// are linear). Keys are strs, or ints (a template's `{512: 128}`), kept apart: in iteration
// the int keys follow the str keys.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  std::vector<std::pair<int64_t, Value>> int_items;
  const Value* find(absl::string_view key) const;
  const Value* findInt(int64_t key) const;
  void set(const std::string& key, Value value);
  void setInt(int64_t key, Value value);
  size_t size() const;
  // Every key as a Value, in iteration order.
  std::vector<Value> keys() const;
};

// `namespace(...)`: the one object a template may assign attributes to.
struct Namespace {
  Dict attributes;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<absl::StatusOr<Value>(const CallArgs&)>;

struct Undefined {
  std::string name;  // What was looked up, for the error its use raises.
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };

  Value() : v_(Undefined{}) {}
  static Value undefined(std::string name) { return Value(Undefined{std::move(name)}); }
  static Value none() { return Value(Variant(std::in_place_index<1>, nullptr)); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(double f) : v_(f) {}
  Value(std::string s)
      : v_(std::make_shared<const std::string>(std::move(s))),
        weight_(static_cast<int64_t>(asString().size()) + 2) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(List list);
  Value(Dict dict);
  // A str marked safe (`|safe`: markupsafe's Markup): a plain str added to it is
  // HTML-escaped first, as Jinja does even without autoescaping.
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  // A Python tuple: a list that prints as "(a, b)" / "(a,)".
  static Value tuple(List items) {
    Value v(std::move(items));
    v.tuple_ = true;
    return v;
  }
  // `captured`: what the function holds (a bound method's object), so chains of functions
  // count towards depth and weight.
  static Value function(Function f, const Value* captured = nullptr) {
    Value v(std::make_shared<Function>(std::move(f)));
    if (captured != nullptr) {
      v.depth_ = captured->depth_ + 1;
      v.weight_ = captured->weight_ + 8;
    }
    return v;
  }
  static Value makeNamespace(Dict attributes) {
    return Value(std::make_shared<Namespace>(Namespace{std::move(attributes)}));
  }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool isUndefined() const { return kind() == Kind::kUndefined; }
  bool isNone() const { return kind() == Kind::kNone; }
  bool isBool() const { return kind() == Kind::kBool; }
  bool isInt() const { return kind() == Kind::kInt; }
  bool isFloat() const { return kind() == Kind::kFloat; }
  // int, float or bool (a bool is a number in Python).
  bool isNumber() const { return isInt() || isFloat() || isBool(); }
  bool isString() const { return kind() == Kind::kString; }
  bool isList() const { return kind() == Kind::kList; }
  bool isTuple() const { return tuple_; }
  // What printing this value could write, in bytes, roughly: a str's length, 8 for a
  // scalar, a list's or dict's items summed (a shared item counted each time it appears, as
  // printing it would), saturating at 2^62.
  int64_t weight() const { return weight_; }
  bool isMarkup() const { return markup_; }
  int depth() const { return depth_; }
  bool isDict() const { return kind() == Kind::kDict; }
  bool isNamespace() const { return kind() == Kind::kNamespace; }
  bool isFunction() const { return kind() == Kind::kFunction; }

  bool asBool() const { return std::get<bool>(v_); }
  int64_t asInt() const { return isBool() ? int64_t{asBool()} : std::get<int64_t>(v_); }
  double asDouble() const {
    return isFloat() ? std::get<double>(v_) : static_cast<double>(asInt());
  }
  const std::string& asString() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  const List& asList() const { return *std::get<std::shared_ptr<List>>(v_); }
  List& mutableList() const { return *std::get<std::shared_ptr<List>>(v_); }
  const Dict& asDict() const { return *std::get<std::shared_ptr<Dict>>(v_); }
  Namespace& asNamespace() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  const Function& asFunction() const { return *std::get<std::shared_ptr<Function>>(v_); }
  const std::string& undefinedName() const { return std::get<Undefined>(v_).name; }

  // Python's bool().
  bool truthy() const;
  // Python's str(): what `{{ value }}` prints (Undefined prints nothing).
  std::string str() const;
  // Python's repr() (str() of a list or dict shows its items so).
  std::string repr() const;
  // Python's type name ("str", "int", "list", "dict", "NoneType"...), for error messages.
  std::string typeName() const;

 private:
  // Strings are shared, not copied, when a value is (templates pass contents around).
  using Variant =
      std::variant<Undefined, std::nullptr_t, bool, int64_t, double,
                   std::shared_ptr<const std::string>, std::shared_ptr<List>, std::shared_ptr<Dict>,
                   std::shared_ptr<Namespace>, std::shared_ptr<Function>>;
  explicit Value(Variant v) : v_(std::move(v)) {}
  Variant v_;
  bool tuple_ = false;
  bool markup_ = false;
  // Lists and dicts: 1 + the deepest item's depth (a namespace counts as 1), so a template
  // cannot build nesting deep enough to overflow the stack when printed or freed.
  int depth_ = 0;
  int64_t weight_ = 8;
};

// Python's ==: numbers by value (1 == 1.0 == True), strings, lists and dicts by content,
// functions and namespaces by identity; different kinds are unequal.
bool equal(const Value& a, const Value& b);
// Python's <: numbers, strings (by code point), lists element by element; else an error.
absl::StatusOr<bool> less(const Value& a, const Value& b);

// Python's repr(float): the shortest digits that read back to the same double, in fixed
// notation with at least one decimal ("2.0", "0.30000000000000004") for exponents -4..15,
// else scientific ("1e+16", "1.5e-05"); "inf", "nan".
std::string formatFloat(double f);

// json.dumps's options: indent < 0 is None; empty separators are Python's defaults (", "
// and ": " without an indent, "," with one).
struct JsonStyle {
  int indent = -1;
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
  bool ensure_ascii = false;  // non-ASCII characters as \uXXXX escapes
};

// json.dumps(value, ...) as Python writes it.
absl::StatusOr<std::string> toJson(const Value& value, const JsonStyle& style = {});

}  // namespace cleave::jinja
