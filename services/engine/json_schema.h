// Constrained decoding to a JSON Schema (the API's response_format "json_schema"): a
// schema compiled into nodes, and a grammar that follows JsonGrammar's syntax byte by byte
// while checking each value against the node that applies to it.
//
// The output is always an instance of the schema; the grammar produces a subset of the
// instances, chosen for models to write:
// * objects hold only their declared `properties` (in any order, each at most once, the
//   `required` ones before the object closes; a required name not declared takes what
//   `additionalProperties` allows). Without `properties`, `additionalProperties` decides:
//   any members (absent or true), none (false), or a map whose values follow its schema;
// * arrays: `items` (one schema for every element), `prefixItems` (the first elements'
//   schemas, as pydantic writes tuples; `items: false` allows no more), `minItems`,
//   `maxItems`;
// * `type` (one or a list), `enum` and `const` (written exactly as compact JSON), `anyOf`
//   and `oneOf` whose branches differ in the kind of value they allow (object, array,
//   string, number, boolean, null: the first byte picks the branch; pydantic's
//   Optional[X] is such a union; each oneOf branch must name its type) or objects that a
//   property fixed to its own constant in each branch tells apart (pydantic's
//   discriminated unions: the property is written first and picks the branch), `allOf` of one
//   schema, `$ref` to "#", "#/$defs/..." or "#/definitions/..." (recursion allowed, also
//   through unions); beside `$ref` and the unions only annotations;
// * `format` date-time, date, time, uuid, email and ipv4 (pydantic's datetime, date, time,
//   UUID, EmailStr, IPv4Address) are followed as patterns, unless a `pattern` is given;
//   other formats are annotations (as JSON Schema defines them by default); titles,
//   descriptions, defaults and examples are ignored.
// * strings: `minLength` and `maxLength` (in characters), `pattern` (an ECMAScript regular
//   expression, searched for as JSON Schema says: unanchored unless it starts with ^ or
//   ends with $; the syntax regex.h follows, its automaton at most kMaxPatternStates;
//   such a string is written without \u escapes, its characters as they are);
// * numbers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (numbers, or
//   draft 4's booleans beside minimum/maximum); such a number is a plain decimal of at most
//   15 significant digits (json_number_bounds.h), never one that cannot end within them;
// Anything else that constrains a value (`multipleOf`, `uniqueItems`, `not`, `if`, ...) is
// refused when compiled
// (Unimplemented, naming the keyword and where it is), never ignored. Followed containers
// nest at most kMaxFrames deep in an output (an object that would open deeper is refused
// while writing).
//
// Threading: a JsonSchema is immutable and shared; a grammar belongs to one sequence.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "services/engine/json_grammar.h"
#include "services/engine/json_number_bounds.h"
#include "services/engine/regex.h"

namespace cleave::engine {

class JsonSchema {
 public:
  // The kinds of JSON value, told apart by a value's first byte.
  enum Kind : uint8_t { kObject, kArray, kString, kNumber, kTrue, kFalse, kNull, kKinds };

  struct Node {
    // The node a value of each kind follows; -1: that kind is not allowed here.
    std::array<int32_t, kKinds> kinds{-1, -1, -1, -1, -1, -1, -1};
    bool free = false;     // Below this value, anything JSON allows.
    bool integer = false;  // A number here has no fraction or exponent.
    // enum / const: the allowed values as compact JSON texts, sorted; empty when none.
    std::vector<std::string> literals;
    // Objects: declared property names as they are written between quotes (JSON-escaped),
    // sorted, the node of each one's value, and a bit per required one.
    std::vector<std::string> keys;
    std::vector<int32_t> values;
    uint64_t required = 0;
    // A map (additionalProperties a schema, no properties): any keys, each value this node.
    int32_t map_values = -1;
    // A discriminated union's objects: `keys` holds the one property each branch fixes to
    // its own constant, written first; branches[i] follows once the value is literal i of
    // values[0].
    std::vector<int32_t> branches;
    // Arrays: the first elements' nodes (prefixItems, a tuple), the other elements' node,
    // and how many there may be.
    std::vector<int32_t> prefix_items;
    int32_t items = -1;
    uint32_t min_items = 0;
    uint32_t max_items = UINT32_MAX;
    // Strings: how many characters (code points, as written once unescaped) they may have,
    // and the pattern they must match (an index into patterns(); -1: none).
    uint32_t min_length = 0;
    uint32_t max_length = UINT32_MAX;
    int32_t pattern = -1;
    bool constrainsStrings() const {
      return min_length > 0 || max_length != UINT32_MAX || pattern >= 0;
    }
    // Numbers: their bounds (NumberBounds::any(): some).
    NumberBounds bounds;
  };

