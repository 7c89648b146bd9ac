// AVX2 kernel over the row-interleaved layout (packed_layout.h). A 16-row group is taken as
// two halves of 8 rows, each 32-bit lane of a 256-bit vector one row: chunk c's bytes
// [64c + 32h, 64c + 32h + 32) are half h's. Per block, each 4-weight chunk is multiplied with
// the matching 4 bytes of x broadcast to every lane (VPMADDUBSW, u8 x s8 into s16 pairs), one
// broadcast for both halves, so a lane ends the block holding its row's integer dot product;
// scales and offsets are applied per lane, with no horizontal sums.
//   Q4_0 / Q4_1: codes 0..15 times |x| <= 127 give pairs of at most 3810, so a block's eight
//     products add in int16 (at most 30480) and widen once (VPMADDWD).
//   Q8_0: the codes are stored + 128; made signed again, they multiply as |w| x (x * sign w)
//     (pairs of at most 2 * 128 * 127) and widen every chunk.
//   MXFP4: the codes are looked up (VPSHUFB) as twice their value, -12..12, and multiply as
//     |w| x (x * sign w): pairs of at most 3048, a block's eight in int16 (at most 24384).
//   NVFP4: as MXFP4, but each half block (low nibbles, high nibbles) has its own scale, so
//     the halves sum apart.
// Tokens go in tiles so each block is unpacked once per tile; a token's sums run in the same
// order whatever its tile, so its output does not depend on the batch.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/packed_layout.h"

namespace cleave::cpu::kernels {
namespace {

using model::TensorType;

constexpr int kHalfRows = 8;
constexpr int kTokenTile = 4;  // Tokens sharing each unpacked block (16 registers).

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Tokens [t0, t0 + kCount) against the first kHalves halves of a group (8 rows each; both,
// or only the first when the group has no more than 8 rows): each broadcast of x feeds every
// half. The last half has `valid` rows (1..8); the rest are padding and are not stored.
template <TensorType kType, int kCount, int kHalves>
inline void tile(const uint8_t* group, int64_t blocks, const QuantizedActivations& x, int64_t t0,
                 float* y, int64_t ldy, int valid) {
  constexpr int64_t kGroupBlock = packed::groupBlockBytes(kType);
  constexpr int64_t kScales = packed::scaleBytes(kType);
  constexpr bool kFp4 = kType == TensorType::kMXFP4 || kType == TensorType::kNVFP4;
  constexpr bool kSplit = kType == TensorType::kNVFP4;  // Halves of a block summed apart.
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low_mask = _mm256_set1_epi8(0x0f);
  __m256 acc[kHalves][kCount];
  for (int h = 0; h < kHalves; ++h)
    for (int i = 0; i < kCount; ++i) acc[h][i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = group + b * kGroupBlock;
    const uint8_t* quants = block + kScales;
    __m256i dot[kHalves][kCount];
    [[maybe_unused]] __m256i dot_high[kHalves][kCount];
    if constexpr (kType == TensorType::kQ8_0) {
      for (int h = 0; h < kHalves; ++h)
        for (int i = 0; i < kCount; ++i) dot[h][i] = _mm256_setzero_si256();
      const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
      for (int c = 0; c < 8; ++c) {
        __m256i w[kHalves], magnitude[kHalves];
        for (int h = 0; h < kHalves; ++h) {
          w[h] = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * c + 32 * h)), bias);
          magnitude[h] = _mm256_abs_epi8(w[h]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < kCount; ++i) {
          const __m256i xb = broadcast4(x.rowQ(t0 + i) + 32 * b + 4 * c);
          for (int h = 0; h < kHalves; ++h) {
            const __m256i pairs = _mm256_maddubs_epi16(magnitude[h], _mm256_sign_epi8(xb, w[h]));
            dot[h][i] = _mm256_add_epi32(dot[h][i], _mm256_madd_epi16(pairs, ones));
          }
        }
      }
    } else {
      __m256i pairs[kHalves][kCount];
      [[maybe_unused]] __m256i pairs_high[kHalves][kCount];
      for (int h = 0; h < kHalves; ++h) {
        for (int i = 0; i < kCount; ++i) {
          pairs[h][i] = _mm256_setzero_si256();
          if constexpr (kSplit) pairs_high[h][i] = _mm256_setzero_si256();
        }
      }
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        __m256i low[kHalves], high[kHalves];
        for (int h = 0; h < kHalves; ++h) {
          const __m256i v =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * c + 32 * h));
          low[h] = _mm256_and_si256(v, low_mask);
          high[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_mask);
        }
        [[maybe_unused]] __m256i low_sign[kHalves], high_sign[kHalves];
        if constexpr (kFp4) {
          const __m256i lut = _mm256_broadcastsi128_si256(
              _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
          for (int h = 0; h < kHalves; ++h) {
            low_sign[h] = _mm256_shuffle_epi8(lut, low[h]);
            high_sign[h] = _mm256_shuffle_epi8(lut, high[h]);
            low[h] = _mm256_abs_epi8(low_sign[h]);
            high[h] = _mm256_abs_epi8(high_sign[h]);
          }
        }
#pragma GCC unroll 4
        for (int i = 0; i < kCount; ++i) {
          const int8_t* xq = x.rowQ(t0 + i) + 32 * b;
          const __m256i xl = broadcast4(xq + 4 * c), xh = broadcast4(xq + 16 + 4 * c);
          for (int h = 0; h < kHalves; ++h) {
            __m256i xlh = xl, xhh = xh;
            if constexpr (kFp4) {
              xlh = _mm256_sign_epi8(xl, low_sign[h]);
              xhh = _mm256_sign_epi8(xh, high_sign[h]);
            }
            if constexpr (kSplit) {
              pairs[h][i] = _mm256_add_epi16(pairs[h][i], _mm256_maddubs_epi16(low[h], xlh));
              pairs_high[h][i] =
                  _mm256_add_epi16(pairs_high[h][i], _mm256_maddubs_epi16(high[h], xhh));
            } else {
              pairs[h][i] = _mm256_add_epi16(pairs[h][i],
                                             _mm256_add_epi16(_mm256_maddubs_epi16(low[h], xlh),
                                                              _mm256_maddubs_epi16(high[h], xhh)));
            }
          }
        }
      }
      for (int h = 0; h < kHalves; ++h) {
        for (int i = 0; i < kCount; ++i) {
          dot[h][i] = _mm256_madd_epi16(pairs[h][i], ones);
          if constexpr (kSplit) dot_high[h][i] = _mm256_madd_epi16(pairs_high[h][i], ones);
        }
      }
    }
    // The scales are read here, after the products: held across them, GCC moved them through
    // general registers a half-word at a time.
    __m256 d[kHalves];
    [[maybe_unused]] __m256 m[kHalves], d_high[kHalves];
    for (int h = 0; h < kHalves; ++h) {
      if constexpr (kFp4) {
        d[h] = _mm256_loadu_ps(reinterpret_cast<const float*>(block) + 8 * h);
        if constexpr (kSplit)
          d_high[h] = _mm256_loadu_ps(reinterpret_cast<const float*>(block) + 16 + 8 * h);
      } else {
        d[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * h)));
      }
      if constexpr (kType == TensorType::kQ4_1) {
        m[h] =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 32 + 16 * h)));
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < kCount; ++i) {
      const int64_t t = t0 + i;
      const float dx = x.rowD(t)[b];
      const float xs = x.rowDsum(t)[b];
      for (int h = 0; h < kHalves; ++h) {
        acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[h][i]),
                                    _mm256_mul_ps(d[h], _mm256_set1_ps(dx)), acc[h][i]);
        if constexpr (kSplit)
          acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_high[h][i]),
                                      _mm256_mul_ps(d_high[h], _mm256_set1_ps(dx)), acc[h][i]);
        if constexpr (kType == TensorType::kQ4_0)
          acc[h][i] = _mm256_fmadd_ps(d[h], _mm256_set1_ps(-8.0f * xs), acc[h][i]);
        if constexpr (kType == TensorType::kQ4_1)
          acc[h][i] = _mm256_fmadd_ps(m[h], _mm256_set1_ps(xs), acc[h][i]);
      }
    }
  }
  for (int h = 0; h + 1 < kHalves; ++h)
    for (int i = 0; i < kCount; ++i) _mm256_storeu_ps(y + (t0 + i) * ldy + 8 * h, acc[h][i]);
  float* last = y + kHalfRows * (kHalves - 1);
  if (valid == kHalfRows) {
    for (int i = 0; i < kCount; ++i) _mm256_storeu_ps(last + (t0 + i) * ldy, acc[kHalves - 1][i]);
  } else {
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int i = 0; i < kCount; ++i) {
      _mm256_maskstore_ps(last + (t0 + i) * ldy, mask, acc[kHalves - 1][i]);
    }
  }
}

