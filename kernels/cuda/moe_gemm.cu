#include "kernels/cuda/moe_gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <string>

#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/paged_tile.cuh"

namespace cleave::cuda {
namespace {

using Format = ExpertWeightFormat;

constexpr int kThreads = 128;  // 4 warps
constexpr int kStep = 64;      // K elements per pipeline stage
constexpr int kOutCols = 64;   // output columns per block, 16 per warp
constexpr int kFp8Block = 128;

// Shared memory of one block: [A stage 0, 1][B stage 0, 1][widened B (quantized only)].
// A stages are swizzled bf16 [rows][kStep]; B stages hold the weight tile as stored (bf16
// swizzled, or raw e4m3 / E2M1 bytes), widened into one swizzled bf16 tile before use.
template <int kMTiles, Format F, bool kSilu>
struct Tiles {
  static constexpr int kRows = 16 * kMTiles;
  static constexpr int kWeightRows = kSilu ? 2 * kOutCols : kOutCols;
  static constexpr int kABytes = kRows * kStep * 2;
  static constexpr int kBf16Bytes = kWeightRows * kStep * 2;
  static constexpr int kStageBytes = F == Format::kBf16          ? kBf16Bytes
                                     : F == Format::kFp8Block128 ? kWeightRows * kStep
                                                                 : kWeightRows * kStep / 2;
  static constexpr int kShared =
      2 * kABytes + 2 * kStageBytes + (F == Format::kBf16 ? 0 : kBf16Bytes);
};

struct Params {
  const int32_t* row_pair = nullptr;
  const int32_t* tile_expert = nullptr;
  const int32_t* tile_count = nullptr;
  int64_t dense_rows = 0;  // > 0: no layout, expert 0, rows [0, dense_rows) in order
  int slots = 1;           // k
  const bf16* x = nullptr;
  int64_t x_stride = 0;
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
  const bf16* bias = nullptr;  // dense, not silu: [out_cols], added to each row
};

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

template <int kMTiles, Format F, bool kSilu>
__global__ void __launch_bounds__(kThreads) moeGemmKernel(Params p) {
  using T = Tiles<kMTiles, F, kSilu>;
  const int tile = blockIdx.y;
  const bool dense = p.dense_rows > 0;
  if (dense ? int64_t{tile} * T::kRows >= p.dense_rows : tile >= *p.tile_count) return;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int64_t src_row[T::kRows];
  const int expert = dense ? 0 : p.tile_expert[tile];
  const int64_t row0 = int64_t{tile} * T::kRows;
  const int64_t col0 = int64_t{blockIdx.x} * kOutCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  bf16* a_stages = reinterpret_cast<bf16*>(smem);
  unsigned char* b_stages = smem + 2 * T::kABytes;
  bf16* widened = reinterpret_cast<bf16*>(b_stages + 2 * T::kStageBytes);
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

  auto load = [&](int stage, int64_t k0) {
    bf16* a = a_stages + stage * T::kRows * kStep;
    for (int i = threadIdx.x; i < T::kRows * 8; i += kThreads) {
      const int r = i / 8, c = i % 8;
      const bool valid = src_row[r] >= 0 && k0 + c * 8 < p.k;
      const bf16* src = valid ? p.x + src_row[r] * p.x_stride + k0 + c * 8 : p.x;
      cpAsync16(a + swizzled<kStep>(r, c), src, valid);
    }
    unsigned char* b = b_stages + stage * T::kStageBytes;
    constexpr int kBytesPerRow = T::kStageBytes / T::kWeightRows;
    constexpr int kChunks = kBytesPerRow / 16;
    constexpr int kElementsPerChunk = kStep / kChunks;
    for (int i = threadIdx.x; i < T::kWeightRows * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const int64_t wr = weightRow(r);
      const bool valid = wr >= 0 && k0 + c * kElementsPerChunk < p.k;
      const auto* base = static_cast<const unsigned char*>(p.w);
      // Bytes of one stored row, and where this chunk starts in it.
      const int64_t row_bytes = p.k * kBytesPerRow / kStep;
      const unsigned char* src =
          valid ? base + (expert_row + wr) * row_bytes + k0 * kBytesPerRow / kStep + c * 16 : base;
      if constexpr (F == Format::kBf16) {
        cpAsync16(reinterpret_cast<bf16*>(b) + swizzled<kStep>(r, c), src, valid);
      } else {
        cpAsync16(b + r * kBytesPerRow + c * 16, src, valid);
      }
    }
    cpAsyncCommit();
  };

  // The bf16 weight tile of `stage`, once its copies landed.
  auto ready = [&](int stage, int64_t k0) -> const bf16* {
    const unsigned char* raw = b_stages + stage * T::kStageBytes;
    if constexpr (F == Format::kBf16) {
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
  // C fragments: [m-tile][gate, up][n8 tile of the warp's 16 columns][4].
  float acc[kMTiles][kProjections][2][4] = {};
  float part[kMTiles][kProjections][2][4] = {};  // fp8: the current 128-column block's sums
  auto target = [&](int mi, int proj, int j) -> float(&)[4] {
    if constexpr (F == Format::kFp8Block128) return part[mi][proj][j];
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
    const bf16* a = a_stages + stage * T::kRows * kStep;
#pragma unroll
    for (int kk = 0; kk < kStep / 16; ++kk) {
      uint32_t af[kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
        ldmatrixX4(af[mi], a + swizzled<kStep>(mi * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
      for (int proj = 0; proj < kProjections; ++proj) {
        const int first = proj * kOutCols + warp * 16;
        uint32_t bf[4];
        ldmatrixX4(bf, b + swizzled<kStep>(first + (lane & 7) + ((lane >> 4) << 3),
                                           2 * kk + ((lane >> 3) & 1)));
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          mmaBf16(target(mi, proj, 0), af[mi], bf[0], bf[1]);
          mmaBf16(target(mi, proj, 1), af[mi], bf[2], bf[3]);
        }
      }
    }
    if constexpr (F == Format::kFp8Block128) {
      if ((s + 1) * kStep % kFp8Block == 0) {  // K % 128 == 0: every block ends on a step
        const int64_t block_cols = p.k / kFp8Block;
        const int64_t block_rows = (p.rows + kFp8Block - 1) / kFp8Block;
        const int64_t kb = s * kStep / kFp8Block;
#pragma unroll
        for (int proj = 0; proj < kProjections; ++proj) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            // Columns 2t and 2t + 1 of the n8 tile share their 128-row block.
            const int64_t wr = weightRow(proj * kOutCols + warp * 16 + j * 8 + 2 * (lane % 4));
            const float scale =
                wr < 0 ? 0.0f
                       : p.block_scales[(expert * block_rows + wr / kFp8Block) * block_cols + kb];
#pragma unroll
            for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                acc[mi][proj][j][c] += part[mi][proj][j][c] * scale;
                part[mi][proj][j][c] = 0.0f;
              }
            }
          }
        }
      }
    }
    __syncthreads();  // This stage (and the widened tile) may be overwritten now.
  }

  const int g = lane / 4, t = lane % 4;
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
        float v0 = acc[mi][0][j][2 * h] * row_scale[0][j][0];
        float v1 = acc[mi][0][j][2 * h + 1] * row_scale[0][j][1];
        if constexpr (kSilu) {
          const float u0 = acc[mi][1][j][2 * h] * row_scale[kProjections - 1][j][0];
          const float u1 = acc[mi][1][j][2 * h + 1] * row_scale[kProjections - 1][j][1];
          v0 = v0 / (1.0f + __expf(-v0)) * u0;
          v1 = v1 / (1.0f + __expf(-v1)) * u1;
        }
        const int64_t row = row0 + mi * 16 + g + 8 * h;
        if (dense && row >= p.dense_rows) continue;
        if (p.bias != nullptr) {
          v0 += __bfloat162float(p.bias[col]);
          v1 += __bfloat162float(p.bias[col + 1]);
        }
        *reinterpret_cast<uint32_t*>(p.y + row * p.y_stride + col) = packBf16(v0, v1);
      }
    }
  }
}

