// What identifies a loaded model across processes: an id clients use, and a SHA-256 over
// the bytes that decide its outputs, so a router pairs only workers that loaded the same
// model (proto/cleave/v1/worker.proto, ModelFingerprint).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cleave::model {

// The model id for `path`: the file name without ".gguf", or the folder's name.
std::string modelIdFromPath(const std::string& path);

// Lower-case hex SHA-256 of a GGUF file's bytes, or of a folder's config.json and its
// *.safetensors files (in name order, each name hashed before its bytes). Errors name the
// file that cannot be read.
absl::StatusOr<std::string> modelSha256(const std::string& path);

// Lower-case hex SHA-256 over `files` in order, each file's name hashed before its bytes.
absl::StatusOr<std::string> filesSha256(const std::vector<std::string>& files);

}  // namespace cleave::model
