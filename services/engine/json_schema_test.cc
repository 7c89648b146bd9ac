// JsonSchema's compiler (what it follows, what it refuses and where), and
// JsonSchemaGrammar on hand-written instances and non-instances of a pydantic-style schema,
// every prefix of an instance, and random documents it lets through (checked as instances
// by hand); the mask over a real vocabulary exact in the schema's states.
#include "services/engine/json_schema.h"

#include <arpa/inet.h>

#include <cmath>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/engine/json_constraint.h"
#include "services/engine/json_mask_check.h"

namespace cleave::engine {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

// A person as pydantic writes it: Optional fields as anyOf with null, a nested model
// through $defs, an Enum, a bounded list.
const char* kPerson = R"({
  "title": "Person", "type": "object", "additionalProperties": false,
  "properties": {
    "name": {"type": "string", "title": "Name"},
    "age": {"type": "integer"},
    "height": {"type": "number", "format": "float"},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}], "default": null},
    "color": {"enum": ["red", "green", 1.5]},
    "extra": {}
  },
  "required": ["name", "age"],
  "$defs": {"Pet": {"type": "object", "properties": {
                      "kind": {"const": "cat"},
                      "friend": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]}},
                    "required": ["kind"]}}
})";

std::shared_ptr<const JsonSchema> person() {
  static const std::shared_ptr<const JsonSchema> schema = *JsonSchema::compile(kPerson);
  return schema;
}

bool accepts(const std::string& text) {
  JsonSchemaGrammar grammar(person().get());
  return grammar.pushAll(text) && grammar.complete();
}

TEST(JsonSchemaTest, InstancesPassAndEverythingElseIsStopped) {
  for (const char* good : {
           R"({"name": "a", "age": 3})",
           R"({"age": -3, "name": "x \"y\"\n", "tags": ["a", "b"], "pet": null, "color": "green"})",
           R"({"name":"a","age":10,"pet":{"kind":"cat","friend":{"kind":"cat"}},"color":1.5})",
           R"({"name":"a","age":1,"pet":{"friend":{"kind":"cat","friend":null},"kind":"cat"}})",
           R"({"name": "a", "age": 0, "height": 1.5e3, "extra": {"any": [1, {"x": null}]}})",
           R"({"extra": "s", "name": "", "age": 12, "tags": ["z"]})",
       }) {
    EXPECT_TRUE(accepts(good)) << good;
    // Every prefix is taken as it comes, byte by byte.
    JsonSchemaGrammar grammar(person().get());
    for (char c : std::string(good)) ASSERT_TRUE(grammar.push(static_cast<uint8_t>(c))) << good;
  }
  for (const char* bad : {
           R"({"name": "a"})",                                       // age required
           R"({"name": "a", "age": 1.5})",                           // an integer
           R"({"name": "a", "age": 1e3})",                           // an integer
           R"({"name": 1, "age": 1})",                               // a string
           R"({"name": "a", "age": 1, "x": 1})",                     // not a property
           R"({"name": "a", "nam": "b", "age": 1})",                 // a prefix of a property
           R"({"name": "a", "name": "b", "age": 1})",                // twice
           R"({"name": "a", "age": 1, "tags": []})",                 // minItems
           R"({"name": "a", "age": 1, "tags": ["a","b","c","d"]})",  // maxItems
           R"({"name": "a", "age": 1, "tags": [1]})",                // items
           R"({"name": "a", "age": 1, "color": "blue"})",            // enum
           R"({"name": "a", "age": 1, "color": "re"})",              // a prefix of an enum value
           R"({"name": "a", "age": 1, "color": 1.50})",              // enum values as compact JSON
           R"({"name": "a", "age": 1, "pet": {"kind": "dog"}})",     // const
           R"({"name": "a", "age": 1, "pet": {}})",                  // kind required
           R"({"name": "a", "age": 1, "pet": "cat"})",               // object or null
           R"({"name": "a", "age": 1, "extra": {"a": tru}})",        // still JSON inside
           R"(["name"])",                                            // the root is an object
       }) {
    EXPECT_FALSE(accepts(bad)) << bad;
  }
}

