#include "common/ready_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace cleave {

absl::Status writeReadyFile(const std::string& path,
                            const std::vector<std::pair<std::string, int64_t>>& fields) {
  std::string json = "{";
  for (size_t i = 0; i < fields.size(); ++i) {
    absl::StrAppend(&json, i ? ", " : "", "\"", fields[i].first, "\": ", fields[i].second);
  }
  json += "}\n";
  std::string temporary = path + ".tmp";
  std::FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ready file ", path, ": ", std::strerror(errno)));
  }
  bool written = std::fwrite(json.data(), 1, json.size(), file) == json.size();
  written = std::fclose(file) == 0 && written;
  if (!written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot write ready file ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace cleave