template <int kMTiles, Format F, bool kSilu>
absl::Status allow() {
  return cudaStatus(cudaFuncSetAttribute(moeGemmKernel<kMTiles, F, kSilu>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Tiles<kMTiles, F, kSilu>::kShared),
                    "moe_gemm shared memory");
}

template <int kMTiles, Format F>
absl::Status allowBoth() {
  if (absl::Status s = allow<kMTiles, F, false>(); !s.ok()) return s;
  return allow<kMTiles, F, true>();
}

template <int kMTiles, Format F, bool kSilu>
void launch(const Params& p, int64_t tiles, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.out_cols + kOutCols - 1) / kOutCols),
                  static_cast<unsigned>(tiles));
  moeGemmKernel<kMTiles, F, kSilu>
      <<<grid, kThreads, Tiles<kMTiles, F, kSilu>::kShared, stream>>>(p);
}

template <int kMTiles, Format F>
void launchFormat(const Params& p, bool silu, int64_t tiles, cudaStream_t stream) {
  if (silu) {
    launch<kMTiles, F, true>(p, tiles, stream);
  } else {
    launch<kMTiles, F, false>(p, tiles, stream);
  }
}

template <int kMTiles>
void launchTiles(const Params& p, Format format, bool silu, int64_t tiles, cudaStream_t stream) {
  switch (format) {
    case Format::kBf16: launchFormat<kMTiles, Format::kBf16>(p, silu, tiles, stream); break;
    case Format::kFp8Block128:
      launchFormat<kMTiles, Format::kFp8Block128>(p, silu, tiles, stream);
      break;
    case Format::kNvfp4: launchFormat<kMTiles, Format::kNvfp4>(p, silu, tiles, stream); break;
  }
}

}  // namespace

