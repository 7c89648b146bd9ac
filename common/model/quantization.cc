#include "common/model/quantization.h"

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

absl::StatusOr<nlohmann::json> readJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return json;
}

absl::Status bad(const std::string& where, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
}

std::string shapeText(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&text, i ? ", " : "", shape[i]);
  return text + "]";
}

const float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float e2m1(uint8_t code) {
  float magnitude = kE2m1[code & 7];
  return (code & 8) ? -magnitude : magnitude;
}

}  // namespace

const char* quantSchemeName(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::kNone: return "none";
    case QuantScheme::kFp8BlockScaled: return "fp8-block-scaled";
    case QuantScheme::kNvfp4: return "nvfp4";
  }
  return "unknown";
}

absl::StatusOr<QuantizationInfo> readQuantizationInfo(const std::string& folder) {
  QuantizationInfo info;
  fs::path hf_quant = fs::path(folder) / "hf_quant_config.json";
  if (fs::exists(hf_quant)) {
    info.source = hf_quant.string();
    CLEAVE_ASSIGN_OR_RETURN(nlohmann::json json, readJson(info.source));
    auto q = json.find("quantization");
    if (q == json.end() || !q->is_object()) return bad(info.source, "\"quantization\" is missing");
    std::string algo = q->value("quant_algo", "");
    if (algo != "NVFP4") {
      return bad(info.source, absl::StrCat("quantization.quant_algo \"", algo,
                                           "\" is not supported (supported: NVFP4)"));
    }
    info.scheme = QuantScheme::kNvfp4;
    auto group = q->find("group_size");
    info.group_size =
        group != q->end() && group->is_number_unsigned() ? group->get<uint32_t>() : 16;
    if (info.group_size != 16)
      return bad(info.source, "quantization.group_size must be 16 for NVFP4");
    auto excluded = q->find("exclude_modules");
    if (excluded != q->end() && excluded->is_array()) {
      for (const auto& m : *excluded) {
        if (m.is_string()) info.excluded_modules.push_back(m.get<std::string>());
      }
    }
    return info;
  }
  fs::path config = fs::path(folder) / "config.json";
  if (!fs::exists(config)) return info;
  CLEAVE_ASSIGN_OR_RETURN(nlohmann::json json, readJson(config.string()));
  auto q = json.find("quantization_config");
  if (q == json.end()) return info;
  info.source = config.string();
  if (!q->is_object()) return bad(info.source, "quantization_config must be an object");
  std::string method = q->value("quant_method", "");
  if (method != "fp8") {
    return bad(info.source, absl::StrCat("quantization_config.quant_method \"", method,
                                         "\" is not supported (supported: fp8)"));
  }
  auto block = q->find("weight_block_size");
  if (block == q->end() || !block->is_array() || block->size() != 2 ||
      !(*block)[0].is_number_unsigned() || !(*block)[1].is_number_unsigned() ||
      (*block)[0].get<uint64_t>() == 0 || (*block)[1].get<uint64_t>() == 0 ||
      (*block)[0].get<uint64_t>() > 65536 || (*block)[1].get<uint64_t>() > 65536) {
    return bad(info.source,
               "quantization_config.weight_block_size must be [rows, cols] of positive integers "
               "(per-tensor FP8 is not supported)");
  }
  info.scheme = QuantScheme::kFp8BlockScaled;
  info.block_rows = (*block)[0].get<uint32_t>();
  info.block_cols = (*block)[1].get<uint32_t>();
  return info;
}

