// Moving tiles of head vectors into shared memory for the attention kernels.
//
// Paged KV cache, one layer's keys (or values), the CPU backend's layout in bf16:
//   [block][kv head][slot in the block][head_dim]
// Position p of a sequence lives in block block_table[p >> block_shift] at slot
// p & (block_size - 1); block sizes are powers of two.
//
// Shared-memory tiles are [rows][D] bf16 in 16-byte chunks, chunk c of row r stored at
// chunk position c ^ (r % 8): the eight rows an ldmatrix reads at one logical chunk then
// land in eight different bank groups. Rows of fewer than 8 chunks (head_dim 16, 32) XOR
// with r % chunks and keep a 2- or 4-way conflict; the XOR always stays inside the row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace cleave::cuda {

using bf16 = __nv_bfloat16;

// Positions per context part of a sequence attending to `len` positions split `parts` ways
// across blocks (flash-decoding): the parts its context reaches split it evenly, in whole
// stages of Tile positions and at least four stages when split, so a context shorter than a
// plan's longest still spreads over the blocks. Parts past the context get nothing.
template <int Tile>
__device__ __forceinline__ int contextPartSize(int len, int parts) {
  const int size = ((max(len, 1) + parts - 1) / parts + Tile - 1) / Tile * Tile;
  return parts == 1 ? size : max(size, 4 * Tile);
}

// Element offset of chunk `chunk` of row `row` in a swizzled [rows][D] tile.
template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  static_assert(D % 16 == 0, "rows are whole k-steps of 16 elements");
  constexpr int kChunks = D / 8;
  constexpr int kMask = (kChunks < 8 ? kChunks : 8) - 1;  // Rows shorter than 128 B: fewer.
  return (row * kChunks + (chunk ^ (row & kMask))) * 8;
}

// Starts copying positions [first, first + Rows) of kv head `kv_head` into `tile`; positions
// at or past `end` are zero-filled (their block-table entries are never read). All
// `Threads` threads of the block call it; the copies land after cpAsyncWait. The tile holds
// D columns of cache rows of S elements from column `col0` (a part of a wide head's values).
template <int D, int Rows, int Threads, int S = D>
__device__ __forceinline__ void loadPagedTile(bf16* tile, const bf16* cache,
                                              const int32_t* block_table, int block_shift,
                                              int kv_heads, int kv_head, int first, int end,
                                              int col0 = 0) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < Rows * kChunks; i += Threads) {
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const int pos = first + row;
    const bool valid = pos < end;
    const bf16* src = cache;
    if (valid) {
      const int64_t block = block_table[pos >> block_shift];
      const int64_t slot = pos & ((1 << block_shift) - 1);
      src = cache + (((block * kv_heads + kv_head) << block_shift) + slot) * S + col0 + chunk * 8;
    }
    cpAsync16(tile + swizzled<D>(row, chunk), src, valid);
  }
}

// FP8 (e4m3) caches, one byte per element: positions [first, first + Rows) of kv head
// `kv_head` are staged as raw [Rows][D] bytes (zero-filled past `end`), then widened into a
// swizzled bf16 tile (e4m3 values are exact in bf16); the tensor's scale is applied by the
// caller (folded into the softmax scale for K and the output for V). Columns as
// loadPagedTile's.
template <int D, int Rows, int Threads, int S = D>
__device__ __forceinline__ void loadPagedTileFp8(uint8_t* staging, const uint8_t* cache,
                                                 const int32_t* block_table, int block_shift,
                                                 int kv_heads, int kv_head, int first, int end,
                                                 int col0 = 0) {
  static_assert(D % 16 == 0);
  constexpr int kChunks = D / 16;
  for (int i = threadIdx.x; i < Rows * kChunks; i += Threads) {
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const int pos = first + row;
    const bool valid = pos < end;
    const uint8_t* src = cache;
    if (valid) {
      const int64_t block = block_table[pos >> block_shift];
      const int64_t slot = pos & ((1 << block_shift) - 1);
      src = cache + (((block * kv_heads + kv_head) << block_shift) + slot) * S + col0 + chunk * 16;
    }
    cpAsync16(staging + row * D + chunk * 16, src, valid);
  }
}

