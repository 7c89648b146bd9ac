// A read-only view of a whole file, memory-mapped (or, for tests and fuzzers, an owned
// in-memory buffer behind the same interface). Nothing is copied or read until touched.
//
// Threading: immutable after open; share it freely (std::shared_ptr).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace cleave::model {

class MappedFile {
 public:
  // Maps `path` read-only. Errors name the path: missing file, no permission, a folder.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> open(const std::string& path);
  // Wraps `bytes` under the display name `name` (used in error messages).
  static std::shared_ptr<const MappedFile> fromBuffer(std::string name, std::string bytes);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;

  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;  // true: munmap on destruction; false: owned_ holds the bytes.
  std::string owned_;
};

}  // namespace cleave::model
