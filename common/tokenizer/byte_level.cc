#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

bool isPrintableByte(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> to_unicode{};
  std::array<int16_t, 324> to_byte{};  // Code points 0..323 cover the whole alphabet.

  Tables() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_unicode[b] = isPrintableByte(b) ? static_cast<char32_t>(b) : next++;
      to_byte[to_unicode[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables kTables;
  return kTables;
}

}  // namespace

char32_t byteToUnicode(uint8_t byte) { return tables().to_unicode[byte]; }

int unicodeToByte(char32_t cp) { return cp < tables().to_byte.size() ? tables().to_byte[cp] : -1; }

std::string byteLevelEncode(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) appendUtf8(byteToUnicode(static_cast<uint8_t>(c)), &out);
  return out;
}

std::optional<std::string> byteLevelDecode(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    char32_t cp = 0;
    const size_t n = utf8SequenceLength(text, i, &cp);
    if (n == 0) return std::nullopt;
    const int b = unicodeToByte(cp);
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
    i += n;
  }
  return out;
}

std::optional<uint8_t> parseByteToken(absl::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(text[3]);
  const int lo = hex(text[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

}  // namespace cleave::tokenizer