// Each keyword the grammar follows holds beside the others: a type list, enum beside type,
// const beside enum, additionalProperties without properties (none, or a map), numbers
// inside enum values, keys beyond ASCII.
TEST(JsonSchemaTest, KeywordsHoldTogether) {
  auto check = [](const char* schema, std::vector<std::string> good, std::vector<std::string> bad) {
    auto compiled = JsonSchema::compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status() << " " << schema;
    for (const std::string& text : good) {
      JsonSchemaGrammar grammar(compiled->get());
      EXPECT_TRUE(grammar.pushAll(text) && grammar.complete()) << schema << " " << text;
    }
    for (const std::string& text : bad) {
      JsonSchemaGrammar grammar(compiled->get());
      EXPECT_FALSE(grammar.pushAll(text) && grammar.complete()) << schema << " " << text;
    }
  };
  check(R"({"type": "object", "properties": {"v": {"type": ["object", "integer"]},
            "w": {"type": ["object", "array"], "items": {"type": "string"}}}})",
        {R"({"v": 2, "w": ["a"]})", R"({"v": {"a": 1.5}, "w": {}})"},
        {R"({"v": 1.5})", R"({"w": [1]})"});
  check(R"({"type": "object", "properties": {"s": {"type": "string", "enum": ["a", 1]},
            "c": {"const": "a", "enum": ["a", "b"]}, "i": {"type": "integer", "enum": [1, 2.5]}}})",
        {R"({"s": "a", "c": "a", "i": 1})"}, {R"({"s": 1})", R"({"c": "b"})", R"({"i": 2.5})"});
  check(R"({"type": "object", "properties": {"e": {"type": "object", "additionalProperties": false},
            "m": {"type": "object", "additionalProperties": {"type": "integer"}}}})",
        {R"({"e": {}, "m": {"k": 1, "j": -2}})", R"({"m": {}})"},
        {R"({"e": {"x": 1}})", R"({"m": {"k": "s"}})", R"({"m": {"k": 1.5}})"});
  check(R"({"type": "object", "required": ["b"], "additionalProperties": {"type": "integer"}})",
        {R"({"b": 3})"}, {R"({"b": "s"})", R"({})"});
  check(R"({"type": "object", "properties": {"v": {"const": {"a": 1}}, "w": {"enum": [[1, 20]]}}})",
        {R"({"v": {"a":1}, "w": [1,20]})"}, {R"({"v": {"a":12}})", R"({"w": [1,2]})"});
  check(
      R"({"type": "object", "properties": {"a": {}, "é": {"enum": ["a", "é"]}}, "required": ["é"]})",
      {R"({"a": 1, "é": "é"})", R"({"é": "a"})"}, {R"({"a": 1})", R"({"é": "e"})"});
}

// A union of objects told apart by a property each fixes to its own constant (pydantic's
// discriminated unions, with or without the discriminator annotation): that property is
// written first, and its value picks the branch the rest of the object follows.
TEST(JsonSchemaTest, DiscriminatedUnionsPickTheirBranchByTheKeyValue) {
  const char* schema = R"({"type": "object", "properties": {"pet": {
      "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"type": "null"}],
      "discriminator": {"propertyName": "kind"}}},
    "required": ["pet"],
    "$defs": {
      "Cat": {"type": "object", "properties": {"kind": {"const": "cat", "type": "string"},
              "lives": {"type": "integer"}}, "required": ["kind", "lives"]},
      "Dog": {"type": "object", "properties": {"kind": {"enum": ["dog"]},
              "good": {"type": "boolean"}}, "required": ["kind"]}}})";
  auto compiled = JsonSchema::compile(schema);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  auto accepts = [&](const std::string& text) {
    JsonSchemaGrammar grammar(compiled->get());
    return grammar.pushAll(text) && grammar.complete();
  };
  EXPECT_TRUE(accepts(R"({"pet": {"kind": "cat", "lives": 9}})"));
  EXPECT_TRUE(accepts(R"({"pet": {"kind": "dog", "good": true}})"));
  EXPECT_TRUE(accepts(R"({"pet": {"kind": "dog"}})"));
  EXPECT_TRUE(accepts(R"({"pet": null})"));
  EXPECT_FALSE(accepts(R"({"pet": {"kind": "cat", "good": true}})"));  // a Dog's property
  EXPECT_FALSE(accepts(R"({"pet": {"kind": "cat"}})"));                // lives required
  EXPECT_FALSE(accepts(R"({"pet": {"lives": 9, "kind": "cat"}})"));    // the key comes first
  EXPECT_FALSE(accepts(R"({"pet": {"kind": "cow"}})"));
  EXPECT_FALSE(accepts(R"({"pet": {}})"));
  // Without the annotation, the first property that tells the branches apart.
  auto plain = JsonSchema::compile(R"({"anyOf": [
      {"type": "object", "properties": {"name": {"const": "a"}, "x": {"type": "integer"}}},
      {"type": "object", "properties": {"name": {"const": "b"}, "y": {"type": "string"}}}]})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  JsonSchemaGrammar grammar(plain->get());
  EXPECT_TRUE(grammar.pushAll(R"({"name": "b", "y": "z"})") && grammar.complete());
  EXPECT_THAT(std::string(JsonSchema::compile(R"({"anyOf": [
      {"type": "object", "properties": {"a": {"type": "integer"}}},
      {"type": "object", "properties": {"b": {"type": "string"}}}]})")
                              .status()
                              .message()),
              HasSubstr("no property has its own constant value in each"));
}

