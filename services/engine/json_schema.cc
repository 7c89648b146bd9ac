#include "services/engine/json_schema.h"
#include "services/engine/json_grammar_inl.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace cleave::engine {

using Json = nlohmann::json;

// Builds a JsonSchema's nodes from a schema document, one per schema object reached. A
// $ref becomes a node of its own, and so does a union; their kinds come from their target
// or branches once everything is compiled (settle()), so recursion through either is a
// cycle of node indices.
namespace {

// Whether a string of node `n`, `written` characters in and its pattern's automaton at
// `state`, can still end as a match of a length n allows.
bool lengthsFit(const RegexDfa& dfa, int32_t state, uint32_t written, const JsonSchema::Node& n) {
  const uint32_t fewest = dfa.charsToAccept(state), most = dfa.longestToAccept(state);
  return fewest != RegexDfa::kNever && uint64_t{written} + fewest <= n.max_length &&
         (most == RegexDfa::kUnbounded || uint64_t{written} + most >= n.min_length);
}

}  // namespace

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& document) : document_(document) {}

  absl::StatusOr<std::shared_ptr<const JsonSchema>> run() {
    auto schema = std::make_shared<JsonSchema>();
    nodes_ = &schema->nodes_;
    patterns_ = &schema->patterns_;
    absl::StatusOr<int32_t> root = compile(document_, "", 0);
    if (!root.ok()) return root.status();
    if (absl::Status settled = settle(); !settled.ok()) return settled;
    // Each discriminated branch in the place of the value it fixes.
    for (const Discriminated& d : discriminated_) {
      const std::string text = constantOf(d.schema, discriminator_names_[d.discriminator])->dump();
      const std::vector<std::string>& values = at(at(d.discriminator).values[0]).literals;
      const auto place = std::lower_bound(values.begin(), values.end(), text);
      at(d.discriminator).branches[static_cast<size_t>(place - values.begin())] = d.branch;
    }
    if (*root != 0 || at(0).kinds[JsonSchema::kObject] < 0) {
      return absl::UnimplementedError(
          "a JSON schema output must be an object at its root (\"type\": \"object\")");
    }
    return std::shared_ptr<const JsonSchema>(std::move(schema));
  }

  static JsonSchema::Kind kindOf(uint8_t c) {
    switch (c) {
      case '{': return JsonSchema::kObject;
      case '[': return JsonSchema::kArray;
      case '"': return JsonSchema::kString;
      case 't': return JsonSchema::kTrue;
      case 'f': return JsonSchema::kFalse;
      case 'n': return JsonSchema::kNull;
      default: return JsonSchema::kNumber;
    }
  }

 private:
  using Node = JsonSchema::Node;

  // A node whose kinds are those of `from` (a $ref's target, or a union's branches).
  struct Alias {
    int32_t node;
    std::vector<int32_t> from;
    std::string path;
    std::string keyword;
    bool objects_discriminated = false;  // Its objects go to a discriminator node instead.
  };

  // Keywords that say nothing about which values are instances.
  static bool annotation(const std::string& keyword) {
    static const std::set<std::string> kAnnotations = {
        "title",     "description", "default",     "examples",     "format",
        "$schema",   "$id",         "$comment",    "deprecated",   "readOnly",
        "writeOnly", "$defs",       "definitions", "discriminator"};
    return kAnnotations.contains(keyword);
  }
  static bool followed(const std::string& keyword) {
    static const std::set<std::string> kFollowed = {"type",
                                                    "enum",
                                                    "const",
                                                    "properties",
                                                    "required",
                                                    "additionalProperties",
                                                    "items",
                                                    "prefixItems",
                                                    "minItems",
                                                    "maxItems",
                                                    "anyOf",
                                                    "oneOf",
                                                    "allOf",
                                                    "$ref",
                                                    "minLength",
                                                    "maxLength",
                                                    "pattern",
                                                    "minimum",
                                                    "maximum",
                                                    "exclusiveMinimum",
                                                    "exclusiveMaximum"};
    return kFollowed.contains(keyword);
  }

  static std::string where(const std::string& path) { return path.empty() ? "/" : path; }
  static absl::Status unsupported(const std::string& path, const std::string& what) {
    return absl::UnimplementedError(absl::StrCat("at ", where(path), ": ", what));
  }
  static absl::Status invalid(const std::string& path, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("at ", where(path), ": ", what));
  }

  absl::StatusOr<int32_t> newNode() {
    if (static_cast<int64_t>(nodes_->size()) >= JsonSchema::kMaxNodes)
      return absl::UnimplementedError("the schema has too many parts (limit 10000)");
    nodes_->emplace_back();
    return static_cast<int32_t>(nodes_->size() - 1);
  }
  Node& at(int32_t index) { return (*nodes_)[static_cast<size_t>(index)]; }

  // A node allowing anything.
  absl::StatusOr<int32_t> anyNode() {
    if (any_ < 0) {
      absl::StatusOr<int32_t> n = newNode();
      if (!n.ok()) return n.status();
      any_ = *n;
      at(any_).free = true;
      at(any_).kinds.fill(any_);
    }
    return any_;
  }

  absl::Status settle() {
    // Kinds only ever go from unset to set: this ends.
    for (bool changed = true; changed;) {
      changed = false;
      for (const Alias& alias : aliases_) {
        for (int k = 0; k < JsonSchema::kKinds; ++k) {
          if (at(alias.node).kinds[k] >= 0) continue;
          for (int32_t from : alias.from) {
            if (at(from).kinds[k] < 0) continue;
            at(alias.node).kinds[k] = at(from).kinds[k];
            changed = true;
            break;
          }
        }
      }
    }
    static const char* kNames[] = {"objects", "arrays", "strings", "numbers",
                                   "true",    "false",  "null"};
    for (const Alias& alias : aliases_) {
      for (int k = 0; k < JsonSchema::kKinds; ++k) {
        if (k == JsonSchema::kObject && alias.objects_discriminated) continue;
        for (int32_t from : alias.from) {
          const int32_t to = at(from).kinds[k];
          if (to >= 0 && to != at(alias.node).kinds[k]) {
            return unsupported(alias.path,
                               absl::StrCat(alias.keyword, ": two branches both allow ", kNames[k],
                                            "; the grammar tells branches apart by the kind of "
                                            "value, or objects by a property each branch fixes "
                                            "to its own constant"));
          }
        }
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> resolve(const std::string& ref, const std::string& path, int depth) {
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    if (ref != "#" && !ref.starts_with("#/")) {
      return unsupported(path, absl::StrCat("$ref \"", ref,
                                            "\": only references within the schema (\"#/...\") "
                                            "are followed"));
    }
    const Json::json_pointer pointer(ref == "#" ? "" : ref.substr(1));
    if (!document_.contains(pointer))
      return invalid(path, absl::StrCat("$ref \"", ref, "\" names nothing in the schema"));
    // Reserved first: a reference back to it from inside is a cycle, not a loop.
    absl::StatusOr<int32_t> slot = newNode();
    if (!slot.ok()) return slot.status();
    refs_[ref] = *slot;
    absl::StatusOr<int32_t> target = compile(document_.at(pointer), ref.substr(1), depth + 1);
    if (!target.ok()) return target.status();
    aliases_.push_back({*slot, {*target}, path, "$ref"});
    return *slot;
  }

  // Whether a oneOf branch names its kinds (else JSON Schema lets every other kind of value
  // through it, and the branches would not exclude each other).
  bool typed(const Json& s, int hops = 0) const {
    if (!s.is_object() || hops > 8) return false;
    if (s.contains("type") || s.contains("enum") || s.contains("const")) return true;
    if (s.contains("$ref") && s["$ref"].is_string()) {
      const std::string ref = s["$ref"].get<std::string>();
      if (ref != "#" && !ref.starts_with("#/")) return false;
      const Json::json_pointer pointer(ref == "#" ? "" : ref.substr(1));
      return document_.contains(pointer) && typed(document_.at(pointer), hops + 1);
    }
    return false;
  }

  absl::StatusOr<int32_t> compile(const Json& s, const std::string& path, int depth) {
    if (depth > 128) return unsupported(path, "schemas nested more than 128 deep");
    if (s.is_boolean()) {
      if (!s.get<bool>()) return unsupported(path, "the schema false allows no value");
      return anyNode();
    }
    if (!s.is_object()) return invalid(path, "a schema must be an object or a boolean");
    for (const auto& [keyword, value] : s.items()) {
      if (annotation(keyword) || followed(keyword)) continue;
      return unsupported(path, absl::StrCat("\"", keyword,
                                            "\" is not supported in a JSON schema output; leave "
                                            "it out or describe it in the prompt"));
    }
    for (const char* combinator : {"$ref", "anyOf", "oneOf", "allOf"}) {
      if (!s.contains(combinator)) continue;
      for (const auto& [keyword, value] : s.items()) {
        if (keyword == combinator || annotation(keyword)) continue;
        if (keyword == "additionalProperties" && value == Json(true)) continue;
        return unsupported(path, absl::StrCat("\"", keyword, "\" beside ", combinator));
      }
      if (std::string_view(combinator) == "$ref") {
        if (!s["$ref"].is_string()) return invalid(path, "$ref must be a string");
        return resolve(s["$ref"].get<std::string>(), path, depth);
      }
      return compileUnion(s, combinator, path, depth);
    }
    absl::StatusOr<int32_t> made = newNode();
    if (!made.ok()) return made.status();
    const int32_t n = *made;
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& one : t) {
          if (!one.is_string()) return invalid(path, "type must be a string or a list of them");
          types.push_back(one.get<std::string>());
        }
      } else {
        return invalid(path, "type must be a string or a non-empty list of them");
      }
    }
    if (s.contains("enum") || s.contains("const")) return compileLiterals(s, n, types, path);
    if (types.empty()) {
      if (s.contains("properties") || s.contains("required") ||
          s.contains("additionalProperties")) {
        types.push_back("object");
      } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
                 s.contains("maxItems")) {
        types.push_back("array");
      } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern")) {
        types.push_back("string");
      } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
                 s.contains("exclusiveMaximum")) {
        types.push_back("number");
      } else {
        at(n).free = true;  // No constraint: any value.
        at(n).kinds.fill(n);
        return n;
      }
    }
    const bool number = std::find(types.begin(), types.end(), "number") != types.end();
    for (const std::string& type : types) {
      Node& node = at(n);
      if (type == "object") {
        node.kinds[JsonSchema::kObject] = n;
      } else if (type == "array") {
        node.kinds[JsonSchema::kArray] = n;
      } else if (type == "string") {
        node.kinds[JsonSchema::kString] = n;
      } else if (type == "number" || type == "integer") {
        node.kinds[JsonSchema::kNumber] = n;
        node.integer = !number;
      } else if (type == "boolean") {
        node.kinds[JsonSchema::kTrue] = node.kinds[JsonSchema::kFalse] = n;
      } else if (type == "null") {
        node.kinds[JsonSchema::kNull] = n;
      } else {
        return invalid(path, absl::StrCat("unknown type \"", type, "\""));
      }
    }
    if (at(n).kinds[JsonSchema::kObject] >= 0) {
      if (absl::Status object = compileObject(s, n, path, depth); !object.ok()) return object;
    }
    if (at(n).kinds[JsonSchema::kArray] >= 0) {
      if (absl::Status array = compileArray(s, n, path, depth); !array.ok()) return array;
    }
    if (at(n).kinds[JsonSchema::kString] >= 0) {
      if (absl::Status string = compileString(s, n, path); !string.ok()) return string;
    }
    if (at(n).kinds[JsonSchema::kNumber] >= 0) {
      if (absl::Status number = compileNumber(s, n, path); !number.ok()) return number;
    }
    return n;
  }

  // minimum, maximum, exclusiveMinimum, exclusiveMaximum: the tightest of each side.
  absl::Status compileNumber(const Json& s, int32_t n, const std::string& path) {
    NumberBounds b{.integer = at(n).integer};
    auto tighten = [&](const char* keyword, bool low, bool exclusive) -> absl::Status {
      const Json& v = s[keyword];
      if (!v.is_number()) return invalid(path, absl::StrCat(keyword, " must be a number"));
      const Decimal d = v.is_number_unsigned()  ? Decimal::fromUnsigned(v.get<uint64_t>())
                        : v.is_number_integer() ? Decimal::fromInteger(v.get<int64_t>())
                                                : Decimal::fromDouble(v.get<double>());
      std::optional<Decimal>& bound = low ? b.low : b.high;
      bool& bound_exclusive = low ? b.low_exclusive : b.high_exclusive;
      const int c = bound ? compare(d, *bound) * (low ? 1 : -1) : 1;
      if (c > 0 || (c == 0 && exclusive)) {
        bound = d;
        bound_exclusive = exclusive;
      }
      return absl::OkStatus();
    };
    for (const auto& [keyword, exclusive, low] :
         {std::tuple{"minimum", "exclusiveMinimum", true},
          std::tuple{"maximum", "exclusiveMaximum", false}}) {
      // Draft 4: a boolean exclusive keyword makes its bound exclusive.
      const bool draft4 = s.contains(exclusive) && s[exclusive].is_boolean();
      if (draft4 && !s.contains(keyword))
        return invalid(path, absl::StrCat(exclusive, " true or false needs ", keyword));
      if (s.contains(keyword)) {
        CLEAVE_RETURN_IF_ERROR(tighten(keyword, low, draft4 && s[exclusive].get<bool>()));
      }
      if (s.contains(exclusive) && !draft4) CLEAVE_RETURN_IF_ERROR(tighten(exclusive, low, true));
    }
    if (!b.any()) return absl::OkStatus();
    at(n).bounds = b;
    if (b.low && b.high) {
      const int c = compare(*b.low, *b.high);
      if (c > 0 || (c == 0 && (b.low_exclusive || b.high_exclusive))) {
        return invalid(path, absl::StrCat("no number lies between the lower bound ", b.low->text(),
                                          " and the upper bound ", b.high->text()));
      }
    }
    if (!NumberText().reachable(b)) {
      return unsupported(
          path, absl::StrCat("no ", b.integer ? "integer" : "number",
                             " of at most 15 significant digits, written without an exponent, "
                             "lies within the bounds (",
                             b.low ? b.low->text() : "none", " to ",
                             b.high ? b.high->text() : "none", ")"));
    }
    return absl::OkStatus();
  }

  // The pattern a string of a JSON Schema `format` is written to (whole), for the formats
  // pydantic's common types carry; null for others, which stay annotations. Dates are of
  // years 1-9999 and the days their month has (February 29 in leap years).
  static const char* formatPattern(const std::string& format) {
    static const std::map<std::string, std::string> kFormats = [] {
      // Years 0001-9999; February 29 in leap years only.
      const std::string year = R"((?:[1-9]\d{3}|0[1-9]\d{2}|00[1-9]\d|000[1-9]))";
      const std::string leap =
          R"((?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00))";
      const std::string date = absl::StrCat(
          "(?:", year,
          R"(-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30))",
          R"(|02-(?:0[1-9]|1\d|2[0-8]))|)", leap, "-02-29)");
      const std::string time =
          R"((?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d))";
      const std::string octet = R"((?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
      return std::map<std::string, std::string>{
          {"date", date},
          {"time", time},
          {"date-time", date + "T" + time},
          {"uuid", R"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"},
          {"email", R"([A-Za-z0-9_%+-]{1,32}(?:\.[A-Za-z0-9_%+-]{1,32}){0,3}@)"
                    R"((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?\.){1,3}[A-Za-z]{2,12})"},
          {"ipv4", absl::StrCat(octet, R"((?:\.)", octet, "){3}")},
      };
    }();
    const auto it = kFormats.find(format);
    return it == kFormats.end() ? nullptr : it->second.c_str();
  }

  // minLength, maxLength, and pattern (or a format formatPattern() knows).
  absl::Status compileString(const Json& s, int32_t n, const std::string& path) {
    uint32_t low = 0, high = UINT32_MAX;
    for (auto [keyword, bound] : {std::pair{"minLength", &low}, std::pair{"maxLength", &high}}) {
      if (!s.contains(keyword)) continue;
      if (!s[keyword].is_number_unsigned() || s[keyword].get<uint64_t>() > 1000000)
        return invalid(path, absl::StrCat(keyword, " must be an integer in 0..1000000"));
      *bound = s[keyword].get<uint32_t>();
    }
    if (low > high) return invalid(path, "minLength is larger than maxLength");
    at(n).min_length = low;
    at(n).max_length = high;
    std::string wrapped;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return invalid(path, "pattern must be a string");
      // JSON Schema searches: a pattern matches anywhere unless anchored. The strings
      // written match it whole between the anchors it has, a subset of those it allows.
      std::string_view p = s["pattern"].get_ref<const std::string&>();
      const bool from_start = p.starts_with('^');
      if (from_start) p.remove_prefix(1);
      size_t escapes = 0;  // Backslashes before a final $: an odd count escapes it.
      while (p.size() >= 2 + escapes && p[p.size() - 2 - escapes] == '\\') ++escapes;
      const bool to_end = p.ends_with('$') && escapes % 2 == 0;
      if (to_end) p.remove_suffix(1);
      wrapped = absl::StrCat(from_start ? "" : "[\\s\\S]*", "(?:", std::string(p), ")",
                             to_end ? "" : "[\\s\\S]*");
    } else if (const Json* format = s.contains("format") ? &s["format"] : nullptr;
               format != nullptr && format->is_string()) {
      const char* whole = formatPattern(format->get_ref<const std::string&>());
      if (whole == nullptr) return absl::OkStatus();  // An annotation.
      wrapped = absl::StrCat("(?:", whole, ")");
    } else {
      return absl::OkStatus();
    }
    absl::StatusOr<std::shared_ptr<const Regex>> regex = Regex::compile(wrapped);
    if (!regex.ok()) {
      return unsupported(path, absl::StrCat("pattern: ", regex.status().message(),
                                            " in the pattern as wrapped: ", wrapped));
    }
    if (patterns_->size() >= JsonSchema::kMaxPatterns)
      return unsupported(path, absl::StrCat("more than ", JsonSchema::kMaxPatterns, " patterns"));
    RegexDfa dfa(*regex, JsonSchema::kMaxPatternStates);
    const bool built = dfa.expandAll(JsonSchema::kMaxPatternWork - pattern_work_);
    pattern_work_ += dfa.work();
    if (!built) {
      return unsupported(path,
                         absl::StrCat("the pattern needs more than ", JsonSchema::kMaxPatternStates,
                                      " automaton states, or the schema's patterns more than ",
                                      JsonSchema::kMaxPatternWork, " steps to build; simplify it"));
    }
    // Lengths between the fewest and the most characters a match takes (a pattern that
    // jumps over the range, "a|aaa" with length 2, is not seen here).
    if (!lengthsFit(dfa, dfa.start(), 0, at(n))) {
      return unsupported(path,
                         "no string of the pattern has a length within minLength and maxLength");
    }
    at(n).pattern = static_cast<int32_t>(patterns_->size());
    patterns_->push_back(std::move(dfa));
    return absl::OkStatus();
  }

  // enum / const: the values (those of the `types` given), as compact JSON texts.
  absl::StatusOr<int32_t> compileLiterals(const Json& s, int32_t n,
                                          const std::vector<std::string>& types,
                                          const std::string& path) {
    for (const char* other :
         {"properties", "required", "items", "prefixItems", "minItems", "maxItems", "minLength",
          "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (s.contains(other)) return unsupported(path, absl::StrCat("\"", other, "\" beside enum"));
    }
    std::vector<Json> values;
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty())
        return invalid(path, "enum must be a non-empty array");
      values.assign(s["enum"].begin(), s["enum"].end());
    }
    if (s.contains("const")) {
      if (!values.empty() && std::find(values.begin(), values.end(), s["const"]) == values.end())
        return invalid(path, "const is not one of enum: no value is both");
      values = {s["const"]};
    }
    auto ofType = [](const Json& v, const std::string& type) {
      if (type == "integer") {
        return v.is_number_integer() ||
               (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      }
      return (type == "object" && v.is_object()) || (type == "array" && v.is_array()) ||
             (type == "string" && v.is_string()) || (type == "number" && v.is_number()) ||
             (type == "boolean" && v.is_boolean()) || (type == "null" && v.is_null());
    };
    std::vector<std::string> literals;
    for (const Json& v : values) {
      if (!types.empty() && std::none_of(types.begin(), types.end(),
                                         [&](const std::string& t) { return ofType(v, t); })) {
        continue;
      }
      std::string text = v.dump();
      if (text.size() > 4096) return unsupported(path, "an enum value over 4096 bytes");
      // Written as the grammar takes it (numbers within its digit limits).
      JsonGrammar check;
      if (!check.pushAll("{\"v\":" + text + "}") || !check.complete())
        return unsupported(path, absl::StrCat("the enum value ", text, " cannot be written"));
      literals.push_back(std::move(text));
    }
    if (literals.empty()) return invalid(path, "no enum value has the type the schema gives");
    std::sort(literals.begin(), literals.end());  // bytewise, as unsigned characters
    literals.erase(std::unique(literals.begin(), literals.end()), literals.end());
    if (literals.size() > 60000) return unsupported(path, "more than 60000 enum values");
    for (const std::string& l : literals) at(n).kinds[kindOf(static_cast<uint8_t>(l[0]))] = n;
    at(n).literals = std::move(literals);
    return n;
  }

  absl::Status compileObject(const Json& s, int32_t n, const std::string& path, int depth) {
    const Json extra = s.contains("additionalProperties") ? s["additionalProperties"] : Json(true);
    if (!extra.is_boolean() && !extra.is_object())
      return invalid(path, "additionalProperties must be a boolean or a schema");
    if (!s.contains("properties") && !s.contains("required")) {
      if (extra == Json(true)) {  // Any members.
        absl::StatusOr<int32_t> any = anyNode();
        if (!any.ok()) return any.status();
        at(n).kinds[JsonSchema::kObject] = *any;
      } else if (extra.is_object()) {  // A map: any keys, each value an instance of `extra`.
        absl::StatusOr<int32_t> values = compile(extra, path + "/additionalProperties", depth + 1);
        if (!values.ok()) return values.status();
        at(n).map_values = *values;
      }  // false: only {}.
      return absl::OkStatus();
    }
    std::map<std::string, Json> properties;  // by name
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return invalid(path, "properties must be an object");
      for (const auto& [name, schema] : s["properties"].items()) properties[name] = schema;
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return invalid(path, "required must be an array of names");
      for (const Json& name : s["required"]) {
        if (!name.is_string()) return invalid(path, "required must be an array of names");
        required.insert(name.get<std::string>());
        if (properties.contains(name.get<std::string>())) continue;
        // Not declared: its value is what additionalProperties says.
        if (extra == Json(false)) {
          return invalid(path, absl::StrCat("\"", name.get<std::string>(),
                                            "\" is required but not in properties, and "
                                            "additionalProperties is false"));
        }
        properties[name.get<std::string>()] = extra;
      }
    }
    if (properties.size() > JsonSchema::kMaxProperties)
      return unsupported(path, "an object of more than 64 properties");
    // Sorted by the name as written (JSON-escaped), the order the grammar matches in.
    std::vector<std::pair<std::string, std::string>> written;  // (escaped, name)
    for (const auto& [name, schema] : properties) {
      const std::string quoted = Json(name).dump();
      if (quoted.size() > 1024) return unsupported(path, "a property name over 1 KiB");
      written.emplace_back(quoted.substr(1, quoted.size() - 2), name);
    }
    std::sort(written.begin(), written.end());
    std::vector<std::string> keys;
    std::vector<int32_t> values;
    uint64_t required_bits = 0;
    for (size_t i = 0; i < written.size(); ++i) {
      const std::string& name = written[i].second;
      absl::StatusOr<int32_t> value =
          compile(properties[name], absl::StrCat(path, "/properties/", name), depth + 1);
      if (!value.ok()) return value.status();
      keys.push_back(written[i].first);
      values.push_back(*value);
      if (required.contains(name)) required_bits |= uint64_t{1} << i;
    }
    Node& node = at(n);
    node.keys = std::move(keys);
    node.values = std::move(values);
    node.required = required_bits;
    return absl::OkStatus();
  }

  // items, prefixItems (the first elements' schemas, a tuple; `items: false` then allows
  // no more), minItems, maxItems.
  absl::Status compileArray(const Json& s, int32_t n, const std::string& path, int depth) {
    std::vector<int32_t> prefix;
    if (s.contains("prefixItems")) {
      const Json& list = s["prefixItems"];
      if (!list.is_array()) return invalid(path, "prefixItems must be an array of schemas");
      for (size_t i = 0; i < list.size(); ++i) {
        absl::StatusOr<int32_t> element =
            compile(list[i], absl::StrCat(path, "/prefixItems/", i), depth + 1);
        if (!element.ok()) return element.status();
        prefix.push_back(*element);
      }
    }
    const bool closed = s.contains("items") && s["items"] == Json(false);
    if (closed && prefix.empty()) return unsupported(path, "items false without prefixItems");
    absl::StatusOr<int32_t> items = s.contains("items") && !closed
                                        ? compile(s["items"], path + "/items", depth + 1)
                                        : anyNode();
    if (!items.ok()) return items.status();
    uint32_t low = 0, high = closed ? static_cast<uint32_t>(prefix.size()) : UINT32_MAX;
    for (auto [keyword, bound] : {std::pair{"minItems", &low}, std::pair{"maxItems", &high}}) {
      if (!s.contains(keyword)) continue;
      if (!s[keyword].is_number_unsigned() || s[keyword].get<uint64_t>() > 1000000)
        return invalid(path, absl::StrCat(keyword, " must be an integer in 0..1000000"));
      *bound = s[keyword].get<uint32_t>();
    }
    if (closed && s.contains("maxItems"))
      high = std::min(high, static_cast<uint32_t>(prefix.size()));
    if (low > high) return invalid(path, "minItems is larger than maxItems (or prefixItems)");
    Node& node = at(n);
    node.prefix_items = std::move(prefix);
    node.items = *items;
    node.min_items = low;
    node.max_items = high;
    return absl::OkStatus();
  }

  // anyOf / oneOf whose branches allow different kinds of value (checked in settle());
  // allOf of one schema.
  absl::StatusOr<int32_t> compileUnion(const Json& s, const char* keyword, const std::string& path,
                                       int depth) {
    const Json& branches = s[keyword];
    if (!branches.is_array() || branches.empty())
      return invalid(path, absl::StrCat(keyword, " must be a non-empty array"));
    if (std::string_view(keyword) == "allOf") {
      if (branches.size() != 1) return unsupported(path, "allOf of more than one schema");
      return compile(branches[0], path + "/allOf/0", depth + 1);
    }
    absl::StatusOr<int32_t> made = newNode();
    if (!made.ok()) return made.status();
    Alias alias{.node = *made, .path = path, .keyword = keyword};
    // Objects in several branches: told apart by a property each fixes to a constant.
    std::vector<size_t> objects;
    for (size_t i = 0; i < branches.size(); ++i) {
      if (allowsObjects(resolved(branches[i]))) objects.push_back(i);
    }
    absl::StatusOr<int32_t> discriminator = -1;
    if (objects.size() >= 2) {
      discriminator = compileDiscriminator(s, branches, objects, keyword, path, depth);
      if (!discriminator.ok()) return discriminator.status();
      at(*made).kinds[JsonSchema::kObject] = *discriminator;
      alias.objects_discriminated = true;
    }
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string at_branch = absl::StrCat(path, "/", keyword, "/", i);
      if (std::string_view(keyword) == "oneOf" && !typed(branches[i])) {
        return unsupported(at_branch,
                           "a oneOf branch without \"type\", \"enum\" or \"const\" lets other "
                           "kinds of value through; give each branch its type");
      }
      absl::StatusOr<int32_t> branch = compile(branches[i], at_branch, depth + 1);
      if (!branch.ok()) return branch.status();
      alias.from.push_back(*branch);
      if (*discriminator >= 0 && std::find(objects.begin(), objects.end(), i) != objects.end()) {
        discriminated_.push_back({*discriminator, *branch, branches[i]});
      }
    }
    aliases_.push_back(std::move(alias));
    return *made;
  }

  // The constant a branch's schema fixes its property `name` to (const, or an enum of one).
  std::optional<Json> constantOf(const Json& branch, const std::string& name) const {
    const Json* b = resolved(branch);
    if (b == nullptr || !b->contains("properties") || !(*b)["properties"].is_object())
      return std::nullopt;
    const Json& properties = (*b)["properties"];
    if (!properties.contains(name)) return std::nullopt;
    const Json* p = resolved(properties[name]);
    if (p == nullptr) return std::nullopt;
    if (p->contains("const")) return (*p)["const"];
    if (p->contains("enum") && (*p)["enum"].is_array() && (*p)["enum"].size() == 1)
      return (*p)["enum"][0];
    return std::nullopt;
  }

  // A schema with its $refs followed (up to 8), or null.
  const Json* resolved(const Json& s) const {
    const Json* at = &s;
    for (int hops = 0; hops < 8 && at->is_object() && at->contains("$ref"); ++hops) {
      const Json& ref = (*at)["$ref"];
      if (!ref.is_string()) return nullptr;
      const std::string text = ref.get<std::string>();
      if (text != "#" && !text.starts_with("#/")) return nullptr;
      const Json::json_pointer pointer(text == "#" ? "" : text.substr(1));
      if (!document_.contains(pointer)) return nullptr;
      at = &document_.at(pointer);
    }
    return at->is_object() ? at : nullptr;
  }
  static bool allowsObjects(const Json* s) {
    if (s == nullptr) return false;
    if (!s->contains("type")) return s->contains("properties") || s->contains("required");
    const Json& type = (*s)["type"];
    return type == "object" ||
           (type.is_array() && std::find(type.begin(), type.end(), "object") != type.end());
  }

  // The node for objects of a union's `objects` branches: the one property every one of
  // them fixes to its own constant (the schema's discriminator.propertyName, or the first
  // such), written first; its value picks the branch (JsonSchemaGrammar::endValue).
  absl::StatusOr<int32_t> compileDiscriminator(const Json& s, const Json& branches,
                                               const std::vector<size_t>& objects,
                                               const char* keyword, const std::string& path,
                                               int depth) {
    std::vector<std::string> names;
    if (s.contains("discriminator") && s["discriminator"].is_object() &&
        s["discriminator"].contains("propertyName") &&
        s["discriminator"]["propertyName"].is_string()) {
      names.push_back(s["discriminator"]["propertyName"].get<std::string>());
    } else if (const Json* first = resolved(branches[objects[0]]);
               first != nullptr && first->contains("properties") &&
               (*first)["properties"].is_object()) {
      for (const auto& [name, schema] : (*first)["properties"].items()) names.push_back(name);
    }
    for (const std::string& name : names) {
      std::vector<std::pair<std::string, size_t>> values;  // (value as compact JSON, branch)
      for (size_t branch : objects) {
        std::optional<Json> value = constantOf(branches[branch], name);
        if (!value) break;
        values.emplace_back(value->dump(), branch);
      }
      if (values.size() != objects.size()) continue;
      std::sort(values.begin(), values.end());
      if (std::adjacent_find(values.begin(), values.end(), [](const auto& a, const auto& b) {
            return a.first == b.first;
          }) != values.end()) {
        continue;  // Two branches fix it to the same value: it tells nothing apart.
      }
      Json key_schema = {{"enum", Json::array()}};
      for (const auto& [text, branch] : values) key_schema["enum"].push_back(Json::parse(text));
      absl::StatusOr<int32_t> key = compile(key_schema, path + "/discriminator", depth + 1);
      if (!key.ok()) return key.status();
      absl::StatusOr<int32_t> node = newNode();
      if (!node.ok()) return node.status();
      const std::string quoted = Json(name).dump();
      Node& d = at(*node);
      d.kinds[JsonSchema::kObject] = *node;
      d.keys = {quoted.substr(1, quoted.size() - 2)};
      d.values = {*key};
      d.required = 1;
      d.branches.assign(values.size(), -1);  // placed in run()
      discriminator_names_[*node] = name;
      return *node;
    }
    return unsupported(path, absl::StrCat(keyword,
                                          ": several branches allow objects, and no "
                                          "property has its own constant value in each; give "
                                          "each object branch one (a discriminator)"));
  }

  const Json& document_;
  std::vector<JsonSchema::Node>* nodes_ = nullptr;
  std::vector<RegexDfa>* patterns_ = nullptr;
  uint64_t pattern_work_ = 0;  // RegexDfa::work() of the patterns built so far.
  std::map<std::string, int32_t> refs_;
  std::vector<Alias> aliases_;
  // Object branches of discriminated unions: the discriminator node, the branch's node, its
  // schema (for the value it fixes), placed in the discriminator's literal order in run().
  struct Discriminated {
    int32_t discriminator;
    int32_t branch;
    Json schema;
  };
  std::vector<Discriminated> discriminated_;
  std::map<int32_t, std::string> discriminator_names_;  // discriminator node -> property
  int32_t any_ = -1;
};

