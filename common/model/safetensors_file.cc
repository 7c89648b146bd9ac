#include "common/model/safetensors_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace cleave::model {
namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr size_t kMaxDims = 8;

struct DtypeName {
  const char* name;
  TensorType type;
};
constexpr DtypeName kDtypes[] = {
    {"BF16", TensorType::kBF16}, {"F16", TensorType::kF16},        {"F32", TensorType::kF32},
    {"F64", TensorType::kF64},   {"F8_E4M3", TensorType::kF8E4M3}, {"F8_E5M2", TensorType::kF8E5M2},
    {"U8", TensorType::kU8},     {"I8", TensorType::kI8},          {"I16", TensorType::kI16},
    {"I32", TensorType::kI32},   {"I64", TensorType::kI64},        {"BOOL", TensorType::kBool},
};

absl::Status invalid(const std::string& path, absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, ": ", message));
}

// Reads a small JSON file (config, index) into `out`.
absl::Status readJsonFile(const std::string& path, nlohmann::json& out) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  out = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TensorType> parseSafetensorsDtype(absl::string_view name) {
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype \"", name, "\""));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  CLEAVE_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::open(path));
  return parse(std::move(file));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(
    std::shared_ptr<const MappedFile> file) {
  auto st = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  st->file_ = std::move(file);
  CLEAVE_RETURN_IF_ERROR(st->parseHeader());
  return st;
}

absl::Status SafetensorsFile::parseHeader() {
  const std::string& path = file_->path();
  if (file_->size() < 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: ", file_->size(),
                                            " bytes cannot hold the 8-byte header length"));
  }
  std::memcpy(&header_size_, file_->data(), 8);
  if (header_size_ > kMaxHeaderBytes || header_size_ > file_->size() - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_size_,
                                            " runs past the end of the file (", file_->size(),
                                            " bytes)"));
  }
  absl::string_view text(reinterpret_cast<const char*>(file_->data() + 8), header_size_);
  nlohmann::json header = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return invalid(path, "header", "not a JSON object");
  }
  const uint64_t buffer_start = 8 + header_size_;
  const uint64_t buffer_size = file_->size() - buffer_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return invalid(path, "__metadata__", "must be an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return invalid(path, absl::StrCat("__metadata__.", m.key()), "must be a string");
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    std::string field = absl::StrCat("tensor \"", name, "\"");
    if (!entry.is_object()) return invalid(path, field, "must be an object");
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return invalid(path, field, "\"dtype\" is missing or not a string");
    }
    if (shape_it == entry.end() || !shape_it->is_array() || shape_it->size() > kMaxDims) {
      return invalid(path, field, "\"shape\" is missing, not an array, or has over 8 dims");
    }
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      return invalid(path, field, "\"data_offsets\" must be [begin, end] of unsigned integers");
    }
    SafetensorsTensor tensor;
    tensor.name = name;
    tensor.file = path;
    absl::StatusOr<TensorType> dtype = parseSafetensorsDtype(dtype_it->get<std::string>());
    if (!dtype.ok()) return invalid(path, field, dtype.status().message());
    tensor.dtype = *dtype;
    uint64_t elements = 1;
    for (const nlohmann::json& dim : *shape_it) {
      if (!dim.is_number_unsigned())
        return invalid(path, field, "shape entries must be unsigned integers");
      uint64_t d = dim.get<uint64_t>();
      if (d != 0 && elements > std::numeric_limits<uint64_t>::max() / 16 / d) {
        return invalid(path, field, "shape overflows");
      }
      elements *= d;
      tensor.shape.push_back(d);
    }
    tensor.num_elements = elements;
    tensor.num_bytes = *tensorBytes(tensor.dtype, elements);
    uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    uint64_t end = (*offsets_it)[1].get<uint64_t>();
    if (end < begin || end - begin != tensor.num_bytes) {
      return invalid(path, field,
                     absl::StrCat("data_offsets [", begin, ", ", end, ") hold ", end - begin,
                                  " bytes but dtype and shape need ", tensor.num_bytes));
    }
    if (end > buffer_size) {
      return absl::DataLossError(absl::StrCat(path, ": ", field, ": data_offsets end ", end,
                                              " is past the end of the data (", buffer_size,
                                              " bytes); the file is truncated"));
    }
    tensor.file_offset = buffer_start + begin;
    tensor.data = file_->data() + tensor.file_offset;
    tensors_.push_back(std::move(tensor));
  }
  // The buffer must be covered exactly, in order of offsets.
  std::vector<const SafetensorsTensor*> sorted;
  for (const SafetensorsTensor& t : tensors_) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](auto* a, auto* b) { return a->file_offset < b->file_offset; });
  uint64_t expected = buffer_start;
  for (const SafetensorsTensor* t : sorted) {
    if (t->file_offset != expected) {
      return invalid(path, absl::StrCat("tensor \"", t->name, "\""),
                     t->file_offset < expected ? "overlaps the previous tensor's data"
                                               : "leaves a hole before its data");
    }
    expected += t->num_bytes;
  }
  if (expected != file_->size()) {
    return invalid(
        path, "data",
        absl::StrCat(file_->size() - expected, " bytes after the last tensor belong to no tensor"));
  }
  // File order is the order of the data.
  std::stable_sort(tensors_.begin(), tensors_.end(),
                   [](const auto& a, const auto& b) { return a.file_offset < b.file_offset; });
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  return absl::OkStatus();
}

