// Bounds-checked little-endian reads from a byte range, for file-format parsers. Every
// read that would pass the end fails with DataLoss naming the file, the field being read
// and the byte offset. Internal to cleave_model.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace cleave::model {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, uint64_t size, const std::string& file)
      : data_(data), size_(size), file_(file) {}

  uint64_t offset() const { return offset_; }
  uint64_t remaining() const { return size_ - offset_; }

  template <typename T>
  absl::StatusOr<T> read(absl::string_view field) {
    if (remaining() < sizeof(T)) return truncated(field, sizeof(T));
    T value;
    std::memcpy(&value, data_ + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  // Reads `length` bytes as a string (no UTF-8 check).
  absl::StatusOr<std::string> readBytes(uint64_t length, absl::string_view field) {
    if (remaining() < length) return truncated(field, length);
    std::string value(reinterpret_cast<const char*>(data_ + offset_), length);
    offset_ += length;
    return value;
  }

  absl::Status skip(uint64_t length, absl::string_view field) {
    if (remaining() < length) return truncated(field, length);
    offset_ += length;
    return absl::OkStatus();
  }

  // An error at the current offset: "FILE: FIELD at byte OFFSET: MESSAGE".
  absl::Status error(absl::string_view field, absl::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": ", field, " at byte ", offset_, ": ", message));
  }

 private:
  absl::Status truncated(absl::string_view field, uint64_t wanted) const {
    return absl::DataLossError(absl::StrCat(file_, ": truncated: ", field, " at byte ", offset_,
                                            " needs ", wanted, " bytes but the file has ",
                                            remaining(), " left"));
  }

  const uint8_t* data_;
  uint64_t size_;
  const std::string& file_;
  uint64_t offset_ = 0;
};

}  // namespace cleave::model