absl::StatusOr<std::shared_ptr<const JsonSchema>> JsonSchema::compile(std::string_view text) {
  const Json document = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) return absl::InvalidArgumentError("the JSON schema is not JSON");
  try {
    SchemaCompiler compiler(document);
    return compiler.run();
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the JSON schema: ", e.what()));
  }
}

// ---------------------------------------------------------------------------------------

bool JsonSchemaGrammar::pushAll(std::string_view bytes) {
  JsonSchemaGrammar next = *this;
  for (char c : bytes) {
    if (!next.step(static_cast<uint8_t>(c))) return false;
  }
  *this = std::move(next);
  return true;
}

bool JsonSchemaGrammar::push(uint8_t c) {
  JsonSchemaGrammar next = *this;
  if (!next.step(c)) return false;
  *this = std::move(next);
  return true;
}

bool JsonSchemaGrammar::betweenStringCharacters() const {
  if (!syntax_.betweenStringCharacters()) return false;
  if (schema_ == nullptr || free_depth_ >= 0) return true;
  return literal_ < 0 && !key_ && string_node_ < 0;
}

bool JsonSchemaGrammar::step(uint8_t c) {
  if (schema_ == nullptr) return syntax_.step(c);
  using Mode = JsonGrammar::Mode;
  if (syntax_.mode_ == Mode::kNumber) {
    if (integer_ && (c == '.' || c == 'e' || c == 'E')) return false;
    JsonGrammar probe = syntax_;
    if (!probe.step(c)) return false;
    if (probe.mode_ == Mode::kNumber) {  // The number goes on.
      if (literal_ >= 0 && !narrow(schema_->node(literal_).literals, c, nullptr)) return false;
      if (number_node_ >= 0 && !number_.push(c, schema_->node(number_node_).bounds)) return false;
      syntax_ = probe;
      return true;
    }
    // `c` ends the number and belongs to what follows it.
    if (number_node_ >= 0) {
      if (!number_.complete(schema_->node(number_node_).bounds)) return false;
      number_node_ = -1;
    }
    syntax_.valueEnded();
    if (!endValue()) return false;
  }
  return stepAt(c);
}

