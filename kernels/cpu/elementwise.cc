#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/vector_ops.h"

namespace cleave::cpu {

void rmsNorm(const float* x, int64_t ldx, const float* weight, int64_t rows, int64_t cols,
             float eps, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * ldx;
    float* out = y + r * ldy;
    double sum = 0;  // Accumulated in double: hidden sizes reach 8192.
    for (int64_t i = 0; i < cols; ++i) sum += static_cast<double>(in[i]) * in[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(cols) + eps));
    for (int64_t i = 0; i < cols; ++i) out[i] = in[i] * scale * weight[i];
  }
}

void siluMul(const float* gate, const float* up, int64_t ld_in, int64_t rows, int64_t cols,
             float* out, int64_t ld_out) {
  for (int64_t r = 0; r < rows; ++r) {
    siluMulRow(gate + r * ld_in, up + r * ld_in, out + r * ld_out, cols);
  }
}

void geluTanhMul(const float* gate, const float* up, int64_t ld_in, int64_t rows, int64_t cols,
                 float* out, int64_t ld_out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate + r * ld_in;
    const float* u = up + r * ld_in;
    float* o = out + r * ld_out;
    for (int64_t i = 0; i < cols; ++i) {
      const float v = g[i];
      o[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v))) * u[i];
    }
  }
}

void softCap(float* x, int64_t n, float cap) {
  const float inverse = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inverse);
}

void addInPlace(float* x, int64_t ldx, const float* y, int64_t ldy, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) x[r * ldx + i] += y[r * ldy + i];
  }
}

void addRowBias(float* x, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) x[r * cols + i] += bias[i];
  }
}

void softmax(float* x, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * ld;
    const float peak = *std::max_element(v, v + cols);
    const float sum = expShiftSum(v, cols, peak);
    const float inverse = 1.0f / sum;
    for (int64_t i = 0; i < cols; ++i) v[i] *= inverse;
  }
}

}  // namespace cleave::cpu