const char* expertWeightFormatName(ExpertWeightFormat format) {
  switch (format) {
    case Format::kBf16: return "bf16";
    case Format::kFp8Block128: return "fp8 (128x128 blocks)";
    case Format::kNvfp4: return "nvfp4";
  }
  return "unknown";
}

absl::Status prepareMoeGemm() {
  for (absl::Status s : {allowBoth<1, Format::kBf16>(), allowBoth<1, Format::kFp8Block128>(),
                         allowBoth<1, Format::kNvfp4>(), allowBoth<4, Format::kBf16>(),
                         allowBoth<4, Format::kFp8Block128>(), allowBoth<4, Format::kNvfp4>()}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

// Checks the weights and strides every product needs; the output width on success.
absl::StatusOr<int64_t> checkProduct(const ExpertWeights& w, const void* x, int64_t x_stride,
                                     bool silu_mul, const void* y, int64_t y_stride,
                                     const char* op) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(std::string(op) + " (" + expertWeightFormatName(w.format) +
                                      "): " + what);
  };
  if (x == nullptr || y == nullptr || w.data == nullptr)
    return bad("x, y and weights are required");
  const int64_t align = w.format == Format::kFp8Block128 ? kFp8Block : 32;
  if (w.cols <= 0 || w.cols % align != 0)
    return bad("K = " + std::to_string(w.cols) + " must be a positive multiple of " +
               std::to_string(align));
  if (w.rows <= 0 || (silu_mul && w.rows % 2 != 0))
    return bad("a fused gate/up weight needs an even number of rows");
  const int64_t out_cols = silu_mul ? w.rows / 2 : w.rows;
  if (out_cols % 2 != 0) return bad("the output width must be even");
  if (x_stride % 8 != 0 || x_stride < w.cols) return bad("x_stride must be >= K and % 8 == 0");
  if (y_stride % 2 != 0 || y_stride < out_cols)
    return bad("y_stride must be >= the output width and even");
  if (w.format == Format::kFp8Block128 && w.block_scales == nullptr) return bad("no block scales");
  if (w.format == Format::kNvfp4 && (w.group_scales == nullptr || w.row_scales == nullptr))
    return bad("no group or row scales");
  return out_cols;
}

