// Float vector primitives for the small ops, dispatched once to the best ISA.
#pragma once

#include <cstdint>

namespace cleave::cpu {

// sum_i a[i] * b[i]
float dot(const float* a, const float* b, int64_t n);
// y[i] += alpha * x[i]
void axpy(float alpha, const float* x, float* y, int64_t n);

// x[i] = exp(x[i] - shift); returns the sum of the results (for softmax).
float expShiftSum(float* x, int64_t n, float shift);
// out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]
void siluMulRow(const float* gate, const float* up, float* out, int64_t n);

namespace vec {
float expShiftSumAvx2(float* x, int64_t n, float shift);
void siluMulRowAvx2(const float* gate, const float* up, float* out, int64_t n);
float expShiftSumAvx512(float* x, int64_t n, float shift);
void siluMulRowAvx512(const float* gate, const float* up, float* out, int64_t n);
float dotAvx512(const float* a, const float* b, int64_t n);
void axpyAvx512(float alpha, const float* x, float* y, int64_t n);
}  // namespace vec

}  // namespace cleave::cpu
