// Text that streams in and may end in the first bytes of a tag not yet complete.
#pragma once

#include <algorithm>
#include <cstddef>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace cleave::router {

// The length of the longest end of `text` that begins `tag` without being all of it: the
// bytes to hold back until the next piece says whether the tag is there.
inline size_t partialTagLength(absl::string_view text, absl::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (absl::StartsWith(tag, text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace cleave::router
