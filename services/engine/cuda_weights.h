// Weight matrices on the GPU in a form the kernels read: bf16 (cuBLASLt, or the expert and
// skinny GEMMs of kernels/cuda/moe_gemm.h), or kept in the checkpoint's quantized format for
// those GEMMs — NVFP4 (E2M1 codes, e4m3 scales per 16, the global scale per row) and FP8
// with 128 x 128 block scales. The CUDA model's dense layers and MoE experts both go
// through here.
//
// A cuda::ExpertWeights holds `experts` matrices of [rows][cols]; a dense matrix is one of
// them. Matrices can be stacked (QKV, gate/up) by uploading each part at its first row.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/moe_gemm.h"
#include "services/engine/cuda_arena.h"

namespace cleave::engine {

// The format a kernel can read `m` in as stored — NVFP4 (MXFP4 too, rewritten at upload by
// model::mxfp4AsNvfp4), FP8 128x128, else bf16 (every stored format dequantizes to it) —
// given where its scales fall (a tensor-parallel slice must start on a scale block).
cuda::ExpertWeightFormat nativeFormat(const cpu::CpuMatrix& m);

// The format of matrices stacked into one [sum of rows][cols] ExpertWeights: their common
// native format when the kernels can read the stack in it (every part's rows but the last a
// whole number of FP8 blocks, columns a multiple of what the format needs), else bf16.
cuda::ExpertWeightFormat stackFormat(const std::vector<const cpu::CpuMatrix*>& parts);

// Bytes of one matrix [rows][cols] in `format` with its scales.
int64_t matrixBytes(cuda::ExpertWeightFormat format, int64_t rows, int64_t cols);

// Where `count` matrices of [rows][cols] in `format` go (an Arena pass).
cuda::ExpertWeights placeWeights(Arena& arena, cuda::ExpertWeightFormat format, int64_t count,
                                 int64_t rows, int64_t cols);

// Uploads `m` as rows [first, first + m.rows()) of matrix `index` of `dst` (converted to
// bf16 when dst is bf16; otherwise `m` must be in dst's format).
absl::Status uploadRows(const cpu::CpuMatrix& m, const cuda::ExpertWeights& dst, int64_t index,
                        int64_t first, const char* what);

// `bytes` host bytes to device `dst`; errors name `what`.
absl::Status uploadBytes(void* dst, const void* src, size_t bytes, const char* what);

// Host floats, or any stored matrix dequantized, as bf16 at `dst`.
absl::Status uploadBf16(const std::vector<float>& values, __nv_bfloat16* dst, const char* what);
absl::Status uploadDequantized(const cpu::CpuMatrix& m, __nv_bfloat16* dst, const char* what);
// Host floats kept f32 at `dst` (norm weights).
// `values` must hold `count` floats (an InvalidArgument naming `what` otherwise: a norm of
// another width would overrun its piece of the arena, or leave it unwritten).
absl::Status uploadF32(const std::vector<float>& values, float* dst, int64_t count,
                       const char* what);

}  // namespace cleave::engine
