// Activations quantized per 32-element block to int8, the input side of the quantized
// matrix products (weights stay in their stored block format). Per block b of row t:
//   x[t][32b + j] ~= d[t][b] * q[t][32b + j],  d = max|x| / 127,  sum = sum_j q,
//   dsum = d * sum (in float: what a block's weight offsets multiply).
// Layout: q is [rows, cols] int8 row-major (so two blocks are 64 contiguous bytes);
// d and sum are [rows, cols / 32].
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"

namespace cleave::cpu {

struct QuantizedActivations {
  int64_t rows = 0;
  int64_t cols = 0;  // A multiple of 32.
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sum;
  std::vector<int32_t> half_sum;  // Of each block's first 16 values (Q6_K's sub-blocks).
  std::vector<float> dsum;

  int64_t blocksPerRow() const { return cols / 32; }
  const int8_t* rowQ(int64_t row) const { return q.data() + row * cols; }
  const float* rowD(int64_t row) const { return d.data() + row * blocksPerRow(); }
  const int32_t* rowSum(int64_t row) const { return sum.data() + row * blocksPerRow(); }
  const int32_t* rowHalfSum(int64_t row) const { return half_sum.data() + row * blocksPerRow(); }
  const float* rowDsum(int64_t row) const { return dsum.data() + row * blocksPerRow(); }
};

// Quantizes `rows` rows of `cols` floats (row stride `ld`) into `out`, reusing its storage,
// over `pool` in runs of 32 rows when given. `cols` must be a multiple of 32. Every ISA's
// path gives the same bytes.
void quantizeActivations(const float* x, int64_t rows, int64_t cols, int64_t ld,
                         QuantizedActivations& out, Isa isa = bestIsa(),
                         ThreadPool* pool = nullptr);

}  // namespace cleave::cpu