// Widens a staged [Rows][D] e4m3 tile into the swizzled bf16 `tile`.
template <int D, int Rows, int Threads>
__device__ __forceinline__ void widenFp8Tile(bf16* tile, const uint8_t* staging) {
  constexpr int kChunks = D / 16;
  for (int i = threadIdx.x; i < Rows * kChunks; i += Threads) {
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const uint4 raw = *reinterpret_cast<const uint4*>(staging + row * D + chunk * 16);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t out[8];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h));
        const __half2_raw halves = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&halves));
        out[2 * w + h] = packBf16(f.x, f.y);
      }
    }
    *reinterpret_cast<uint4*>(tile + swizzled<D>(row, 2 * chunk)) =
        make_uint4(out[0], out[1], out[2], out[3]);
    *reinterpret_cast<uint4*>(tile + swizzled<D>(row, 2 * chunk + 1)) =
        make_uint4(out[4], out[5], out[6], out[7]);
  }
}

// Two pipeline stages of K and V tiles of `Rows` positions each, for a bf16 or an e4m3
// cache, in kBytes of shared memory; K tiles hold whole heads of D values, V tiles the DV
// values from column v_col0 (a wide head's values split between blocks; DV = D otherwise):
//   bf16  [stage][K [Rows][D], V [Rows][DV]] swizzled bf16
//   e4m3  [stage][K, V] staged bytes, then one widened [K, V] bf16 tile
template <int D, int DV, int Rows, int Threads, bool kFp8>
struct KvStages {
  static constexpr int kStageElements = Rows * (D + DV);
  static constexpr int kBytes = 4 * kStageElements;  // bf16: 2 stages; e4m3: 2 + widened
  // Where stage 1's copies go (free until the first stage-1 load: a place for the query
  // tile before then).
  static constexpr int kSecondStageOffset = (kFp8 ? 1 : 2) * kStageElements;
  unsigned char* area;
  const void* k_cache;
  const void* v_cache;
  const int32_t* table;
  int block_shift, kv_heads, kv_head;
  int v_col0 = 0;

  // Starts copying positions [first, first + Rows) (zero past `end`) into `stage`.
  __device__ __forceinline__ void load(int stage, int first, int end) const {
    if constexpr (kFp8) {
      uint8_t* k = area + stage * kStageElements;
      loadPagedTileFp8<D, Rows, Threads>(k, static_cast<const uint8_t*>(k_cache), table,
                                         block_shift, kv_heads, kv_head, first, end);
      loadPagedTileFp8<DV, Rows, Threads, D>(k + Rows * D, static_cast<const uint8_t*>(v_cache),
                                             table, block_shift, kv_heads, kv_head, first, end,
                                             v_col0);
    } else {
      bf16* k = reinterpret_cast<bf16*>(area) + stage * kStageElements;
      loadPagedTile<D, Rows, Threads>(k, static_cast<const bf16*>(k_cache), table, block_shift,
                                      kv_heads, kv_head, first, end);
      loadPagedTile<DV, Rows, Threads, D>(k + Rows * D, static_cast<const bf16*>(v_cache), table,
                                          block_shift, kv_heads, kv_head, first, end, v_col0);
    }
  }
  // The bf16 K tile of `stage` (its V tile follows at + Rows * D). Every thread calls it
  // once the stage's copies landed (cpAsyncWait + __syncthreads); for e4m3 it widens, then
  // syncs.
  __device__ __forceinline__ const bf16* ready(int stage) const {
    if constexpr (kFp8) {
      bf16* widened = reinterpret_cast<bf16*>(area + 2 * kStageElements);
      const uint8_t* staged = area + stage * kStageElements;
      widenFp8Tile<D, Rows, Threads>(widened, staged);
      widenFp8Tile<DV, Rows, Threads>(widened + Rows * D, staged + Rows * D);
      __syncthreads();
      return widened;
    } else {
      return reinterpret_cast<const bf16*>(area) + stage * kStageElements;
    }
  }
};

