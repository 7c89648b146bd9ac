// Outputs scaled by a sigmoid gate, bf16 storage and f32 arithmetic:
//   gated attention (Qwen3.5, Qwen3-Next): each value times σ of its own gate value;
//   a gated shared expert (Qwen3.5-MoE, Qwen2-MoE): each row times σ(input row · weight).
// Every function enqueues on `stream` (capturable) and returns the launch's error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace cleave::cuda {

// x[r][i] *= σ(gate[r][i]) for rows x cols values; x and gate may not overlap.
absl::Status sigmoidGate(__nv_bfloat16* x, int64_t x_stride, const __nv_bfloat16* gate,
                         int64_t gate_stride, int64_t rows, int64_t cols, cudaStream_t stream);

// x[r][i] *= σ(Σ_k input[r][k] · weight[k]) for rows x cols values; weight [in_cols], f32.
absl::Status sigmoidRowGate(__nv_bfloat16* x, int64_t x_stride, const __nv_bfloat16* input,
                            int64_t input_stride, const float* weight, int64_t in_cols,
                            int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace cleave::cuda
