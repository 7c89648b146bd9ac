// Added tokens (special and user-defined tokens such as "<|im_start|>") found verbatim in
// the input before the rest of the text is tokenized.
//
// Two matching policies, one per reference:
//  * kLeftmostLongest (Hugging Face tokenizers): scan left to right, take the longest token
//    starting at the leftmost position; lstrip/rstrip/single_word apply. A special token that
//    is not to be parsed is skipped (its text stays ordinary text, and the scan resumes after
//    it).
//  * kLongestFirst (llama.cpp): longer tokens are cut out of the whole text before shorter
//    ones; special tokens that are not to be parsed are not searched at all.
//
// Threading: immutable after construction; split() from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/tokenizer.h"

namespace cleave::tokenizer {

struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool special = false;  // Matched only when EncodeOptions.parse_special.
  bool lstrip = false;   // Swallows the whitespace on its left.
  bool rstrip = false;   // Swallows the whitespace on its right.
  bool single_word = false;
  bool normalized = false;  // Matched in normalized text (Hugging Face).
};

enum class AddedTokenPolicy { kLeftmostLongest, kLongestFirst };

// A part of the input: text [begin, end) to tokenize, or a token (id >= 0) covering it.
struct Segment {
  size_t begin = 0;
  size_t end = 0;
  int64_t id = -1;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher(std::vector<AddedToken> tokens, AddedTokenPolicy policy);

  bool empty() const { return tokens_.empty(); }
  // Cuts `text` into segments covering it in order (empty text segments are left out).
  void split(absl::string_view text, bool parse_special, std::vector<Segment>* out) const;

 private:
  // Index of the longest token starting at `pos`, or -1.
  int64_t longestAt(absl::string_view text, size_t pos) const;
  void splitLeftmostLongest(absl::string_view text, bool parse_special,
                            std::vector<Segment>* out) const;
  void splitLongestFirst(absl::string_view text, bool parse_special,
                         std::vector<Segment>* out) const;
  bool isWordBoundaryOk(absl::string_view text, size_t begin, size_t end) const;

  std::vector<AddedToken> tokens_;
  AddedTokenPolicy policy_;
  // Byte trie over the contents: edges keyed by (node << 8 | byte); terminal token per node.
  absl::flat_hash_map<uint64_t, uint32_t> edges_;
  std::vector<int64_t> terminal_;
  bool first_byte_[256] = {};
  std::vector<uint32_t> by_length_;   // Token indices, longest first (kLongestFirst).
  std::unique_ptr<Regex> word_char_;  // For single_word.
};

}  // namespace cleave::tokenizer
