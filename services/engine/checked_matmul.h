// A matrix product whose shapes were fixed at load: a failure is a broken invariant, not
// bad input, so it stops the process.
#pragma once

#include <cstdint>

#include "common/log.h"
#include "kernels/cpu/matmul.h"

namespace cleave::engine {

inline void checkedMatmul(const cpu::CpuMatrix& w, const float* x, int64_t ldx, int64_t tokens,
                          float* y, int64_t ldy, cpu::ThreadPool& pool) {
  CLEAVE_CHECK_OK(
      cpu::matmul({.weight = &w, .x = x, .ldx = ldx, .tokens = tokens, .y = y, .ldy = ldy}, pool));
}

}  // namespace cleave::engine
