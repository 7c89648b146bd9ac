#include <algorithm>
#include <cfloat>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/warp_math.cuh"

namespace cleave::cuda {
namespace {

using bf16 = __nv_bfloat16;
using bf162 = __nv_bfloat162;

constexpr int kRowsPerBlock = 4;  // one warp per row

__global__ void __launch_bounds__(kRowsPerBlock * 32) rmsNormKernel(const RmsNormArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= a.rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t pairs = a.cols / 2;
  const int64_t outer = row / a.group, inner = (row % a.group) * a.cols;
  const bf162* x = reinterpret_cast<const bf162*>(a.x + outer * a.x_stride + inner);
  bf162* residual = a.residual
                        ? reinterpret_cast<bf162*>(a.residual + outer * a.residual_stride + inner)
                        : nullptr;
  const bf162* source = residual ? residual : x;
  float squares = 0.0f;
  for (int64_t i = lane; i < pairs; i += 32) {
    bf162 v = x[i];
    if (residual) {
      v = __floats2bfloat162_rn(__low2float(v) * a.x_scale + __low2float(residual[i]),
                                __high2float(v) * a.x_scale + __high2float(residual[i]));
      residual[i] = v;
    }
    squares += __low2float(v) * __low2float(v) + __high2float(v) * __high2float(v);
  }
  squares = warpSum(squares);
  if (a.squares_out != nullptr) {
    if (lane == 0) a.squares_out[row] = squares;
    return;
  }
  const float mean = a.squares != nullptr ? a.squares[row] / static_cast<float>(a.norm_cols)
                                          : squares / static_cast<float>(a.cols);
  const float inverse = a.weight != nullptr ? rsqrtf(mean + a.eps) : 1.0f;
  __syncwarp();
  const float2* weight = reinterpret_cast<const float2*>(a.weight);
  bf162* out = reinterpret_cast<bf162*>(a.out + outer * a.out_stride + inner);
  for (int64_t i = lane; i < pairs; i += 32) {
    const bf162 v = source[i];
    const float2 w = weight != nullptr ? weight[i] : make_float2(1.0f, 1.0f);
    out[i] = __floats2bfloat162_rn(__low2float(v) * inverse * w.x, __high2float(v) * inverse * w.y);
  }
}

// The gate's activation: SiLU, or GELU's tanh form (kernels/cpu/elementwise.h).
template <bool kGelu>
__device__ __forceinline__ float gateActivation(float g) {
  if constexpr (kGelu) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
  } else {
    return g / (1.0f + __expf(-g));
  }
}

template <bool kGelu>
__global__ void gatedMulKernel(const bf16* gate, const bf16* up, int64_t in_stride, int64_t rows,
                               int64_t cols, bf16* out, int64_t out_stride) {
  const int64_t pairs = cols / 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / pairs;
    const int64_t c = (i % pairs) * 2;
    const bf162 g = *reinterpret_cast<const bf162*>(gate + r * in_stride + c);
    const bf162 u = *reinterpret_cast<const bf162*>(up + r * in_stride + c);
    *reinterpret_cast<bf162*>(out + r * out_stride + c) =
        __floats2bfloat162_rn(gateActivation<kGelu>(__low2float(g)) * __low2float(u),
                              gateActivation<kGelu>(__high2float(g)) * __high2float(u));
  }
}

__device__ __forceinline__ float toFloat(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float toFloat(float v) { return v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }

template <typename T>
__global__ void scaleKernel(T* x, int64_t count, float factor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store(x + i, toFloat(x[i]) * factor);
}

__global__ void softCapKernel(float* x, int64_t count, float cap) {
  const float inverse = 1.0f / cap;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] * inverse);
}

// Blocks of 256 threads for a grid-stride loop over `count` items.
unsigned strideBlocks(int64_t count) {
  return static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 65535));
}

