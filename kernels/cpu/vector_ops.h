// Float vector primitives for the small ops, dispatched once to the best ISA.
#pragma once

#include <cstdint>

namespace cleave::cpu {

// sum_i a[i] * b[i]
float dot(const float* a, const float* b, int64_t n);
// y[i] += alpha * x[i]
void axpy(float alpha, const float* x, float* y, int64_t n);

namespace vec {
float dotAvx512(const float* a, const float* b, int64_t n);
void axpyAvx512(float alpha, const float* x, float* y, int64_t n);
}  // namespace vec

}  // namespace cleave::cpu
