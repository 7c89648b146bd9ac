#include "common/model/gguf_file.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/model/byte_reader.h"
#include "common/status_macros.h"

namespace cleave::model {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian.
constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;

// Smallest encoded size of one element, used to bound counts before allocating.
uint64_t minEncodedSize(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kString:  // u64 length.
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64: return 8;
    case GgufValueType::kArray: return 12;  // u32 type + u64 count.
  }
  return 1;
}

bool knownValueType(uint32_t type) { return type <= 12; }

}  // namespace

const char* ggufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

bool GgufValue::isInteger() const {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64: return true;
    default: return false;
  }
}

// Reads a GGUF byte stream into a GgufFile. One parser per file.
class GgufParser {
 public:
  GgufParser(GgufFile& out, const MappedFile& file)
      : out_(out), reader_(file.data(), file.size(), file.path()), file_size_(file.size()) {}

  absl::Status parse() {
    CLEAVE_ASSIGN_OR_RETURN(uint32_t magic, reader_.read<uint32_t>("magic"));
    if (magic != kMagic) {
      return absl::InvalidArgumentError(
          absl::StrCat(out_.path(), ": not a GGUF file (the first 4 bytes are not \"GGUF\")"));
    }
    CLEAVE_ASSIGN_OR_RETURN(out_.version_, reader_.read<uint32_t>("version"));
    if (out_.version_ == 1) {
      return reader_.error("version", "GGUF version 1 is not supported; convert the file to v3");
    }
    if (out_.version_ != 2 && out_.version_ != 3) {
      return reader_.error("version", absl::StrCat("unsupported GGUF version ", out_.version_,
                                                   " (big-endian files are not supported either)"));
    }
    CLEAVE_ASSIGN_OR_RETURN(uint64_t tensor_count, reader_.read<uint64_t>("tensor_count"));
    CLEAVE_ASSIGN_OR_RETURN(uint64_t kv_count, reader_.read<uint64_t>("metadata_kv_count"));
    // Every kv needs at least a key length, a type and a 1-byte value.
    if (kv_count > reader_.remaining() / 13) {
      return reader_.error("metadata_kv_count",
                           absl::StrCat(kv_count, " entries cannot fit in the file"));
    }
    out_.metadata_.reserve(kv_count);
    for (uint64_t i = 0; i < kv_count; ++i) CLEAVE_RETURN_IF_ERROR(parseKeyValue(i));
    CLEAVE_RETURN_IF_ERROR(readAlignment());

    // Every tensor info needs at least a name length, n_dims, type and offset.
    if (tensor_count > reader_.remaining() / 24) {
      return reader_.error("tensor_count",
                           absl::StrCat(tensor_count, " tensors cannot fit in the file"));
    }
    out_.tensors_.reserve(tensor_count);
    for (uint64_t i = 0; i < tensor_count; ++i) CLEAVE_RETURN_IF_ERROR(parseTensorInfo(i));

    uint64_t end_of_infos = reader_.offset();
    out_.data_offset_ = (end_of_infos + out_.alignment_ - 1) / out_.alignment_ * out_.alignment_;
    if (out_.data_offset_ > file_size_ && !out_.tensors_.empty()) {
      return absl::DataLossError(
          absl::StrCat(out_.path(), ": truncated: the data section starts at byte ",
                       out_.data_offset_, " past the end of the file (", file_size_, " bytes)"));
    }
    return placeTensors();
  }

 private:
  absl::StatusOr<std::string> readString(absl::string_view field) {
    CLEAVE_ASSIGN_OR_RETURN(uint64_t length, reader_.read<uint64_t>(field));
    if (length > kMaxStringBytes || length > reader_.remaining()) {
      return reader_.error(
          field, absl::StrCat("string length ", length, " runs past the end of the file"));
    }
    return reader_.readBytes(length, field);
  }

