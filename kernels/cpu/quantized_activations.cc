#include "kernels/cpu/quantized_activations.h"

#include <cmath>

namespace cleave::cpu {

void quantizeActivations(const float* x, int64_t rows, int64_t cols, int64_t ld,
                         QuantizedActivations& out) {
  out.rows = rows;
  out.cols = cols;
  const int64_t blocks = cols / 32;
  out.q.resize(rows * cols);
  out.d.resize(rows * blocks);
  out.sum.resize(rows * blocks);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ld;
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = row + b * 32;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(v[j]));
      const float d = amax / 127.0f;
      const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
      int8_t* q = out.q.data() + r * cols + b * 32;
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) {
        q[j] = static_cast<int8_t>(std::lround(v[j] * inverse));
        sum += q[j];
      }
      out.d[r * blocks + b] = d;
      out.sum[r * blocks + b] = sum;
    }
  }
}

}  // namespace cleave::cpu