absl::StatusOr<QuantizedWeight> resolveQuantizedWeight(const SafetensorsCheckpoint& checkpoint,
                                                       const QuantizationInfo& info,
                                                       absl::string_view weight_name) {
  std::string name(weight_name);
  QuantizedWeight out;
  out.weight = checkpoint.find(name);
  if (out.weight == nullptr)
    return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" is missing"));
  const SafetensorsTensor& w = *out.weight;
  std::string where = absl::StrCat(w.file, ": tensor \"", name, "\"");
  if (w.shape.size() != 2)
    return bad(where, absl::StrCat("must be 2-D, has shape ", shapeText(w.shape)));
  auto companion =
      [&](const std::string& suffix, TensorType dtype,
          const std::vector<uint64_t>& shape) -> absl::StatusOr<const SafetensorsTensor*> {
    // Companions extend the weight's name: "x.weight" -> "x.weight_scale_inv".
    std::string companion_name = name + suffix;
    const SafetensorsTensor* t = checkpoint.find(companion_name);
    if (t == nullptr)
      return bad(where, absl::StrCat("its companion \"", companion_name, "\" is missing"));
    if (t->dtype != dtype || t->shape != shape) {
      return bad(where, absl::StrCat("companion \"", companion_name, "\" is ",
                                     tensorTypeName(t->dtype), " ", shapeText(t->shape),
                                     ", expected ", tensorTypeName(dtype), " ", shapeText(shape)));
    }
    return t;
  };
  switch (info.scheme) {
    case QuantScheme::kNone: return bad(where, "the checkpoint is not quantized");
    case QuantScheme::kFp8BlockScaled: {
      if (w.dtype != TensorType::kF8E4M3) return bad(where, "must be F8_E4M3");
      out.rows = w.shape[0];
      out.cols = w.shape[1];
      uint64_t scale_rows = (out.rows + info.block_rows - 1) / info.block_rows;
      uint64_t scale_cols = (out.cols + info.block_cols - 1) / info.block_cols;
      CLEAVE_ASSIGN_OR_RETURN(out.scale,
                              companion("_scale_inv", TensorType::kF32, {scale_rows, scale_cols}));
      return out;
    }
    case QuantScheme::kNvfp4: {
      if (w.dtype != TensorType::kU8) return bad(where, "must be U8 (two FP4 values per byte)");
      out.rows = w.shape[0];
      out.cols = w.shape[1] * 2;
      if (out.cols % info.group_size != 0) {
        return bad(where, absl::StrCat(out.cols, " columns is not a multiple of the group size ",
                                       info.group_size));
      }
      CLEAVE_ASSIGN_OR_RETURN(out.scale, companion("_scale", TensorType::kF8E4M3,
                                                   {out.rows, out.cols / info.group_size}));
      CLEAVE_ASSIGN_OR_RETURN(out.global_scale, companion("_scale_2", TensorType::kF32, {}));
      std::string module = name.substr(0, name.rfind('.'));
      out.input_scale = checkpoint.find(module + ".input_scale");
      return out;
    }
  }
  return bad(where, "unknown scheme");
}

absl::Status dequantizeWeight(const QuantizedWeight& weight, const QuantizationInfo& info,
                              float* out) {
  const uint64_t rows = weight.rows;
  const uint64_t cols = weight.cols;
  if (info.scheme == QuantScheme::kFp8BlockScaled) {
    const uint64_t scale_cols = weight.scale->shape[1];
    for (uint64_t i = 0; i < rows; ++i) {
      for (uint64_t j = 0; j < cols; ++j) {
        float scale;
        std::memcpy(
            &scale,
            weight.scale->data + 4 * ((i / info.block_rows) * scale_cols + j / info.block_cols), 4);
        out[i * cols + j] = dequant::fp8e4m3ToFloat(weight.weight->data[i * cols + j]) * scale;
      }
    }
    return absl::OkStatus();
  }
  if (info.scheme == QuantScheme::kNvfp4) {
    float global;
    std::memcpy(&global, weight.global_scale->data, 4);
    const uint64_t groups = cols / info.group_size;
    for (uint64_t i = 0; i < rows; ++i) {
      for (uint64_t j = 0; j < cols; ++j) {
        uint8_t byte = weight.weight->data[i * (cols / 2) + j / 2];
        uint8_t code = (j % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
        float scale = dequant::fp8e4m3ToFloat(weight.scale->data[i * groups + j / info.group_size]);
        out[i * cols + j] = (e2m1(code) * scale) * global;
      }
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("the weight is not quantized");
}

}  // namespace cleave::model
