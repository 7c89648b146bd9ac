#include "common/model/quantization.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/model/dequant_kernels.h"
#include "common/status_macros.h"

namespace cleave::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

absl::StatusOr<json> readJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  json doc = json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return doc;
}

absl::Status bad(const std::string& where, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
}

std::string shapeText(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&text, i ? ", " : "", shape[i]);
  return text + "]";
}

void readStrings(const json& object, const char* key, std::vector<std::string>& out) {
  auto list = object.find(key);
  if (list == object.end() || !list->is_array()) return;
  for (const auto& m : *list) {
    if (m.is_string()) out.push_back(m.get<std::string>());
  }
}

// [R, C] of positive integers.
bool readBlock(const json& object, const char* key, uint32_t& rows, uint32_t& cols) {
  auto block = object.find(key);
  if (block == object.end() || !block->is_array() || block->size() != 2) return false;
  for (const auto& v : *block) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() == 0 || v.get<uint64_t>() > 65536)
      return false;
  }
  rows = (*block)[0].get<uint32_t>();
  cols = (*block)[1].get<uint32_t>();
  return true;
}

// ModelOpt's fields, in hf_quant_config.json's "quantization" or config.json's
// "quantization_config" (`field` names the object in messages).
absl::Status parseModelOpt(const json& q, const std::string& field, QuantizationInfo& info) {
  info.format = QuantFormat::kModelOpt;
  info.activations_quantized = true;  // FP8 and NVFP4 are W8A8 and W4A4 there.
  const std::string algo = q.value("quant_algo", "");
  readStrings(q, "exclude_modules", info.excluded_modules);
  if (algo == "FP8") {
    info.scheme = QuantScheme::kFp8;  // Per tensor.
    return absl::OkStatus();
  }
  if (algo != "NVFP4") {
    return bad(info.source, absl::StrCat(field, ".quant_algo \"", algo,
                                         "\" is not supported (supported: NVFP4, FP8)"));
  }
  info.scheme = QuantScheme::kNvfp4;
  auto group = q.find("group_size");
  info.group_size = group != q.end() && group->is_number_unsigned() ? group->get<uint32_t>() : 16;
  if (info.group_size != 16) return bad(info.source, field + ".group_size must be 16 for NVFP4");
  return absl::OkStatus();
}

