// AVX-512 VNNI kernel over the row-interleaved layout (packed_layout.h): each 512-bit lane
// is one of 16 output rows. Per block, the 8 four-element groups of weights are multiplied
// with the matching 4 bytes of x broadcast to every lane (VPDPBUSD), so a lane ends the
// block holding its row's integer dot product; scales and offsets are applied per lane.
// Tokens go in tiles (forEachTokenTile) so each block is widened once per tile. Q6_K's 6-bit values
// are put together from their low nibbles and high bit pairs, and its halves summed apart.
// MXFP4's codes are looked up (VPSHUFB) as twice their value + 12, 0..24 unsigned, the 12
// taken back off with each token's block sum as Q4_0 takes off its 8; NVFP4's the same way,
// its halves summed apart as Q6_K's are.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/packed_layout.h"

namespace cleave::cpu::kernels {
namespace {

using model::TensorType;

// Tokens sharing each unpacked block: 8 accumulators next to the block's 8 weight vectors.
constexpr int kTokenTile = 8;

// E2M1 codes 0..15 to twice their value + 12 (0..24), for VPSHUFB.
inline __m512i twiceE2M1Plus12() {
  return _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <TensorType kType, int kCount>
inline void groupTile(const uint8_t* group, int64_t blocks, const QuantizedActivations& x,
                      int64_t t0, float* y, int64_t ldy, __mmask16 rows_mask) {
  constexpr int64_t kGroupBlock = packed::groupBlockBytes(kType);
  constexpr int64_t kScales = packed::scaleBytes(kType);
  __m512 acc[kCount];
  for (int i = 0; i < kCount; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i low_mask = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = group + b * kGroupBlock;
    __m512 d;
    if constexpr (kType == TensorType::kMXFP4) {
      d = _mm512_loadu_ps(block);
    } else {
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
    }
    __m512 m = _mm512_setzero_ps();
    if constexpr (kType == TensorType::kQ4_1) {
      m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32)));
    }
    const uint8_t* quants = block + kScales;
    __m512i w[8];
    if constexpr (kType == TensorType::kQ8_0) {
      for (int c = 0; c < 8; ++c) w[c] = _mm512_loadu_si512(quants + 64 * c);
    } else {
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(quants + 64 * c);
        w[c] = _mm512_and_si512(v, low_mask);
        w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low_mask);
      }
      if constexpr (kType == TensorType::kMXFP4) {
        const __m512i lut = twiceE2M1Plus12();
        for (int c = 0; c < 8; ++c) w[c] = _mm512_shuffle_epi8(lut, w[c]);
      }
    }
    // The unsigned storage's offset times d (exact: a power of two), so each token's offset
    // term is one FMA with its dsum broadcast from memory: d * (-8 xs) = -(8d * xs), bit for bit.
    [[maybe_unused]] const __m512 offset_d =
        _mm512_mul_ps(d, _mm512_set1_ps(kType == TensorType::kQ8_0    ? 128.0f
                                        : kType == TensorType::kMXFP4 ? 12.0f
                                                                      : 8.0f));
    // Unrolled, so the accumulators stay in registers (rolled, they go through the stack).
#pragma GCC unroll 8
    for (int i = 0; i < kCount; ++i) {
      const int64_t t = t0 + i;
      const int8_t* xq = x.rowQ(t) + 32 * b;
      __m512i dot = _mm512_setzero_si512();
      for (int c = 0; c < 8; ++c) dot = _mm512_dpbusd_epi32(dot, w[c], broadcast4(xq + 4 * c));
      const __m512 xs = _mm512_set1_ps(x.rowDsum(t)[b]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                               _mm512_mul_ps(d, _mm512_set1_ps(x.rowD(t)[b])), acc[i]);
      if constexpr (kType == TensorType::kQ4_0 || kType == TensorType::kQ8_0 ||
                    kType == TensorType::kMXFP4)
        acc[i] = _mm512_fnmadd_ps(offset_d, xs, acc[i]);
      if constexpr (kType == TensorType::kQ4_1) acc[i] = _mm512_fmadd_ps(m, xs, acc[i]);
    }
  }
  for (int i = 0; i < kCount; ++i) _mm512_mask_storeu_ps(y + (t0 + i) * ldy, rows_mask, acc[i]);
}

// Tokens [t0, t0 + kCount) times block b of a group whose two halves (its first and second
// 16 elements) have scales of their own, added to acc: w[0..3] are the first half's weights
// and w[4..7] the second's, stored + kOffset, which comes back off as kOffset times each
// half's sum of x. Each half's products sum apart.
template <int kCount, int kOffset>
inline void addHalves(const __m512i (&w)[8], __m512 d_first, __m512 d_second,
                      const QuantizedActivations& x, int64_t t0, int64_t b, __m512 (&acc)[kCount]) {
#pragma GCC unroll 8
  for (int i = 0; i < kCount; ++i) {
    const int64_t t = t0 + i;
    const int8_t* xq = x.rowQ(t) + 32 * b;
    __m512i first = _mm512_setzero_si512(), second = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      first = _mm512_dpbusd_epi32(first, w[c], broadcast4(xq + 4 * c));
      second = _mm512_dpbusd_epi32(second, w[c + 4], broadcast4(xq + 16 + 4 * c));
    }
    const int32_t first_sum = x.rowHalfSum(t)[b];
    const int32_t second_sum = x.rowSum(t)[b] - first_sum;
    first = _mm512_sub_epi32(first, _mm512_set1_epi32(kOffset * first_sum));
    second = _mm512_sub_epi32(second, _mm512_set1_epi32(kOffset * second_sum));
    const __m512 dx = _mm512_set1_ps(x.rowD(t)[b]);
    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(first), _mm512_mul_ps(d_first, dx), acc[i]);
    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(second), _mm512_mul_ps(d_second, dx), acc[i]);
  }
}