// The V columns one block of a head accumulates: the whole head up to 128 values, a half
// of a head of 256 (two blocks share such a head, each reading all of K and its half of V,
// which keeps the accumulators and the stages within a block's registers and shared
// memory).
template <int D>
inline constexpr int kValueColumns = D > 128 ? 128 : D;
template <int D>
inline constexpr int kValueParts = D / kValueColumns<D>;

// Starts copying rows [0, Rows) of a row-major matrix (row r at src + r * stride) into
// `tile`; rows at or past `valid_rows` are zero-filled.
template <int D, int Rows, int Threads>
__device__ __forceinline__ void loadRowTile(bf16* tile, const bf16* src, int64_t stride,
                                            int valid_rows) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < Rows * kChunks; i += Threads) {
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const bool valid = row < valid_rows;
    cpAsync16(tile + swizzled<D>(row, chunk), valid ? src + row * stride + chunk * 8 : src, valid);
  }
}

inline constexpr float kLog2e = 1.4426950408889634f;

// How a raw score (q·k as the cache stores k) becomes a logit in exp2 units: times the
// softmax scale, or — with Gemma 2's soft cap — cap · tanh(scale · s / cap).
struct ScoreScale {
  float log2 = 0.0f;         // scale · k_scale · log2(e)
  float cap_log2 = 0.0f;     // cap · log2(e); 0: no cap
  float cap_inverse = 0.0f;  // scale · k_scale / cap
};
inline ScoreScale scoreScale(float scale, float k_scale, float cap) {
  return {.log2 = scale * k_scale * kLog2e,
          .cap_log2 = cap > 0 ? cap * kLog2e : 0.0f,
          .cap_inverse = cap > 0 ? scale * k_scale / cap : 0.0f};
}
__device__ __forceinline__ float scaledScore(float s, const ScoreScale& k) {
  return k.cap_log2 > 0 ? k.cap_log2 * tanhf(s * k.cap_inverse) : s * k.log2;
}

// value / sum of a softmax whose scores (log2 units) peak at `top`, with head `head`'s sink
// logit (natural units) joining the denominator when there are sinks (gpt-oss): the sink's
// weight and the scores' are both taken against the larger of the two peaks, so that
// neither overflows.
__device__ __forceinline__ float normalized(float value, float sum, float top, const float* sinks,
                                            int head) {
  if (sinks == nullptr) return value / sum;
  const float sink = sinks[head] * kLog2e;
  const float peak = fmaxf(top, sink);
  const float kept = exp2f(top - peak);
  return value * kept / (sum * kept + exp2f(sink - peak));
}

// Online softmax of one warp's 16 query rows (flash-attention): the running maximum (in
// log2 units) and sum of the two rows a lane holds (g and g + 8).
struct OnlineSoftmax {
  float max[2] = {-INFINITY, -INFINITY};
  float sum[2] = {0.0f, 0.0f};

  // Takes a tile of scaled scores s[N][4] (C fragments of N n-tiles, masked entries -inf),
  // turns them into probabilities relative to the new maximum, and returns per row the
  // factor by which earlier accumulators must be multiplied.
  template <int N>
  __device__ __forceinline__ void update(float (&s)[N][4], float (&rescale)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < N; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      const float new_max = fmaxf(max[r], quadMax(tile_max));
      // A row with every score masked so far keeps max -inf; exp2 against 0 keeps it 0.
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      rescale[r] = exp2f(max[r] - base);
      max[r] = new_max;
      float tile_sum = 0.0f;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        s[n][2 * r] = exp2f(s[n][2 * r] - base);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - base);
        tile_sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      sum[r] = sum[r] * rescale[r] + quadSum(tile_sum);
    }
  }
};