  absl::Status readScalar(GgufValueType type, GgufValue& value, absl::string_view field) {
    value.type = type;
    auto integer = [&](auto signed_value) -> absl::Status {
      value.int_value = static_cast<int64_t>(signed_value);
      value.uint_value = static_cast<uint64_t>(signed_value);
      return absl::OkStatus();
    };
    switch (type) {
      case GgufValueType::kUint8: {
        CLEAVE_ASSIGN_OR_RETURN(auto v, reader_.read<uint8_t>(field));
        return integer(v);
      }
      case GgufValueType::kInt8: {
        CLEAVE_ASSIGN_OR_RETURN(auto v, reader_.read<int8_t>(field));
        return integer(v);
      }
      case GgufValueType::kUint16: {
        CLEAVE_ASSIGN_OR_RETURN(auto v, reader_.read<uint16_t>(field));
        return integer(v);
      }
      case GgufValueType::kInt16: {
        CLEAVE_ASSIGN_OR_RETURN(auto v, reader_.read<int16_t>(field));
        return integer(v);
      }
      case GgufValueType::kUint32: {
        CLEAVE_ASSIGN_OR_RETURN(auto v, reader_.read<uint32_t>(field));
        return integer(v);
      }
      case GgufValueType::kInt32: {
        CLEAVE_ASSIGN_OR_RETURN(auto v, reader_.read<int32_t>(field));
        return integer(v);
      }
      case GgufValueType::kUint64: {
        CLEAVE_ASSIGN_OR_RETURN(auto v, reader_.read<uint64_t>(field));
        return integer(v);
      }
      case GgufValueType::kInt64: {
        CLEAVE_ASSIGN_OR_RETURN(auto v, reader_.read<int64_t>(field));
        return integer(v);
      }
      case GgufValueType::kFloat32: {
        CLEAVE_ASSIGN_OR_RETURN(float v, reader_.read<float>(field));
        value.float_value = v;
        return absl::OkStatus();
      }
      case GgufValueType::kFloat64: {
        CLEAVE_ASSIGN_OR_RETURN(value.float_value, reader_.read<double>(field));
        return absl::OkStatus();
      }
      case GgufValueType::kBool: {
        CLEAVE_ASSIGN_OR_RETURN(uint8_t v, reader_.read<uint8_t>(field));
        if (v > 1)
          return reader_.error(field, absl::StrCat("bool value ", int{v}, " is not 0 or 1"));
        value.bool_value = v == 1;
        value.int_value = v;
        value.uint_value = v;
        return absl::OkStatus();
      }
      case GgufValueType::kString: {
        CLEAVE_ASSIGN_OR_RETURN(value.string_value, readString(field));
        return absl::OkStatus();
      }
      case GgufValueType::kArray: break;
    }
    return reader_.error(field, "unexpected value type");
  }

  // Reads an array body (after its u32 type and u64 count have been read). `depth` guards
  // against nested arrays recursing without bound.
  absl::Status readArray(GgufValue& value, absl::string_view field, int depth) {
    CLEAVE_ASSIGN_OR_RETURN(uint32_t element_type, reader_.read<uint32_t>(field));
    if (!knownValueType(element_type)) {
      return reader_.error(field, absl::StrCat("unknown array element type ", element_type));
    }
    CLEAVE_ASSIGN_OR_RETURN(uint64_t count, reader_.read<uint64_t>(field));
    value.type = GgufValueType::kArray;
    value.element_type = static_cast<GgufValueType>(element_type);
    value.array_size = count;
    if (count > reader_.remaining() / minEncodedSize(value.element_type)) {
      return reader_.error(
          field, absl::StrCat("array of ", count, " ", ggufValueTypeName(value.element_type),
                              " runs past the end of the file"));
    }
    if (value.element_type == GgufValueType::kArray) {
      if (depth >= 4) return reader_.error(field, "arrays nested deeper than 4 levels");
      for (uint64_t i = 0; i < count; ++i) {
        GgufValue inner;
        CLEAVE_RETURN_IF_ERROR(readArray(inner, field, depth + 1));
      }
      return absl::OkStatus();
    }
    GgufValue element;
    for (uint64_t i = 0; i < count; ++i) {
      CLEAVE_RETURN_IF_ERROR(readScalar(value.element_type, element, field));
      switch (value.element_type) {
        case GgufValueType::kString:
          value.strings.push_back(std::move(element.string_value));
          break;
        case GgufValueType::kFloat32:
        case GgufValueType::kFloat64: value.floats.push_back(element.float_value); break;
        default: value.ints.push_back(element.int_value); break;
      }
    }
    return absl::OkStatus();
  }

