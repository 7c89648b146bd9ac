// Build identity, baked in at configure time.
#pragma once

#include <string>

namespace cleave {

// "0.1.0", the project version.
const char* version();
// Short git commit of the build, or "unknown" outside a git checkout.
const char* gitCommit();
// "0.1.0 (commit abc1234)".
std::string versionString();

}  // namespace cleave