// One block per token, 16-byte copies.
// Row id - row_begin of the table; an id outside [row_begin, row_begin + vocab) gives a row
// of `outside` bits (NaN pairs, or zeros for another shard's rows).
__global__ void embedKernel(const int32_t* ids, const bf16* table, int64_t row_begin, int64_t vocab,
                            int64_t cols, bf16* out, int64_t out_stride, uint32_t outside) {
  const int64_t token = blockIdx.x;
  const int64_t id = int64_t{ids[token]} - row_begin;
  uint4* dst = reinterpret_cast<uint4*>(out + token * out_stride);
  const bool valid = id >= 0 && id < vocab;
  const uint4* src = reinterpret_cast<const uint4*>(table + (valid ? id : 0) * cols);
  for (int64_t i = threadIdx.x; i < cols / 8; i += blockDim.x)
    dst[i] = valid ? src[i] : make_uint4(outside, outside, outside, outside);
}

constexpr int kArgmaxThreads = 256;

__global__ void __launch_bounds__(kArgmaxThreads)
    argmaxKernel(const float* logits, int64_t stride, int64_t vocab, int32_t* ids) {
  const float* row = logits + blockIdx.x * stride;
  float best = -FLT_MAX;
  int32_t best_index = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kArgmaxThreads) {
    const float v = row[i];
    if (v > best) {  // Strided from low to high: the first of equals stays.
      best = v;
      best_index = static_cast<int32_t>(i);
    }
  }
  __shared__ float values[kArgmaxThreads / 32];
  __shared__ int32_t indices[kArgmaxThreads / 32];
  auto reduce = [](float& value, int32_t& index) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, value, offset);
      const int32_t other_index = __shfl_xor_sync(0xffffffffu, index, offset);
      if (other > value || (other == value && other_index < index)) {
        value = other;
        index = other_index;
      }
    }
  };
  reduce(best, best_index);
  if (threadIdx.x % 32 == 0) {
    values[threadIdx.x / 32] = best;
    indices[threadIdx.x / 32] = best_index;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    best = threadIdx.x < kArgmaxThreads / 32 ? values[threadIdx.x] : -FLT_MAX;
    best_index = threadIdx.x < kArgmaxThreads / 32 ? indices[threadIdx.x] : INT32_MAX;
    reduce(best, best_index);
    if (threadIdx.x == 0) ids[blockIdx.x] = best_index;
  }
}

template <typename T>
__global__ void fillUniformKernel(T* data, int64_t count, float low, float high, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float unit = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    data[i] = static_cast<T>(low + (high - low) * unit);
  }
}

}  // namespace

namespace {

template <typename T>
absl::Status fillUniformOf(T* data, int64_t count, float low, float high, uint64_t seed,
                           cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 65535));
  fillUniformKernel<<<blocks, 256, 0, stream>>>(data, count, low, high, seed);
  return launchStatus("fill_uniform");
}

}  // namespace

absl::Status fillUniform(__nv_bfloat16* data, int64_t count, float low, float high, uint64_t seed,
                         cudaStream_t stream) {
  return fillUniformOf(data, count, low, high, seed, stream);
}

absl::Status fillUniform(float* data, int64_t count, float low, float high, uint64_t seed,
                         cudaStream_t stream) {
  return fillUniformOf(data, count, low, high, seed, stream);
}

