// The expert-GEMM kernel (moe_gemm.h) as a template, shared by the translation unit that
// builds it for every architecture (moe_gemm.cu) and the one that builds the block-scaled
// E2M1 product for sm_120a only (moe_gemm_fp4.cu).
//
// Two operand modes:
//   widened  bf16 activations; weights staged as stored and widened to bf16 in shared
//            memory (W16A16, W8A16, W4A16), mma.sync m16n8k16 bf16
//   native   activations quantized per row like the weights (quantize_rows.h) and both
//            operands fed to the tensor cores as stored: e4m3 m16n8k32 (W8A8, each
//            128-column block's partial sums scaled by the weight block's and the row's
//            scales) or E2M1 m16n8k64 with e4m3 group scales applied by the MMA itself
//            (W4A4, sm_120a; the row's and the weight row's global scales on the
//            accumulator)
// A native stage is 128 bytes of K per row (128 e4m3 or 256 E2M1 elements), the bytes of a
// 64-column bf16 stage, so both modes share the swizzled tiles and ldmatrix addressing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <array>
#include <atomic>
#include <cstdint>

#include "kernels/cuda/moe_gemm.h"
#include "kernels/cuda/paged_tile.cuh"

namespace cleave::cuda::moe_gemm {

using Format = ExpertWeightFormat;

constexpr int kThreads = 128;  // 4 warps
constexpr int kOutCols = 64;   // output columns per block, 16 per warp
constexpr int kFp8Block = 128;
constexpr int kStageBytes = 128;  // bytes of K per row and stage

// Shared memory of one block: [A stage 0, 1][B stage 0, 1][widened B (widened, quantized)]
// [A scales 0, 1][B scales 0, 1] (native E2M1). Every tile is swizzled [rows][64 x 2 bytes].
template <int kMTiles, Format F, bool kSilu, bool kNative>
struct Tiles {
  static constexpr int kRows = 16 * kMTiles;
  static constexpr int kWeightRows = kSilu ? 2 * kOutCols : kOutCols;
  // K elements per stage.
  static constexpr int kStep = !kNative ? 64 : F == Format::kFp8Block128 ? 128 : 256;
  static constexpr int kABytes = kRows * kStageBytes;
  static constexpr int kBf16Bytes = kWeightRows * kStageBytes;
  static constexpr int kBStageBytes = kNative || F == Format::kBf16 ? kBf16Bytes
                                      : F == Format::kFp8Block128   ? kWeightRows * kStep
                                                                    : kWeightRows * kStep / 2;
  static constexpr bool kWidens = !kNative && F != Format::kBf16;
  static constexpr int kScaleRowBytes = kStep / 16;  // native E2M1: group scales per stage
  static constexpr bool kStagedScales = kNative && F == Format::kNvfp4;
  static constexpr int kScaleBytes = kStagedScales ? (kRows + kWeightRows) * kScaleRowBytes : 0;
  static constexpr int kShared =
      2 * kABytes + 2 * kBStageBytes + (kWidens ? kBf16Bytes : 0) + 2 * kScaleBytes;
};

struct Params {
  const int32_t* row_pair = nullptr;
  const int32_t* tile_expert = nullptr;
  const int32_t* tile_count = nullptr;
  int64_t dense_rows = 0;  // > 0: no layout, expert 0, rows [0, dense_rows) in order
  int slots = 1;           // k
  const bf16* x = nullptr;
  int64_t x_stride = 0;
  // Native: x quantized (quantize_rows.h, rows tight: K bytes or K / 2 per row).
  const uint8_t* xq = nullptr;
  const float* x_scales = nullptr;          // fp8 [rows][K/128]; E2M1 [rows]
  const uint8_t* x_group_scales = nullptr;  // E2M1 [rows][K/16]
  bool gather = false;
  const void* w = nullptr;
  const float* block_scales = nullptr;
  const uint8_t* group_scales = nullptr;
  const float* row_scales = nullptr;
  int64_t rows = 0;      // N per expert
  int64_t out_cols = 0;  // output width
  int64_t half = 0;      // silu: the first up row
  int64_t k = 0;         // K
  bf16* y = nullptr;
  int64_t y_stride = 0;
  // [experts][rows]: each weight row's bias, added to its product before the activation.
  const bf16* bias = nullptr;
  float swiglu_limit = 0.0f;  // GatedActivation (moe_gemm.h)
  float swiglu_alpha = 1.702f;
};

// A fused gate/up product's activation (GatedActivation, moe_gemm.h).
__device__ __forceinline__ float gatedActivation(float gate, float up, const Params& p) {
  if (p.swiglu_limit > 0.0f) {
    // Comparisons, not fminf/fmaxf, so a NaN product stays NaN as on the CPU (std::min,
    // std::clamp) instead of becoming the limit.
    const float limit = p.swiglu_limit;
    gate = gate > limit ? limit : gate;
    up = up > limit ? limit : (up < -limit ? -limit : up);
    return (up + 1.0f) * (gate / (1.0f + __expf(-p.swiglu_alpha * gate)));
  }
  return gate / (1.0f + __expf(-gate)) * up;
}

// E2M1 code (sign bit 3) to float, exactly: 2^(e-1) (1 + m/2), e = 0: m/2.
__device__ __forceinline__ float e2m1ToFloat(uint32_t code) {
  const uint32_t e = (code >> 1) & 3u, m = code & 1u;
  const uint32_t magnitude = e != 0 ? ((e + 126u) << 23) | (m << 22) : (m != 0 ? 126u << 23 : 0u);
  return __uint_as_float(magnitude | ((code & 8u) << 28));
}

__device__ __forceinline__ float e4m3ToFloat(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);
  return __half2float(__half(h));
}