TEST(JsonSchemaTest, RefusesWhatItCannotEnforceSayingWhere) {
  auto refusal = [](const std::string& schema) {
    absl::StatusOr<std::shared_ptr<const JsonSchema>> compiled = JsonSchema::compile(schema);
    return compiled.ok() ? std::string("ok") : std::string(compiled.status().message());
  };
  EXPECT_EQ(refusal(kPerson), "ok");
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"a": {"type": "array",
               "uniqueItems": true}}})"),
              HasSubstr("at /properties/a: \"uniqueItems\" is not supported"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"a": {"type": "string",
               "pattern": "(a)\\1"}}})"),
              HasSubstr("at /properties/a: pattern: the regular expression uses a backreference"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"a": {"type": "string",
               "pattern": "a[ab]{14}$"}}})"),
              HasSubstr("more than 2048 automaton states"));
  // Few states, but each a set of thousands of NFA states: refused for the work, at once.
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"a": {"type": "string",
               "pattern": "^(a{0,1000}){0,30}b$"}}})"),
              HasSubstr("more than 8000000 steps to build"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"a": {"minLength": 3,
               "maxLength": 2}}})"),
              HasSubstr("minLength is larger than maxLength"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"n": {"type": "integer",
               "multipleOf": 2}}})"),
              HasSubstr("at /properties/n: \"multipleOf\" is not supported"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"n": {"minimum": 5,
               "exclusiveMaximum": 5}}})"),
              HasSubstr("at /properties/n: no number lies between the lower bound 5 and the upper "
                        "bound 5"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"n": {"type": "integer",
               "minimum": 0.2, "maximum": 0.8}}})"),
              HasSubstr("no integer of at most 15 significant digits"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"n": {"minimum": 1e20}}})"),
              HasSubstr("lies within the bounds (100000000000000000000 to none)"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"n": {"minimum": "1"}}})"),
              HasSubstr("minimum must be a number"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"n": {"exclusiveMinimum": true}}})"),
              HasSubstr("exclusiveMinimum true or false needs minimum"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"p": {"enum": [1, 2],
               "minimum": 2}}})"),
              HasSubstr("\"minimum\" beside enum"));
  EXPECT_THAT(refusal(R"({"type": "array"})"), HasSubstr("object at its root"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"},
               {"enum": ["x"]}]}}})"),
              HasSubstr("two branches both allow strings"));
  EXPECT_THAT(refusal(R"({"$ref": "#/$defs/Missing"})"), HasSubstr("names nothing"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"a": {"type": "text"}}})"),
              HasSubstr("unknown type \"text\""));
  EXPECT_THAT(refusal("{not json"), HasSubstr("not JSON"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"p": {"anyOf": [{"type": "object"},
               {"type": "null"}], "required": ["a"]}}})"),
              HasSubstr("at /properties/p: \"required\" beside anyOf"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"p": {"oneOf": [
               {"properties": {"a": {}}}, {"type": "string"}]}}})"),
              HasSubstr("at /properties/p/oneOf/0: a oneOf branch without \"type\""));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"p": {"enum": [[1, 2, 3]],
               "maxItems": 2}}})"),
              HasSubstr("\"maxItems\" beside enum"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"p": {"enum": [1e300]}}})"),
              HasSubstr("cannot be written"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"p": {"type": []}}})"),
              HasSubstr("non-empty list"));
  EXPECT_THAT(refusal(R"({"type": "object", "required": ["x"], "additionalProperties": false})"),
              HasSubstr("\"x\" is required but not in properties"));
  std::string deep = "true";
  for (int i = 0; i < 200; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"d": )" + deep + "}}"),
              HasSubstr("nested more than 128 deep"));
  EXPECT_EQ(JsonSchema::compile(R"({"type": "object", "properties": {"a": {"not": {}}}})")
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(JsonSchema::compile("[1]").status().code(), absl::StatusCode::kInvalidArgument);
}

// A document grown byte by byte from `alphabet`, each byte one the grammar of `schema`
// takes, closers ('}', ']', '"') preferred one time in `closer_odds` so documents end;
// empty when it did not complete within 400 bytes. A dead end (no byte taken) fails.
std::string growDocument(const JsonSchema* schema, std::string_view alphabet,
                         std::mt19937_64& random, int closer_odds) {
  JsonSchemaGrammar grammar(schema);
  std::string text;
  for (int step = 0; step < 400 && !grammar.complete(); ++step) {
    std::vector<char> allowed;
    for (char c : alphabet) {
      JsonSchemaGrammar next = grammar;
      if (next.push(static_cast<uint8_t>(c))) allowed.push_back(c);
    }
    if (allowed.empty()) {
      ADD_FAILURE() << "a dead end after " << text;
      return "";
    }
    char pick = allowed[random() % allowed.size()];
    for (char closer : {'}', ']', '"'}) {
      if (random() % closer_odds == 0 &&
          std::find(allowed.begin(), allowed.end(), closer) != allowed.end()) {
        pick = closer;
      }
    }
    EXPECT_TRUE(grammar.push(static_cast<uint8_t>(pick)));
    text += pick;
  }
  return grammar.complete() ? text : "";
}

