#include "services/engine/json_schema.h"
#include "services/engine/json_grammar_inl.h"

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cleave::engine {

using Json = nlohmann::json;

// Builds a JsonSchema's nodes from a schema document, one per schema object reached
// (a $ref target once, so recursion is a cycle of node indices).
class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& document) : document_(document) {}

  absl::StatusOr<std::shared_ptr<const JsonSchema>> run() {
    auto schema = std::make_shared<JsonSchema>();
    nodes_ = &schema->nodes_;
    absl::StatusOr<int32_t> root = compile(document_, "");
    if (!root.ok()) return root.status();
    if (nodes_->at(static_cast<size_t>(*root)).kinds[JsonSchema::kObject] < 0) {
      return absl::UnimplementedError(
          "a JSON schema output must be an object at its root (\"type\": \"object\")");
    }
    // The grammar starts at node 0: make it the root's.
    if (*root != 0) (*nodes_)[0] = (*nodes_)[static_cast<size_t>(*root)];
    return std::shared_ptr<const JsonSchema>(std::move(schema));
  }

 private:
  using Node = JsonSchema::Node;

  static std::string where(const std::string& path) { return path.empty() ? "/" : path; }
  absl::Status unsupported(const std::string& path, const std::string& what) {
    return absl::UnimplementedError(absl::StrCat("at ", where(path), ": ", what));
  }
  absl::Status invalid(const std::string& path, const std::string& what) {
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

  absl::StatusOr<int32_t> resolve(const std::string& ref, const std::string& path) {
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    if (ref != "#" && !ref.starts_with("#/")) {
      return unsupported(path, absl::StrCat("$ref \"", ref,
                                            "\": only references within the "
                                            "schema (\"#/...\") are followed"));
    }
    const Json::json_pointer pointer(ref == "#" ? "" : ref.substr(1));
    if (!document_.contains(pointer))
      return invalid(path, absl::StrCat("$ref \"", ref, "\" names nothing in the schema"));
    if (++depth_ > 64) return unsupported(path, "$ref chains deeper than 64");
    // Reserved first: a reference back to it from inside is a cycle, not a loop.
    absl::StatusOr<int32_t> slot = newNode();
    if (!slot.ok()) return slot.status();
    refs_[ref] = *slot;
    absl::StatusOr<int32_t> target = compile(document_.at(pointer), ref.substr(1));
    --depth_;
    if (!target.ok()) return target.status();
    at(*slot) = at(*target);
    return *slot;
  }

  absl::StatusOr<int32_t> compile(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) return unsupported(path, "the schema false allows no value");
      return anyNode();
    }
    if (!s.is_object()) return invalid(path, "a schema must be an object or a boolean");
    static const std::set<std::string> kIgnored = {"title",        "description",
                                                   "default",      "examples",
                                                   "format",       "$schema",
                                                   "$id",          "$comment",
                                                   "deprecated",   "readOnly",
                                                   "writeOnly",    "$defs",
                                                   "definitions",  "additionalProperties",
                                                   "discriminator"};
    static const std::set<std::string> kFollowed = {"type",     "enum",  "const",    "properties",
                                                    "required", "items", "minItems", "maxItems",
                                                    "anyOf",    "oneOf", "allOf",    "$ref"};
    for (const auto& [keyword, value] : s.items()) {
      if (kIgnored.contains(keyword) || kFollowed.contains(keyword)) continue;
      return unsupported(path, absl::StrCat("\"", keyword,
                                            "\" is not supported in a JSON schema "
                                            "output; leave it out or describe it in the prompt"));
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return invalid(path, "$ref must be a string");
      for (const char* other :
           {"type", "enum", "const", "properties", "items", "anyOf", "oneOf", "allOf"}) {
        if (s.contains(other))
          return unsupported(path, absl::StrCat("$ref beside \"", other, "\""));
      }
      return resolve(s["$ref"].get<std::string>(), path);
    }
    for (const char* union_keyword : {"anyOf", "oneOf", "allOf"}) {
      if (s.contains(union_keyword)) return compileUnion(s, union_keyword, path);
    }
    absl::StatusOr<int32_t> made = newNode();
    if (!made.ok()) return made.status();
    const int32_t n = *made;
    if (s.contains("enum") || s.contains("const")) {
      std::vector<Json> values;
      if (s.contains("const")) values.push_back(s["const"]);
      if (s.contains("enum")) {
        if (!s["enum"].is_array() || s["enum"].empty())
          return invalid(path, "enum must be a non-empty array");
        for (const Json& v : s["enum"]) values.push_back(v);
      }
      std::vector<std::string> literals;
      for (const Json& v : values) {
        literals.push_back(v.dump());
        if (literals.back().size() > 4096)
          return unsupported(path, "an enum value over 4096 bytes");
      }
      std::sort(literals.begin(), literals.end());
      literals.erase(std::unique(literals.begin(), literals.end()), literals.end());
      if (literals.size() > 60000) return unsupported(path, "more than 60000 enum values");
      for (const std::string& l : literals) at(n).kinds[kindOf(static_cast<uint8_t>(l[0]))] = n;
      at(n).literals = std::move(literals);
      return n;
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array()) {
        for (const Json& one : t) {
          if (!one.is_string()) return invalid(path, "type must be a string or a list of them");
          types.push_back(one.get<std::string>());
        }
      } else {
        return invalid(path, "type must be a string or a list of them");
      }
    } else if (s.contains("properties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else {
      at(n).free = true;  // No constraint: any value.
      at(n).kinds.fill(n);
      return n;
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
      if (absl::Status s_object = compileObject(s, n, path); !s_object.ok()) return s_object;
    }
    if (at(n).kinds[JsonSchema::kArray] >= 0) {
      if (absl::Status s_array = compileArray(s, n, path); !s_array.ok()) return s_array;
    }
    return n;
  }

  absl::Status compileObject(const Json& s, int32_t n, const std::string& path) {
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
        properties.try_emplace(name.get<std::string>(), Json(true));  // Any value.
      }
    }
    if (!s.contains("properties") && required.empty()) {
      at(n).free = true;  // Any members.
      return absl::OkStatus();
    }
    if (properties.size() > JsonSchema::kMaxProperties)
      return unsupported(path, "an object of more than 64 properties");
    // Sorted by the name as written (JSON-escaped), the order the grammar matches in.
    std::vector<std::pair<std::string, std::string>> written;  // (escaped, name)
    for (const auto& [name, schema] : properties) {
      const std::string quoted = Json(name).dump();
      written.emplace_back(quoted.substr(1, quoted.size() - 2), name);
    }
    std::sort(written.begin(), written.end());
    std::vector<std::string> keys;
    std::vector<int32_t> values;
    uint64_t required_bits = 0;
    for (size_t i = 0; i < written.size(); ++i) {
      const std::string& name = written[i].second;
      absl::StatusOr<int32_t> value =
          compile(properties[name], absl::StrCat(path, "/properties/", name));
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

  absl::Status compileArray(const Json& s, int32_t n, const std::string& path) {
    absl::StatusOr<int32_t> items =
        s.contains("items") ? compile(s["items"], path + "/items") : anyNode();
    if (!items.ok()) return items.status();
    uint32_t low = 0, high = UINT32_MAX;
    for (auto [keyword, bound] : {std::pair{"minItems", &low}, std::pair{"maxItems", &high}}) {
      if (!s.contains(keyword)) continue;
      if (!s[keyword].is_number_unsigned() || s[keyword].get<uint64_t>() > 1000000)
        return invalid(path, absl::StrCat(keyword, " must be an integer in 0..1000000"));
      *bound = s[keyword].get<uint32_t>();
    }
    if (low > high) return invalid(path, "minItems is larger than maxItems");
    Node& node = at(n);
    node.items = *items;
    node.min_items = low;
    node.max_items = high;
    return absl::OkStatus();
  }

  // anyOf / oneOf whose branches allow different kinds of value; allOf of one schema.
  absl::StatusOr<int32_t> compileUnion(const Json& s, const char* keyword,
                                       const std::string& path) {
    const Json& branches = s[keyword];
    if (!branches.is_array() || branches.empty())
      return invalid(path, absl::StrCat(keyword, " must be a non-empty array"));
    for (const char* other : {"type", "enum", "const", "properties", "items"}) {
      if (s.contains(other))
        return unsupported(path, absl::StrCat(keyword, " beside \"", other, "\""));
    }
    if (std::string_view(keyword) == "allOf") {
      if (branches.size() != 1) return unsupported(path, "allOf of more than one schema");
      return compile(branches[0], path + "/allOf/0");
    }
    absl::StatusOr<int32_t> made = newNode();
    if (!made.ok()) return made.status();
    std::array<int32_t, JsonSchema::kKinds> kinds{-1, -1, -1, -1, -1, -1, -1};
    for (size_t i = 0; i < branches.size(); ++i) {
      absl::StatusOr<int32_t> branch =
          compile(branches[i], absl::StrCat(path, "/", keyword, "/", i));
      if (!branch.ok()) return branch.status();
      for (int k = 0; k < JsonSchema::kKinds; ++k) {
        const int32_t to = at(*branch).kinds[k];
        if (to < 0) continue;
        if (kinds[k] >= 0 && kinds[k] != to) {
          static const char* kNames[] = {"objects", "arrays", "strings", "numbers",
                                         "true",    "false",  "null"};
          return unsupported(path, absl::StrCat(keyword, ": two branches both allow ", kNames[k],
                                                "; the grammar tells branches apart by the kind "
                                                "of value only"));
        }
        kinds[k] = to;
      }
    }
    at(*made).kinds = kinds;
    return *made;
  }

 public:
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
  const Json& document_;
  std::vector<JsonSchema::Node>* nodes_ = nullptr;
  std::map<std::string, int32_t> refs_;
  int32_t any_ = -1;
  int depth_ = 0;
};