// Whether this compilation targets sm_120 or later (or is the host pass).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 1200
inline constexpr bool kSm120 = false;
#else
inline constexpr bool kSm120 = true;
#endif

// Which kernels each architecture builds: on sm_90 the e4m3 MMA is emulated and 64-row
// native tiles run out of registers, so there only 16-row ones exist (they check the
// arithmetic; sm_90 prefers the widened operands anyway).
template <int kMTiles, bool kNative>
inline constexpr bool kBuilt = !kNative || kMTiles == 1 || kSm120;

template <int kMTiles, Format F, bool kSilu, bool kNative>
__device__ __forceinline__ void moeGemmTile(const Params& p) {
  using T = Tiles<kMTiles, F, kSilu, kNative>;
  constexpr int kStep = T::kStep;
  constexpr bool kNativeFp4 = kNative && F == Format::kNvfp4;
  static_assert(!kNative || F != Format::kBf16, "bf16 has no native mode apart");
  const int tile = blockIdx.y;
  const bool dense = p.dense_rows > 0;
  if (dense ? int64_t{tile} * T::kRows >= p.dense_rows : tile >= *p.tile_count) return;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int64_t src_row[T::kRows];
  const int expert = dense ? 0 : p.tile_expert[tile];
  const int64_t row0 = int64_t{tile} * T::kRows;
  const int64_t col0 = int64_t{blockIdx.x} * kOutCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  unsigned char* a_stages = smem;
  unsigned char* b_stages = smem + 2 * T::kABytes;
  bf16* widened = reinterpret_cast<bf16*>(b_stages + 2 * T::kBStageBytes);
  uint8_t* scale_stages =
      b_stages + 2 * T::kBStageBytes + (T::kWidens ? T::kBf16Bytes : 0);  // [stage][A, B rows]
  const int64_t expert_row = int64_t{expert} * p.rows;

  for (int r = threadIdx.x; r < T::kRows; r += kThreads) {
    if (dense) {
      src_row[r] = row0 + r < p.dense_rows ? row0 + r : -1;
      continue;
    }
    const int32_t pair = p.row_pair[row0 + r];
    src_row[r] = pair < 0 ? -1 : (p.gather ? pair / p.slots : row0 + r);
  }
  __syncthreads();

  // The weight row behind tile row i, or -1 past the output width.
  auto weightRow = [&](int i) -> int64_t {
    const int64_t col = col0 + i % kOutCols;
    if (col >= p.out_cols) return -1;
    return kSilu && i >= kOutCols ? p.half + col : col;
  };

  // Bytes of one stored row of K elements (activations quantized as the weights).
  constexpr int kElementsPerByte = F == Format::kNvfp4 ? 2 : F == Format::kFp8Block128 ? 1 : 0;
  auto load = [&](int stage, int64_t k0) {
    bf16* a = reinterpret_cast<bf16*>(a_stages + stage * T::kABytes);
    for (int i = threadIdx.x; i < T::kRows * 8; i += kThreads) {
      const int r = i / 8, c = i % 8;
      const int64_t first = k0 + c * (kStep / 8);  // the chunk's first element
      const bool valid = src_row[r] >= 0 && first < p.k;
      const void* src;
      if constexpr (kNative) {
        src = valid ? p.xq + src_row[r] * (p.k / kElementsPerByte) + first / kElementsPerByte
                    : static_cast<const void*>(p.xq);
      } else {
        src = valid ? p.x + src_row[r] * p.x_stride + first : p.x;
      }
      cpAsync16(a + swizzled<64>(r, c), src, valid);
    }
    unsigned char* b = b_stages + stage * T::kBStageBytes;
    constexpr int kBytesPerRow = T::kBStageBytes / T::kWeightRows;
    constexpr int kChunks = kBytesPerRow / 16;
    constexpr int kElementsPerChunk = kStep / kChunks;
    const auto* base = static_cast<const unsigned char*>(p.w);
    const int64_t row_bytes = p.k * kBytesPerRow / kStep;  // of one stored row
    for (int i = threadIdx.x; i < T::kWeightRows * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const int64_t wr = weightRow(r);
      const bool valid = wr >= 0 && k0 + c * kElementsPerChunk < p.k;
      const unsigned char* src =
          valid ? base + (expert_row + wr) * row_bytes + k0 * kBytesPerRow / kStep + c * 16 : base;
      if constexpr (F == Format::kBf16 || kNative) {
        cpAsync16(reinterpret_cast<bf16*>(b) + swizzled<64>(r, c), src, valid);
      } else {
        cpAsync16(b + r * kBytesPerRow + c * 16, src, valid);
      }
    }
    if constexpr (T::kStagedScales) {
      // Group scales of the stage, 4 bytes (one MMA's K) at a time: A rows, then B rows.
      uint8_t* s = scale_stages + stage * T::kScaleBytes;
      constexpr int kWords = T::kScaleRowBytes / 4;
      const int64_t groups = p.k / 16, g0 = k0 / 16;
      for (int i = threadIdx.x; i < (T::kRows + T::kWeightRows) * kWords; i += kThreads) {
        const int r = i / kWords, w = i % kWords;
        const bool a_row = r < T::kRows;
        const int64_t source = a_row ? src_row[r] : weightRow(r - T::kRows);
        const bool valid = source >= 0 && g0 + 4 * w < groups;
        const uint8_t* src = a_row ? p.x_group_scales + source * groups
                                   : p.group_scales + (expert_row + source) * groups;
        cpAsync4(s + r * T::kScaleRowBytes + 4 * w, valid ? src + g0 + 4 * w : p.group_scales,
                 valid);
      }
    }
    cpAsyncCommit();
  };

  // The weight tile of `stage` as the MMA reads it, once its copies landed.
  auto ready = [&](int stage, int64_t k0) -> const bf16* {
    const unsigned char* raw = b_stages + stage * T::kBStageBytes;
    if constexpr (!T::kWidens) {
      return reinterpret_cast<const bf16*>(raw);
    } else if constexpr (F == Format::kFp8Block128) {
      widenFp8Tile<kStep, T::kWeightRows, kThreads>(widened, raw);  // scales come later
    } else {
      for (int i = threadIdx.x; i < T::kWeightRows * (kStep / 16); i += kThreads) {
        const int r = i / (kStep / 16), group = i % (kStep / 16);
        const int64_t wr = weightRow(r);
        float scale = 0.0f;
        if (wr >= 0 && k0 + group * 16 < p.k)
          scale = e4m3ToFloat(p.group_scales[(expert_row + wr) * (p.k / 16) + k0 / 16 + group]);
        const uint2 codes = *reinterpret_cast<const uint2*>(raw + r * (kStep / 2) + group * 8);
        const uint32_t words[2] = {codes.x, codes.y};
        uint32_t out[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t byte = (words[j / 4] >> (8 * (j % 4))) & 0xffu;
          out[j] = packBf16(e2m1ToFloat(byte & 15u) * scale, e2m1ToFloat(byte >> 4) * scale);
        }
        *reinterpret_cast<uint4*>(widened + swizzled<kStep>(r, 2 * group)) =
            make_uint4(out[0], out[1], out[2], out[3]);
        *reinterpret_cast<uint4*>(widened + swizzled<kStep>(r, 2 * group + 1)) =
            make_uint4(out[4], out[5], out[6], out[7]);
      }
    }
    __syncthreads();
    return widened;
  };

  constexpr int kProjections = kSilu ? 2 : 1;
  constexpr bool kBlockScaled = F == Format::kFp8Block128;
  // C fragments: [m-tile][gate, up][n8 tile of the warp's 16 columns][4].
  float acc[kMTiles][kProjections][2][4] = {};
  float part[kMTiles][kProjections][2][4] = {};  // fp8: the current 128-column block's sums
  auto target = [&](int mi, int proj, int j) -> float(&)[4] {
    if constexpr (kBlockScaled) return part[mi][proj][j];
    return acc[mi][proj][j];
  };

  const int64_t steps = (p.k + kStep - 1) / kStep;
  load(0, 0);
  for (int64_t s = 0; s < steps; ++s) {
    const int stage = static_cast<int>(s & 1);
    if (s + 1 < steps) {
      load(stage ^ 1, (s + 1) * kStep);
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    const bf16* b = ready(stage, s * kStep);
    const bf16* a = reinterpret_cast<const bf16*>(a_stages + stage * T::kABytes);
    const uint8_t* scales = scale_stages + stage * T::kScaleBytes;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // four MMAs of K per stage in every mode
      uint32_t af[kMTiles][4], sfa[kMTiles];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        ldmatrixX4(af[mi], a + swizzled<64>(mi * 16 + (lane & 15), 2 * kk + (lane >> 4)));
        if constexpr (kNativeFp4)
          sfa[mi] = *reinterpret_cast<const uint32_t*>(
              scales + (mi * 16 + g + 8 * (t & 1)) * T::kScaleRowBytes + 4 * kk);
      }
#pragma unroll
      for (int proj = 0; proj < kProjections; ++proj) {
        const int first = proj * kOutCols + warp * 16;
        uint32_t bf[4];
        ldmatrixX4(bf, b + swizzled<64>(first + (lane & 7) + ((lane >> 4) << 3),
                                        2 * kk + ((lane >> 3) & 1)));
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t sfb = 0;
          if constexpr (kNativeFp4)
            sfb = *reinterpret_cast<const uint32_t*>(
                scales + (T::kRows + first + 8 * j + g) * T::kScaleRowBytes + 4 * kk);
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi) {
            if constexpr (!kNative) {
              mmaBf16(target(mi, proj, j), af[mi], bf[2 * j], bf[2 * j + 1]);
            } else if constexpr (F == Format::kFp8Block128) {
              mmaE4m3(target(mi, proj, j), af[mi], bf[2 * j], bf[2 * j + 1]);
            } else {
              mmaNvfp4(target(mi, proj, j), af[mi], bf[2 * j], bf[2 * j + 1], sfa[mi], sfb);
            }
          }
        }
      }
    }
    if constexpr (kBlockScaled) {
      if ((s + 1) * kStep % kFp8Block == 0) {  // K % 128 == 0: every block ends on a step
        const int64_t block_cols = p.k / kFp8Block;
        const int64_t block_rows = (p.rows + kFp8Block - 1) / kFp8Block;
        const int64_t kb = s * kStep / kFp8Block;
        // The weight blocks' scales: columns 2t and 2t + 1 of an n8 tile share their block.
        float w_scale[kProjections][2];
#pragma unroll
        for (int proj = 0; proj < kProjections; ++proj) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int64_t wr = weightRow(proj * kOutCols + warp * 16 + j * 8 + 2 * t);
            w_scale[proj][j] =
                wr < 0 ? 0.0f
                       : p.block_scales[(expert * block_rows + wr / kFp8Block) * block_cols + kb];
          }
        }
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            // W8A8: the scale of the activation row (g or g + 8 of the m-tile) too.
            float x_scale = 1.0f;
            if constexpr (kNative) {
              const int64_t src = src_row[mi * 16 + g + 8 * h];
              x_scale = src < 0 ? 0.0f : p.x_scales[src * block_cols + kb];
            }
