#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sigmoid_gate.h"
#include "kernels/cuda/warp_math.cuh"

namespace cleave::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;

// Block = row: its gate (a value per column, or one per row from a dot product), then the
// row's values times σ(gate).
template <bool kPerRow>
__global__ void __launch_bounds__(kThreads)
    sigmoidGateKernel(bf16* x, int64_t x_stride, const bf16* gate, int64_t gate_stride,
                      const float* weight, int64_t in_cols, int64_t cols) {
  const int64_t row = blockIdx.x;
  const bf16* g = gate + row * gate_stride;
  bf16* out = x + row * x_stride;
  float row_gate = 0.0f;
  if constexpr (kPerRow) {
    __shared__ float partial[kThreads / 32];
    float sum = 0.0f;
    for (int64_t k = threadIdx.x; k < in_cols; k += kThreads)
      sum += __bfloat162float(g[k]) * weight[k];
    sum = warpSum(sum);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) sum += partial[w];
    row_gate = sigmoidOf(sum);
  }
  for (int64_t i = threadIdx.x; i < cols; i += kThreads) {
    const float scale = kPerRow ? row_gate : sigmoidOf(__bfloat162float(g[i]));
    out[i] = __float2bfloat16(__bfloat162float(out[i]) * scale);
  }
}

}  // namespace

absl::Status sigmoidGate(bf16* x, int64_t x_stride, const bf16* gate, int64_t gate_stride,
                         int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  sigmoidGateKernel<false><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, x_stride, gate, gate_stride, nullptr, 0, cols);
  return launchStatus("sigmoid_gate");
}

absl::Status sigmoidRowGate(bf16* x, int64_t x_stride, const bf16* input, int64_t input_stride,
                            const float* weight, int64_t in_cols, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  sigmoidGateKernel<true><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, x_stride, input, input_stride, weight, in_cols, cols);
  return launchStatus("sigmoid_row_gate");
}

}  // namespace cleave::cuda
