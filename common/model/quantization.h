// Quantized safetensors checkpoints: recognizing the scheme, finding each weight's
// companion tensors, and what their scales mean.
//
// Two schemes, each written under three conventions:
//
//  FP8 E4M3 weights, value = e4m3(w[i][j]) * scale[i / R][j / C]:
//  * Hugging Face "fp8" (DeepSeek-V3, Qwen FP8; config.json "quantization_config":
//    {"quant_method": "fp8", "weight_block_size": [R, C]}): `<weight>_scale_inv` F32
//    [ceil(rows/R), ceil(cols/C)] (despite the name, a multiplier).
//  * ModelOpt (hf_quant_config.json "quantization": {"quant_algo": "FP8"}, or config.json
//    "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}): per tensor,
//    `<module>.weight_scale` F32 scalar.
//  * compressed-tensors (config.json "quantization_config": {"quant_method":
//    "compressed-tensors", "format": "float-quantized", "config_groups": {...: {"weights":
//    {"type": "float", "num_bits": 8, "strategy": "tensor" | "channel" | "block",
//    "block_structure": [R, C]}}}}): `<module>.weight_scale` in any float dtype, [] or [1]
//    per tensor, [rows, 1] per channel, the block grid per block.
//
//  NVFP4 weights: E2M1 codes two per byte (element 2k in the low nibble) and an E4M3 scale
//  per 16 consecutive elements of a row, `<module>.weight_scale` F8_E4M3 [rows, cols/16],
//  plus a global scale:
//  * ModelOpt (quant_algo "NVFP4"): codes in `<module>.weight` U8 [rows, cols/2];
//    value = (e2m1 * e4m3(scale)) * weight_scale_2 (F32 scalar).
//  * compressed-tensors ("format": "nvfp4-pack-quantized", weights {"type": "float",
//    "num_bits": 4, "strategy": "tensor_group", "group_size": 16}): codes in
//    `<module>.weight_packed`; the global scale is stored as its reciprocal,
//    value = e2m1 * (e4m3(scale) / weight_global_scale).
//
//  Int4 weights (W4A16), symmetric, a scale per group of consecutive elements of a row:
//  * compressed-tensors ("format": "pack-quantized", weights {"type": "int", "num_bits": 4,
//    "symmetric": true, "strategy": "group" with "group_size", or "channel"}): codes in
//    `<module>.weight_packed` I32 [rows, cols / 8] (element i at bits 4i of the row's words,
//    stored as value + 8), `<module>.weight_scale` in any float dtype [rows, cols / group],
//    `<module>.weight_shape` [rows, cols]; value = code * scale. Asymmetric weights (zero
//    points) and activation ordering (g_idx) are refused.
//
//  MXFP4 (gpt-oss as OpenAI publishes it; config.json "quantization_config": {"quant_method":
//  "mxfp4"}): only the routed experts are quantized, E2M1 codes with an E8M0 exponent per 32
//  elements, in tensors of their own (services/engine/gpt_oss_experts.h reads them); every
//  other weight is stored as floats.
//
// Activation scales (input_scale, input_global_scale) are found and kept, not applied: the
// engines run these checkpoints weight-only, activations in their compute precision.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/safetensors_file.h"

namespace cleave::model {

enum class QuantScheme { kNone, kFp8, kNvfp4, kMxfp4, kInt4 };
enum class QuantFormat { kNone, kHfFp8, kModelOpt, kCompressedTensors };

const char* quantSchemeName(QuantScheme scheme);
const char* quantFormatName(QuantFormat format);

struct QuantizationInfo {
  QuantScheme scheme = QuantScheme::kNone;
  QuantFormat format = QuantFormat::kNone;
  // FP8: one scale covers block_rows x block_cols elements; 0 means the whole dimension
  // (per tensor: 0 x 0; per output channel: 1 x 0).
  uint32_t block_rows = 0;
  uint32_t block_cols = 0;
  // NVFP4 and int4: elements per scale along a row (int4 per channel: 0, the whole row).
  uint32_t group_size = 0;
  // Whether the checkpoint was made to run with its activations quantized too (W8A8, W4A4:
  // ModelOpt's FP8 and NVFP4, compressed-tensors groups with input_activations, fp8 with an
  // activation_scheme), not weight-only (NVFP4A16, int4, MXFP4). The CPU runs every one
  // weight-only; the CUDA backend's native FP8/FP4 products are for these alone.
  bool activations_quantized = false;
  // Modules the checkpoint says it left unquantized (e.g. "lm_head"), as written there.
  std::vector<std::string> excluded_modules;
  // The file the scheme was read from.
  std::string source;
  // "fp8 per-channel (compressed-tensors)", for logs and `cleave inspect`.
  std::string describe() const;
};

// Reads the scheme of the checkpoint in `folder`: hf_quant_config.json, else the
// "quantization_config" of config.json, else kNone. Unknown or unsupported methods are an
// error naming the file and field.
absl::StatusOr<QuantizationInfo> readQuantizationInfo(const std::string& folder);

struct QuantizedWeight {
  TensorType codes = TensorType::kF8E4M3;           // kF8E4M3, kE2M1 (NVFP4) or kI4.
  const SafetensorsTensor* weight = nullptr;        // The codes.
  const SafetensorsTensor* scale = nullptr;         // Block, channel, tensor or group scales.
  const SafetensorsTensor* global_scale = nullptr;  // NVFP4.
  const SafetensorsTensor* input_scale = nullptr;   // Optional.
  uint64_t rows = 0;
  uint64_t cols = 0;  // Logical columns (NVFP4: twice the stored bytes per row).
  // The block one scale covers, whole dimensions filled in.
  uint64_t block_rows = 0;
  uint64_t block_cols = 0;
};

// Finds and checks the codes and companions of `weight_name` ("...down_proj.weight"; for
// compressed-tensors NVFP4 the codes are "...down_proj.weight_packed"): presence, dtypes
// and shapes. Errors name the tensor and what is wrong.
absl::StatusOr<QuantizedWeight> resolveQuantizedWeight(const SafetensorsCheckpoint& checkpoint,
                                                       const QuantizationInfo& info,
                                                       absl::string_view weight_name);

// A resolved weight's scales as floats, one per block, row-major: element (r, c) is
//   (code(r, c) * values[(r / block_rows) * grid_cols + c / block_cols]) * global
// which is each convention's own order of operations (ModelOpt NVFP4: global =
// weight_scale_2; compressed-tensors NVFP4 folds 1 / weight_global_scale into values as it
// does; otherwise global = 1).
struct ScaleGrid {
  std::vector<float> values;
  uint64_t block_rows = 0;
  uint64_t block_cols = 0;
  uint64_t grid_cols = 0;
  float global = 1.0f;
};
absl::StatusOr<ScaleGrid> scaleGrid(const QuantizedWeight& weight, const QuantizationInfo& info);

// A resolved int4 weight as GGUF Q4_0 blocks ([rows][cols / 32] of an fp16 scale and 16
// bytes of codes), which the CPU kernels multiply: the same codes, each group's scale as
// every one of its blocks' scale. Nullopt when that is not exact: groups or rows not whole
// 32-element blocks, or a scale that is not an fp16 value (the caller keeps floats).
std::optional<std::vector<uint8_t>> int4AsQ4_0(const QuantizedWeight& weight,
                                               const ScaleGrid& grid);

// Dequantizes a resolved weight into `out` (rows * cols floats, row-major), exactly as the
// convention defines it.
absl::Status dequantizeWeight(const QuantizedWeight& weight, const QuantizationInfo& info,
                              float* out);

}  // namespace cleave::model
