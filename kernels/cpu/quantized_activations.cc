#include "kernels/cpu/quantized_activations.h"

#include <cmath>

namespace cleave::cpu {

// Rows [row_begin, row_end) of x into the same rows of `out` (sized by the caller).
void quantizeActivationsAvx2(const float* x, int64_t row_begin, int64_t row_end, int64_t cols,
                             int64_t ld, QuantizedActivations& out);
void quantizeActivationsAvx512(const float* x, int64_t row_begin, int64_t row_end, int64_t cols,
                               int64_t ld, QuantizedActivations& out);

namespace {

// Rounds half to even, as the SIMD conversion does, so every path quantizes alike.
void quantizePortable(const float* x, int64_t row_begin, int64_t row_end, int64_t cols, int64_t ld,
                      QuantizedActivations& out) {
  const int64_t blocks = cols / 32;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* row = x + r * ld;
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = row + b * 32;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(v[j]));
      const float d = amax / 127.0f;
      const float inverse = d != 0.0f ? 127.0f / amax : 0.0f;
      int8_t* q = out.q.data() + r * cols + b * 32;
      int32_t sum = 0, half = 0;
      for (int j = 0; j < 32; ++j) {
        q[j] = static_cast<int8_t>(std::nearbyint(v[j] * inverse));
        sum += q[j];
        if (j == 15) half = sum;
      }
      out.d[r * blocks + b] = d;
      out.sum[r * blocks + b] = sum;
      out.half_sum[r * blocks + b] = half;
    }
  }
}

}  // namespace

void quantizeActivations(const float* x, int64_t rows, int64_t cols, int64_t ld,
                         QuantizedActivations& out, Isa isa, ThreadPool* pool) {
  out.rows = rows;
  out.cols = cols;
  out.q.resize(rows * cols);
  out.d.resize(rows * (cols / 32));
  out.sum.resize(rows * (cols / 32));
  out.half_sum.resize(rows * (cols / 32));
  out.dsum.resize(rows * (cols / 32));
  auto quantize = isa == Isa::kAvx512 ? quantizeActivationsAvx512
                  : isa == Isa::kAvx2 ? quantizeActivationsAvx2
                                      : quantizePortable;
  auto rowsOf = [&](int64_t begin, int64_t end) {
    quantize(x, begin, end, cols, ld, out);
    const int64_t blocks = cols / 32;
    for (int64_t i = begin * blocks; i < end * blocks; ++i)
      out.dsum[i] = out.d[i] * static_cast<float>(out.sum[i]);
  };
  if (pool == nullptr) return rowsOf(0, rows);
  pool->parallelFor(rows, 32, rowsOf);  // A decode step's few rows stay on this thread.
}

}  // namespace cleave::cpu