// acc[n] (C fragments of the output rows g, g + 8) *= rescale of their row.
template <int N>
__device__ __forceinline__ void rescaleRows(float (&acc)[N][4], const float (&rescale)[2]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    acc[n][0] *= rescale[0];
    acc[n][1] *= rescale[0];
    acc[n][2] *= rescale[1];
    acc[n][3] *= rescale[1];
  }
}

// acc[D / 8] += P · V for one k-step of 16 positions: `p` is the A fragment of the
// probabilities, `v_rows` the tile's row 0 of those 16 positions.
template <int D>
__device__ __forceinline__ void accumulatePV(float (&acc)[D / 8][4], const uint32_t (&p)[4],
                                             const bf16* v_tile, int first_row, int lane) {
  const int row = first_row + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
  for (int n2 = 0; n2 < D / 16; ++n2) {
    uint32_t b[4];
    ldmatrixX4Trans(b, v_tile + swizzled<D>(row, 2 * n2 + (lane >> 4)));
    mmaBf16(acc[2 * n2], p, b[0], b[1]);
    mmaBf16(acc[2 * n2 + 1], p, b[2], b[3]);
  }
}

// s[2] += Q · K^T for 16 key positions starting at tile row `first_row`, the warp's A
// fragments read from the swizzled Q tile (rows [q_row, +16)) step by step: for heads too
// wide to keep every k-step's fragments in registers.
template <int D>
__device__ __forceinline__ void accumulateQKFromTile(float (&s)[2][4], const bf16* q_tile,
                                                     int q_row, const bf16* k_tile, int first_row,
                                                     int lane) {
  const int row = first_row + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4], b[4];
    ldmatrixX4(a, q_tile + swizzled<D>(q_row + (lane & 15), 2 * kk + (lane >> 4)));
    ldmatrixX4(b, k_tile + swizzled<D>(row, 2 * kk + ((lane >> 3) & 1)));
    mmaBf16(s[0], a, b[0], b[1]);
    mmaBf16(s[1], a, b[2], b[3]);
  }
}

// s[2] += Q · K^T for 16 key positions starting at tile row `first_row`; q holds the
// warp's A fragments of all D / 16 k-steps.
template <int D>
__device__ __forceinline__ void accumulateQK(float (&s)[2][4], const uint32_t (&q)[D / 16][4],
                                             const bf16* k_tile, int first_row, int lane) {
  const int row = first_row + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t b[4];
    ldmatrixX4(b, k_tile + swizzled<D>(row, 2 * kk + ((lane >> 3) & 1)));
    mmaBf16(s[0], q[kk], b[0], b[1]);
    mmaBf16(s[1], q[kk], b[2], b[3]);
  }
}

// The warp's A fragments of 16 rows [first_row, +16) of a swizzled Q tile.
template <int D>
__device__ __forceinline__ void loadQFragments(uint32_t (&q)[D / 16][4], const bf16* q_tile,
                                               int first_row, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrixX4(q[kk], q_tile + swizzled<D>(first_row + (lane & 15), 2 * kk + (lane >> 4)));
}

// The probabilities of n-tiles 2j and 2j + 1 as the A fragment of a P · V k-step.
template <int N>
__device__ __forceinline__ void probabilityFragment(const float (&s)[N][4], int j,
                                                    uint32_t (&p)[4]) {
  p[0] = packBf16(s[2 * j][0], s[2 * j][1]);
  p[1] = packBf16(s[2 * j][2], s[2 * j][3]);
  p[2] = packBf16(s[2 * j + 1][0], s[2 * j + 1][1]);
  p[3] = packBf16(s[2 * j + 1][2], s[2 * j + 1][3]);
}

}  // namespace cleave::cuda