#pragma unroll
            for (int proj = 0; proj < kProjections; ++proj) {
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                const float scale = w_scale[proj][j] * x_scale;
#pragma unroll
                for (int c = 2 * h; c < 2 * h + 2; ++c) {
                  acc[mi][proj][j][c] += part[mi][proj][j][c] * scale;
                  part[mi][proj][j][c] = 0.0f;
                }
              }
            }
          }
        }
      }
    }
    __syncthreads();  // This stage (and the widened tile) may be overwritten now.
  }

  // nvfp4: the row scales of the two columns a lane holds in each n8 tile, per projection.
  float row_scale[kProjections][2][2];
#pragma unroll
  for (int proj = 0; proj < kProjections; ++proj) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t wr = weightRow(proj * kOutCols + warp * 16 + j * 8 + 2 * t);
      const bool scaled = F == Format::kNvfp4 && wr >= 0;
      row_scale[proj][j][0] = scaled ? p.row_scales[expert_row + wr] : 1.0f;
      row_scale[proj][j][1] = scaled ? p.row_scales[expert_row + wr + 1] : 1.0f;
    }
  }
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t col = col0 + warp * 16 + j * 8 + 2 * t;
      if (col >= p.out_cols) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mi * 16 + g + 8 * h;
        const int64_t row = row0 + r;
        if (dense && row >= p.dense_rows) continue;
        // W4A4: the activation row's own global scale.
        float x_scale = 1.0f;
        if constexpr (kNativeFp4) x_scale = src_row[r] >= 0 ? p.x_scales[src_row[r]] : 0.0f;
        float v0 = acc[mi][0][j][2 * h] * row_scale[0][j][0] * x_scale;
        float v1 = acc[mi][0][j][2 * h + 1] * row_scale[0][j][1] * x_scale;
        if (p.bias != nullptr) {
          v0 += __bfloat162float(p.bias[expert_row + col]);
          v1 += __bfloat162float(p.bias[expert_row + col + 1]);
        }
        if constexpr (kSilu) {
          float u0 = acc[mi][1][j][2 * h] * row_scale[kProjections - 1][j][0] * x_scale;
          float u1 = acc[mi][1][j][2 * h + 1] * row_scale[kProjections - 1][j][1] * x_scale;
          if (p.bias != nullptr) {
            u0 += __bfloat162float(p.bias[expert_row + p.half + col]);
            u1 += __bfloat162float(p.bias[expert_row + p.half + col + 1]);
          }
          v0 = gatedActivation(v0, u0, p);
          v1 = gatedActivation(v1, u1, p);
        }
        *reinterpret_cast<uint32_t*>(p.y + row * p.y_stride + col) = packBf16(v0, v1);
      }
    }
  }
}

