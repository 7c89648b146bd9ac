#include "common/json_shape.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace cleave {

absl::Status checkJsonShape(absl::string_view text, absl::string_view field) {
  std::vector<int> members;  // per open bracket
  int containers = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      members.push_back(0);
      if (++containers > kMaxRequestJsonContainers) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": more than ", kMaxRequestJsonContainers, " arrays and objects"));
      }
      if (members.size() > static_cast<size_t>(kMaxRequestJsonDepth)) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": nested deeper than ", kMaxRequestJsonDepth, " levels"));
      }
    } else if ((c == ']' || c == '}') && !members.empty()) {
      members.pop_back();
    } else if (c == ',' && !members.empty() && ++members.back() >= kMaxRequestJsonMembers) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": an array or object with more than ",
                                                     kMaxRequestJsonMembers, " members"));
    }
  }
  return absl::OkStatus();
}

}  // namespace cleave
