// AVX2 (+FMA, F16C) row kernels for float weights (F32, F16, BF16); quantized weights run on
// the packed kernel (matmul_packed_avx2.cc).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/simd_reduce.h"

namespace cleave::cpu::kernels {
namespace {

// 8 weights starting at element k of a float-format row, as floats.
template <model::TensorType kType>
inline __m256 loadWeights8(const uint8_t* row, int64_t k) {
  if constexpr (kType == model::TensorType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (kType == model::TensorType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
  } else {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
}

// y of rows [n, n + R) for tokens [t, t + T): R x T dot products sharing their loads (each
// weight block feeds T tokens, each activation block R rows), with R x T independent
// accumulators so the FMAs pipeline instead of waiting on one chain. Each accumulator sums
// its own (row, token) in the same order as a lone dot product would.
template <model::TensorType kType, int R, int T, bool kPrefetch>
inline void floatBlock(const FloatRows& a, int64_t n, int64_t t) {
  const WeightMatrix& w = *a.weight;
  const int64_t row_bytes = w.rowBytes();
  const int64_t whole = w.cols / 8 * 8;
  // kPrefetch (a decode step's product): the first block of tokens asks for the next block's
  // rows (R rows on) as it goes, as the AVX-512 kernel does.
  const int64_t ahead = kPrefetch && t == 0 ? R * row_bytes : 0;
  const int64_t step_bytes = row_bytes * 8 / w.cols;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w.data + (n + r) * row_bytes;
  const float* xs[T];
  for (int j = 0; j < T; ++j) xs[j] = a.x + (t + j) * a.ldx;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < T; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < whole; k += 8) {
    if (kPrefetch && ahead > 0) {
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + k / 8 * step_bytes),
                     _MM_HINT_T0);
    }
    __m256 x[T];
    for (int j = 0; j < T; ++j) x[j] = _mm256_loadu_ps(xs[j] + k);
    for (int r = 0; r < R; ++r) {
      const __m256 weights = loadWeights8<kType>(rows[r], k);
      for (int j = 0; j < T; ++j) acc[r][j] = _mm256_fmadd_ps(weights, x[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float tail[8] = {};
    if (whole < w.cols) {
      // The last cols % 8 weights, copied into a zeroed block and widened like the body.
      alignas(32) uint8_t padded[32] = {};
      const int64_t element = row_bytes / w.cols;
      std::memcpy(padded, rows[r] + whole * element, (w.cols - whole) * element);
      _mm256_store_ps(tail, loadWeights8<kType>(padded, 0));
    }
    for (int j = 0; j < T; ++j) {
      float sum = simd::sum8(acc[r][j]);
      for (int64_t k = whole; k < w.cols; ++k) sum += tail[k - whole] * xs[j][k];
      a.y[(t + j) * a.ldy + n + r] = sum;
    }
  }
}

// Blocks of 4 rows x 2 tokens (11 of the 16 vector registers), then the rows and tokens left.
template <model::TensorType kType>
void floatRowsAvx2Typed(const FloatRows& a) {
  forEachBlockPrefetching<4, 2>(a, [&]<int R, int T, bool kPrefetch>(int64_t n, int64_t t) {
    floatBlock<kType, R, T, kPrefetch>(a, n, t);
  });
}

}  // namespace

void floatRowsAvx2(const FloatRows& a) {
  switch (a.weight->type) {
    case model::TensorType::kF32: return floatRowsAvx2Typed<model::TensorType::kF32>(a);
    case model::TensorType::kF16: return floatRowsAvx2Typed<model::TensorType::kF16>(a);
    case model::TensorType::kBF16: return floatRowsAvx2Typed<model::TensorType::kBF16>(a);
    default: return;
  }
}

}  // namespace cleave::cpu::kernels
