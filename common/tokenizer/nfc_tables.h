// Unicode data for NFC (generated into nfc_tables.cc by gen_nfc_tables.py). All tables are
// sorted by their first field for binary search.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cleave::tokenizer::nfc {

struct CombiningClassRange {
  char32_t first;
  char32_t last;
  uint8_t ccc;
};

// The full canonical decomposition of `cp`: kDecompositionPool[offset, offset + length).
struct Decomposition {
  char32_t cp;
  uint16_t offset;
  uint8_t length;
};

// `first` followed by `second` composes to `composite`.
struct Composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};

extern const char* const kUnicodeVersion;
extern const CombiningClassRange kCombiningClasses[];
extern const size_t kNumCombiningClasses;
extern const char32_t kDecompositionPool[];
extern const Decomposition kDecompositions[];
extern const size_t kNumDecompositions;
extern const Composition kCompositions[];
extern const size_t kNumCompositions;

}  // namespace cleave::tokenizer::nfc
