// What this machine can do with a pool's threads, measured on the spot: read bandwidth
// (summing a buffer far larger than the caches) and the arithmetic peak of the SIMD units
// (register-only loops). The two sides of a CPU step's floor.
#pragma once

#include "kernels/cpu/thread_pool.h"

namespace cleave::cpu {

// int8 multiply-adds as the quantized matmuls issue them (AVX-512 VNNI VPDPBUSD, or AVX2
// VPMADDUBSW into int16 sums), in operations per second (a multiply-add is two). 0 when the
// quantized matmuls run the portable path.
double int8PeakOps(ThreadPool& pool);
// float32 fused multiply-adds (AVX-512, else AVX2), in FLOP/s.
double f32PeakFlops(ThreadPool& pool);
// bf16 pair dot products into float (AVX-512 BF16 VDPBF16PS, as the BF16 weights' kernel
// issues them: CpuMatrix::multipliesBf16), in FLOP/s; 0 where the CPU has none.
double bf16PeakFlops(ThreadPool& pool);
// Read bandwidth in bytes/s: the best of `reps` sums of a `bytes` buffer (far larger than
// the caches) by every thread, on the pages the KV cache and repacked weights use
// (huge_pages.h).
double readBandwidth(ThreadPool& pool, int reps, int64_t bytes = int64_t{1} << 30);

}  // namespace cleave::cpu