const SafetensorsTensor* SafetensorsFile::find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::open(
    const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  std::vector<std::string> shard_paths;
  std::string index_path;
  if (fs::is_directory(path, error)) {
    if (fs::exists(fs::path(path) / "model.safetensors.index.json")) {
      index_path = (fs::path(path) / "model.safetensors.index.json").string();
    } else if (fs::exists(fs::path(path) / "model.safetensors")) {
      shard_paths.push_back((fs::path(path) / "model.safetensors").string());
    } else {
      return absl::NotFoundError(absl::StrCat(
          path, ": no model.safetensors or model.safetensors.index.json in this folder"));
    }
  } else if (absl::string_view(path).size() >= 5 &&
             absl::string_view(path).substr(path.size() - 5) == ".json") {
    index_path = path;
  } else {
    shard_paths.push_back(path);
  }

  auto checkpoint = std::make_unique<SafetensorsCheckpoint>();
  std::map<std::string, std::string> weight_map;
  if (!index_path.empty()) {
    nlohmann::json index;
    CLEAVE_RETURN_IF_ERROR(readJsonFile(index_path, index));
    auto map_it = index.is_object() ? index.find("weight_map") : index.end();
    if (map_it == index.end() || !map_it->is_object()) {
      return invalid(index_path, "weight_map", "is missing or not an object");
    }
    fs::path folder = fs::path(index_path).parent_path();
    for (auto it = map_it->begin(); it != map_it->end(); ++it) {
      if (!it.value().is_string())
        return invalid(index_path, absl::StrCat("weight_map.", it.key()), "must be a file name");
      std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos) {
        return invalid(index_path, absl::StrCat("weight_map.", it.key()),
                       "shard names must not contain '/'");
      }
      weight_map[it.key()] = (folder / shard).string();
      if (std::find(shard_paths.begin(), shard_paths.end(), weight_map[it.key()]) ==
          shard_paths.end()) {
        shard_paths.push_back(weight_map[it.key()]);
      }
    }
    std::sort(shard_paths.begin(), shard_paths.end());
  }
  for (const std::string& shard : shard_paths) {
    CLEAVE_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::open(shard));
    for (const SafetensorsTensor& tensor : file->tensors()) {
      if (!checkpoint->index_.emplace(tensor.name, &tensor).second) {
        return invalid(shard, absl::StrCat("tensor \"", tensor.name, "\""),
                       "appears in two shards");
      }
    }
    checkpoint->files_.push_back(std::move(file));
  }
  for (const auto& [name, shard] : weight_map) {
    auto it = checkpoint->index_.find(name);
    if (it == checkpoint->index_.end()) {
      return invalid(index_path, absl::StrCat("weight_map.", name),
                     absl::StrCat("names ", shard, " but that file has no such tensor"));
    }
    if (it->second->file != shard) {
      return invalid(index_path, absl::StrCat("weight_map.", name),
                     absl::StrCat("names ", shard, " but the tensor is in ", it->second->file));
    }
  }
  return checkpoint;
}

const SafetensorsTensor* SafetensorsCheckpoint::find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<const SafetensorsTensor*> SafetensorsCheckpoint::tensors() const {
  std::vector<const SafetensorsTensor*> all;
  for (const auto& file : files_) {
    for (const SafetensorsTensor& tensor : file->tensors()) all.push_back(&tensor);
  }
  return all;
}

uint64_t SafetensorsCheckpoint::totalTensorBytes() const {
  uint64_t total = 0;
  for (const auto& file : files_) {
    for (const SafetensorsTensor& tensor : file->tensors()) total += tensor.num_bytes;
  }
  return total;
}

}  // namespace cleave::model