bool JsonSchemaGrammar::stepAt(uint8_t c) {
  using Mode = JsonGrammar::Mode;
  const JsonGrammar before = syntax_;
  if (free_depth_ >= 0) {  // Inside a value the schema leaves free.
    if (!syntax_.step(c)) return false;
    if (syntax_.depth_ == free_depth_ &&
        (syntax_.mode_ == Mode::kAfterValue || syntax_.mode_ == Mode::kDone)) {
      free_depth_ = -1;
    }
    return true;
  }
  if (literal_ >= 0) {  // Inside an enum value: every byte is matched.
    if (!syntax_.step(c) || !narrow(schema_->node(literal_).literals, c, nullptr)) return false;
    if (syntax_.depth_ == literal_depth_ &&
        (syntax_.mode_ == Mode::kAfterValue || syntax_.mode_ == Mode::kDone)) {
      return endValue();
    }
    return true;
  }
  Frame* top = frames_used_ > 0 ? &frames_[frames_used_ - 1] : nullptr;
  switch (before.mode_) {
    case Mode::kStart:
      if (c != '{') return syntax_.step(c);  // blanks
      if (!syntax_.step(c)) return false;
      return beginValue(schema_->root(), c);
    case Mode::kKeyOrEnd:
    case Mode::kAfterValue:
      if (c == '}' || c == ']') {
        if (!syntax_.step(c)) return false;
        return closeContainer(c == ']');
      }
      if (c == ',') {
        if (!syntax_.step(c)) return false;
        const JsonSchema::Node& node = schema_->node(top->node);
        if (before.topIsArray()) return top->count < node.max_items;
        // Another member only where an unused key is left.
        return node.keys.empty() ||
               top->used !=
                   (node.keys.size() == 64 ? ~uint64_t{0} : (uint64_t{1} << node.keys.size()) - 1);
      }
      if (before.mode_ == Mode::kAfterValue) return syntax_.step(c);
      [[fallthrough]];
    case Mode::kKey:
      if (c != '"') return syntax_.step(c);
      if (!syntax_.step(c)) return false;
      if (schema_->node(top->node).map_values >= 0) return true;  // Any key of a map.
      key_ = true;
      match_ = {0, static_cast<uint16_t>(schema_->node(top->node).keys.size()), 0};
      // Some key must be left to write.
      if (schema_->node(top->node).keys.empty()) return false;
      for (uint16_t i = match_.lo; i < match_.hi; ++i) {
        if (!(top->used >> i & 1)) return true;
      }
      return false;
    case Mode::kString:
    case Mode::kEscape:
    case Mode::kUnicode:
      if (!before.key_) {
        if (string_node_ < 0) return syntax_.step(c);  // A string the schema leaves free.
        return syntax_.step(c) && stringByte(before, c);
      }
      if (!syntax_.step(c)) return false;
      if (const int32_t values = schema_->node(top->node).map_values; values >= 0) {
        if (syntax_.mode_ == Mode::kColon) top->value = values;  // The map's key ended.
        return true;
      }
      if (before.mode_ == Mode::kString && before.utf8_left_ == 0 && c == '"') {
        // The key ends: it must be one of the object's, not written yet.
        key_ = false;
        const int32_t k = matched(schema_->node(top->node).keys);
        if (k < 0 || (top->used >> k & 1)) return false;
        top->used |= uint64_t{1} << k;
        top->value = schema_->node(top->node).values[static_cast<size_t>(k)];
        return true;
      }
      return narrow(schema_->node(top->node).keys, c, top);
    case Mode::kValue:
    case Mode::kValueOrEnd: {
      if (c == ']' && before.mode_ == Mode::kValueOrEnd) {
        if (!syntax_.step(c)) return false;
        return closeContainer(true);
      }
      if (json_grammar_detail::isBlank(c)) return syntax_.step(c);
      if (!syntax_.step(c)) return false;
      int32_t node;
      if (before.topIsArray()) {
        ++top->count;
        const JsonSchema::Node& array = schema_->node(top->node);
        if (top->count > array.max_items) return false;
        node = top->count <= array.prefix_items.size() ? array.prefix_items[top->count - 1]
                                                       : array.items;
      } else {
        node = top->value;
      }
      return beginValue(node, c);
    }
    case Mode::kColon:
    case Mode::kLiteral:
    case Mode::kDone: return syntax_.step(c);
    case Mode::kNumber: break;  // step() handled it.
  }
  return false;
}