absl::Status rmsNorm(const RmsNormArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return absl::OkStatus();
  if (args.cols % 2 != 0) return absl::InvalidArgumentError("rms_norm: cols must be even");
  if (args.group < 1) return absl::InvalidArgumentError("rms_norm: group must be >= 1");
  if (args.squares != nullptr && args.norm_cols < args.cols)
    return absl::InvalidArgumentError("rms_norm: norm_cols must cover the row");
  const auto blocks = static_cast<unsigned>((args.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  rmsNormKernel<<<blocks, kRowsPerBlock * 32, 0, stream>>>(args);
  return launchStatus("rms_norm");
}

absl::Status siluMul(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride,
                     int64_t rows, int64_t cols, __nv_bfloat16* out, int64_t out_stride,
                     cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  if (cols % 2 != 0) return absl::InvalidArgumentError("silu_mul: cols must be even");
  gatedMulKernel<false><<<strideBlocks(rows * cols / 2), 256, 0, stream>>>(
      gate, up, in_stride, rows, cols, out, out_stride);
  return launchStatus("silu_mul");
}

absl::Status geluTanhMul(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride,
                         int64_t rows, int64_t cols, __nv_bfloat16* out, int64_t out_stride,
                         cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  if (cols % 2 != 0) return absl::InvalidArgumentError("gelu_tanh_mul: cols must be even");
  gatedMulKernel<true><<<strideBlocks(rows * cols / 2), 256, 0, stream>>>(gate, up, in_stride, rows,
                                                                          cols, out, out_stride);
  return launchStatus("gelu_tanh_mul");
}

namespace {

template <typename T>
absl::Status scaleOf(T* x, int64_t count, float factor, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  scaleKernel<<<strideBlocks(count), 256, 0, stream>>>(x, count, factor);
  return launchStatus("scale");
}

}  // namespace

absl::Status scale(__nv_bfloat16* x, int64_t count, float factor, cudaStream_t stream) {
  return scaleOf(x, count, factor, stream);
}

absl::Status scale(float* x, int64_t count, float factor, cudaStream_t stream) {
  return scaleOf(x, count, factor, stream);
}

absl::Status softCap(float* x, int64_t count, float cap, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  if (!(cap > 0)) return absl::InvalidArgumentError("soft_cap: the cap must be positive");
  softCapKernel<<<strideBlocks(count), 256, 0, stream>>>(x, count, cap);
  return launchStatus("soft_cap");
}

absl::Status embed(const int32_t* ids, int64_t tokens, const __nv_bfloat16* table, int64_t vocab,
                   int64_t cols, __nv_bfloat16* out, int64_t out_stride, cudaStream_t stream) {
  if (tokens == 0) return absl::OkStatus();
  if (cols % 8 != 0) return absl::InvalidArgumentError("embed: cols must be a multiple of 8");
  constexpr uint32_t kNanPair = 0x7fc07fc0u;
  embedKernel<<<static_cast<unsigned>(tokens), 128, 0, stream>>>(ids, table, 0, vocab, cols, out,
                                                                 out_stride, kNanPair);
  return launchStatus("embed");
}

absl::Status embedShard(const int32_t* ids, int64_t tokens, const __nv_bfloat16* table,
                        int64_t row_begin, int64_t rows, int64_t cols, __nv_bfloat16* out,
                        int64_t out_stride, cudaStream_t stream) {
  if (tokens == 0) return absl::OkStatus();
  if (cols % 8 != 0) return absl::InvalidArgumentError("embed: cols must be a multiple of 8");
  embedKernel<<<static_cast<unsigned>(tokens), 128, 0, stream>>>(ids, table, row_begin, rows, cols,
                                                                 out, out_stride, 0u);
  return launchStatus("embed shard");
}

absl::Status argmax(const float* logits, int64_t stride, int64_t rows, int64_t vocab, int32_t* ids,
                    cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  argmaxKernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, stream>>>(logits, stride, vocab,
                                                                           ids);
  return launchStatus("argmax");
}

absl::Status joinColumnSlices(const float* slices, std::span<const int64_t> widths,
                              int64_t slice_rows, int64_t rows, float* out, cudaStream_t stream) {
  if (rows > slice_rows)
    return absl::InvalidArgumentError(
        absl::StrCat("joinColumnSlices: ", rows, " rows of slices holding ", slice_rows));
  int64_t stride = 0;
  for (int64_t w : widths) stride += w;
  int64_t offset = 0, column = 0;
  for (int64_t w : widths) {
    if (rows > 0 && w > 0)
      CLEAVE_RETURN_IF_ERROR(
          cudaStatus(cudaMemcpy2DAsync(out + column, stride * sizeof(float), slices + offset,
                                       w * sizeof(float), w * sizeof(float), rows,
                                       cudaMemcpyDeviceToDevice, stream),
                     "joining column slices"));
    offset += slice_rows * w;
    column += w;
  }
  return absl::OkStatus();
}

}  // namespace cleave::cuda