  static constexpr int kMaxProperties = 64;
  static constexpr int kMaxNodes = 10000;
  // A string pattern's automaton is built whole when the schema is compiled: at most this
  // many states each, this many patterns, and this much work for them all
  // (RegexDfa::work(); about 0.1 s).
  static constexpr size_t kMaxPatternStates = 2048;
  static constexpr size_t kMaxPatterns = 64;
  static constexpr uint64_t kMaxPatternWork = 8'000'000;

  // Compiles `text` (a JSON Schema). InvalidArgument for text that is not a schema,
  // Unimplemented for a keyword the grammar cannot enforce; messages say where
  // ("at /properties/age: ...").
  static absl::StatusOr<std::shared_ptr<const JsonSchema>> compile(std::string_view text);

  const Node& node(int32_t index) const { return nodes_[static_cast<size_t>(index)]; }
  int32_t root() const { return 0; }
  // Expanded (RegexDfa::expandAll): only read.
  const RegexDfa& pattern(int32_t index) const { return patterns_[static_cast<size_t>(index)]; }

 private:
  friend class SchemaCompiler;
  std::vector<Node> nodes_;
  std::vector<RegexDfa> patterns_;
};

// JsonGrammar's syntax with `schema` followed; without a schema, exactly JsonGrammar (one
// JSON object).
class JsonSchemaGrammar {
 public:
  JsonSchemaGrammar() = default;
  // `schema` (null: none) must outlive the grammar and its copies.
  explicit JsonSchemaGrammar(const JsonSchema* schema) : schema_(schema) {}

  bool push(uint8_t byte);
  bool pushAll(std::string_view bytes);
  bool complete() const { return syntax_.complete(); }
  // Inside a string the schema does not constrain, between characters: any plain text
  // (TokenBytes::plainText) continues it and leaves it so.
  bool betweenStringCharacters() const;
  // Without a schema: the syntax alone, which is all there is to follow.
  const JsonGrammar* plain() const { return schema_ == nullptr ? &syntax_ : nullptr; }

  // Containers the schema follows at once (deeper ones are refused).
  static constexpr int kMaxFrames = 16;

 private:
  struct Frame {
    int32_t node = -1;
    int32_t value = -1;  // Objects: the node of the value of the key just read.
    uint32_t count = 0;  // Arrays: elements begun.
    uint64_t used = 0;   // Objects: the keys written (bits in node.keys order).
  };
  // Matching a value's (or key's) bytes against sorted candidates: those in [lo, hi) share
  // the `offset` bytes read so far.
  struct Match {
    uint16_t lo = 0, hi = 0;
    uint16_t offset = 0;
  };

  bool step(uint8_t c);
  // `c` at syntax_'s current position, no number ending before it.
  bool stepAt(uint8_t c);
  bool beginValue(int32_t node, uint8_t c);
  // Narrows `match_` over `candidates` by `c`; false when nothing is left (or, for keys,
  // nothing unused).
  bool narrow(const std::vector<std::string>& candidates, uint8_t c, const Frame* keys_of);
  // The candidate matched in full by what was read, if any (-1).
  int32_t matched(const std::vector<std::string>& candidates) const;
  bool closeContainer(bool array);
  // The value that was literal-matched, integer or free ended (at its own depth).
  bool endValue();

  const JsonSchema* schema_ = nullptr;  // Copies are made per token: no count to touch.
  JsonGrammar syntax_;
  std::array<Frame, kMaxFrames> frames_{};
  uint8_t frames_used_ = 0;
  // The value being read: free from this depth (-1: not free), literal-matched (its node),
  // an integer, a key being matched.
  int8_t free_depth_ = -1;
  int32_t literal_ = -1;
  uint8_t literal_depth_ = 0;
  bool integer_ = false;
  bool key_ = false;
  Match match_;
  // A number whose node bounds it (-1: none), and its text so far.
  int32_t number_node_ = -1;
  NumberText number_;
  // A string whose node constrains strings (Node::constrainsStrings; -1: none): the
  // characters written and its pattern's state.
  int32_t string_node_ = -1;
  int32_t string_state_ = 0;
  uint32_t string_chars_ = 0;
  // `before` is the syntax before `c`, which syntax_ has taken, inside such a string.
  bool stringByte(const JsonGrammar& before, uint8_t c);
  // One character of the string's content, as `bytes` of UTF-8 (a continuation byte of a
  // character begun before counts none): false when it leaves no way to a string the node
  // allows.
  bool content(std::string_view bytes);
};

}  // namespace cleave::engine