bool JsonSchemaGrammar::beginValue(int32_t node, uint8_t c) {
  const JsonSchema::Kind kind = SchemaCompiler::kindOf(c);
  const int32_t at = schema_->node(node).kinds[kind];
  if (at < 0) return false;
  const JsonSchema::Node& n = schema_->node(at);
  // The value's own depth: where the syntax returns when it ends.
  const uint8_t depth = kind == JsonSchema::kObject || kind == JsonSchema::kArray
                            ? static_cast<uint8_t>(syntax_.depth_ - 1)
                            : syntax_.depth_;
  if (!n.literals.empty()) {
    literal_ = at;
    literal_depth_ = depth;
    match_ = {0, static_cast<uint16_t>(n.literals.size()), 0};
    return narrow(n.literals, c, nullptr);
  }
  if (n.free) {
    free_depth_ = static_cast<int8_t>(depth);
    // A scalar may already be whole (not here: no scalar is one byte long).
    return true;
  }
  if (kind == JsonSchema::kObject || kind == JsonSchema::kArray) {
    if (frames_used_ >= kMaxFrames) return false;
    frames_[frames_used_++] = {.node = at};
    // An object needs a key it could write, or none required.
    return true;
  }
  integer_ = kind == JsonSchema::kNumber && n.integer;
  if (kind == JsonSchema::kNumber && n.bounds.any()) {
    number_node_ = at;
    number_ = NumberText();
    return number_.push(c, n.bounds);
  }
  if (kind == JsonSchema::kString && n.constrainsStrings()) {
    string_node_ = at;
    string_state_ = n.pattern >= 0 ? schema_->pattern(n.pattern).start() : 0;
    string_chars_ = 0;
  }
  return true;
}

