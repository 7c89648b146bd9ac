// MXFP4 weights (GGUF blocks, model::TensorType::kMXFP4: value = e2m1 x 2^(e - 127), one E8M0
// exponent e per 32 values) rewritten as the NVFP4 the GPU's expert and skinny GEMMs read
// (kernels/cuda/moe_gemm.h): E2M1 codes, an e4m3 scale per 16 values and an f32 scale per
// row.
//
// Each row's scale is 2^(m - 135), m its largest exponent, so a block of exponent e gets the
// group scale 2^(e - m + 8): an e4m3 value (2^-9 .. 2^8) for the 18 exponents m - 17 .. m,
// whose values come out exactly. A block further below its row's largest gets the smallest
// scale, 2^-9, and its values are rounded to the nearest E2M1 at that scale (ties to the
// even code): its scale is at most 2^-18 of the row's largest block's, and each value moves
// by at most 2^-10 of the row scale.
#pragma once

#include <cstdint>
#include <vector>

namespace cleave::model {

struct Nvfp4Rows {
  std::vector<uint8_t> codes;     // [rows][cols / 2], element 2k in the low nibble of byte k
  std::vector<uint8_t> scales;    // [rows][cols / 16], e4m3
  std::vector<float> row_scales;  // [rows]
  int64_t rounded_blocks = 0;     // blocks whose values were rounded (above)
};

// `rows` rows of `cols` (a multiple of 32) values in MXFP4 blocks, row after row.
Nvfp4Rows mxfp4AsNvfp4(const uint8_t* blocks, int64_t rows, int64_t cols);

}  // namespace cleave::model