template <int kMTiles, Format F, bool kSilu, bool kNative>
__global__ void __launch_bounds__(kThreads) moeGemmKernel(Params p) {
  if constexpr (kBuilt<kMTiles, kNative>) {
    moeGemmTile<kMTiles, F, kSilu, kNative>(p);
  } else {
    __trap();  // Never launched: the host refuses (nativeTilesBuilt).
  }
}

// Whether 64-row native tiles exist for a device of this compute capability.
inline bool nativeTilesBuilt(int tile_rows, int compute_major) {
  return tile_rows == 16 || compute_major >= 12;
}

template <int kMTiles, Format F, bool kSilu, bool kNative>
absl::Status allow() {
  return cudaStatus(cudaFuncSetAttribute(moeGemmKernel<kMTiles, F, kSilu, kNative>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Tiles<kMTiles, F, kSilu, kNative>::kShared),
                    "moe_gemm shared memory");
}

// Both tile heights, with and without the fused SiLU-and-mul.
template <Format F, bool kNative>
absl::Status allowAll() {
  for (absl::Status s : {allow<1, F, false, kNative>(), allow<1, F, true, kNative>(),
                         allow<4, F, false, kNative>(), allow<4, F, true, kNative>()}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

template <int kMTiles, Format F, bool kSilu, bool kNative>
void launch(const Params& p, int64_t tiles, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.out_cols + kOutCols - 1) / kOutCols),
                  static_cast<unsigned>(tiles));
  moeGemmKernel<kMTiles, F, kSilu, kNative>
      <<<grid, kThreads, Tiles<kMTiles, F, kSilu, kNative>::kShared, stream>>>(p);
}