bool JsonSchemaGrammar::stringByte(const JsonGrammar& before, uint8_t c) {
  using Mode = JsonGrammar::Mode;
  constexpr std::string_view kLetters = "\"\\/bfnrt", kBytes = "\"\\/\b\f\n\r\t";
  const JsonSchema::Node& n = schema_->node(string_node_);
  if (before.mode_ == Mode::kString) {
    if (before.utf8_left_ == 0 && c == '"') {  // The string ends.
      const bool whole = string_chars_ >= n.min_length &&
                         (n.pattern < 0 || schema_->pattern(n.pattern).accepting(string_state_));
      string_node_ = -1;
      return whole;
    }
    if (before.utf8_left_ == 0 && c == '\\') {  // An escape begins: one must be able to go on.
      if (n.pattern < 0) return string_chars_ < n.max_length;
      for (char b : kBytes) {
        JsonSchemaGrammar probe = *this;
        if (probe.content(std::string_view(&b, 1))) return true;
      }
      return false;
    }
    const char byte = static_cast<char>(c);
    return content(std::string_view(&byte, 1));
  }
  if (before.mode_ == Mode::kEscape) {
    // \uXXXX stands for one character; with a pattern, characters are written as they are.
    if (c == 'u') return n.pattern < 0 && content("u");
    const size_t i = kLetters.find(static_cast<char>(c));
    return i != std::string_view::npos && content(kBytes.substr(i, 1));
  }
  return true;  // A \u escape's hex digits: its character was counted at the u.
}