// Random documents grown byte by byte from what the grammar takes (closing brackets and
// quotes favoured so they end) are instances: checked here against the schema's rules.
TEST(JsonSchemaTest, EveryDocumentTheGrammarCompletesIsAnInstance) {
  std::mt19937_64 random(11);
  const std::string alphabet = "{}[]\",:0123456789.-E abcdefghijklmnopqrstuvwxyz";
  int completed = 0;
  for (int run = 0; run < 400 && completed < 60 && !HasFailure(); ++run) {
    const std::string text = growDocument(person().get(), alphabet, random, 2);
    if (text.empty()) continue;
    ++completed;
    const Json j = Json::parse(text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
    // An integer (past int64, nlohmann reads it as a double with no fraction).
    ASSERT_TRUE(j.contains("age") && j["age"].is_number() &&
                std::floor(j["age"].get<double>()) == j["age"].get<double>())
        << text;
    for (const auto& [key, value] : j.items()) {
      ASSERT_TRUE(Json::parse(kPerson)["properties"].contains(key)) << text;
    }
    if (j.contains("tags")) {
      ASSERT_TRUE(j["tags"].is_array() && !j["tags"].empty() && j["tags"].size() <= 3) << text;
    }
    if (j.contains("color")) {
      ASSERT_TRUE(j["color"] == "red" || j["color"] == "green" || j["color"] == 1.5) << text;
    }
    if (j.contains("pet") && !j["pet"].is_null()) ASSERT_EQ(j["pet"]["kind"], "cat") << text;
    if (j.contains("height")) ASSERT_TRUE(j["height"].is_number()) << text;
  }
  EXPECT_GE(completed, 30);
}

const char* kCodes = R"({"type": "object", "properties": {
    "code": {"type": "string", "pattern": "^[A-Z]{2,3}-\\d{2}$"},
    "word": {"type": "string", "minLength": 2, "maxLength": 4},
    "note": {"type": "string", "pattern": "ab", "maxLength": 6}},
  "required": ["code", "word", "note"]})";

// Whole documents: accepted and complete, or refused (at some byte).
bool instance(const JsonSchema& schema, const std::string& text) {
  JsonSchemaGrammar grammar(&schema);
  return grammar.pushAll(text) && grammar.complete();
}

// minLength and maxLength count characters once unescaped; a pattern is searched for in
// the unescaped string unless anchored.
TEST(JsonSchemaTest, StringLengthsAndPatternsAreFollowed) {
  auto schema = JsonSchema::compile(kCodes);
  ASSERT_TRUE(schema.ok()) << schema.status();
  auto doc = [](const std::string& code, const std::string& word, const std::string& note) {
    return R"({"code": ")" + code + R"(", "word": ")" + word + R"(", "note": ")" + note + R"("})";
  };
  EXPECT_TRUE(instance(**schema, doc("AB-12", "h\u00e9", "xxabyy")));  // raw UTF-8
  EXPECT_TRUE(instance(**schema, doc("ABC-99", "\u00e9\u00e9\u00e9\u00e9", "ab")));
  // Escapes count and match as the characters they stand for; under a pattern, \u is not
  // written (the character is).
  EXPECT_TRUE(instance(**schema, doc("XY-00", "\\n\\t", "\\nab")));
  EXPECT_TRUE(instance(**schema, doc("XY-00", "\\u00e9\\u00e9\\u00e9", "a\\\"ab")));
  EXPECT_FALSE(instance(**schema, doc("XY-00", "hi", "\\u0061b")));
  // No dead ends: with 6 characters at most and "ab" still to come, a fifth x is refused.
  JsonSchemaGrammar grammar(schema->get());
  ASSERT_TRUE(grammar.pushAll(R"({"code": "AB-12", "word": "hi", "note": "xxxx)"));
  JsonSchemaGrammar fifth = grammar;
  EXPECT_FALSE(fifth.push('x'));
  EXPECT_TRUE(grammar.pushAll("ab\"}"));
  EXPECT_TRUE(grammar.complete());
  for (const std::string& bad :
       {doc("AB-1", "hi", "ab"), doc("ab-12", "hi", "ab"), doc("ABCD-12", "hi", "ab"),
        doc("AB-123", "hi", "ab"), doc("AB-12", "h", "ab"), doc("AB-12", "hello", "ab"),
        doc("AB-12", "\u00e9", "ab"), doc("AB-12", "\\u00e9", "ab"),
        doc("AB-12", "\\u00e9\\n\\t\\\\x", "ab"), doc("AB-12", "hi", "a"), doc("AB-12", "hi", "ba"),
        doc("AB-12", "hi", "xxxxab1"), doc("AB-12", "hi", "a\\u0063")}) {
    EXPECT_FALSE(instance(**schema, bad)) << bad;
  }
}

// pydantic's conint(ge=0, le=120), confloat(gt=-273.15), Field(lt=1.5); draft 4's boolean
// exclusive bounds; the tighter of two bounds on a side.
const char* kMeasures = R"({"type": "object", "properties": {
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "celsius": {"type": "number", "exclusiveMinimum": -273.15},
    "ratio": {"anyOf": [{"type": "number", "exclusiveMaximum": 1.5}, {"type": "null"}]},
    "d4": {"type": "number", "minimum": 2, "exclusiveMinimum": true, "maximum": 3},
    "both": {"type": "integer", "minimum": -10, "exclusiveMinimum": -3, "maximum": 9,
             "exclusiveMaximum": 10}},
  "required": ["age", "celsius"]})";

