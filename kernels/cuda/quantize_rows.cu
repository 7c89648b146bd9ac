#include "kernels/cuda/quantize_rows.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/cuda_check.h"

namespace cleave::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;
constexpr int64_t kAlign = 256;

int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

__device__ __forceinline__ bool liveRow(const int32_t* live_tiles, int tile_rows, int64_t row) {
  return live_tiles == nullptr || row < int64_t{*live_tiles} * tile_rows;
}

__device__ __forceinline__ float warpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// One block per row; warp w quantizes 128-element blocks w, w + 4, ..., four per lane.
__global__ void __launch_bounds__(kThreads)
    quantizeFp8Kernel(const bf16* x, int64_t x_stride, int64_t k, uint8_t* codes, float* scales,
                      const int32_t* live_tiles, int tile_rows) {
  const int64_t row = blockIdx.x;
  if (!liveRow(live_tiles, tile_rows, row)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t blocks = k / 128;
  for (int64_t b = warp; b < blocks; b += kThreads / 32) {
    const int64_t c = b * 128 + lane * 4;
    const uint2 raw = *reinterpret_cast<const uint2*>(x + row * x_stride + c);
    const float2 v01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 v23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    const float amax =
        warpMax(fmaxf(fmaxf(fabsf(v01.x), fabsf(v01.y)), fmaxf(fabsf(v23.x), fabsf(v23.y))));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v01.x / scale, v01.y / scale),
                                                 __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v23.x / scale, v23.y / scale),
                                                 __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<uint32_t*>(codes + row * k + c) = lo | (hi << 16);
    if (lane == 0) scales[row * blocks + b] = scale;
  }
}

// E2M1 code of v (sign bit 3), rounded to nearest even among 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
// saturated at 6.
__device__ __forceinline__ uint32_t e2m1Code(float v) {
  const float a = fabsf(v);
  const uint32_t magnitude = a <= 0.25f   ? 0u
                             : a < 0.75f  ? 1u
                             : a <= 1.25f ? 2u
                             : a < 1.75f  ? 3u
                             : a <= 2.5f  ? 4u
                             : a < 3.5f   ? 5u
                             : a <= 5.0f  ? 6u
                                          : 7u;
  return magnitude | (v < 0.0f ? 8u : 0u);
}

// One block per row: the row's amax first, then one thread per 16-element group.
__global__ void __launch_bounds__(kThreads)
    quantizeNvfp4Kernel(const bf16* x, int64_t x_stride, int64_t k, uint8_t* codes,
                        uint8_t* group_scales, float* row_scales, const int32_t* live_tiles,
                        int tile_rows) {
  const int64_t row = blockIdx.x;
  if (!liveRow(live_tiles, tile_rows, row)) return;
  const bf16* xr = x + row * x_stride;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < k; c += kThreads)
    amax = fmaxf(amax, fabsf(__bfloat162float(xr[c])));
  __shared__ float warp_max[kThreads / 32];
  amax = warpMax(amax);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = fmaxf(fmaxf(warp_max[0], warp_max[1]), fmaxf(warp_max[2], warp_max[3]));
  const float global = amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
  if (threadIdx.x == 0) row_scales[row] = global;
  const int64_t groups = k / 16;
  for (int64_t g = threadIdx.x; g < groups; g += kThreads) {
    const uint4* src = reinterpret_cast<const uint4*>(xr + g * 16);
    const uint4 raw[2] = {src[0], src[1]};
    float v[16];
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float2 f = __bfloat1622float2(pairs[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
    float group_max = 0.0f;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      group_max = fmaxf(group_max, fabsf(v[i]));
      nan = nan || isnan(v[i]);
    }
    // E2M1 has no NaN: a group holding one gets a NaN scale (e4m3 0x7f), so the products it
    // feeds stay NaN instead of turning finite.
    const __nv_fp8_storage_t scale =
        nan ? __nv_fp8_storage_t{0x7f}
            : __nv_cvt_float_to_fp8(group_max / 6.0f / global, __NV_SATFINITE, __NV_E4M3);
    const float decoded = __half2float(__half(__nv_cvt_fp8_to_halfraw(scale, __NV_E4M3)));
    const float denominator = decoded * global;
    uint32_t words[2] = {0u, 0u};
    if (decoded > 0.0f) {
#pragma unroll
      for (int i = 0; i < 16; ++i) words[i / 8] |= e2m1Code(v[i] / denominator) << (4 * (i % 8));
    }
    *reinterpret_cast<uint2*>(codes + row * (k / 2) + g * 8) = make_uint2(words[0], words[1]);
    group_scales[row * groups + g] = scale;
  }
}

}  // namespace

int64_t quantizedRowsBytes(RowQuantization kind, int64_t rows, int64_t k) {
  if (kind == RowQuantization::kFp8Block128)
    return aligned(rows * k) + aligned(rows * (k / 128) * 4);
  return aligned(rows * k / 2) + aligned(rows * (k / 16)) + aligned(rows * 4);
}

QuantizedRows carveQuantizedRows(RowQuantization kind, int64_t rows, int64_t k, void* base) {
  auto* p = static_cast<uint8_t*>(base);
  QuantizedRows q;
  if (kind == RowQuantization::kFp8Block128) {
    q.codes = p;
    q.scales = reinterpret_cast<float*>(p + aligned(rows * k));
    return q;
  }
  q.codes = p;
  q.group_scales = p + aligned(rows * k / 2);
  q.scales = reinterpret_cast<float*>(q.group_scales + aligned(rows * (k / 16)));
  return q;
}

absl::Status quantizeRows(const QuantizeRowsArgs& a, cudaStream_t stream) {
  const bool fp8 = a.kind == RowQuantization::kFp8Block128;
  if (a.x == nullptr || a.out.codes == nullptr || a.out.scales == nullptr ||
      (!fp8 && a.out.group_scales == nullptr))
    return absl::InvalidArgumentError("quantize_rows: x and every output part are required");
  if (a.k <= 0 || a.k % (fp8 ? 128 : 16) != 0)
    return absl::InvalidArgumentError(fp8 ? "quantize_rows: fp8 needs K % 128 == 0"
                                          : "quantize_rows: nvfp4 needs K % 16 == 0");
  if (a.x_stride < a.k || a.x_stride % 8 != 0)
    return absl::InvalidArgumentError("quantize_rows: x_stride must be >= K and % 8 == 0");
  if (a.live_tiles != nullptr && a.tile_rows <= 0)
    return absl::InvalidArgumentError("quantize_rows: live_tiles needs tile_rows");
  if (a.rows <= 0) return absl::OkStatus();
  if (a.rows > 0x7fffffff) return absl::InvalidArgumentError("quantize_rows: too many rows");
  const auto* x = static_cast<const bf16*>(a.x);
  const unsigned grid = static_cast<unsigned>(a.rows);
  if (fp8) {
    quantizeFp8Kernel<<<grid, kThreads, 0, stream>>>(x, a.x_stride, a.k, a.out.codes, a.out.scales,
                                                     a.live_tiles, a.tile_rows);
  } else {
    quantizeNvfp4Kernel<<<grid, kThreads, 0, stream>>>(x, a.x_stride, a.k, a.out.codes,
                                                       a.out.group_scales, a.out.scales,
                                                       a.live_tiles, a.tile_rows);
  }
  return launchStatus("quantize_rows");
}

}  // namespace cleave::cuda