bool JsonSchemaGrammar::content(std::string_view bytes) {
  const JsonSchema::Node& n = schema_->node(string_node_);
  if ((static_cast<uint8_t>(bytes[0]) & 0xC0) != 0x80 && ++string_chars_ > n.max_length)
    return false;
  if (n.pattern < 0) return true;
  const RegexDfa& dfa = schema_->pattern(n.pattern);
  for (char b : bytes) string_state_ = dfa.next(string_state_, static_cast<uint8_t>(b));
  // Some way on to a match, within the characters left, and one long enough.
  return lengthsFit(dfa, string_state_, string_chars_, n);
}

bool JsonSchemaGrammar::narrow(const std::vector<std::string>& candidates, uint8_t c,
                               const Frame* keys_of) {
  // Sorted candidates sharing a prefix are contiguous: keep those with `c` next.
  // Bytes compare as unsigned, as the candidates were sorted.
  auto byte = [&](uint16_t i) { return static_cast<uint8_t>(candidates[i][match_.offset]); };
  uint16_t lo = match_.lo, hi = match_.hi;
  while (lo < hi && (candidates[lo].size() <= match_.offset || byte(lo) < c)) ++lo;
  uint16_t end = lo;
  while (end < hi && candidates[end].size() > match_.offset && byte(end) == c) ++end;
  match_ = {lo, end, static_cast<uint16_t>(match_.offset + 1)};
  if (lo == end) return false;
  if (keys_of == nullptr) return true;
  for (uint16_t i = lo; i < end; ++i) {
    if (!(keys_of->used >> i & 1)) return true;
  }
  return false;
}