TEST(JsonSchemaTest, NumberBoundsAreFollowed) {
  auto schema = JsonSchema::compile(kMeasures);
  ASSERT_TRUE(schema.ok()) << schema.status();
  auto doc = [](const std::string& age, const std::string& celsius, const std::string& rest = "") {
    return R"({"age": )" + age + R"(, "celsius": )" + celsius + rest + "}";
  };
  for (const std::string& good :
       {doc("0", "-273.149"), doc("120", "0"), doc("37", "1000"), doc("7", "-273.14999999999"),
        doc("1", "2", R"(, "ratio": 1.4999)"), doc("1", "2", R"(, "ratio": null)"),
        doc("1", "2", R"(, "ratio": -100000)"), doc("1", "2", R"(, "d4": 2.5)"),
        doc("1", "2", R"(, "d4": 3)"), doc("1", "2", R"(, "both": -2)"),
        doc("1", "2", R"(, "both": 9)")}) {
    EXPECT_TRUE(instance(**schema, good)) << good;
  }
  for (const std::string& bad :
       {doc("-1", "0"), doc("121", "0"), doc("1000", "0"), doc("1.0", "0"), doc("5", "-273.15"),
        doc("5", "-274"), doc("5", "-273.150000000001"), doc("5", "0", R"(, "ratio": 1.5)"),
        doc("5", "0", R"(, "ratio": 2)"), doc("5", "0", R"(, "d4": 2)"),
        doc("5", "0", R"(, "d4": 3.01)"), doc("5", "0", R"(, "both": -3)"),
        doc("5", "0", R"(, "both": 10)"),
        // Bounded numbers are plain decimals of at most 15 significant digits.
        doc("5", "0.1234567890123456"), doc("37", "1e3"), doc("5", "0", R"(, "ratio": -1e5)")}) {
    EXPECT_FALSE(instance(**schema, bad)) << bad;
  }
  // No dead ends: "12" may still become 120, "13" may not go on; "-" leads only to -0.
  JsonSchemaGrammar grammar(schema->get());
  ASSERT_TRUE(grammar.pushAll(R"({"age": 1)"));
  EXPECT_TRUE(JsonSchemaGrammar(grammar).pushAll("20,"));
  EXPECT_FALSE(JsonSchemaGrammar(grammar).pushAll("30"));
  EXPECT_FALSE(JsonSchemaGrammar(schema->get()).pushAll(R"({"age": -1)"));
  EXPECT_FALSE(JsonSchemaGrammar(schema->get()).pushAll(R"({"age": -0.)"));
}

// Random documents the grammar completes hold their bounds, as a validator comparing
// doubles sees them.
TEST(JsonSchemaTest, GrownNumbersLieWithinTheirBounds) {
  auto schema = JsonSchema::compile(kMeasures);
  ASSERT_TRUE(schema.ok()) << schema.status();
  std::mt19937_64 random(3);
  const std::string alphabet = "{}\",: abcdeghilorstu0123456789.-enul";
  int completed = 0, ratios = 0;
  for (int run = 0; run < 3000 && completed < 60 && !HasFailure(); ++run) {
    const std::string text = growDocument(schema->get(), alphabet, random, 3);
    if (text.empty()) continue;
    ++completed;
    const Json j = Json::parse(text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j["age"].is_number_integer()) << text;
    EXPECT_GE(j["age"].get<int64_t>(), 0) << text;
    EXPECT_LE(j["age"].get<int64_t>(), 120) << text;
    EXPECT_GT(j["celsius"].get<double>(), -273.15) << text;
    if (j.contains("ratio") && !j["ratio"].is_null()) {
      EXPECT_LT(j["ratio"].get<double>(), 1.5) << text;
      ++ratios;
    }
    if (j.contains("d4")) {
      EXPECT_GT(j["d4"].get<double>(), 2.0) << text;
      EXPECT_LE(j["d4"].get<double>(), 3.0) << text;
    }
    if (j.contains("both")) {
      EXPECT_GT(j["both"].get<int64_t>(), -3) << text;
      EXPECT_LE(j["both"].get<int64_t>(), 9) << text;
    }
  }
  EXPECT_GE(completed, 30);
  EXPECT_GE(ratios, 3);
}