template <TensorType kType>
void groups(const PackedRows& a) {
  const CpuMatrix& w = *a.weight;
  const int64_t blocks = w.cols() / 32;
  const int64_t group_bytes = packed::groupBytes(kType, blocks);
  const int64_t tokens = a.x->rows;
  for (int64_t g = a.group_begin; g < a.group_end; ++g) {
    const uint8_t* group = w.packedData() + g * group_bytes;
    const int64_t rows = std::min<int64_t>(packed::kGroupRows, w.rows() - g * packed::kGroupRows);
    float* y = a.y + g * packed::kGroupRows;
    if (rows > kHalfRows) {
      const int valid = static_cast<int>(rows - kHalfRows);
      forEachTokenTile<kTokenTile>(tokens, [&]<int kCount>(int64_t t) {
        tile<kType, kCount, 2>(group, blocks, *a.x, t, y, a.ldy, valid);
      });
    } else {
      forEachTokenTile<kTokenTile>(tokens, [&]<int kCount>(int64_t t) {
        tile<kType, kCount, 1>(group, blocks, *a.x, t, y, a.ldy, static_cast<int>(rows));
      });
    }
  }
}

}  // namespace

void packedGroupsAvx2(const PackedRows& a) {
  switch (a.weight->kernelType()) {
    case TensorType::kQ4_0: return groups<TensorType::kQ4_0>(a);
    case TensorType::kQ4_1: return groups<TensorType::kQ4_1>(a);
    case TensorType::kQ8_0: return groups<TensorType::kQ8_0>(a);
    case TensorType::kMXFP4: return groups<TensorType::kMXFP4>(a);
    case TensorType::kNVFP4: return groups<TensorType::kNVFP4>(a);
    default: return;
  }
}

}  // namespace cleave::cpu::kernels
