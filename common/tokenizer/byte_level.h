// The GPT-2 byte-level alphabet: every byte maps to one printable code point (printable
// Latin-1 bytes to themselves, the other 68 to U+0100..U+0143 in byte order), so byte-level
// vocabularies can store any byte sequence as text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace cleave::tokenizer {

char32_t byteToUnicode(uint8_t byte);
// -1 when `cp` is not in the alphabet.
int unicodeToByte(char32_t cp);

// Maps each byte of `bytes` to its code point, UTF-8 encoded ("hello world" -> "helloĠworld").
std::string byteLevelEncode(absl::string_view bytes);
// The inverse; nullopt when `text` holds a character outside the alphabet or invalid UTF-8.
std::optional<std::string> byteLevelDecode(absl::string_view text);

// The byte of a byte-fallback token such as "<0x0A>"; nullopt for any other text.
std::optional<uint8_t> parseByteToken(absl::string_view text);

}  // namespace cleave::tokenizer