// Tuples as pydantic writes them (tuple[int, str]: prefixItems with minItems = maxItems), a
// tuple with more elements of one schema, and prefixItems closed by items: false.
TEST(JsonSchemaTest, TuplesFollowPrefixItems) {
  auto schema = JsonSchema::compile(R"({"type": "object", "properties": {
      "point": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "minItems": 2, "maxItems": 2},
      "head": {"type": "array", "prefixItems": [{"type": "boolean"}], "items": {"type": "number"}},
      "closed": {"type": "array", "prefixItems": [{"type": "null"}], "items": false}},
    "required": ["point"]})");
  ASSERT_TRUE(schema.ok()) << schema.status();
  for (const char* good :
       {R"({"point": [1, "a"]})", R"({"point": [-7, ""], "head": [true, 1.5, 2]})",
        R"({"point": [1, "a"], "head": [], "closed": [null]})",
        R"({"point": [1, "a"], "closed": []})"}) {
    EXPECT_TRUE(instance(**schema, good)) << good;
  }
  for (const char* bad :
       {R"({"point": [1]})", R"({"point": [1, "a", 2]})", R"({"point": ["a", 1]})",
        R"({"point": [1, "a"], "head": [1]})", R"({"point": [1, "a"], "head": [true, "x"]})",
        R"({"point": [1, "a"], "closed": [null, null]})"}) {
    EXPECT_FALSE(instance(**schema, bad)) << bad;
  }
  EXPECT_THAT(JsonSchema::compile(R"({"type": "object", "properties": {"a": {"type": "array",
                 "items": false}}})")
                  .status()
                  .message(),
              HasSubstr("items false without prefixItems"));
  EXPECT_THAT(JsonSchema::compile(R"({"type": "object", "properties": {"a": {"prefixItems": [{}],
                 "items": false, "minItems": 2}}})")
                  .status()
                  .message(),
              HasSubstr("minItems is larger than maxItems (or prefixItems)"));
}

// pydantic's datetime, date, time, UUID, EmailStr and IPv4Address fields carry these formats.
const char* kFormats = R"({"type": "object", "properties": {
    "at": {"type": "string", "format": "date-time"}, "day": {"type": "string", "format": "date"},
    "clock": {"type": "string", "format": "time"}, "id": {"type": "string", "format": "uuid"},
    "mail": {"type": "string", "format": "email"}, "ip": {"type": "string", "format": "ipv4"},
    "site": {"type": "string", "format": "uri"}},
  "required": ["at", "day", "clock", "id", "mail", "ip", "site"]})";

// A date that exists in years 1-9999, checked by the C library's calendar.
bool realDate(const std::string& text) {
  int y = 0, m = 0, d = 0;
  if (text.size() != 10 || std::sscanf(text.c_str(), "%4d-%2d-%2d", &y, &m, &d) != 3) return false;
  if (y < 1) return false;
  std::tm t{};
  t.tm_year = y - 1900;
  t.tm_mon = m - 1;
  t.tm_mday = d;
  const std::time_t seconds = timegm(&t);
  std::tm back{};
  gmtime_r(&seconds, &back);
  return m >= 1 && m <= 12 && back.tm_mon == m - 1 && back.tm_mday == d;
}

bool realTime(const std::string& text) {
  int h = -1, mi = -1, sec = -1, n = 0;
  if (std::sscanf(text.c_str(), "%2d:%2d:%2d%n", &h, &mi, &sec, &n) != 3 || n != 8) return false;
  std::string rest = text.substr(8);
  if (rest.starts_with('.')) {
    size_t digits = 1;
    while (digits < rest.size() && std::isdigit(static_cast<unsigned char>(rest[digits]))) ++digits;
    if (digits == 1 || digits > 7) return false;
    rest = rest.substr(digits);
  }
  int oh = -1, om = -1;
  const bool zone = rest == "Z" || ((rest.size() == 6 && (rest[0] == '+' || rest[0] == '-') &&
                                     std::sscanf(rest.c_str() + 1, "%2d:%2d", &oh, &om) == 2 &&
                                     oh < 24 && om < 60 && rest[3] == ':'));
  return zone && h < 24 && mi < 60 && sec < 60;
}

