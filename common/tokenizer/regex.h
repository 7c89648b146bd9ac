// Regular expressions for pre-tokenization: PCRE2 in UTF + Unicode-property mode with JIT.
//
// Patterns are Oniguruma/Rust-style pre-tokenizer patterns (\p{L}, \s, (?i:...), (?!...)).
// Subjects may hold invalid UTF-8: ill-formed bytes never match any pattern item, so they end
// up between matches. Iteration follows Rust's and Oniguruma's find_iter: matches do not
// overlap, and an empty match never directly follows the previous match.
//
// Threading: immutable after compile(); match from any thread (scratch state is per thread).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cleave::tokenizer {

class Regex {
 public:
  // InvalidArgument naming the offset of the error in the pattern.
  static absl::StatusOr<std::unique_ptr<Regex>> compile(absl::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(start, end) for each match, left to right. Returns false when PCRE2 hit a
  // resource limit; the text after the last reported match then counts as unmatched.
  bool forEachMatch(absl::string_view text,
                    absl::FunctionRef<void(size_t start, size_t end)> on_match) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace cleave::tokenizer
