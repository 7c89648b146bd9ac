#include "common/tokenizer/nfc.h"

#include <algorithm>
#include <vector>

#include "common/tokenizer/nfc_tables.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

// Hangul syllables decompose and compose algorithmically.
constexpr char32_t kSBase = 0xAC00;
constexpr char32_t kLBase = 0x1100;
constexpr char32_t kVBase = 0x1161;
constexpr char32_t kTBase = 0x11A7;
constexpr char32_t kLCount = 19;
constexpr char32_t kVCount = 21;
constexpr char32_t kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount;
constexpr char32_t kSCount = kLCount * kNCount;

// An ill-formed byte b is carried as kRawByte + b: above every code point, class 0, and in
// no composition.
constexpr char32_t kRawByte = 0x110000;

uint8_t combiningClass(char32_t cp) {
  if (cp < 0x300 || cp >= kRawByte) return 0;
  const auto* end = nfc::kCombiningClasses + nfc::kNumCombiningClasses;
  const auto* it =
      std::upper_bound(nfc::kCombiningClasses, end, cp,
                       [](char32_t c, const nfc::CombiningClassRange& r) { return c < r.first; });
  if (it == nfc::kCombiningClasses) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

void decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const auto* end = nfc::kDecompositions + nfc::kNumDecompositions;
  const auto* it =
      std::lower_bound(nfc::kDecompositions, end, cp,
                       [](const nfc::Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) {
    out->push_back(cp);
    return;
  }
  out->insert(out->end(), nfc::kDecompositionPool + it->offset,
              nfc::kDecompositionPool + it->offset + it->length);
}

// The primary composite of `first` + `second`, or 0.
char32_t compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const auto* end = nfc::kCompositions + nfc::kNumCompositions;
  const auto* it =
      std::lower_bound(nfc::kCompositions, end, std::make_pair(first, second),
                       [](const nfc::Composition& c, const std::pair<char32_t, char32_t>& key) {
                         return c.first != key.first ? c.first < key.first : c.second < key.second;
                       });
  if (it == end || it->first != first || it->second != second) return 0;
  return it->composite;
}

}  // namespace

std::string toNfc(absl::string_view text) {
  // Nothing below U+0300 (lead bytes under 0xCC) changes or takes part in a composition.
  if (std::none_of(text.begin(), text.end(),
                   [](char c) { return static_cast<uint8_t>(c) >= 0xCC; })) {
    return std::string(text);
  }
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const size_t n = utf8SequenceLength(text, i, &cp);
    if (n == 0) {
      cps.push_back(kRawByte + static_cast<uint8_t>(text[i]));
      ++i;
    } else {
      decompose(cp, &cps);
      i += n;
    }
  }
  // Canonical order: sort each run of non-starters by class, keeping equal classes in order.
  for (size_t i = 0; i < cps.size();) {
    if (combiningClass(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combiningClass(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i),
                     cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return combiningClass(a) < combiningClass(b); });
    i = j;
  }
  // Canonical composition: a character composes with the last starter unless a character
  // of the same or a higher class (or a starter) stands between them.
  size_t out = 0;
  size_t starter = static_cast<size_t>(-1);
  int last_class = -1;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t cp = cps[i];
    const int cls = combiningClass(cp);
    if (starter != static_cast<size_t>(-1) &&
        (last_class < cls || (last_class == 0 && cls == 0 && out == starter + 1))) {
      if (const char32_t composite = compose(cps[starter], cp)) {
        cps[starter] = composite;
        continue;
      }
    }
    if (cls == 0) {
      starter = out;
      last_class = 0;
    } else {
      last_class = cls;
    }
    cps[out++] = cp;
  }
  cps.resize(out);
  std::string result;
  result.reserve(text.size());
  for (char32_t cp : cps) {
    if (cp >= kRawByte) {
      result.push_back(static_cast<char>(cp - kRawByte));
    } else {
      appendUtf8(cp, &result);
    }
  }
  return result;
}

}  // namespace cleave::tokenizer
