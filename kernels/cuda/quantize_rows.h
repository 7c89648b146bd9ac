// Activations quantized per row for the native low-precision products (moe_gemm.h): each
// row of x on its own, so no step needs a pass over the whole tensor and a CUDA graph can
// capture it.
//
//   fp8    e4m3 codes [rows][K] and f32 scales [rows][K/128]: per 128 consecutive elements
//          (DeepSeek-V3's 1x128 activation blocks), scale = amax / 448, code = e4m3(x / scale)
//          rounded to nearest even and saturated (scale 1 for a block of zeros).
//   nvfp4  E2M1 codes [rows][K/2] (element 2k in the low nibble), e4m3 scales per 16
//          elements [rows][K/16] and an f32 scale per row [rows]:
//            row   = amax(row) / (6 x 448)                      (1 for a row of zeros)
//            group = e4m3(amax(group) / 6 / row)                nearest even
//            code  = e2m1(x / (group x row))                    nearest even, saturated at 6
//          so x ~ code x group x row, as the checkpoints store weights (the row scale plays
//          the global scale, per row).
// Rows at or past `live_rows` (when given: *live_tiles x tile_rows, read on the device) are
// skipped: the padding rows of an expert layout need no codes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace cleave::cuda {

struct QuantizedRows {
  uint8_t* codes = nullptr;
  float* scales = nullptr;          // fp8: [rows][K/128]; nvfp4: [rows]
  uint8_t* group_scales = nullptr;  // nvfp4: [rows][K/16]
};

enum class RowQuantization { kFp8Block128, kNvfp4 };

// Bytes of the quantized form of [rows][k], and its parts carved from `base` (256-byte
// aligned pieces; `base` 256-byte aligned).
int64_t quantizedRowsBytes(RowQuantization kind, int64_t rows, int64_t k);
QuantizedRows carveQuantizedRows(RowQuantization kind, int64_t rows, int64_t k, void* base);

struct QuantizeRowsArgs {
  RowQuantization kind = RowQuantization::kFp8Block128;
  const void* x = nullptr;  // bf16 [rows][x_stride]
  int64_t x_stride = 0;
  int64_t rows = 0;
  int64_t k = 0;  // fp8: % 128 == 0; nvfp4: % 16 == 0
  QuantizedRows out;
  const int32_t* live_tiles = nullptr;  // optional, with tile_rows
  int tile_rows = 0;
};

absl::Status quantizeRows(const QuantizeRowsArgs& args, cudaStream_t stream);

}  // namespace cleave::cuda
