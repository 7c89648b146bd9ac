// GGUF model files (versions 2 and 3): metadata, tensor directory and tensor data.
//
// Layout (little-endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, then
// kv_count metadata entries (string key, u32 value type, value), then tensor_count tensor
// infos (string name, u32 n_dims, n_dims x u64 dims, u32 type, u64 offset), padding to
// `general.alignment` (default 32), then the data section; each tensor's offset is
// relative to the data section's start. dims[0] is the fastest-varying dimension.
//
// Parsing validates everything before use: every length and offset is checked against
// the file size, element counts against overflow, tensors for overlap. Errors are
// InvalidArgument / DataLoss naming the file and the field or byte offset.
//
// Threading: immutable after open().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/mapped_file.h"
#include "common/model/tensor_type.h"

namespace cleave::model {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

const char* ggufValueTypeName(GgufValueType type);

// One metadata value. Scalars use the member matching their type class; arrays of
// integers/bools use `ints`, of floats `floats`, of strings `strings`. Arrays of arrays are
// validated but their contents are not kept (element_type == kArray, all vectors empty).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType element_type = GgufValueType::kUint8;  // Arrays only.
  int64_t int_value = 0;      // Every integer type (u64 values above INT64_MAX keep bits).
  uint64_t uint_value = 0;    // Every integer type, as unsigned.
  double float_value = 0;     // kFloat32, kFloat64.
  bool bool_value = false;    // kBool.
  std::string string_value;   // kString.
  std::vector<int64_t> ints;  // Integer and bool arrays.
  std::vector<double> floats;
  std::vector<std::string> strings;
  uint64_t array_size = 0;  // Arrays: number of elements.

  bool isInteger() const;
  bool isArray() const { return type == GgufValueType::kArray; }
};

struct GgufTensor {
  std::string name;
  std::vector<uint64_t> dims;  // dims[0] varies fastest (a row of a matrix).
  TensorType type = TensorType::kF32;
  uint64_t offset = 0;  // From the start of the data section.
  uint64_t num_elements = 0;
  uint64_t num_bytes = 0;
  const uint8_t* data = nullptr;  // Into the mapped file.
};

class GgufFile {
 public:
  // Maps and parses `path`.
  static absl::StatusOr<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Parses an already mapped file (or an in-memory buffer, for tests and fuzzing).
  static absl::StatusOr<std::unique_ptr<GgufFile>> parse(std::shared_ptr<const MappedFile> file);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t dataOffset() const { return data_offset_; }
  const std::string& path() const { return file_->path(); }

  // Metadata in file order and by key.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(absl::string_view key) const;

  // Typed lookups. NotFound names the file and key; InvalidArgument when the value has
  // another type. Integer getters accept any integer type whose value fits.
  absl::StatusOr<std::string> getString(absl::string_view key) const;
  absl::StatusOr<uint64_t> getUint(absl::string_view key) const;
  absl::StatusOr<int64_t> getInt(absl::string_view key) const;
  absl::StatusOr<double> getFloat(absl::string_view key) const;  // Also accepts integers.
  absl::StatusOr<bool> getBool(absl::string_view key) const;
  absl::StatusOr<const std::vector<std::string>*> getStringArray(absl::string_view key) const;
  absl::StatusOr<const std::vector<int64_t>*> getIntArray(absl::string_view key) const;
  absl::StatusOr<const std::vector<double>*> getFloatArray(absl::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* findTensor(absl::string_view name) const;
  // Sum of all tensors' bytes.
  uint64_t totalTensorBytes() const;

 private:
  GgufFile() = default;
  friend class GgufParser;

  std::shared_ptr<const MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace cleave::model
