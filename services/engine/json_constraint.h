// Constrained decoding to JSON (the API's response_format "json_object" and
// "json_schema"): before each draw, tokens whose bytes cannot continue the output are
// masked out, and once it is complete only a token that ends the sequence may follow. The
// grammar is json_grammar.h's (one object), or json_schema.h's following a schema.
//
// The mask needs the bytes each token adds to the text: TokenBytes reads them from the
// tokenizer, each token after an ordinary one (a decoder may strip a text's leading space),
// and checks on sample pairs that the bytes of tokens put together are their text
// (exact()); special tokens add none and are never allowed, except those that end the
// sequence.
//
// Threading: a JsonConstraint belongs to one sequence; TokenBytes is immutable and shared.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "services/engine/json_schema.h"
#include "services/engine/output_constraint.h"

namespace cleave::tokenizer {
class Tokenizer;
}

namespace cleave::engine {

// The bytes each token of a vocabulary adds to the text (empty for special tokens), and
// the groupings that make a mask cheap: tokens by first byte, and the tokens that are
// plain string text (whole UTF-8 characters, no '"', '\\' or control characters).
class TokenBytes {
 public:
  explicit TokenBytes(const tokenizer::Tokenizer& tokenizer);
  explicit TokenBytes(std::vector<std::string> bytes);
  // Whether the bytes of tokens put together are the text of the tokens together (checked
  // on sample pairs when read from a tokenizer); a constraint needs it.
  bool exact() const { return exact_; }
  const std::string& operator[](uint32_t id) const { return bytes_[id]; }
  size_t size() const { return bytes_.size(); }
  // The tokens starting with `byte`: those of one byte first, then by second byte.
  const std::vector<uint32_t>& startingWith(uint8_t byte) const { return by_first_[byte]; }
  // Within startingWith(first): [begin, end) of the one-byte tokens (second = -1) or of
  // those whose second byte is `second`.
  std::pair<size_t, size_t> group(uint8_t first, int second) const {
    const size_t* at = &groups_[first * 258 + static_cast<size_t>(second + 1)];
    return {at[0], at[1]};
  }
  bool plainText(uint32_t id) const { return plain_[id]; }

 private:
  void sortIntoGroups();

  std::vector<std::string> bytes_;
  std::vector<std::vector<uint32_t>> by_first_;
  std::vector<size_t> groups_;  // per first byte, 258 offsets into by_first_[first]
  std::vector<bool> plain_;
  bool exact_ = true;
};

class JsonConstraint : public OutputConstraint {
 public:
  // `ends`: the tokens that end the sequence (at least one). `schema`: what the output
  // must be an instance of (null: any JSON object).
  JsonConstraint(std::shared_ptr<const TokenBytes> bytes, std::vector<uint32_t> ends,
                 std::shared_ptr<const JsonSchema> schema = nullptr);

  void mask(std::span<float> logits) const override;
  bool accept(uint32_t token) override;
  bool complete() const { return grammar_.complete(); }

 private:
  std::shared_ptr<const TokenBytes> bytes_;
  mutable std::vector<uint8_t> keep_;  // mask(): the tokens allowed
  std::vector<uint32_t> ends_;
  std::shared_ptr<const JsonSchema> schema_;  // What grammar_ follows (may be null).
  JsonSchemaGrammar grammar_;
};

}  // namespace cleave::engine