// compressed-tensors: every config group must quantize weights the same supported way.
absl::Status parseCompressedTensors(const json& q, QuantizationInfo& info) {
  info.format = QuantFormat::kCompressedTensors;
  readStrings(q, "ignore", info.excluded_modules);
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty()) {
    return bad(info.source, "quantization_config.config_groups must be a non-empty object");
  }
  const std::string format = q.value("format", "");
  const json* first = nullptr;
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    const std::string where = absl::StrCat("quantization_config.config_groups.", it.key());
    if (!it->is_object() || !it->contains("weights") || !(*it)["weights"].is_object())
      return bad(info.source, where + ".weights must be an object");
    const json& w = (*it)["weights"];
    auto activations = it->find("input_activations");
    if (activations != it->end() && !activations->is_null()) info.activations_quantized = true;
    if (first != nullptr && w != *first) {
      return bad(info.source, where +
                                  ".weights differs from the first group's (checkpoints mixing "
                                  "weight schemes are not supported)");
    }
    first = &w;
  }
  const json& w = *first;
  const std::string type = w.value("type", "");
  const int bits = w.value("num_bits", 0);
  const std::string strategy = w.value("strategy", "");
  const std::string where = "quantization_config.config_groups.*.weights";
  if (type == "float" && bits == 4) {
    if (strategy != "tensor_group" || w.value("group_size", 0) != 16) {
      return bad(info.source, where +
                                  ": 4-bit float weights must be NVFP4 (strategy "
                                  "\"tensor_group\", group_size 16)");
    }
    if (format != "nvfp4-pack-quantized") {
      return bad(info.source, absl::StrCat("quantization_config.format \"", format,
                                           "\" is not supported for NVFP4 weights (supported: "
                                           "nvfp4-pack-quantized)"));
    }
    info.scheme = QuantScheme::kNvfp4;
    info.group_size = 16;
    return absl::OkStatus();
  }
  if (type == "float" && bits == 8) {
    if (format != "float-quantized") {
      return bad(info.source, absl::StrCat("quantization_config.format \"", format,
                                           "\" is not supported for FP8 weights (supported: "
                                           "float-quantized)"));
    }
    info.scheme = QuantScheme::kFp8;
    if (strategy == "tensor") return absl::OkStatus();
    if (strategy == "channel") {
      info.block_rows = 1;
      return absl::OkStatus();
    }
    if (strategy == "block" && readBlock(w, "block_structure", info.block_rows, info.block_cols))
      return absl::OkStatus();
    return bad(info.source, absl::StrCat(where, ".strategy \"", strategy,
                                         "\" is not supported for FP8 (supported: tensor, "
                                         "channel, block with block_structure [rows, cols])"));
  }
  if (type == "int" && bits == 4) {
    if (format != "pack-quantized") {
      return bad(info.source, absl::StrCat("quantization_config.format \"", format,
                                           "\" is not supported for int4 weights (supported: "
                                           "pack-quantized)"));
    }
    if (!w.value("symmetric", true)) {
      return bad(info.source, where + ": asymmetric int4 weights (zero points) are not supported");
    }
    if (w.contains("actorder") && !w["actorder"].is_null() && w["actorder"] != "static" &&
        w["actorder"] != "weight") {
      return bad(info.source, where + ".actorder: activation-ordered groups are not supported");
    }
    info.scheme = QuantScheme::kInt4;
    if (strategy == "channel") return absl::OkStatus();
    const auto size = w.find("group_size");
    const uint64_t group =
        size != w.end() && size->is_number_unsigned() ? size->get<uint64_t>() : 0;
    if (strategy != "group" || group == 0 || group > 65536 || group % 8 != 0) {
      return bad(info.source, absl::StrCat(where, ".strategy \"", strategy,
                                           "\" is not supported for int4 (supported: channel, "
                                           "group with a group_size that is a multiple of 8)"));
    }
    info.group_size = static_cast<uint32_t>(group);
    return absl::OkStatus();
  }
  return bad(info.source,
             absl::StrCat(where, ": ", type, " ", bits,
                          "-bit weights are not supported (supported: float 8-bit FP8, float "
                          "4-bit NVFP4, int 4-bit)"));
}

}  // namespace

const char* quantSchemeName(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::kNone: return "none";
    case QuantScheme::kFp8: return "fp8";
    case QuantScheme::kNvfp4: return "nvfp4";
    case QuantScheme::kMxfp4: return "mxfp4";
    case QuantScheme::kInt4: return "int4";
  }
  return "unknown";
}

const char* quantFormatName(QuantFormat format) {
  switch (format) {
    case QuantFormat::kNone: return "none";
    case QuantFormat::kHfFp8: return "hf-fp8";
    case QuantFormat::kModelOpt: return "modelopt";
    case QuantFormat::kCompressedTensors: return "compressed-tensors";
  }
  return "unknown";
}

std::string QuantizationInfo::describe() const {
  if (scheme == QuantScheme::kNone) return "none";
  if (scheme == QuantScheme::kMxfp4) return "mxfp4 experts, groups of 32";
  std::string granularity;
  if (scheme == QuantScheme::kInt4 && group_size == 0) {
    granularity = "per channel";
  } else if (scheme == QuantScheme::kNvfp4 || scheme == QuantScheme::kInt4) {
    granularity = absl::StrCat("groups of ", group_size);
  } else if (block_rows == 0 && block_cols == 0) {
    granularity = "per tensor";
  } else if (block_cols == 0) {
    granularity = "per channel";
  } else {
    granularity = absl::StrCat(block_rows, "x", block_cols, " blocks");
  }
  return absl::StrCat(quantSchemeName(scheme), " ", granularity, " (", quantFormatName(format),
                      ")");
}