int32_t JsonSchemaGrammar::matched(const std::vector<std::string>& candidates) const {
  // The shortest candidate sorts first.
  if (match_.lo < match_.hi && candidates[match_.lo].size() == match_.offset) return match_.lo;
  return -1;
}

bool JsonSchemaGrammar::closeContainer(bool array) {
  const Frame& top = frames_[frames_used_ - 1];
  const JsonSchema::Node& node = schema_->node(top.node);
  if (array ? top.count < node.min_items : (top.used & node.required) != node.required)
    return false;
  --frames_used_;
  return true;
}

bool JsonSchemaGrammar::endValue() {
  integer_ = false;
  if (free_depth_ >= 0 && syntax_.depth_ == free_depth_) free_depth_ = -1;
  // A number inside an enum value's object or array ends only itself.
  if (literal_ < 0 || syntax_.depth_ != literal_depth_) return true;
  const int32_t k = matched(schema_->node(literal_).literals);
  literal_ = -1;
  if (k < 0) return false;
  // A discriminated union's key: its value picks the object's branch from here on.
  if (frames_used_ > 0) {
    Frame& top = frames_[frames_used_ - 1];
    const JsonSchema::Node& object = schema_->node(top.node);
    if (!object.branches.empty()) {
      const int32_t branch =
          schema_->node(object.branches[static_cast<size_t>(k)]).kinds[JsonSchema::kObject];
      if (branch < 0) return false;
      const std::vector<std::string>& keys = schema_->node(branch).keys;
      const auto key = std::find(keys.begin(), keys.end(), object.keys[0]);
      if (key == keys.end()) return false;
      top.node = branch;
      top.used = uint64_t{1} << (key - keys.begin());
    }
  }
  return true;
}

}  // namespace cleave::engine