Params params(const ExpertWeights& w, const void* x, int64_t x_stride, int64_t out_cols, void* y,
              int64_t y_stride) {
  Params p;
  p.x = static_cast<const bf16*>(x);
  p.x_stride = x_stride;
  p.w = w.data;
  p.block_scales = w.block_scales;
  p.group_scales = w.group_scales;
  p.row_scales = w.row_scales;
  p.rows = w.rows;
  p.out_cols = out_cols;
  p.half = out_cols;
  p.k = w.cols;
  p.y = static_cast<bf16*>(y);
  p.y_stride = y_stride;
  return p;
}

void launchRows(const Params& p, int tile_rows, Format format, bool silu, int64_t tiles,
                cudaStream_t stream) {
  if (tile_rows == 16) {
    launchTiles<1>(p, format, silu, tiles, stream);
  } else {
    launchTiles<4>(p, format, silu, tiles, stream);
  }
}

}  // namespace

absl::Status runMoeGemm(const MoeGemmArgs& a, cudaStream_t stream) {
  if (a.plan == nullptr) return absl::InvalidArgumentError("moe_gemm: no layout plan");
  CLEAVE_ASSIGN_OR_RETURN(
      const int64_t out_cols,
      checkProduct(a.weights, a.x, a.x_stride, a.silu_mul, a.y, a.y_stride, "moe_gemm"));
  if (a.weights.experts != a.plan->experts)
    return absl::InvalidArgumentError("moe_gemm: the weights' experts differ from the layout's");
  if (a.plan->max_tiles > 65535) return absl::InvalidArgumentError("moe_gemm: over 65535 tiles");
  Params p = params(a.weights, a.x, a.x_stride, out_cols, a.y, a.y_stride);
  p.row_pair = a.layout.row_pair;
  p.tile_expert = a.layout.tile_expert;
  p.tile_count = a.layout.tile_count;
  p.slots = a.plan->k;
  p.gather = a.gather;
  launchRows(p, a.plan->tile_rows, a.weights.format, a.silu_mul, a.plan->max_tiles, stream);
  return launchStatus("moe_gemm");
}

absl::Status runSkinnyGemm(const SkinnyGemmArgs& a, cudaStream_t stream) {
  CLEAVE_ASSIGN_OR_RETURN(
      const int64_t out_cols,
      checkProduct(a.weights, a.x, a.x_stride, a.silu_mul, a.y, a.y_stride, "skinny_gemm"));
  if (a.weights.experts != 1)
    return absl::InvalidArgumentError("skinny_gemm: the weights must be one matrix");
  if (a.rows <= 0) return absl::OkStatus();
  const int tile_rows = a.rows <= 16 ? 16 : 64;
  const int64_t tiles = (a.rows + tile_rows - 1) / tile_rows;
  if (tiles > 65535) return absl::InvalidArgumentError("skinny_gemm: over 65535 row tiles");
  if (a.bias != nullptr && a.silu_mul)
    return absl::InvalidArgumentError("skinny_gemm: a bias with the fused SiLU-and-mul");
  Params p = params(a.weights, a.x, a.x_stride, out_cols, a.y, a.y_stride);
  p.dense_rows = a.rows;
  p.bias = static_cast<const bf16*>(a.bias);
  launchRows(p, tile_rows, a.weights.format, a.silu_mul, tiles, stream);
  return launchStatus("skinny_gemm");
}

}  // namespace cleave::cuda
