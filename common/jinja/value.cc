#include "common/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/jinja/text.h"

namespace cleave::jinja {

const Value* Dict::find(absl::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

const Value* Dict::findInt(int64_t key) const {
  for (const auto& [k, v] : int_items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::setInt(int64_t key, Value value) {
  for (auto& [k, v] : int_items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  int_items.emplace_back(key, std::move(value));
}

size_t Dict::size() const { return items.size() + int_items.size(); }

std::vector<Value> Dict::keys() const {
  std::vector<Value> out;
  for (const auto& [k, v] : items) out.emplace_back(k);
  for (const auto& [k, v] : int_items) out.emplace_back(k);
  return out;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

namespace {

constexpr int64_t kMaxWeight = int64_t{1} << 62;

int64_t addWeight(int64_t a, int64_t b) {
  return std::min(kMaxWeight, a + std::min(b, kMaxWeight));
}

}  // namespace

Value::Value(List list) : v_(std::make_shared<List>(std::move(list))) {
  depth_ = 1;
  weight_ = 2;
  for (const Value& v : asList()) {
    depth_ = std::max(depth_, v.depth_ + 1);
    weight_ = addWeight(weight_, v.weight_ + 2);
  }
}

Value::Value(Dict dict) : v_(std::make_shared<Dict>(std::move(dict))) {
  depth_ = 1;
  weight_ = 2;
  for (const auto& [k, v] : asDict().items) {
    depth_ = std::max(depth_, v.depth_ + 1);
    weight_ = addWeight(weight_, v.weight_ + static_cast<int64_t>(k.size()) + 6);
  }
  for (const auto& [k, v] : asDict().int_items) {
    depth_ = std::max(depth_, v.depth_ + 1);
    weight_ = addWeight(weight_, v.weight_ + 24);
  }
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return asBool();
    case Kind::kInt: return asInt() != 0;
    case Kind::kFloat: return asDouble() != 0.0;
    case Kind::kString: return !asString().empty();
    case Kind::kList: return !asList().empty();
    case Kind::kDict: return asDict().size() > 0;
    case Kind::kNamespace:
    case Kind::kFunction: return true;
  }
  return false;
}

std::string formatFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits, as d.ddde±x.
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, end);
  const size_t e = sci.find('e');
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string mantissa = sci.substr(0, e);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(static_cast<size_t>(exponent + 1) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exponent) + 1) + "." +
            digits.substr(static_cast<size_t>(exponent) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  }
  return negative ? "-" + out : out;
}

namespace {

// Whether Python's str.isprintable() holds for `c` (control, format and separator
// characters other than the space are not; the common ones are listed).
bool printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if (c == 0x1680 || c == 0x180e || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
      (c >= 0x205f && c <= 0x206f) || c == 0x3000 || c == 0xfeff) {
    return false;
  }
  return true;
}

// Python's repr of a str: single quotes unless the text holds ' and no ", escapes for
// backslashes, the quote and characters that are not printable; others as they are.
std::string reprString(const std::string& s) {
  const bool double_quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = double_quote ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : text::decode(s)) {
    char hex[16];
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == static_cast<char32_t>(quote)) {
          out += '\\';
          out += quote;
        } else if (printable(c)) {
          out += text::encode(std::u32string(1, c));
        } else {
          std::snprintf(hex, sizeof hex, c < 0x100 ? "\\x%02x" : "\\u%04x",
                        static_cast<unsigned>(c));
          out += hex;
        }
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::str() const {
  switch (kind()) {
    case Kind::kUndefined: return "";
    case Kind::kString: return asString();
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind()) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return asBool() ? "True" : "False";
    case Kind::kInt: return absl::StrCat(asInt());
    case Kind::kFloat: return formatFloat(asDouble());
    case Kind::kString: return reprString(asString());
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < asList().size(); ++i) {
        if (i > 0) out += ", ";
        out += asList()[i].repr();
      }
      if (tuple_ && asList().size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : asDict().items) {
        if (!first) out += ", ";
        first = false;
        out += reprString(k) + ": " + v.repr();
      }
      for (const auto& [k, v] : asDict().int_items) {
        if (!first) out += ", ";
        first = false;
        out += absl::StrCat(k, ": ", v.repr());
      }
      return out + "}";
    }
    case Kind::kNamespace: return "<Namespace>";
    case Kind::kFunction: return "<function>";
  }
  return "";
}

std::string Value::typeName() const {
  switch (kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return tuple_ ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kFunction: return "function";
  }
  return "";
}