absl::StatusOr<QuantizationInfo> readQuantizationInfo(const std::string& folder) {
  QuantizationInfo info;
  fs::path hf_quant = fs::path(folder) / "hf_quant_config.json";
  if (fs::exists(hf_quant)) {
    info.source = hf_quant.string();
    CLEAVE_ASSIGN_OR_RETURN(json doc, readJson(info.source));
    auto q = doc.find("quantization");
    if (q == doc.end() || !q->is_object()) return bad(info.source, "\"quantization\" is missing");
    CLEAVE_RETURN_IF_ERROR(parseModelOpt(*q, "quantization", info));
    return info;
  }
  fs::path config = fs::path(folder) / "config.json";
  if (!fs::exists(config)) return info;
  CLEAVE_ASSIGN_OR_RETURN(json doc, readJson(config.string()));
  auto q = doc.find("quantization_config");
  if (q == doc.end()) return info;
  info.source = config.string();
  if (!q->is_object()) return bad(info.source, "quantization_config must be an object");
  const std::string method = q->value("quant_method", "");
  if (method == "modelopt") {
    CLEAVE_RETURN_IF_ERROR(parseModelOpt(*q, "quantization_config", info));
    return info;
  }
  if (method == "compressed-tensors") {
    CLEAVE_RETURN_IF_ERROR(parseCompressedTensors(*q, info));
    return info;
  }
  if (method == "mxfp4") {
    info.scheme = QuantScheme::kMxfp4;
    info.group_size = 32;
    return info;
  }
  if (method != "fp8") {
    return bad(info.source, absl::StrCat("quantization_config.quant_method \"", method,
                                         "\" is not supported (supported: fp8, modelopt, "
                                         "compressed-tensors, mxfp4)"));
  }
  if (!readBlock(*q, "weight_block_size", info.block_rows, info.block_cols)) {
    return bad(info.source,
               "quantization_config.weight_block_size must be [rows, cols] of positive integers");
  }
  info.scheme = QuantScheme::kFp8;
  info.format = QuantFormat::kHfFp8;
  info.activations_quantized =
      q->contains("activation_scheme") && !(*q)["activation_scheme"].is_null();
  return info;
}

