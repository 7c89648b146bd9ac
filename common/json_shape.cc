#include "common/json_shape.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace cleave {

namespace {

// Calls on(i, c) for each character of `text` outside strings, in order, until it returns
// false. Does not check that `text` is JSON.
template <typename F>
void forEachStructural(absl::string_view text, F on) {
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (!on(i, c)) {
      return;
    }
  }
}

}  // namespace

absl::Status checkJsonShape(absl::string_view text, absl::string_view field) {
  std::vector<int> members;  // per open bracket
  int containers = 0;
  absl::Status status;
  forEachStructural(text, [&](size_t, char c) {
    if (c == '[' || c == '{') {
      members.push_back(0);
      if (++containers > kMaxRequestJsonContainers) {
        status = absl::InvalidArgumentError(
            absl::StrCat(field, ": more than ", kMaxRequestJsonContainers, " arrays and objects"));
      } else if (members.size() > static_cast<size_t>(kMaxRequestJsonDepth)) {
        status = absl::InvalidArgumentError(
            absl::StrCat(field, ": nested deeper than ", kMaxRequestJsonDepth, " levels"));
      }
    } else if ((c == ']' || c == '}') && !members.empty()) {
      members.pop_back();
    } else if (c == ',' && !members.empty() && ++members.back() >= kMaxRequestJsonMembers) {
      status = absl::InvalidArgumentError(absl::StrCat(
          field, ": an array or object with more than ", kMaxRequestJsonMembers, " members"));
    }
    return status.ok();
  });
  return status;
}

size_t jsonContainerEnd(absl::string_view text) {
  int depth = 0;
  size_t end = absl::string_view::npos;
  forEachStructural(text, [&](size_t i, char c) {
    if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      end = i + 1;
    }
    return end == absl::string_view::npos && depth >= 0;
  });
  return end;
}

}  // namespace cleave