// NVFP4: MXFP4's codes, with a scale per half block (fp32, packed_layout.h).
template <int kCount>
inline void nvfp4Tile(const uint8_t* group, int64_t blocks, const QuantizedActivations& x,
                      int64_t t0, float* y, int64_t ldy, __mmask16 rows_mask) {
  constexpr int64_t kGroupBlock = packed::groupBlockBytes(TensorType::kNVFP4);
  __m512 acc[kCount];
  for (int i = 0; i < kCount; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i low_mask = _mm512_set1_epi8(0x0f);
  const __m512i lut = twiceE2M1Plus12();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = group + b * kGroupBlock;
    const float* d = reinterpret_cast<const float*>(block);
    const uint8_t* quants = block + packed::scaleBytes(TensorType::kNVFP4);
    __m512i w[8];
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(quants + 64 * c);
      w[c] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, low_mask));
      w[c + 4] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), low_mask));
    }
    addHalves<kCount, 12>(w, _mm512_loadu_ps(d), _mm512_loadu_ps(d + 16), x, t0, b, acc);
  }
  for (int i = 0; i < kCount; ++i) _mm512_mask_storeu_ps(y + (t0 + i) * ldy, rows_mask, acc[i]);
}

// Q6_K: each block's two halves have their own scale (the super-block's d times the
// half's int8 scale); values are stored + 32.
template <int kCount>
inline void q6Tile(const uint8_t* group, int64_t blocks, const QuantizedActivations& x, int64_t t0,
                   float* y, int64_t ldy, __mmask16 rows_mask) {
  constexpr int64_t kGroupBlock = packed::groupBlockBytes(TensorType::kQ6_K);
  const float* supers = reinterpret_cast<const float*>(group);
  const uint8_t* body = group + packed::groupHeaderBytes(TensorType::kQ6_K, blocks);
  __m512 acc[kCount];
  for (int i = 0; i < kCount; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i low_mask = _mm512_set1_epi8(0x0f);
  const __m512i high_mask = _mm512_set1_epi8(0x30);
  __m512 d = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    if (b % 8 == 0) d = _mm512_loadu_ps(supers + b / 8 * 16);
    const uint8_t* block = body + b * kGroupBlock;
    const __m512 d_first = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                                reinterpret_cast<const __m128i*>(block)))));
    const __m512 d_second =
        _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16)))));
    __m512i w[8];
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(block + 32 + 64 * c);
      w[c] = _mm512_and_si512(v, low_mask);
      w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low_mask);
    }
    for (int h = 0; h < 2; ++h) {
      const __m512i v = _mm512_loadu_si512(block + 288 + 64 * h);
      // Bits 2k, 2k + 1 of each byte to bits 4, 5 (16-bit shifts: what crosses a byte
      // boundary is masked off), or-ed in: w | (bits & 0x30) is ternary logic 0xF8.
      w[4 * h + 0] =
          _mm512_ternarylogic_epi32(w[4 * h + 0], _mm512_slli_epi16(v, 4), high_mask, 0xF8);
      w[4 * h + 1] =
          _mm512_ternarylogic_epi32(w[4 * h + 1], _mm512_slli_epi16(v, 2), high_mask, 0xF8);
      w[4 * h + 2] = _mm512_ternarylogic_epi32(w[4 * h + 2], v, high_mask, 0xF8);
      w[4 * h + 3] =
          _mm512_ternarylogic_epi32(w[4 * h + 3], _mm512_srli_epi16(v, 2), high_mask, 0xF8);
    }
    addHalves<kCount, 32>(w, d_first, d_second, x, t0, b, acc);
  }
  for (int i = 0; i < kCount; ++i) _mm512_mask_storeu_ps(y + (t0 + i) * ldy, rows_mask, acc[i]);
}

template <TensorType kType, int kCount>
inline void tile(const uint8_t* group, int64_t blocks, const QuantizedActivations& x, int64_t t0,
                 float* y, int64_t ldy, __mmask16 rows_mask) {
  if constexpr (kType == TensorType::kQ6_K) {
    q6Tile<kCount>(group, blocks, x, t0, y, ldy, rows_mask);
  } else if constexpr (kType == TensorType::kNVFP4) {
    nvfp4Tile<kCount>(group, blocks, x, t0, y, ldy, rows_mask);
  } else {
    groupTile<kType, kCount>(group, blocks, x, t0, y, ldy, rows_mask);
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
    const int64_t valid = std::min<int64_t>(packed::kGroupRows, w.rows() - g * packed::kGroupRows);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    float* y = a.y + g * packed::kGroupRows;
    forEachTokenTile<kTokenTile>(tokens, [&]<int kCount>(int64_t t) {
      tile<kType, kCount>(group, blocks, *a.x, t, y, a.ldy, mask);
    });
  }
}

}  // namespace

void packedGroupsAvx512(const PackedRows& a) {
  switch (a.weight->kernelType()) {
    case TensorType::kQ4_0: return groups<TensorType::kQ4_0>(a);
    case TensorType::kQ4_1: return groups<TensorType::kQ4_1>(a);
    case TensorType::kQ8_0: return groups<TensorType::kQ8_0>(a);
    case TensorType::kQ6_K: return groups<TensorType::kQ6_K>(a);
    case TensorType::kMXFP4: return groups<TensorType::kMXFP4>(a);
    case TensorType::kNVFP4: return groups<TensorType::kNVFP4>(a);
    default: return;
  }
}

}  // namespace cleave::cpu::kernels