absl::StatusOr<QuantizedWeight> resolveQuantizedWeight(const SafetensorsCheckpoint& checkpoint,
                                                       const QuantizationInfo& info,
                                                       absl::string_view weight_name) {
  const std::string name(weight_name);
  const std::string module = name.substr(0, name.rfind('.'));
  const bool nvfp4 = info.scheme == QuantScheme::kNvfp4;
  const bool int4 = info.scheme == QuantScheme::kInt4;
  const bool compressed = info.format == QuantFormat::kCompressedTensors;
  const std::string codes_name = (nvfp4 || int4) && compressed ? module + ".weight_packed" : name;
  if (info.scheme == QuantScheme::kNone)
    return bad(absl::StrCat("tensor \"", name, "\""), "the checkpoint is not quantized");
  QuantizedWeight out;
  out.weight = checkpoint.find(codes_name);
  if (out.weight == nullptr)
    return absl::NotFoundError(absl::StrCat("tensor \"", codes_name, "\" is missing"));
  const SafetensorsTensor& w = *out.weight;
  const std::string where = absl::StrCat(w.file, ": tensor \"", codes_name, "\"");
  if (w.shape.size() != 2)
    return bad(where, absl::StrCat("must be 2-D, has shape ", shapeText(w.shape)));
  // A companion `module.suffix` with one of `dtypes` and one of `shapes`.
  auto companion = [&](const std::string& suffix, std::vector<TensorType> dtypes,
                       std::vector<std::vector<uint64_t>> shapes,
                       bool optional = false) -> absl::StatusOr<const SafetensorsTensor*> {
    const std::string companion_name = module + "." + suffix;
    const SafetensorsTensor* t = checkpoint.find(companion_name);
    if (t == nullptr) {
      if (optional) return nullptr;
      return bad(where, absl::StrCat("its companion \"", companion_name, "\" is missing"));
    }
    const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), t->dtype) != dtypes.end();
    const bool shape_ok = std::find(shapes.begin(), shapes.end(), t->shape) != shapes.end();
    if (!dtype_ok || !shape_ok) {
      return bad(where,
                 absl::StrCat("companion \"", companion_name, "\" is ", tensorTypeName(t->dtype),
                              " ", shapeText(t->shape), ", expected ",
                              tensorTypeName(dtypes.front()), " ", shapeText(shapes.front())));
    }
    return t;
  };
  const std::vector<std::vector<uint64_t>> scalar = {{}, {1}};
  const std::vector<TensorType> floats = {TensorType::kF32, TensorType::kBF16, TensorType::kF16};
  if (int4) {
    if (w.dtype != TensorType::kI32) return bad(where, "must be I32 (eight int4 values per word)");
    for (const char* refused : {"weight_zero_point", "weight_g_idx"}) {
      if (checkpoint.find(module + "." + refused) != nullptr) {
        return bad(where, absl::StrCat("its companion \"", module, ".", refused,
                                       "\" (zero points or activation order) is not supported"));
      }
    }
    CLEAVE_ASSIGN_OR_RETURN(const SafetensorsTensor* shape,
                            companion("weight_shape", {TensorType::kI64, TensorType::kI32}, {{2}}));
    int64_t dims[2];  // As integers: a float would round columns past 2^24.
    for (int i = 0; i < 2; ++i) {
      if (shape->dtype == TensorType::kI64) {
        std::memcpy(&dims[i], shape->data + 8 * i, 8);
      } else {
        int32_t narrow;
        std::memcpy(&narrow, shape->data + 4 * i, 4);
        dims[i] = narrow;
      }
    }
    out.codes = TensorType::kI4;
    out.rows = w.shape[0];
    out.cols = dims[1] > 0 ? static_cast<uint64_t>(dims[1]) : 0;
    if (dims[0] != static_cast<int64_t>(out.rows) || out.cols == 0 || out.cols % 8 != 0 ||
        out.cols / 8 != w.shape[1]) {
      return bad(where,
                 absl::StrCat("holds ", shapeText(w.shape), " words, which is not the [", dims[0],
                              ", ", dims[1], "] of its weight_shape in whole words of 8"));
    }
    out.block_rows = 1;
    out.block_cols = info.group_size ? info.group_size : out.cols;
    CLEAVE_ASSIGN_OR_RETURN(
        out.scale, companion("weight_scale", floats,
                             {{out.rows, (out.cols + out.block_cols - 1) / out.block_cols}}));
    return out;
  }
  if (!nvfp4) {
    if (w.dtype != TensorType::kF8E4M3) return bad(where, "must be F8_E4M3");
    out.codes = TensorType::kF8E4M3;
    out.rows = w.shape[0];
    out.cols = w.shape[1];
    out.block_rows = info.block_rows ? info.block_rows : out.rows;
    out.block_cols = info.block_cols ? info.block_cols : out.cols;
    const std::vector<uint64_t> grid = {(out.rows + out.block_rows - 1) / out.block_rows,
                                        (out.cols + out.block_cols - 1) / out.block_cols};
    if (info.format == QuantFormat::kHfFp8) {
      // "x.weight" -> "x.weight_scale_inv".
      CLEAVE_ASSIGN_OR_RETURN(out.scale, companion("weight_scale_inv", {TensorType::kF32}, {grid}));
    } else if (info.format == QuantFormat::kModelOpt) {
      CLEAVE_ASSIGN_OR_RETURN(out.scale, companion("weight_scale", {TensorType::kF32}, scalar));
      CLEAVE_ASSIGN_OR_RETURN(out.input_scale,
                              companion("input_scale", {TensorType::kF32}, scalar, true));
    } else {
      std::vector<std::vector<uint64_t>> shapes = {grid};
      if (grid[0] == 1 && grid[1] == 1) shapes = scalar;
      if (grid[1] == 1 && grid[0] > 1) shapes = {grid, {grid[0]}};  // Channel: [rows, 1].
      CLEAVE_ASSIGN_OR_RETURN(out.scale, companion("weight_scale", floats, shapes));
      CLEAVE_ASSIGN_OR_RETURN(out.input_scale, companion("input_scale", floats, scalar, true));
    }
    return out;
  }
  if (w.dtype != TensorType::kU8) return bad(where, "must be U8 (two FP4 values per byte)");
  out.codes = TensorType::kE2M1;
  out.rows = w.shape[0];
  out.cols = w.shape[1] * 2;
  out.block_rows = 1;
  out.block_cols = info.group_size;
  if (out.cols % info.group_size != 0) {
    return bad(where, absl::StrCat(out.cols, " columns is not a multiple of the group size ",
                                   info.group_size));
  }
  CLEAVE_ASSIGN_OR_RETURN(out.scale, companion("weight_scale", {TensorType::kF8E4M3},
                                               {{out.rows, out.cols / info.group_size}}));
  CLEAVE_ASSIGN_OR_RETURN(
      out.global_scale,
      companion(compressed ? "weight_global_scale" : "weight_scale_2", {TensorType::kF32}, scalar));
  CLEAVE_ASSIGN_OR_RETURN(out.input_scale,
                          companion(compressed ? "input_global_scale" : "input_scale",
                                    {TensorType::kF32}, scalar, true));
  return out;
}