// The kernel for 16- or 64-row tiles, with or without the fused SiLU-and-mul.
template <Format F, bool kNative>
void launchShape(const Params& p, int tile_rows, bool silu, int64_t tiles, cudaStream_t stream) {
  if (tile_rows == 16) {
    silu ? launch<1, F, true, kNative>(p, tiles, stream)
         : launch<1, F, false, kNative>(p, tiles, stream);
  } else {
    silu ? launch<4, F, true, kNative>(p, tiles, stream)
         : launch<4, F, false, kNative>(p, tiles, stream);
  }
}

// A fact about the current device (ask() >= 0), asked once per device and kept in `known`
// (value + 1; 0: not asked yet), so that a graph capture asks nothing; -1 without a device.
template <typename Ask>
int onceForDevice(std::array<std::atomic<int>, 64>& known, Ask ask) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return -1;
  int state = known[device].load(std::memory_order_relaxed);
  if (state == 0) {
    state = ask(device) + 1;
    known[device].store(state, std::memory_order_relaxed);
  }
  return state - 1;
}

// moe_gemm_fp4.cu (sm_120a): whether its kernels can run on the current device, their
// shared-memory limits, and their launch.
bool nativeFp4Available();
absl::Status allowNativeFp4();
void launchNativeFp4(const Params& p, int tile_rows, bool silu, int64_t tiles, cudaStream_t stream);

}  // namespace cleave::cuda::moe_gemm
