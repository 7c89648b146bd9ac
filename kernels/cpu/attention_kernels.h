// The SIMD attention kernels behind attention() (attention.h): a token alone (decode) and
// tiles of prefill chunks, which give a token the same bits. Internal to
// cleave_kernels_cpu.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.h"

namespace cleave::cpu::kernels {

// Attention of token `t`'s query heads that read KV head `kvh`, on its own
// (attention_keys.h), with `scratch` keysScratchFloats floats. Require head_dim a multiple of
// 16 (AVX-512) or 8 (AVX2), at most 256.
void attentionKeysAvx512(const AttentionArgs& args, int64_t t, int64_t kvh, float* scratch);
void attentionKeysAvx2(const AttentionArgs& args, int64_t t, int64_t kvh, float* scratch);

// A run is tokens [t0, t0 + n) of the batch that are consecutive positions of one sequence
// (one block table): a prefill chunk. Its rows are its n x (heads / kv_heads) query rows of
// one KV head, row r being token t0 + r / group's query head r % group of that group; a tile
// is the run's rows [r0, r0 + lanes) (fewer at the end), computed together (attention_rows.h).
struct RowTile {
  int64_t t0 = 0;
  int64_t rows = 0;  // The run's: n x group.
  int64_t r0 = 0;
};
// The lanes of a tile: the rows one kernel call computes.
inline constexpr int64_t kRowLanesAvx512 = 16;
inline constexpr int64_t kRowLanesAvx2 = 8;
// Scratch floats a tile needs, and a token alone (`group` query heads a KV head); the widest
// lanes.
inline constexpr int64_t rowsScratchFloats(int64_t head_dim) {
  return 4 * head_dim * kRowLanesAvx512 + kRowLanesAvx512 * kRowLanesAvx512;
}
inline constexpr int64_t keysScratchFloats(int64_t group, int64_t head_dim) {
  return 2 * group * head_dim + head_dim * kRowLanesAvx512 + group * kRowLanesAvx512 + 3 * group +
         head_dim;
}
// Attention of the tile's rows reading KV head `kvh`, with `scratch` rowsScratchFloats floats.
// The same head_dim requirements as attentionKeys*.
void attentionRowsAvx512(const AttentionArgs& args, const RowTile& tile, int64_t kvh,
                         float* scratch);
void attentionRowsAvx2(const AttentionArgs& args, const RowTile& tile, int64_t kvh, float* scratch);

}  // namespace cleave::cpu::kernels