absl::StatusOr<ScaleGrid> scaleGrid(const QuantizedWeight& weight, const QuantizationInfo& info) {
  ScaleGrid grid;
  grid.block_rows = weight.block_rows;
  grid.block_cols = weight.block_cols;
  grid.grid_cols = (weight.cols + weight.block_cols - 1) / weight.block_cols;
  const uint64_t count = (weight.rows + weight.block_rows - 1) / weight.block_rows * grid.grid_cols;
  if (weight.scale == nullptr || weight.scale->num_elements != count)
    return absl::InvalidArgumentError("scaleGrid: the weight is not resolved");
  grid.values.resize(count);
  CLEAVE_RETURN_IF_ERROR(
      dequantize(weight.scale->dtype, weight.scale->data, count, grid.values.data()));
  if (weight.global_scale != nullptr) {
    float global = 0.0f;
    CLEAVE_RETURN_IF_ERROR(dequantize(TensorType::kF32, weight.global_scale->data, 1, &global));
    if (!(global > 0.0f) || !std::isfinite(global)) {
      return bad(
          absl::StrCat(weight.global_scale->file, ": tensor \"", weight.global_scale->name, "\""),
          absl::StrCat("must be a positive finite number, is ", global));
    }
    grid.global = info.format == QuantFormat::kCompressedTensors ? 1.0f / global : global;
  }
  return grid;
}

std::optional<std::vector<uint8_t>> int4AsQ4_0(const QuantizedWeight& weight,
                                               const ScaleGrid& grid) {
  constexpr uint64_t kBlock = 32, kBlockBytes = 18;
  if (weight.codes != TensorType::kI4 || weight.cols % kBlock != 0 ||
      grid.block_cols % kBlock != 0 || grid.block_rows != 1) {
    return std::nullopt;
  }
  const uint64_t blocks = weight.cols / kBlock;
  std::vector<uint8_t> out(weight.rows * blocks * kBlockBytes);
  for (uint64_t r = 0; r < weight.rows; ++r) {
    const uint8_t* codes = weight.weight->data + r * weight.cols / 2;
    for (uint64_t b = 0; b < blocks; ++b) {
      const float scale = grid.values[r * grid.grid_cols + b * kBlock / grid.block_cols];
      const uint16_t half = dequant::floatToHalf(scale);
      if (dequant::halfToFloat(half) != scale) return std::nullopt;
      uint8_t* block = out.data() + (r * blocks + b) * kBlockBytes;
      std::memcpy(block, &half, 2);
      // Q4_0 holds element j in the low nibble of byte j and element 16 + j in its high one.
      auto code = [&](uint64_t j) {
        const uint8_t byte = codes[(b * kBlock + j) / 2];
        return static_cast<uint8_t>(j % 2 == 0 ? byte & 0x0f : byte >> 4);
      };
      for (uint64_t j = 0; j < 16; ++j)
        block[2 + j] = static_cast<uint8_t>(code(j) | (code(16 + j) << 4));
    }
  }
  return out;
}

absl::Status dequantizeWeight(const QuantizedWeight& weight, const QuantizationInfo& info,
                              float* out) {
  CLEAVE_ASSIGN_OR_RETURN(ScaleGrid grid, scaleGrid(weight, info));
  if (info.format == QuantFormat::kCompressedTensors && weight.global_scale != nullptr) {
    // compressed-tensors divides the group scale by the global first.
    float stored = 0.0f;
    CLEAVE_RETURN_IF_ERROR(dequantize(TensorType::kF32, weight.global_scale->data, 1, &stored));
    for (float& v : grid.values) v /= stored;
    grid.global = 1.0f;
  }
  const uint64_t rows = weight.rows, cols = weight.cols;
  const uint64_t row_bytes = *tensorBytes(weight.codes, cols);
  for (uint64_t i = 0; i < rows; ++i) {
    float* row = out + i * cols;
    CLEAVE_RETURN_IF_ERROR(
        dequantize(weight.codes, weight.weight->data + i * row_bytes, cols, row));
    const float* scale = grid.values.data() + (i / grid.block_rows) * grid.grid_cols;
    for (uint64_t j = 0; j < cols; ++j)
      row[j] = (row[j] * scale[j / grid.block_cols]) * grid.global;
  }
  return absl::OkStatus();
}

}  // namespace cleave::model
