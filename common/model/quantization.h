// Quantized safetensors checkpoints: recognizing the scheme and finding each weight's
// companion tensors.
//
//  * FP8 block-scaled (config.json "quantization_config": {"quant_method": "fp8",
//    "weight_block_size": [R, C]}): weight F8_E4M3 [rows, cols] and `<weight>_scale_inv`
//    F32 [ceil(rows/R), ceil(cols/C)]; value = e4m3(w[i][j]) * scale_inv[i/R][j/C].
//  * NVFP4 (hf_quant_config.json "quantization": {"quant_algo": "NVFP4", "group_size": 16}):
//    weight U8 [rows, cols/2] with two E2M1 codes per byte (element 2k in the low nibble),
//    `<module>.weight_scale` F8_E4M3 [rows, cols/16], `<module>.weight_scale_2` F32 scalar
//    and `<module>.input_scale` F32 scalar; value = (e2m1 * e4m3(scale)) * scale_2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/safetensors_file.h"

namespace cleave::model {

enum class QuantScheme { kNone, kFp8BlockScaled, kNvfp4 };

const char* quantSchemeName(QuantScheme scheme);

struct QuantizationInfo {
  QuantScheme scheme = QuantScheme::kNone;
  // FP8: block of one scale.
  uint32_t block_rows = 0;
  uint32_t block_cols = 0;
  // NVFP4: elements per scale along a row.
  uint32_t group_size = 0;
  // Modules left unquantized (e.g. "lm_head").
  std::vector<std::string> excluded_modules;
  // The file the scheme was read from.
  std::string source;
};

// Reads the scheme of the checkpoint in `folder`: hf_quant_config.json, else the
// "quantization_config" of config.json, else kNone. Unknown methods are an error naming
// the file and field.
absl::StatusOr<QuantizationInfo> readQuantizationInfo(const std::string& folder);

struct QuantizedWeight {
  const SafetensorsTensor* weight = nullptr;
  const SafetensorsTensor* scale = nullptr;         // FP8 scale_inv, NVFP4 weight_scale.
  const SafetensorsTensor* global_scale = nullptr;  // NVFP4 weight_scale_2.
  const SafetensorsTensor* input_scale = nullptr;   // NVFP4, optional.
  uint64_t rows = 0;
  uint64_t cols = 0;  // Logical columns (NVFP4: twice the stored bytes per row).
};

// Finds and checks the companions of `weight_name` ("...down_proj.weight"): presence,
// dtypes and shapes. Errors name the tensor and what is wrong.
absl::StatusOr<QuantizedWeight> resolveQuantizedWeight(const SafetensorsCheckpoint& checkpoint,
                                                       const QuantizationInfo& info,
                                                       absl::string_view weight_name);

// Dequantizes a resolved weight into `out` (rows * cols floats, row-major).
absl::Status dequantizeWeight(const QuantizedWeight& weight, const QuantizationInfo& info,
                              float* out);

}  // namespace cleave::model
