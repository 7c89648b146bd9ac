// The ready file: how a launcher (a test, `cleave up`) learns that a server is serving and
// on which ports, when it was started with port 0.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace cleave {

// Atomically writes {"key": value, ...} as one JSON object to `path` (write to a temporary
// file in the same folder, then rename), so a reader never sees a partial file.
absl::Status writeReadyFile(const std::string& path,
                            const std::vector<std::pair<std::string, int64_t>>& fields);

}  // namespace cleave
