// The row-interleaved layout of quantized weights for the AVX-512 and AVX2 kernels: 16 output
// rows side by side, so one VPDPBUSD lane accumulates one row and no horizontal sums are needed
// (AVX2 takes a group as two halves of 8 rows: the first and second 32 bytes of each 64-byte
// chunk, the first and second 8 scales). Q6_K is packed for AVX-512 only.
//
// Rows are grouped by 16 (the last group zero-padded). A group stores its blocks in order;
// each block of the group is:
//   d[16]            fp16 scale of each row's block                       32 bytes
//                    (MXFP4: fp32, 2^(e - 128), since E8M0 reaches past a half: 64 bytes;
//                    NVFP4: fp32, d[2][16], each row's scale of the block's first and
//                    second 16 elements, halved for the twice-valued codes: 128 bytes)
//   m[16]            fp16 offset (Q4_1 only)                               32 bytes
//   quants           Q4: 4 chunks of 64 bytes; in chunk c, lane r (bytes 4r..4r+3) holds
//                    elements 4c..4c+3 of row r in the low nibbles and elements
//                    16+4c..16+4c+3 in the high nibbles                   256 bytes
//                    (MXFP4, NVFP4: their E2M1 codes, which the kernels look up: 0..15
//                    to twice their value, or that + 12 where they need it unsigned)
//                    Q8: 8 chunks of 64 bytes; chunk c lane r holds elements 4c..4c+3 of
//                    row r, each + 128 (so they read as unsigned)         512 bytes
// Q6_K (its 256-element super-blocks are 8 blocks each) keeps its own bytes and scales: a
// group starts with d[super-block][16], the fp32 super-block scale of each row (64 bytes
// each), then its blocks, each:
//   sc[2][16]        int8 scale of each row's first and second 16 elements  32 bytes
//   low              as Q4's quants, of each value's low 4 bits (value = q + 32, 0..63)
//                                                                          256 bytes
//   high             2 chunks of 64 bytes; in chunk h, lane r byte i holds bits 4-5 of
//                    element 4(4h + k) + i of row r in its bits 2k, 2k + 1 (k = 0..3)
//                                                                          128 bytes
// Internal to cleave_kernels_cpu.
#pragma once

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "common/model/tensor_type.h"

namespace cleave::cpu::packed {

constexpr int64_t kGroupRows = 16;

// The formats packed: Q4_0, Q4_1, Q8_0, Q6_K, MXFP4 and NVFP4 (from GGUF blocks, or from E2M1
// codes with their scales: packE2M1).
constexpr bool packs(model::TensorType type) {
  return type == model::TensorType::kQ4_0 || type == model::TensorType::kQ4_1 ||
         type == model::TensorType::kQ8_0 || type == model::TensorType::kQ6_K ||
         type == model::TensorType::kMXFP4 || type == model::TensorType::kNVFP4;
}
constexpr int64_t scaleBytes(model::TensorType type) {
  return type == model::TensorType::kNVFP4                                       ? 128
         : type == model::TensorType::kQ4_1 || type == model::TensorType::kMXFP4 ? 64
                                                                                 : 32;
}
constexpr int64_t quantBytes(model::TensorType type) {
  return type == model::TensorType::kQ8_0 ? 512 : type == model::TensorType::kQ6_K ? 384 : 256;
}
// Bytes of one block of one 16-row group.
constexpr int64_t groupBlockBytes(model::TensorType type) {
  return scaleBytes(type) + quantBytes(type);
}
// Bytes before a group's blocks: Q6_K's super-block scales.
constexpr int64_t groupHeaderBytes(model::TensorType type, int64_t blocks) {
  return type == model::TensorType::kQ6_K ? blocks / 8 * 64 : 0;
}
// Bytes of one 16-row group of `blocks` blocks.
constexpr int64_t groupBytes(model::TensorType type, int64_t blocks) {
  return groupHeaderBytes(type, blocks) + blocks * groupBlockBytes(type);
}

}  // namespace cleave::cpu::packed

namespace cleave::cpu::packed {

// Rearranges `rows` x `cols` weights stored in GGUF block format (`src`) into the
// row-interleaved layout at `dst` (groups(rows) * groupBytes(type, blocks) bytes).
void pack(model::TensorType type, int64_t rows, int64_t cols, const uint8_t* src, uint8_t* dst);

// Packs `rows` x `cols` E2M1 codes (two per byte, element 2k in the low nibble; cols a
// multiple of 32) as NVFP4: `scale(r, g)` is the value that multiplies the codes of row r's
// elements [16g, 16g + 16).
void packE2M1(int64_t rows, int64_t cols, const uint8_t* codes,
              absl::FunctionRef<float(int64_t row, int64_t group)> scale, uint8_t* dst);

inline int64_t groups(int64_t rows) { return (rows + kGroupRows - 1) / kGroupRows; }

}  // namespace cleave::cpu::packed