  absl::Status parseKeyValue(uint64_t index) {
    std::string where = absl::StrCat("metadata entry ", index);
    CLEAVE_ASSIGN_OR_RETURN(std::string key, readString(absl::StrCat(where, " key")));
    std::string field = absl::StrCat("metadata \"", key, "\"");
    if (out_.metadata_index_.count(key)) return reader_.error(field, "duplicate key");
    CLEAVE_ASSIGN_OR_RETURN(uint32_t type, reader_.read<uint32_t>(field));
    if (!knownValueType(type)) {
      return reader_.error(field, absl::StrCat("unknown value type ", type));
    }
    GgufValue value;
    if (static_cast<GgufValueType>(type) == GgufValueType::kArray) {
      CLEAVE_RETURN_IF_ERROR(readArray(value, field, 0));
    } else {
      CLEAVE_RETURN_IF_ERROR(readScalar(static_cast<GgufValueType>(type), value, field));
    }
    out_.metadata_index_.emplace(key, out_.metadata_.size());
    out_.metadata_.emplace_back(std::move(key), std::move(value));
    return absl::OkStatus();
  }

  absl::Status readAlignment() {
    const GgufValue* alignment = out_.find("general.alignment");
    if (alignment == nullptr) return absl::OkStatus();
    if (!alignment->isInteger() || alignment->uint_value == 0 ||
        (alignment->uint_value & (alignment->uint_value - 1)) != 0 ||
        alignment->uint_value > (1u << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat(out_.path(),
                       ": metadata \"general.alignment\" must be a power of two "
                       "integer up to 1 MiB"));
    }
    out_.alignment_ = alignment->uint_value;
    return absl::OkStatus();
  }

  absl::Status parseTensorInfo(uint64_t index) {
    GgufTensor tensor;
    CLEAVE_ASSIGN_OR_RETURN(tensor.name, readString(absl::StrCat("tensor ", index, " name")));
    std::string field = absl::StrCat("tensor \"", tensor.name, "\"");
    if (out_.tensor_index_.count(tensor.name)) return reader_.error(field, "duplicate tensor name");
    CLEAVE_ASSIGN_OR_RETURN(uint32_t n_dims, reader_.read<uint32_t>(field));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return reader_.error(field, absl::StrCat("n_dims ", n_dims, " is not in 1..", kMaxDims));
    }
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      CLEAVE_ASSIGN_OR_RETURN(uint64_t dim, reader_.read<uint64_t>(field));
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          elements > std::numeric_limits<int64_t>::max() / dim) {
        return reader_.error(field, absl::StrCat("dimension ", d, " = ", dim,
                                                 " is zero or makes the element count overflow"));
      }
      elements *= dim;
      tensor.dims.push_back(dim);
    }
    CLEAVE_ASSIGN_OR_RETURN(uint32_t type, reader_.read<uint32_t>(field));
    tensor.type = static_cast<TensorType>(type);
    std::optional<TensorTypeTraits> traits = tensorTypeTraits(tensor.type);
    if (!traits || type >= 1000) {
      return reader_.error(field, absl::StrCat("unknown tensor type id ", type));
    }
    if (tensor.dims[0] % traits->block_elements != 0) {
      return reader_.error(field,
                           absl::StrCat("row length ", tensor.dims[0], " is not a multiple of the ",
                                        traits->name, " block size ", traits->block_elements));
    }
    std::optional<uint64_t> bytes = tensorBytes(tensor.type, elements);
    if (!bytes) return reader_.error(field, "byte size overflows");
    CLEAVE_ASSIGN_OR_RETURN(tensor.offset, reader_.read<uint64_t>(field));
    tensor.num_elements = elements;
    tensor.num_bytes = *bytes;
    out_.tensor_index_.emplace(tensor.name, out_.tensors_.size());
    out_.tensors_.push_back(std::move(tensor));
    return absl::OkStatus();
  }

  absl::Status placeTensors() {
    uint64_t data_size = file_size_ > out_.data_offset_ ? file_size_ - out_.data_offset_ : 0;
    std::vector<const GgufTensor*> by_offset;
    for (GgufTensor& tensor : out_.tensors_) {
      std::string field = absl::StrCat("tensor \"", tensor.name, "\"");
      if (tensor.offset % out_.alignment_ != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(out_.path(), ": ", field, " offset ", tensor.offset,
                         " is not a multiple of the alignment ", out_.alignment_));
      }
      if (tensor.offset > data_size || tensor.num_bytes > data_size - tensor.offset) {
        return absl::DataLossError(absl::StrCat(out_.path(), ": ", field, " data [", tensor.offset,
                                                ", +", tensor.num_bytes,
                                                ") lies past the end of the data section (",
                                                data_size, " bytes); the file is truncated"));
      }
      tensor.data = out_.file_->data() + out_.data_offset_ + tensor.offset;
      by_offset.push_back(&tensor);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const GgufTensor& prev = *by_offset[i - 1];
      if (prev.offset + prev.num_bytes > by_offset[i]->offset) {
        return absl::InvalidArgumentError(absl::StrCat(out_.path(), ": tensors \"", prev.name,
                                                       "\" and \"", by_offset[i]->name,
                                                       "\" overlap in the data section"));
      }
    }
    return absl::OkStatus();
  }

  GgufFile& out_;
  ByteReader reader_;
  uint64_t file_size_;
};

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  CLEAVE_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::open(path));
  return parse(std::move(file));
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::parse(std::shared_ptr<const MappedFile> file) {
  auto gguf = std::unique_ptr<GgufFile>(new GgufFile());
  gguf->file_ = std::move(file);
  GgufParser parser(*gguf, *gguf->file_);
  CLEAVE_RETURN_IF_ERROR(parser.parse());
  return gguf;
}

