// UTF-8 helpers shared by the tokenizer pipeline. Every function accepts arbitrary bytes:
// invalid sequences are reported, never assumed away.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace cleave::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length of the well-formed UTF-8 sequence starting at text[pos] (1-4), or 0 when the bytes
// there are not one (a stray continuation byte, an overlong form, a surrogate, a truncated
// sequence, a value above U+10FFFF). `*cp` receives the code point when not null.
size_t utf8SequenceLength(absl::string_view text, size_t pos, char32_t* cp = nullptr);

// Length of the unit starting at text[pos] when text is cut into characters: a well-formed
// sequence, or a single byte where the bytes are not well-formed.
inline size_t utf8UnitLength(absl::string_view text, size_t pos) {
  if (static_cast<unsigned char>(text[pos]) < 0x80) return 1;
  const size_t n = utf8SequenceLength(text, pos);
  return n == 0 ? 1 : n;
}

// Length by the lead byte alone (1 for ASCII and stray bytes), clamped to what is left.
size_t utf8LeadLength(absl::string_view text, size_t pos);

bool isValidUtf8(absl::string_view text);

// Number of bytes at the end of `text` that begin a well-formed sequence which more bytes
// could still complete (0-3). Bytes before them are not inspected.
size_t incompleteUtf8Suffix(absl::string_view text);

// Appends `cp` encoded as UTF-8 (code points above U+10FFFF or surrogates become U+FFFD).
void appendUtf8(char32_t cp, std::string* out);

// `text` with each maximal ill-formed subsequence replaced by U+FFFD (as Python's
// bytes.decode("utf-8", "replace") and Rust's from_utf8_lossy do).
std::string sanitizeUtf8(absl::string_view text);

// Unicode White_Space (what Rust's char::is_whitespace tests).
bool isUnicodeWhitespace(char32_t cp);

}  // namespace cleave::tokenizer
