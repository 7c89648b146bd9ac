// The arithmetic peak of this machine's SIMD units with a pool's threads, measured with
// register-only loops (nothing from memory): the compute side of a step's floor.
#pragma once

#include "kernels/cpu/thread_pool.h"

namespace cleave::bench {

// int8 multiply-adds as the quantized matmuls issue them (AVX-512 VNNI VPDPBUSD), in
// operations per second (a multiply-add is two). 0 when the CPU has no AVX-512 VNNI.
double int8PeakOps(cpu::ThreadPool& pool);
// float32 fused multiply-adds (AVX-512, else AVX2), in FLOP/s.
double f32PeakFlops(cpu::ThreadPool& pool);

}  // namespace cleave::bench