const GgufValue* GgufFile::find(absl::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensor* GgufFile::findTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t GgufFile::totalTensorBytes() const {
  uint64_t total = 0;
  for (const GgufTensor& tensor : tensors_) total += tensor.num_bytes;
  return total;
}

namespace {

absl::Status missing(const std::string& path, absl::string_view key) {
  return absl::NotFoundError(absl::StrCat(path, ": metadata \"", key, "\" is missing"));
}

absl::Status wrongType(const std::string& path, absl::string_view key, const GgufValue& value,
                       absl::string_view wanted) {
  std::string actual = ggufValueTypeName(value.type);
  if (value.isArray()) absl::StrAppend(&actual, " of ", ggufValueTypeName(value.element_type));
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": metadata \"", key, "\" is ", actual, ", expected ", wanted));
}

bool isIntegerType(GgufValueType type) {
  GgufValue probe;
  probe.type = type;
  return probe.isInteger() || type == GgufValueType::kBool;
}

}  // namespace

absl::StatusOr<std::string> GgufFile::getString(absl::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing(path(), key);
  if (value->type != GgufValueType::kString) return wrongType(path(), key, *value, "string");
  return value->string_value;
}

absl::StatusOr<uint64_t> GgufFile::getUint(absl::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing(path(), key);
  if (!value->isInteger()) return wrongType(path(), key, *value, "an unsigned integer");
  bool is_signed = value->type == GgufValueType::kInt8 || value->type == GgufValueType::kInt16 ||
                   value->type == GgufValueType::kInt32 || value->type == GgufValueType::kInt64;
  if (is_signed && value->int_value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": metadata \"", key, "\" is negative (", value->int_value, ")"));
  }
  return value->uint_value;
}

absl::StatusOr<int64_t> GgufFile::getInt(absl::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing(path(), key);
  if (!value->isInteger()) return wrongType(path(), key, *value, "an integer");
  if (value->type == GgufValueType::kUint64 &&
      value->uint_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": metadata \"", key, "\" is too large"));
  }
  return value->int_value;
}

absl::StatusOr<double> GgufFile::getFloat(absl::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing(path(), key);
  if (value->type == GgufValueType::kFloat32 || value->type == GgufValueType::kFloat64) {
    return value->float_value;
  }
  if (value->isInteger()) return static_cast<double>(value->int_value);
  return wrongType(path(), key, *value, "a number");
}

absl::StatusOr<bool> GgufFile::getBool(absl::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing(path(), key);
  if (value->type != GgufValueType::kBool) return wrongType(path(), key, *value, "bool");
  return value->bool_value;
}

absl::StatusOr<const std::vector<std::string>*> GgufFile::getStringArray(
    absl::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing(path(), key);
  if (!value->isArray() || value->element_type != GgufValueType::kString) {
    return wrongType(path(), key, *value, "array of string");
  }
  return &value->strings;
}

absl::StatusOr<const std::vector<int64_t>*> GgufFile::getIntArray(absl::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing(path(), key);
  if (!value->isArray() || !isIntegerType(value->element_type)) {
    return wrongType(path(), key, *value, "array of integers");
  }
  return &value->ints;
}

absl::StatusOr<const std::vector<double>*> GgufFile::getFloatArray(absl::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing(path(), key);
  if (!value->isArray() || (value->element_type != GgufValueType::kFloat32 &&
                            value->element_type != GgufValueType::kFloat64)) {
    return wrongType(path(), key, *value, "array of floats");
  }
  return &value->floats;
}

}  // namespace cleave::model
