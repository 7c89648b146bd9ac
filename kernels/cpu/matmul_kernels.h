// Per-ISA row kernels behind matmul(). Each computes y[t][n] for rows [row_begin, row_end)
// and every token. Internal to cleave_kernels_cpu.
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantized_activations.h"

namespace cleave::cpu::kernels {

struct QuantRows {
  const WeightMatrix* weight;
  const QuantizedActivations* x;
  float* y;
  int64_t ldy;
  int64_t row_begin;
  int64_t row_end;
};

struct PackedRows {
  const CpuMatrix* weight;  // packed()
  const QuantizedActivations* x;
  float* y;
  int64_t ldy;
  int64_t group_begin;  // Groups of packed::kGroupRows rows.
  int64_t group_end;
};

struct FloatRows {
  const WeightMatrix* weight;
  const float* x;
  int64_t ldx;
  int64_t tokens;
  float* y;
  int64_t ldy;
  int64_t row_begin;
  int64_t row_end;
  // BF16 weights on the bf16 dot kernel: x rounded to bf16 ([tokens][ldxb]).
  const uint16_t* xb = nullptr;
  int64_t ldxb = 0;
};

// Quantized weights (Q4_0, Q4_1, Q8_0) against quantized activations.
void quantRowsPortable(const QuantRows& args);

// Quantized weights in the row-interleaved layout (Q6_K on AVX-512 only; the portable path
// NVFP4 only, which it has in no other layout).
void packedGroupsAvx2(const PackedRows& args);
void packedGroupsAvx512(const PackedRows& args);
void packedNvfp4Portable(const PackedRows& args);

// Float weights (F32, F16, BF16) against float activations.
void floatRowsPortable(const FloatRows& args);
// Any dequantizable format: a row at a time to float, then dot products (matmul_dequant.cc).
void dequantizedRows(const FloatRows& args);
void floatRowsAvx2(const FloatRows& args);
void floatRowsAvx512(const FloatRows& args);
// BF16 weights against activations rounded to bf16 (args.xb), on AVX-512 BF16 dot products
// (matmul_bf16_avx512.cc; CpuMatrix::multipliesBf16).
void bf16RowsAvx512(const FloatRows& args);
// x [tokens][ldx] rounded to nearest even bf16, into out [tokens][ldo] (its first cols).
void toBf16Avx512(const float* x, int64_t tokens, int64_t cols, int64_t ldx, uint16_t* out,
                  int64_t ldo);

// The float kernels' walk over rows [row_begin, row_end) x tokens [0, tokens): blocks of
// kRows x kTokens, then the tokens and rows left, calling block.template operator()<R, T>(n, t)
// for R rows from n and T tokens from t. (Each ISA's file instantiates it with its own lambda,
// so no instantiation is shared between files compiled for different ISAs.)
template <int kRows, int kTokens, typename Block>
inline void forEachBlock(const FloatRows& a, Block&& block) {
  int64_t n = a.row_begin;
  for (; n + kRows <= a.row_end; n += kRows) {
    int64_t t = 0;
    for (; t + kTokens <= a.tokens; t += kTokens) block.template operator()<kRows, kTokens>(n, t);
    for (; t < a.tokens; ++t) block.template operator()<kRows, 1>(n, t);
  }
  for (; n < a.row_end; ++n) {
    int64_t t = 0;
    for (; t + kTokens <= a.tokens; t += kTokens) block.template operator()<1, kTokens>(n, t);
    for (; t < a.tokens; ++t) block.template operator()<1, 1>(n, t);
  }
}

// Products of this many tokens or fewer (a decode step's) wait on their weights coming from
// memory: the float kernels' first block of tokens prefetches the next block's rows. (A
// prefill's later token blocks find the rows in L1, and its blocks are better without the
// prefetch's address work.)
inline constexpr int64_t kPrefetchTokens = 16;

// forEachBlock calling block.template operator()<R, T, kPrefetch>(n, t), kPrefetch for a
// product of at most kPrefetchTokens tokens.
template <int kRows, int kTokens, typename Block>
inline void forEachBlockPrefetching(const FloatRows& a, Block&& block) {
  if (a.tokens <= kPrefetchTokens) {
    forEachBlock<kRows, kTokens>(a, [&]<int R, int T>(int64_t n, int64_t t) {
      block.template operator()<R, T, true>(n, t);
    });
  } else {
    forEachBlock<kRows, kTokens>(a, [&]<int R, int T>(int64_t n, int64_t t) {
      block.template operator()<R, T, false>(n, t);
    });
  }
}

// tile.template operator()<n>(t) for the n in [1, kMax] that `n` is; nothing for 0.
template <int kMax, typename Tile>
inline void tokenTail(int64_t n, int64_t t, Tile& tile) {
  if constexpr (kMax > 0) {
    if (n == kMax) return tile.template operator()<kMax>(t);
    tokenTail<kMax - 1>(n, t, tile);
  }
}

// The packed kernels' walk over tokens [0, tokens): tiles of kTile (each block unpacked
// once per tile), then one tile of the 1..kTile - 1 left, calling
// tile.template operator()<kCount>(t) for kCount tokens from t. (Instantiated per ISA file, as
// forEachBlock.)
template <int kTile, typename Tile>
inline void forEachTokenTile(int64_t tokens, Tile&& tile) {
  int64_t t = 0;
  for (; t + kTile <= tokens; t += kTile) tile.template operator()<kTile>(t);
  tokenTail<kTile - 1>(tokens - t, t, tile);
}

}  // namespace cleave::cpu::kernels
