// safetensors checkpoints: single files and sharded sets (model.safetensors.index.json).
//
// File layout: u64 little-endian header length N, N bytes of JSON
//   {"NAME": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the byte buffer; offsets are relative to the buffer's start. Shapes are outermost
// first (row-major). The buffer must be covered exactly: no overlaps, no holes.
//
// Errors name the file and the tensor/field. Threading: immutable after open().
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

struct SafetensorsTensor {
  std::string name;
  TensorType dtype = TensorType::kF32;
  std::vector<uint64_t> shape;  // Outermost first; empty for a scalar.
  uint64_t num_elements = 0;
  uint64_t num_bytes = 0;
  uint64_t file_offset = 0;  // Absolute offset of the data in its file.
  const uint8_t* data = nullptr;
  std::string file;  // Path of the file holding it.
};

// Maps a safetensors dtype name ("BF16", "F8_E4M3", ...) to a TensorType.
absl::StatusOr<TensorType> parseSafetensorsDtype(absl::string_view name);

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> parse(
      std::shared_ptr<const MappedFile> file);

  const std::string& path() const { return file_->path(); }
  uint64_t headerSize() const { return header_size_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(absl::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  absl::Status parseHeader();

  std::shared_ptr<const MappedFile> file_;
  uint64_t header_size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint: a .safetensors file, a model.safetensors.index.json, or a
// folder holding either (the index wins when both exist).
class SafetensorsCheckpoint {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> open(const std::string& path);

  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  const SafetensorsTensor* find(absl::string_view name) const;
  // Every tensor, shard by shard in file order.
  std::vector<const SafetensorsTensor*> tensors() const;
  uint64_t totalTensorBytes() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> index_;
};

}  // namespace cleave::model
