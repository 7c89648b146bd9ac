// AVX-512 row kernels for float weights (F32, F16, BF16 widened to float in registers):
// 16 columns per step, in blocks of 6 rows x 4 tokens so each weight vector is loaded once
// per 4 tokens and each activation vector once per 6 rows. Quantized weights use the packed
// kernel (matmul_packed_avx512.cc).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matmul_kernels.h"

namespace cleave::cpu::kernels {
namespace {

using model::TensorType;

// 16 weights starting at element k of a float-format row, as floats.
template <TensorType kType>
inline __m512 loadWeights(const uint8_t* row, int64_t k, __mmask16 mask) {
  if constexpr (kType == TensorType::kF32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + k);
  } else if constexpr (kType == TensorType::kF16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, row + 2 * k));
  } else {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, row + 2 * k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
}

// y of rows [n, n + R) for tokens [t, t + T): R x T dot products sharing their loads (each
// weight vector feeds T tokens, each activation vector R rows), with R x T independent
// accumulators so the FMAs pipeline instead of waiting on one chain. Each accumulator sums
// its own (row, token) in the order a lone dot product would.
template <TensorType kType, int R, int T, bool kPrefetch>
inline void floatBlock(const FloatRows& a, int64_t n, int64_t t) {
  const WeightMatrix& w = *a.weight;
  const int64_t row_bytes = w.rowBytes();
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w.data + (n + r) * row_bytes;
  const float* xs[T];
  for (int j = 0; j < T; ++j) xs[j] = a.x + (t + j) * a.ldx;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < T; ++j) acc[r][j] = _mm512_setzero_ps();
  const auto tail = static_cast<__mmask16>((1u << (w.cols % 16)) - 1);
  // kPrefetch (a decode step's product, whose few tokens wait on the rows coming from
  // memory): the first block of tokens asks for the next block's rows (R rows on) as it goes.
  const int64_t ahead = kPrefetch && t == 0 ? R * row_bytes : 0;
  const int64_t step_bytes = row_bytes * 16 / w.cols;
  for (int64_t k = 0; k < w.cols; k += 16) {
    const __mmask16 mask = w.cols - k >= 16 ? __mmask16{0xffff} : tail;
    if (kPrefetch && ahead > 0) {
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + k / 16 * step_bytes),
                     _MM_HINT_T0);
    }
    __m512 x[T];
    for (int j = 0; j < T; ++j) x[j] = _mm512_maskz_loadu_ps(mask, xs[j] + k);
    for (int r = 0; r < R; ++r) {
      const __m512 weights = loadWeights<kType>(rows[r], k, mask);
      for (int j = 0; j < T; ++j) acc[r][j] = _mm512_fmadd_ps(weights, x[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < T; ++j) a.y[(t + j) * a.ldy + n + r] = _mm512_reduce_add_ps(acc[r][j]);
}

// Blocks of 6 rows x 4 tokens (24 accumulators, 29 of the 32 vector registers), then the
// tokens and rows left: a single token still runs six independent rows. A block's rows stay
// in L1 while the activations of all the tokens stream past from L2, whose bandwidth bounds
// a prefill here: six rows a load of them rather than four took a bf16 0.75B model's 64-token
// prefill and batch-16 decode step 6-8% faster (docs/engine.md). The sums are the same bits
// whatever the block, each accumulator summing its (row, token) in k order.
template <TensorType kType>
void floatRows(const FloatRows& a) {
  // Prefetching took a decode step at batch 1 of a bf16 0.75B model 11% less time
  // (docs/engine.md).
  forEachBlockPrefetching<6, 4>(a, [&]<int R, int T, bool kPrefetch>(int64_t n, int64_t t) {
    floatBlock<kType, R, T, kPrefetch>(a, n, t);
  });
}

}  // namespace

void floatRowsAvx512(const FloatRows& a) {
  switch (a.weight->type) {
    case TensorType::kF32: return floatRows<TensorType::kF32>(a);
    case TensorType::kF16: return floatRows<TensorType::kF16>(a);
    case TensorType::kBF16: return floatRows<TensorType::kBF16>(a);
    default: return;
  }
}

}  // namespace cleave::cpu::kernels
