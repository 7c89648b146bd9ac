// A check of JSON text from a request before it is parsed: nested at most 32 levels deep,
// no array or object with more than 10000 members, at most 100000 arrays and objects in
// all. Each level costs stack when the parsed value is walked recursively; each member, a
// search of its object; each container, an allocation of its own.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cleave {

inline constexpr int kMaxRequestJsonDepth = 32;
inline constexpr int kMaxRequestJsonMembers = 10000;
inline constexpr int kMaxRequestJsonContainers = 100000;

// OK, or InvalidArgument starting with `field` and saying which bound `text` exceeds. Does
// not check that `text` is valid JSON.
absl::Status checkJsonShape(absl::string_view text, absl::string_view field);

// The end (one past its closing bracket) of the object or array `text` starts with, by its
// brackets outside strings; npos when it does not close. Does not check the JSON within.
size_t jsonContainerEnd(absl::string_view text);

}  // namespace cleave