TEST(JsonSchemaTest, FormatsOfCommonTypesAreFollowed) {
  auto schema = JsonSchema::compile(kFormats);
  ASSERT_TRUE(schema.ok()) << schema.status();
  auto doc = [](const std::string& at, const std::string& day, const std::string& id) {
    return R"({"at": ")" + at + R"(", "day": ")" + day + R"(", "clock": "23:59:60Z", "id": ")" +
           id + R"(", "mail": "a.b@c.io", "ip": "10.0.0.255", "site": "any text"})";
  };
  const std::string id = "123e4567-e89b-42d3-a456-426614174000";
  // 23:59:60 (a leap second) is no time here.
  EXPECT_FALSE(instance(**schema, doc("2026-12-05T13:48:05Z", "2026-02-28", id)));
  auto good = [&](const std::string& at, const std::string& day, const std::string& clock) {
    return R"({"at": ")" + at + R"(", "day": ")" + day + R"(", "clock": ")" + clock +
           R"(", "id": ")" + id + R"(", "mail": "a.b@c.io", "ip": "10.0.0.255", "site": "x"})";
  };
  EXPECT_TRUE(instance(**schema, good("2026-12-05T13:48:05Z", "2024-02-29", "00:00:00+05:30")));
  for (const char* day : {"2000-02-29", "0004-02-29", "9996-02-29", "0001-01-01"})
    EXPECT_TRUE(instance(**schema, good("2026-12-05T13:48:05Z", day, "12:00:00Z"))) << day;
  EXPECT_TRUE(
      instance(**schema, good("1999-01-31T23:59:59.123456-08:00", "2026-04-30", "12:00:00Z")));
  for (const auto& [at, day] :
       std::vector<std::pair<std::string, std::string>>{{"2026-12-05 13:48:05Z", "2026-01-01"},
                                                        {"2026-12-05T13:48:05", "2026-01-01"},
                                                        {"2026-13-05T13:48:05Z", "2026-01-01"},
                                                        {"2026-12-05T24:00:00Z", "2026-01-01"},
                                                        {"2026-12-05T13:48:05Z", "2026-04-31"},
                                                        {"2026-12-05T13:48:05Z", "2026-02-30"},
                                                        {"2026-12-05T13:48:05Z", "2026-02-29"},
                                                        {"2026-12-05T13:48:05Z", "1900-02-29"},
                                                        {"2026-12-05T13:48:05Z", "0000-01-01"},
                                                        {"2023-02-29T13:48:05Z", "2026-01-01"}}) {
    EXPECT_FALSE(instance(**schema, good(at, day, "12:00:00Z"))) << at << " " << day;
  }
  // Grown documents: every value what the C library and inet_pton call valid.
  std::mt19937_64 random(9);
  const std::string alphabet = "{}\",: abcdefiklmopstyTZ.@+-0123456789";
  int completed = 0;
  for (int run = 0; run < 3000 && completed < 25 && !HasFailure(); ++run) {
    const std::string text = growDocument(schema->get(), alphabet, random, 3);
    if (text.empty()) continue;
    ++completed;
    const Json j = Json::parse(text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << text;
    const std::string at = j["at"];
    ASSERT_GT(at.size(), 11u) << text;
    EXPECT_TRUE(realDate(at.substr(0, 10)) && at[10] == 'T' && realTime(at.substr(11))) << at;
    EXPECT_TRUE(realDate(j["day"])) << text;
    EXPECT_TRUE(realTime(j["clock"])) << text;
    const std::string uuid = j["id"];
    EXPECT_TRUE(uuid.size() == 36 &&
                std::all_of(uuid.begin(), uuid.end(),
                            [&](char c) {
                              return c == '-' || std::isxdigit(static_cast<unsigned char>(c));
                            }) &&
                uuid[8] == '-' && uuid[13] == '-' && uuid[18] == '-' && uuid[23] == '-')
        << uuid;
    in_addr address{};
    const std::string ip = j["ip"];
    EXPECT_EQ(inet_pton(AF_INET, ip.c_str(), &address), 1) << ip;
    const std::string mail = j["mail"];
    const size_t at_sign = mail.find('@');
    EXPECT_TRUE(at_sign != std::string::npos && at_sign > 0 &&
                mail.find('.', at_sign) != std::string::npos && mail.back() != '.')
        << mail;
  }
  EXPECT_GE(completed, 10);
}