absl::StatusOr<std::shared_ptr<const JsonSchema>> JsonSchema::compile(std::string_view text) {
  const Json document = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) return absl::InvalidArgumentError("the JSON schema is not JSON");
  // The root is node 0: reserve it, then compile into the rest.
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
  return literal_ < 0 && !key_;
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
      syntax_ = probe;
      return true;
    }
    // `c` ends the number and belongs to what follows it.
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
      if (!before.key_) return syntax_.step(c);  // A string the schema leaves free.
      if (!syntax_.step(c)) return false;
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
        if (top->count > schema_->node(top->node).max_items) return false;
        node = schema_->node(top->node).items;
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
  return true;
}

bool JsonSchemaGrammar::narrow(const std::vector<std::string>& candidates, uint8_t c,
                               const Frame* keys_of) {
  // Sorted candidates sharing a prefix are contiguous: keep those with `c` next.
  const char ch = static_cast<char>(c);
  uint16_t lo = match_.lo, hi = match_.hi;
  while (lo < hi && (candidates[lo].size() <= match_.offset || candidates[lo][match_.offset] < ch))
    ++lo;
  uint16_t end = lo;
  while (end < hi && candidates[end].size() > match_.offset && candidates[end][match_.offset] == ch)
    ++end;
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
  if (literal_ < 0) return true;
  const bool whole = matched(schema_->node(literal_).literals) >= 0;
  literal_ = -1;
  return whole;
}

}  // namespace cleave::engine