bool equal(const Value& a, const Value& b) {
  if (a.isNumber() && b.isNumber()) {
    if (a.isFloat() || b.isFloat()) return a.asDouble() == b.asDouble();
    return a.asInt() == b.asInt();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.asString() == b.asString();
    case Value::Kind::kList: {
      const List& x = a.asList();
      const List& y = b.asList();
      if (x.size() != y.size() || a.isTuple() != b.isTuple()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equal(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = a.asDict();
      const Dict& y = b.asDict();
      if (x.items.size() != y.items.size() || x.int_items.size() != y.int_items.size())
        return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (other == nullptr || !equal(v, *other)) return false;
      }
      for (const auto& [k, v] : x.int_items) {
        const Value* other = y.findInt(k);
        if (other == nullptr || !equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return &a.asNamespace() == &b.asNamespace();
    case Value::Kind::kFunction: return &a.asFunction() == &b.asFunction();
    default: return false;
  }
}

absl::StatusOr<bool> less(const Value& a, const Value& b) {
  if (a.isNumber() && b.isNumber()) {
    if (a.isFloat() || b.isFloat()) return a.asDouble() < b.asDouble();
    return a.asInt() < b.asInt();
  }
  if (a.isString() && b.isString()) return a.asString() < b.asString();  // UTF-8: code point order
  if (a.isList() && b.isList()) {
    const List& x = a.asList();
    const List& y = b.asList();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equal(x[i], y[i])) continue;
      return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' is not supported between instances of '",
                                                 a.typeName(), "' and '", b.typeName(), "'"));
}

namespace {

// One ASCII character of a JSON string, escaped as Python's json module does.
void jsonChar(unsigned char c, std::string& out) {
  switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
      if (c < 0x20) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\u%04x", c);
        out += hex;
      } else {
        out += static_cast<char>(c);
      }
  }
}

void jsonString(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  if (!ensure_ascii) {
    for (unsigned char c : s) jsonChar(c, out);
  } else {
    for (char32_t c : text::decode(s)) {
      char hex[16];
      if (c < 0x80) {
        jsonChar(static_cast<unsigned char>(c), out);
        continue;
      }
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        std::snprintf(hex, sizeof hex, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                      static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
      } else {
        std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(c));
      }
      out += hex;
    }
  }
  out += '"';
}

absl::Status json(const Value& v, const JsonStyle& style, int depth, std::string& out) {
  const int indent = style.indent;
  if (depth > 256) return absl::InvalidArgumentError("tojson: nesting deeper than 256 levels");
  const auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
  };
  const std::string separator = !style.item_separator.empty() ? style.item_separator
                                : indent < 0                  ? ", "
                                                              : ",";
  const std::string key_separator = !style.key_separator.empty() ? style.key_separator : ": ";
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return absl::OkStatus();
    case Value::Kind::kBool: out += v.asBool() ? "true" : "false"; return absl::OkStatus();
    case Value::Kind::kInt: out += absl::StrCat(v.asInt()); return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double f = v.asDouble();
      out += std::isnan(f)   ? "NaN"
             : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity")
                             : formatFloat(f);
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      jsonString(v.asString(), style.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      const List& list = v.asList();
      if (list.empty()) {
        out += "[]";
        return absl::OkStatus();
      }
      out += '[';
      for (size_t i = 0; i < list.size(); ++i) {
        if (i > 0) out += separator;
        newline(depth + 1);
        if (auto s = json(list[i], style, depth + 1, out); !s.ok()) return s;
      }
      newline(depth);
      out += ']';
      return absl::OkStatus();
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      if (v.isNamespace()) break;
      const Dict& dict = v.asDict();
      if (dict.size() == 0) {
        out += "{}";
        return absl::OkStatus();
      }
      out += '{';
      // json.dumps writes int keys as strings.
      std::vector<std::pair<std::string, Value>> int_keyed;
      for (const auto& [k, item] : dict.int_items) int_keyed.emplace_back(absl::StrCat(k), item);
      std::vector<const std::pair<std::string, Value>*> order;
      for (const auto& entry : dict.items) order.push_back(&entry);
      for (const auto& entry : int_keyed) order.push_back(&entry);
      if (style.sort_keys) {
        std::stable_sort(order.begin(), order.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      bool first = true;
      for (const auto* entry : order) {
        if (!first) out += separator;
        first = false;
        newline(depth + 1);
        jsonString(entry->first, style.ensure_ascii, out);
        out += key_separator;
        if (auto s = json(entry->second, style, depth + 1, out); !s.ok()) return s;
      }
      newline(depth);
      out += '}';
      return absl::OkStatus();
    }
    default: break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tojson: Object of type ", v.typeName(), " is not JSON serializable"));
}

}  // namespace

absl::StatusOr<std::string> toJson(const Value& value, const JsonStyle& style) {
  std::string out;
  if (auto s = json(value, style, 0, out); !s.ok()) return s;
  return out;
}

}  // namespace cleave::jinja