// A pattern with lengths: a string that could only match too short or too long is not
// begun, and one that cannot fit at all is refused when compiled.
TEST(JsonSchemaTest, PatternsAndLengthsLeaveNoDeadEnd) {
  auto schema = JsonSchema::compile(R"({"type": "object", "properties": {
      "a": {"type": "string", "pattern": "^(ab|c)$", "minLength": 2},
      "b": {"type": "string", "pattern": "^x+$", "minLength": 3, "maxLength": 4}},
    "required": ["a", "b"]})");
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_TRUE(instance(**schema, R"({"a": "ab", "b": "xxx"})"));
  EXPECT_TRUE(instance(**schema, R"({"a": "ab", "b": "xxxx"})"));
  JsonSchemaGrammar grammar(schema->get());
  ASSERT_TRUE(grammar.pushAll(R"({"a": ")"));
  EXPECT_FALSE(JsonSchemaGrammar(grammar).push('c'));  // "c" is a match, but too short.
  EXPECT_FALSE(instance(**schema, R"({"a": "ab", "b": "xx"})"));
  EXPECT_FALSE(instance(**schema, R"({"a": "ab", "b": "xxxxx"})"));
  for (const char* bad : {R"({"type": "object", "properties": {"a": {"type": "string",
                              "pattern": "^abcdef$", "maxLength": 3}}})",
                          R"({"type": "object", "properties": {"a": {"type": "string",
                              "pattern": "^a{1,2}$", "minLength": 3}}})"}) {
    EXPECT_THAT(JsonSchema::compile(bad).status().message(),
                HasSubstr("no string of the pattern has a length within minLength and maxLength"))
        << bad;
  }
}

// Random documents the grammar completes, against std::regex's ECMAScript search (the
// dialect JSON Schema names) and lengths counted in code points.
TEST(JsonSchemaTest, GrownStringsMatchTheirPatternsAsECMAScriptSearches) {
  auto schema = JsonSchema::compile(kCodes);
  ASSERT_TRUE(schema.ok()) << schema.status();
  const std::regex code("^[A-Z]{2,3}-\\d{2}$", std::regex::ECMAScript);
  const std::regex note("ab", std::regex::ECMAScript);
  std::mt19937_64 random(5);
  const std::string alphabet = "{}\",: abcdenortwxyzABXY-0129\\u";
  int completed = 0;
  for (int run = 0; run < 3000 && completed < 40 && !HasFailure(); ++run) {
    const std::string text = growDocument(schema->get(), alphabet, random, 3);
    if (text.empty()) continue;
    ++completed;
    const Json j = Json::parse(text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << text;
    const std::string c = j["code"], w = j["word"], n = j["note"];
    EXPECT_TRUE(std::regex_search(c, code)) << text;
    EXPECT_TRUE(std::regex_search(n, note)) << text;
    auto characters = [](const std::string& utf8) {
      return std::count_if(utf8.begin(), utf8.end(),
                           [](char b) { return (static_cast<uint8_t>(b) & 0xC0) != 0x80; });
    };
    EXPECT_LE(characters(n), 6) << text;
    EXPECT_GE(characters(w), 2) << text;
    EXPECT_LE(characters(w), 4) << text;
  }
  EXPECT_GE(completed, 20);
}

// On SmolLM2's vocabulary, the grouped mask under a schema allows exactly the tokens whose
// bytes the grammar takes, token by token, in the states an instance passes through (keys
// matched against the properties, an enum, free strings, numbers).
TEST(JsonSchemaTest, TheMaskIsExactOnARealVocabulary) {
  uint32_t end = 0;
  const std::shared_ptr<const TokenBytes> bytes = smolLm2TokenBytes(end);
  if (bytes == nullptr) GTEST_SKIP() << "SmolLM2 missing";
  JsonConstraint constraint(bytes, {end}, person());
  expectMaskExact(
      constraint, JsonSchemaGrammar(person().get()), *bytes, end,
      R"({"name": "Fel\u00e9ix", "color": "green", "tags": ["a b"], "age": 12, "pet": null})", 2);
  // Strings with lengths and patterns: each token simulated.
  auto codes = JsonSchema::compile(kCodes);
  ASSERT_TRUE(codes.ok()) << codes.status();
  JsonConstraint constrained(bytes, {end}, *codes);
  expectMaskExact(constrained, JsonSchemaGrammar(codes->get()), *bytes, end,
                  R"({"code": "AB-12", "word": "h\u00e9", "note": "xab"})", 3);
  // Bounded numbers: each digit token checked against the bounds.
  auto measures = JsonSchema::compile(kMeasures);
  ASSERT_TRUE(measures.ok()) << measures.status();
  JsonConstraint bounded(bytes, {end}, *measures);
  expectMaskExact(bounded, JsonSchemaGrammar(measures->get()), *bytes, end,
                  R"({"age": 119, "celsius": -273.1, "ratio": 1.25})", 2);
}

}  // namespace
}  // namespace cleave::engine
