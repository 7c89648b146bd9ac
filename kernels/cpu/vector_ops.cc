#include "kernels/cpu/vector_ops.h"

#include <cmath>

#include "kernels/cpu/cpu_features.h"

namespace cleave::cpu {
namespace {

float dotPortable(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void axpyPortable(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

const bool kAvx512 = bestIsa() == Isa::kAvx512;
const bool kAvx2 = bestIsa() == Isa::kAvx2;

}  // namespace

float dot(const float* a, const float* b, int64_t n) {
  return kAvx512 ? vec::dotAvx512(a, b, n) : dotPortable(a, b, n);
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
  if (kAvx512) {
    vec::axpyAvx512(alpha, x, y, n);
  } else {
    axpyPortable(alpha, x, y, n);
  }
}

float expShiftSum(float* x, int64_t n, float shift) {
  if (kAvx512) return vec::expShiftSumAvx512(x, n, shift);
  if (kAvx2) return vec::expShiftSumAvx2(x, n, shift);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}

void siluMulRow(const float* gate, const float* up, float* out, int64_t n) {
  if (kAvx512) return vec::siluMulRowAvx512(gate, up, out, n);
  if (kAvx2) return vec::siluMulRowAvx2(gate, up, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace cleave::cpu
